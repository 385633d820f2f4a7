//! Coordinator child processes (`idem serve`), restarted by a supervisor when they die.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use idem_participant::testing::{IdemProcess, IdemServe};

use super::calls::CoordinatorProcess;
use super::{Error, RunConfig, Scenario, Settings};
use crate::faults::{CrashAction, FaultPlan, Timeline, TimelineEvent};

/// Coordinator child processes, restarted when they die.
pub(super) struct Coordinators {
    urls: Arc<RwLock<Vec<String>>>,
    restarts: Arc<AtomicU32>,
    stopping: Arc<AtomicBool>,
    pids: Arc<RwLock<Vec<Option<u32>>>>,
    /// Every process started, with when it started and was seen to end.
    processes: Arc<Mutex<Vec<CoordinatorProcess>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Launch {
    bin: PathBuf,
    db: String,
    node: String,
    plan: FaultPlan,
    plan_file: PathBuf,
    timeline: PathBuf,
    /// Where its stderr (the log) goes, appended to by every restart.
    log: PathBuf,
    settings: Settings,
    /// This coordinator's wall clock runs this many ms off (test builds of `idem serve`).
    clock_offset_ms: Option<i64>,
}

/// How long a supervisor keeps trying to bring a coordinator back: `idem serve` exits at
/// once when it cannot reach its database, which a database restart makes happen.
const RESTART_PATIENCE: Duration = Duration::from_secs(120);

/// The clock offset of coordinator `i` of `n`: the skew, if any, goes to the last one (so
/// with one coordinator, to it).
fn clock_offset(settings: &Settings, i: usize, n: usize) -> Option<i64> {
    settings.skewed_clock_ms.filter(|_| i + 1 == n)
}

impl Launch {
    /// How `idem serve` is started for this coordinator.
    fn command(&self) -> IdemServe {
        let s = &self.settings;
        let mut args: Vec<OsString> = [
            "--node",
            &self.node,
            "--lease-ms",
            &s.lease_ms.to_string(),
            "--recovery-interval-ms",
            "100",
            "--retry-interval-ms",
            &s.retry_interval_ms.to_string(),
            "--max-retry-interval-ms",
            &s.max_retry_interval_ms.to_string(),
            "--max-attempts",
            &s.max_attempts.to_string(),
            "--request-timeout-ms",
            &s.request_timeout_ms.to_string(),
            "--prepared-timeout-ms",
            &s.prepared_timeout_ms.to_string(),
            "--sqlite-full-sync",
            "false",
            "--max-connections",
            "8",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        args.extend([
            "--fault-plan".into(),
            self.plan_file.clone().into(),
            "--record".into(),
            self.timeline.clone().into(),
        ]);
        if let Some(offset) = self.clock_offset_ms {
            args.extend(["--test-clock-offset-ms".into(), offset.to_string().into()]);
        }
        if let Some(ms) = s.database_call_timeout_ms {
            args.extend(["--database-call-timeout-ms".into(), ms.to_string().into()]);
        }
        IdemServe::new(&self.bin, &self.db)
            .args(args)
            // IDEM_LAB_COORDINATOR_LOG: the coordinators' log filter when a run must be
            // read afterwards (errors only by default, to keep the files short); the log
            // goes to `c<i>.log` in the work directory, appended to by every restart.
            .env(
                "RUST_LOG",
                std::env::var("IDEM_LAB_COORDINATOR_LOG").unwrap_or_else(|_| "error".into()),
            )
            .log_to(&self.log, true)
    }

    async fn spawn(&self) -> Result<IdemProcess, Error> {
        std::fs::write(&self.plan_file, serde_json::to_string_pretty(&self.plan)?)?;
        Ok(self.command().start(Duration::from_secs(30)).await?)
    }

    /// The crash rules that already fired for this node leave the plan, so a restarted
    /// coordinator does not crash at the same point again forever.
    fn drop_fired_crashes(&mut self) {
        let fired: Vec<(idem::engine::Point, String)> = Timeline::read(&self.timeline)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| match e {
                TimelineEvent::Crash {
                    point,
                    gid,
                    node,
                    action: CrashAction::Crash,
                    ..
                } if node == self.node => Some((point, gid)),
                _ => None,
            })
            .collect();
        self.plan.crashes.retain(|c| {
            !fired.iter().any(|(point, gid)| {
                c.point == *point
                    && c.node.as_deref().is_none_or(|n| n == self.node)
                    && c.gid.as_deref().is_none_or(|p| crate::faults::glob(p, gid))
            })
        });
    }
}

impl Coordinators {
    /// Starts `scenario.coordinators` processes, coordinator `i` on database URL `dbs[i]`.
    pub(super) async fn start(
        scenario: &Scenario,
        config: &RunConfig,
        timeline: &Path,
        dbs: &[String],
    ) -> Result<Coordinators, Error> {
        let n = scenario.coordinators.max(1);
        let urls = Arc::new(RwLock::new(vec![String::new(); n]));
        let pids = Arc::new(RwLock::new(vec![None; n]));
        let processes: Arc<Mutex<Vec<CoordinatorProcess>>> = Arc::default();
        let restarts = Arc::new(AtomicU32::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (i, db) in dbs.iter().enumerate().take(n) {
            let mut launch = Launch {
                bin: config.idem_bin.clone(),
                db: db.clone(),
                node: format!("c{i}"),
                plan: scenario.plan.clone(),
                plan_file: config.work_dir.join(format!("plan-c{i}.json")),
                timeline: timeline.to_owned(),
                log: config.work_dir.join(format!("c{i}.log")),
                settings: scenario.settings.clone(),
                clock_offset_ms: clock_offset(&scenario.settings, i, n),
            };
            let mut child = launch.spawn().await?;
            urls.write().expect("poisoned")[i] = child.url().to_owned();
            pids.write().expect("poisoned")[i] = Some(child.pid());
            let started = move |processes: &Mutex<Vec<CoordinatorProcess>>, pid: u32| {
                processes
                    .lock()
                    .expect("poisoned")
                    .push(CoordinatorProcess {
                        node: format!("c{i}"),
                        pid,
                        started_at: crate::faults::now(),
                        ended_at: None,
                    });
            };
            started(&processes, child.pid());
            let (urls, pids, restarts, stopping, processes) = (
                Arc::clone(&urls),
                Arc::clone(&pids),
                Arc::clone(&restarts),
                Arc::clone(&stopping),
                Arc::clone(&processes),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let _ = child.wait().await;
                    ended(&processes, child.pid());
                    // A dead child's pid may be handed to another process: never signal it.
                    pids.write().expect("poisoned")[i] = None;
                    if stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    restarts.fetch_add(1, Ordering::SeqCst);
                    launch.drop_fired_crashes();
                    let deadline = tokio::time::Instant::now() + RESTART_PATIENCE;
                    child = loop {
                        match launch.spawn().await {
                            Ok(c) => {
                                started(&processes, c.pid());
                                pids.write().expect("poisoned")[i] = Some(c.pid());
                                urls.write().expect("poisoned")[i] = c.url().to_owned();
                                if stopping.load(Ordering::SeqCst) {
                                    // The run ended while it started: dropping it kills it.
                                    return;
                                }
                                break c;
                            }
                            Err(e) if tokio::time::Instant::now() > deadline => {
                                eprintln!("cannot restart coordinator c{i}: {e}");
                                return;
                            }
                            // Its database is restarting, most likely: try again shortly.
                            Err(_) if !stopping.load(Ordering::SeqCst) => {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                            }
                            Err(_) => return,
                        }
                    };
                }
            }));
        }
        Ok(Coordinators {
            urls,
            restarts,
            stopping,
            pids,
            processes,
            tasks,
        })
    }

    pub(super) fn url(&self, i: usize) -> String {
        let urls = self.urls.read().expect("poisoned");
        urls[i % urls.len()].clone()
    }

    pub(super) fn count(&self) -> usize {
        self.urls.read().expect("poisoned").len()
    }

    /// SIGKILL coordinator `i` (the supervisor restarts it).
    pub(super) fn kill(&self, i: usize) {
        if let Some(pid) = self.pids.read().expect("poisoned")[i] {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }

    /// Kills every coordinator; returns how many restarts there were, and every process
    /// the run had.
    pub(super) async fn stop(self) -> (u32, Vec<CoordinatorProcess>) {
        self.stopping.store(true, Ordering::SeqCst);
        for i in 0..self.count() {
            self.kill(i);
        }
        for t in self.tasks {
            let _ = t.await;
        }
        let processes = self.processes.lock().expect("poisoned").clone();
        (self.restarts.load(Ordering::SeqCst), processes)
    }
}

/// Notes that the process `pid` was seen to end.
fn ended(processes: &Mutex<Vec<CoordinatorProcess>>, pid: u32) {
    let now = crate::faults::now();
    let mut processes = processes.lock().expect("poisoned");
    if let Some(p) = processes
        .iter_mut()
        .rev()
        .find(|p| p.pid == pid && p.ended_at.is_none())
    {
        p.ended_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(settings: Settings, i: usize, n: usize) -> Launch {
        Launch {
            bin: "idem".into(),
            db: "sqlite:c.db".into(),
            node: format!("c{i}"),
            plan: FaultPlan::default(),
            plan_file: "plan.json".into(),
            timeline: "timeline.jsonl".into(),
            log: "c0.log".into(),
            clock_offset_ms: clock_offset(&settings, i, n),
            settings,
        }
    }

    fn args(l: &Launch) -> Vec<String> {
        l.command()
            .arg_list()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    /// What `--skewed-clock-ms` makes of the coordinators' command lines. (`idem serve`
    /// learns `--test-clock-offset-ms` on another branch; the run with it is
    /// `tests/it/chaos.rs`, which waits for the flag to exist.)
    #[test]
    fn the_last_coordinator_gets_the_clock_offset() {
        let skewed = Settings {
            skewed_clock_ms: Some(-60_000),
            ..Settings::default()
        };
        for i in 0..2 {
            assert!(
                !args(&launch(skewed.clone(), i, 3)).contains(&"--test-clock-offset-ms".into())
            );
        }
        let last = args(&launch(skewed.clone(), 2, 3));
        let at = last
            .iter()
            .position(|a| a == "--test-clock-offset-ms")
            .expect("the flag");
        assert_eq!(last[at + 1], "-60000");
        // The rest of the command line is the same as without the skew.
        let plain = args(&launch(Settings::default(), 2, 3));
        assert_eq!(last[..at], plain[..]);
        assert_eq!(last.len(), plain.len() + 2);
        assert!(args(&launch(skewed, 0, 1)).contains(&"--test-clock-offset-ms".into()));
        let node = plain.iter().position(|a| a == "--node").unwrap();
        assert_eq!(
            (plain[0].as_str(), plain[node + 1].as_str()),
            ("serve", "c2")
        );
    }
}

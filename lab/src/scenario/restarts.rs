//! Database restarts in the middle of a run: the server that holds the coordinators' and
//! the participants' data goes away and comes back while orders are in flight.
//!
//! Everything must ride it out on its own: the coordinators retry their writes and
//! recover what their drivers dropped, the participants answer 5xx until their
//! connections work again, the runner's client retries its requests. The restarts are
//! spread over the orders (restart k of n when order `k·N/(n+1)` starts), not over time,
//! so each one lands while orders are in flight at any speed of the machine. The runner
//! checks that each one happened: the command succeeded, the server accepted connections
//! again, and its uptime shows it did restart.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::Connection;

use super::{Report, Scenario};

/// One restart, as it went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DbRestart {
    /// The order whose start set it off (0-based).
    pub at_order: usize,
    /// How long the restart command took.
    pub command_ms: u64,
    /// From the command's start until the server accepted a connection again.
    pub down_ms: u64,
    /// The server's uptime, read afterwards, was shorter than the time since the command
    /// started: it really did restart.
    pub restarted: bool,
    /// What went wrong, if anything (the command failed, the server did not come back).
    pub error: Option<String>,
}

/// How long the server may take to accept connections again after the command.
const COMEBACK: Duration = Duration::from_secs(120);

/// The orders at whose start the restarts happen: evenly spread, none at the very start.
pub(super) fn points(orders: usize, restarts: u32) -> Vec<usize> {
    let n = restarts as usize;
    (1..=n).map(|k| k * orders / (n + 1)).collect()
}

/// Runs the restarts one after the other as the run reaches their orders.
pub(super) struct Restarter {
    trigger: tokio::sync::mpsc::UnboundedSender<usize>,
    task: tokio::task::JoinHandle<Vec<DbRestart>>,
}

impl Restarter {
    /// `command` runs with `sh -c`, its output going to `log`; `probe_url` names a
    /// database on the restarted server.
    pub(super) fn start(command: String, probe_url: String, log: PathBuf) -> Restarter {
        let (trigger, mut due) = tokio::sync::mpsc::unbounded_channel::<usize>();
        let task = tokio::spawn(async move {
            let mut done = Vec::new();
            while let Some(at_order) = due.recv().await {
                done.push(restart(&command, &probe_url, &log, at_order, COMEBACK).await);
            }
            done
        });
        Restarter { trigger, task }
    }

    /// Starts a restart (after any still going) without waiting for it.
    pub(super) fn trigger(&self, at_order: usize) {
        let _ = self.trigger.send(at_order);
    }

    /// Waits for the restarts triggered so far and returns what they did.
    pub(super) async fn finish(self) -> Vec<DbRestart> {
        drop(self.trigger);
        self.task.await.unwrap_or_default()
    }
}

async fn restart(
    command: &str,
    probe_url: &str,
    log: &Path,
    at_order: usize,
    comeback: Duration,
) -> DbRestart {
    let started = Instant::now();
    let mut record = DbRestart {
        at_order,
        ..DbRestart::default()
    };
    record.error = run(command, log).await.err();
    record.command_ms = started.elapsed().as_millis() as u64;
    // Whether the command worked or not, wait for the server: the rest of the run needs
    // it, and a server that is down for good must fail the run here, saying so.
    let deadline = started + comeback;
    loop {
        match uptime(probe_url).await {
            Ok(uptime) => {
                record.down_ms = started.elapsed().as_millis() as u64;
                // Uptime is whole seconds on MariaDB: one second of slack.
                record.restarted = uptime <= started.elapsed().as_secs_f64() + 1.0;
                break;
            }
            Err(e) if Instant::now() > deadline => {
                let why = format!("the server did not come back in {comeback:?}: {e}");
                record.error = Some(match record.error.take() {
                    Some(before) => format!("{before}; {why}"),
                    None => why,
                });
                break;
            }
            // Not back yet: ask again shortly.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    record
}

/// Runs the command, its output to a file: the server it starts in the background inherits
/// the command's output, and a pipe would then never reach its end.
async fn run(command: &str, log: &Path) -> Result<(), String> {
    let file =
        std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let status = tokio::process::Command::new("sh")
        .args(["-c", command])
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file)
        .status()
        .await
        .map_err(|e| format!("cannot run `{command}`: {e}"))?;
    if status.success() {
        return Ok(());
    }
    let output = std::fs::read_to_string(log).unwrap_or_default();
    Err(format!("`{command}` failed ({status}): {}", output.trim()))
}

/// How long the database server has been up, in seconds.
async fn uptime(url: &str) -> Result<f64, sqlx::Error> {
    if idem_participant::testing::Backend::from_url(url)
        == Some(idem_participant::testing::Backend::Postgres)
    {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        let up: f64 = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - pg_postmaster_start_time())::float8",
        )
        .fetch_one(&mut conn)
        .await?;
        conn.close().await?;
        Ok(up)
    } else {
        let url = url.replacen("mariadb://", "mysql://", 1);
        let mut conn = sqlx::MySqlConnection::connect(&url).await?;
        let (_, up): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Uptime'")
            .fetch_one(&mut conn)
            .await?;
        conn.close().await?;
        up.parse()
            .map_err(|e| sqlx::Error::Protocol(format!("uptime {up:?}: {e}")))
    }
}

/// Each planned restart happened and the server came back from it.
pub(super) fn check(scenario: &Scenario, report: &Report, v: &mut Vec<String>) {
    let planned = scenario.settings.db_restarts as usize;
    if report.db_restarts.len() != planned {
        v.push(format!(
            "{planned} database restarts planned, {} done",
            report.db_restarts.len()
        ));
    }
    for (k, r) in report.db_restarts.iter().enumerate() {
        if let Some(e) = &r.error {
            v.push(format!("database restart {} failed: {e}", k + 1));
        } else if !r.restarted {
            v.push(format!(
                "database restart {}: the server's uptime shows no restart (is the restart command for the server the run uses?)",
                k + 1
            ));
        }
    }
}

/// The summary's line.
pub(super) fn describe(restarts: &[DbRestart]) -> Option<String> {
    if restarts.is_empty() {
        return None;
    }
    let each: Vec<String> = restarts
        .iter()
        .map(|r| {
            let state = match (&r.error, r.restarted) {
                (Some(_), _) => "FAILED",
                (None, false) => "NOT RESTARTED",
                (None, true) => "back",
            };
            format!(
                "at order {}, {state} after {:.1} s",
                r.at_order,
                r.down_ms as f64 / 1_000.0
            )
        })
        .collect();
    Some(format!(
        "database restarts: {} ({})",
        restarts.len(),
        each.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_are_spread_evenly_over_the_orders() {
        assert_eq!(points(10_000, 2), [3_333, 6_666]);
        assert_eq!(points(120, 1), [60]);
        assert_eq!(points(100, 0), Vec::<usize>::new());
        // Never at the start, never past the last order.
        assert!(points(3, 5).iter().all(|&p| p < 3));
    }

    #[test]
    fn a_missing_or_failed_restart_is_a_violation() {
        let scenario = Scenario {
            settings: super::super::Settings {
                db_restarts: 2,
                ..Default::default()
            },
            ..Scenario::default()
        };
        let ok = DbRestart {
            restarted: true,
            ..DbRestart::default()
        };
        let mut report = Report {
            db_restarts: vec![ok.clone(), ok.clone()],
            ..Report::default()
        };
        let mut v = Vec::new();
        check(&scenario, &report, &mut v);
        assert_eq!(v, Vec::<String>::new());
        report.db_restarts[1].restarted = false;
        report.db_restarts.push(DbRestart {
            error: Some("boom".into()),
            ..ok
        });
        check(&scenario, &report, &mut v);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(v[0].contains("2 database restarts planned, 3 done"));
        assert!(v[1].contains("no restart"));
        assert!(v[2].contains("boom"));
    }

    #[tokio::test]
    async fn a_failed_command_and_a_server_that_stays_away_are_both_reported() {
        // Nothing listens on port 1, so the server never "comes back".
        let log = std::env::temp_dir().join(format!(
            "idem-restart-{}.log",
            uuid::Uuid::new_v4().simple()
        ));
        let record = restart(
            "echo nope >&2; exit 3",
            "postgres://x@127.0.0.1:1/x",
            &log,
            7,
            Duration::from_millis(300),
        )
        .await;
        let _ = std::fs::remove_file(&log);
        assert_eq!(record.at_order, 7);
        assert!(!record.restarted);
        let error = record.error.unwrap();
        assert!(error.contains("failed (exit status: 3): nope"), "{error}");
        assert!(error.contains("did not come back"), "{error}");
    }
}

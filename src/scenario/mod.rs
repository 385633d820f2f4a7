//! Scenarios: a workload of orders plus a fault plan, run against the example participants
//! with real `idem serve` processes, and checked afterwards.
//!
//! The participants (inventory, payment, coupon) run in this process behind the
//! participant-side fault layer; the coordinators run as child processes with the
//! coordinator-side rules and crash points of the plan, and a supervisor restarts any that
//! crash (or are killed), dropping the crash rules that already fired. The runner plays the
//! client: it creates transactions, calls TCC Trys itself, submits or aborts, and retries a
//! request whose coordinator died under it — with the same gid, which is what makes that safe.
//!
//! Used by `tests/scenarios.rs` (the files in `tests/scenarios/`), `idem replay` and
//! `idem chaos`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::core::{Kind, Status};
use crate::faults::{
    CallKey, CrashAction, Delivery, FaultPlan, ParticipantFaults, Timeline, TimelineEvent,
    fault_signature, participant_faults,
};
use idem_demo::{coupon, inventory, payment};

mod chaos;
mod checks;

pub use chaos::{ChaosConfig, scenario as chaos_scenario};
pub use checks::check;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// A scenario file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub plan: FaultPlan,
    /// Coordinator processes sharing the database (orders go to them in turn).
    #[serde(default = "one")]
    pub coordinators: usize,
    /// Orders in flight at once (1: one after the other).
    #[serde(default = "one")]
    pub concurrency: usize,
    #[serde(default)]
    pub settings: Settings,
    /// Stock per SKU, balance per account, coupons per campaign, before the run.
    #[serde(default)]
    pub stock: BTreeMap<String, i64>,
    #[serde(default)]
    pub accounts: BTreeMap<String, i64>,
    #[serde(default)]
    pub campaigns: BTreeMap<String, i64>,
    pub orders: Vec<Order>,
    #[serde(default)]
    pub expect: Expect,
    /// Databases to run it on in `cargo test` (default: sqlite and postgres).
    #[serde(default)]
    pub backends: Vec<String>,
}

fn one() -> usize {
    1
}

/// Coordinator settings for the run (short, so scenarios take seconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub max_attempts: u32,
    pub retry_interval_ms: u64,
    pub max_retry_interval_ms: u64,
    pub request_timeout_ms: u64,
    pub lease_ms: u64,
    /// Timeout of a prepared TCC.
    pub prepared_timeout_ms: u64,
    /// How long the client waits for a Try.
    pub try_timeout_ms: u64,
    /// SIGKILL a coordinator this often (chaos), this many times in all.
    pub kill_every_ms: Option<u64>,
    pub kills: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_attempts: 8,
            retry_interval_ms: 30,
            max_retry_interval_ms: 300,
            request_timeout_ms: 1_000,
            lease_ms: 1_500,
            prepared_timeout_ms: 30_000,
            try_timeout_ms: 2_000,
            kill_every_ms: None,
            kills: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Participant {
    Inventory,
    Payment,
    Coupon,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrderBranch {
    pub participant: Participant,
    pub payload: Value,
}

/// One global transaction of the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Order {
    pub gid: String,
    /// `tcc` or `saga`.
    pub kind: Kind,
    /// Branch ids are `01`, `02`, ... in this order.
    pub branches: Vec<OrderBranch>,
    /// TCC: the client aborts even if every Try succeeded.
    #[serde(default)]
    pub abort: bool,
    /// TCC: after the transaction ends, the client sends every Try once more (a late
    /// retry), to see it rejected.
    #[serde(default)]
    pub late_try: bool,
    /// If the transaction ends stalled, the operator retries it (`tx retry`).
    #[serde(default)]
    pub retry_if_stalled: bool,
}

/// What a scenario expects beyond the invariants every run is checked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// Final status per gid.
    #[serde(default)]
    pub status: BTreeMap<String, Status>,
    /// Final (available, reserved, sold) per SKU.
    #[serde(default)]
    pub stock: BTreeMap<String, [i64; 3]>,
    /// Final balance per account.
    #[serde(default)]
    pub balances: BTreeMap<String, i64>,
    /// Issued (not revoked) coupons per user.
    #[serde(default)]
    pub coupons: BTreeMap<String, usize>,
    /// Faults fired at least (coordinator side + participant side).
    #[serde(default)]
    pub min_faults: usize,
    #[serde(default)]
    pub min_restarts: u32,
    /// A coordinator's stale write was refused at least once.
    #[serde(default)]
    pub fenced: bool,
    /// Every answer a participant gave to "gid/branch_id/op", in order.
    #[serde(default)]
    pub answers: BTreeMap<String, Vec<u16>>,
    /// Stalled at some point (then retried by the operator).
    #[serde(default)]
    pub stalled: Vec<String>,
    /// Failed calls recorded for the gid, at least.
    #[serde(default)]
    pub min_attempts: BTreeMap<String, i32>,
}

impl Scenario {
    /// Reads a scenario: TOML if the path ends in `.toml`, JSON otherwise.
    pub fn read(path: &Path) -> Result<Scenario, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let scenario: Scenario = if path.extension().is_some_and(|e| e == "toml") {
            toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        } else {
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?
        };
        let plan = serde_json::to_string(&scenario.plan)?;
        FaultPlan::parse(&plan, false).map_err(|e| format!("{}: plan: {e}", path.display()))?;
        Ok(scenario)
    }
}

/// Where to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The `idem` binary to start coordinators with.
    pub idem_bin: PathBuf,
    pub coordinator_db: String,
    pub inventory_db: String,
    pub payment_db: String,
    pub coupon_db: String,
    /// For plan and timeline files.
    pub work_dir: PathBuf,
    /// Print progress (chaos runs).
    pub progress: bool,
}

impl RunConfig {
    /// Everything on SQLite files in `work_dir`.
    pub fn sqlite(idem_bin: PathBuf, work_dir: PathBuf) -> RunConfig {
        let file = |name: &str| format!("sqlite://{}?mode=rwc", work_dir.join(name).display());
        RunConfig {
            idem_bin,
            coordinator_db: file("coordinator.db"),
            inventory_db: file("inventory.db"),
            payment_db: file("payment.db"),
            coupon_db: file("coupon.db"),
            work_dir,
            progress: false,
        }
    }
}

/// What a run did and found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub statuses: BTreeMap<String, Status>,
    /// Gids that were stalled at some point before an operator retry.
    pub stalled_seen: Vec<String>,
    pub attempts: BTreeMap<String, i32>,
    pub stock: BTreeMap<String, [i64; 3]>,
    pub balances: BTreeMap<String, i64>,
    pub coupons: BTreeMap<String, usize>,
    pub timeline: Vec<TimelineEvent>,
    pub deliveries: Vec<Delivery>,
    /// Client-side Try answers per "gid/branch_id".
    pub restarts: u32,
    pub violations: Vec<String>,
    pub wall_ms: u64,
}

impl Report {
    /// Faults fired on both sides.
    pub fn faults(&self) -> usize {
        fault_signature(&self.timeline).len() + self.participant_faults().len()
    }

    pub fn participant_faults(&self) -> Vec<(CallKey, String)> {
        let mut out: Vec<(CallKey, String)> = self
            .deliveries
            .iter()
            .filter_map(|d| d.fault.clone().map(|f| (d.call.clone(), f)))
            .collect();
        out.sort();
        out
    }

    /// Calls made to participants: idem's (from the timeline) and the client's Trys.
    pub fn calls(&self) -> usize {
        let by_idem = self
            .timeline
            .iter()
            .filter(|e| matches!(e, TimelineEvent::Call { .. }))
            .count();
        let tries = self
            .deliveries
            .iter()
            .filter(|d| d.call.op == "try")
            .count();
        by_idem + tries
    }

    /// A summary: how many transactions ended how, faults, restarts, violations, time.
    pub fn summary(&self) -> String {
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for s in self.statuses.values() {
            *by_status.entry(s.as_str()).or_default() += 1;
        }
        let calls = self.calls().max(1);
        format!(
            "transactions: {} ({})\nparticipant calls: {}, faults fired: {} ({:.1} % of calls; {} by idem's transport, {} in front of participants)\ncoordinator restarts after SIGKILL or crash: {}\nstalled, then retried by the operator: {}\nviolations: {}\nwall time: {:.1} s",
            self.statuses.len(),
            by_status
                .iter()
                .map(|(s, n)| format!("{n} {s}"))
                .collect::<Vec<_>>()
                .join(", "),
            calls,
            self.faults(),
            100.0 * self.faults() as f64 / calls as f64,
            fault_signature(&self.timeline).len(),
            self.participant_faults().len(),
            self.restarts,
            self.stalled_seen.len(),
            self.violations.len(),
            self.wall_ms as f64 / 1_000.0
        )
    }

    /// The timeline in a readable form, in time order.
    pub fn describe_timeline(&self) -> Vec<String> {
        let mut events: Vec<&TimelineEvent> = self.timeline.iter().collect();
        events.sort_by_key(|e| e.at());
        let mut lines: Vec<String> = events.iter().map(|e| e.describe()).collect();
        for d in &self.deliveries {
            if let Some(f) = &d.fault {
                lines.push(format!(
                    "{} {}/{} #{} at the participant -> HTTP {}  [fault: {f}]",
                    d.call.gid, d.call.branch_id, d.call.op, d.call.attempt, d.status
                ));
            }
        }
        lines
    }
}

// ---- coordinators ----------------------------------------------------------------------

/// Coordinator child processes, restarted when they die.
struct Coordinators {
    urls: Arc<RwLock<Vec<String>>>,
    restarts: Arc<AtomicU32>,
    stopping: Arc<AtomicBool>,
    pids: Arc<RwLock<Vec<Option<u32>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

struct Launch {
    bin: PathBuf,
    db: String,
    node: String,
    plan: FaultPlan,
    plan_file: PathBuf,
    timeline: PathBuf,
    settings: Settings,
}

impl Launch {
    async fn spawn(&self) -> Result<(tokio::process::Child, String), Error> {
        use tokio::io::AsyncBufReadExt;
        std::fs::write(&self.plan_file, serde_json::to_string_pretty(&self.plan)?)?;
        let s = &self.settings;
        let mut child = tokio::process::Command::new(&self.bin)
            .args([
                "serve",
                "--database-url",
                &self.db,
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--node", &self.node])
            .args(["--lease-ms", &s.lease_ms.to_string()])
            .args(["--recovery-interval-ms", "100"])
            .args(["--retry-interval-ms", &s.retry_interval_ms.to_string()])
            .args([
                "--max-retry-interval-ms",
                &s.max_retry_interval_ms.to_string(),
            ])
            .args(["--max-attempts", &s.max_attempts.to_string()])
            .args(["--request-timeout-ms", &s.request_timeout_ms.to_string()])
            .args(["--prepared-timeout-ms", &s.prepared_timeout_ms.to_string()])
            .args(["--sqlite-full-sync", "false", "--max-connections", "8"])
            .arg("--fault-plan")
            .arg(&self.plan_file)
            .arg("--record")
            .arg(&self.timeline)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .map_err(|_| "idem serve did not start in 30 s")??
            .ok_or("idem serve exited before listening")?;
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .ok_or_else(|| format!("unexpected first line from idem serve: {first}"))?
            .to_owned();
        // Keep reading so the child never writes into a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok((child, url))
    }

    /// The crash rules that already fired for this node leave the plan, so a restarted
    /// coordinator does not crash at the same point again forever.
    fn drop_fired_crashes(&mut self) {
        let fired: Vec<(crate::engine::Point, String)> = Timeline::read(&self.timeline)
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
    async fn start(
        scenario: &Scenario,
        config: &RunConfig,
        timeline: &Path,
    ) -> Result<Coordinators, Error> {
        let n = scenario.coordinators.max(1);
        let urls = Arc::new(RwLock::new(vec![String::new(); n]));
        let pids = Arc::new(RwLock::new(vec![None; n]));
        let restarts = Arc::new(AtomicU32::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for i in 0..n {
            let mut launch = Launch {
                bin: config.idem_bin.clone(),
                db: config.coordinator_db.clone(),
                node: format!("c{i}"),
                plan: scenario.plan.clone(),
                plan_file: config.work_dir.join(format!("plan-c{i}.json")),
                timeline: timeline.to_owned(),
                settings: scenario.settings.clone(),
            };
            let (mut child, url) = launch.spawn().await?;
            urls.write().expect("poisoned")[i] = url;
            pids.write().expect("poisoned")[i] = child.id();
            let (urls, pids, restarts, stopping) = (
                Arc::clone(&urls),
                Arc::clone(&pids),
                Arc::clone(&restarts),
                Arc::clone(&stopping),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let _ = child.wait().await;
                    if stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    restarts.fetch_add(1, Ordering::SeqCst);
                    launch.drop_fired_crashes();
                    match launch.spawn().await {
                        Ok((c, url)) => {
                            pids.write().expect("poisoned")[i] = c.id();
                            urls.write().expect("poisoned")[i] = url;
                            child = c;
                        }
                        Err(e) => {
                            eprintln!("cannot restart coordinator c{i}: {e}");
                            return;
                        }
                    }
                }
            }));
        }
        Ok(Coordinators {
            urls,
            restarts,
            stopping,
            pids,
            tasks,
        })
    }

    fn url(&self, i: usize) -> String {
        let urls = self.urls.read().expect("poisoned");
        urls[i % urls.len()].clone()
    }

    fn count(&self) -> usize {
        self.urls.read().expect("poisoned").len()
    }

    /// SIGKILL coordinator `i` (the supervisor restarts it).
    fn kill(&self, i: usize) {
        if let Some(pid) = self.pids.read().expect("poisoned")[i] {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }

    async fn stop(self) -> u32 {
        self.stopping.store(true, Ordering::SeqCst);
        for i in 0..self.count() {
            self.kill(i);
        }
        for t in self.tasks {
            let _ = t.await;
        }
        self.restarts.load(Ordering::SeqCst)
    }
}

// ---- the client ------------------------------------------------------------------------

struct Client {
    http: reqwest::Client,
    coordinators: Arc<Coordinators>,
    urls: BTreeMap<Participant, String>,
    settings: Settings,
}

/// How long the client keeps retrying one request while coordinators restart.
const REQUEST_PATIENCE: Duration = Duration::from_secs(90);

impl Client {
    /// Sends a request to coordinator `via`, retrying while it is down or restarting. A
    /// request whose coordinator died under it is simply repeated: the gid makes it safe.
    async fn api(
        &self,
        via: usize,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), Error> {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        let mut coordinator = via;
        loop {
            let url = format!("{}{path}", self.coordinators.url(coordinator));
            let request = match &body {
                Some(b) => self.http.post(&url).json(b),
                None => self.http.get(&url),
            };
            match request.timeout(Duration::from_secs(30)).send().await {
                Ok(r) if r.status().as_u16() != 503 && r.status().as_u16() < 500 => {
                    let code = r.status().as_u16();
                    return Ok((code, r.json().await.unwrap_or(Value::Null)));
                }
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "coordinators did not answer {path} for {REQUEST_PATIENCE:?}"
                    )
                    .into());
                }
                _ => {
                    // Down or restarting: try again, on another coordinator if there is one.
                    coordinator += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn call_try(&self, order: &Order, index: usize) -> u16 {
        let branch = &order.branches[index];
        let Ok(mut url) = reqwest::Url::parse(&self.urls[&branch.participant]) else {
            return 0;
        };
        url.query_pairs_mut()
            .append_pair("gid", &order.gid)
            .append_pair("trans_type", "tcc")
            .append_pair("branch_id", &branch_id(index))
            .append_pair("op", "try");
        let result = self
            .http
            .post(url)
            .json(&branch.payload)
            .timeout(Duration::from_millis(self.settings.try_timeout_ms))
            .send()
            .await;
        match result {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        }
    }

    async fn wait_settled(&self, via: usize, gid: &str) -> Result<Value, Error> {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        loop {
            let (code, tx) = self
                .api(via, &format!("/api/v1/transactions/{gid}"), None)
                .await?;
            let status = tx["status"].as_str().unwrap_or("");
            if code == 200 && matches!(status, "succeeded" | "failed" | "stalled") {
                return Ok(tx);
            }
            if Instant::now() > deadline {
                return Err(format!("{gid} did not settle: {tx}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs one order to its end; returns whether it was stalled before a retry.
    async fn run(&self, order: &Order, via: usize) -> Result<bool, Error> {
        let gid = &order.gid;
        // TCC: how many branches the client got to (registered and tried).
        let mut tried = 0;
        let tx = match order.kind {
            Kind::Saga => {
                let steps: Vec<Value> = order
                    .branches
                    .iter()
                    .map(|b| {
                        let url = &self.urls[&b.participant];
                        json!({"action": url, "compensate": url, "payload": b.payload})
                    })
                    .collect();
                let body = json!({"gid": gid, "kind": "saga", "steps": steps});
                let (code, answer) = self.api(via, "/api/v1/transactions", Some(body)).await?;
                if code >= 400 {
                    return Err(format!("{gid}: create failed: {answer}").into());
                }
                self.wait_settled(via, gid).await?
            }
            Kind::Tcc | Kind::Msg => {
                let (code, answer) = self
                    .api(
                        via,
                        "/api/v1/transactions",
                        Some(json!({"gid": gid, "kind": "tcc"})),
                    )
                    .await?;
                if code >= 400 {
                    return Err(format!("{gid}: create failed: {answer}").into());
                }
                let mut refused = None;
                for (i, b) in order.branches.iter().enumerate() {
                    tried = i + 1;
                    let url = &self.urls[&b.participant];
                    let body = json!({"branch_id": branch_id(i), "confirm": url, "cancel": url, "payload": b.payload});
                    let (code, answer) = self
                        .api(
                            via,
                            &format!("/api/v1/transactions/{gid}/branches"),
                            Some(body),
                        )
                        .await?;
                    if code != 200 {
                        refused = Some(format!("register {}: {answer}", branch_id(i)));
                        break;
                    }
                    let status = self.call_try(order, i).await;
                    if !(200..300).contains(&status) {
                        refused = Some(format!("Try of {} answered {status}", branch_id(i)));
                        break;
                    }
                }
                let (path, body) = match (&refused, order.abort) {
                    (None, false) => (format!("/api/v1/transactions/{gid}/submit"), json!({})),
                    (why, _) => (
                        format!("/api/v1/transactions/{gid}/abort"),
                        json!({"reason": why.clone().unwrap_or_else(|| "the client aborts".into())}),
                    ),
                };
                let (code, answer) = self.api(via, &path, Some(body)).await?;
                if code >= 400 && code != 409 {
                    return Err(format!("{gid}: {path}: {answer}").into());
                }
                self.wait_settled(via, gid).await?
            }
        };
        let mut stalled = false;
        if tx["status"] == "stalled" && order.retry_if_stalled {
            stalled = true;
            self.api(
                via,
                &format!("/api/v1/transactions/{gid}/retry"),
                Some(json!({})),
            )
            .await?;
            self.wait_settled(via, gid).await?;
        }
        if order.late_try && order.kind == Kind::Tcc {
            for i in 0..tried {
                self.call_try(order, i).await;
            }
        }
        Ok(stalled)
    }
}

pub fn branch_id(index: usize) -> String {
    crate::core::step_branch_id(index)
}

// ---- running ---------------------------------------------------------------------------

/// The participant services of a run.
pub struct Participants {
    pub inventory: sqlx::AnyPool,
    pub payment: sqlx::AnyPool,
    pub coupon: sqlx::AnyPool,
    services: Vec<idem_demo::Service>,
    pub faults: Arc<ParticipantFaults>,
    pub urls: BTreeMap<Participant, String>,
}

impl Participants {
    pub async fn start(scenario: &Scenario, config: &RunConfig) -> Result<Participants, Error> {
        let faults = ParticipantFaults::new(Arc::new(scenario.plan.clone()));
        let inventory_db = inventory::open(&config.inventory_db).await?;
        let payment_db = payment::open(&config.payment_db).await?;
        let coupon_db = coupon::open(&config.coupon_db).await?;
        for (sku, n) in &scenario.stock {
            inventory::seed(&inventory_db, sku, *n).await?;
        }
        for (account, n) in &scenario.accounts {
            payment::seed(&payment_db, account, *n).await?;
        }
        for (code, n) in &scenario.campaigns {
            coupon::seed(&coupon_db, code, *n).await?;
        }
        let layer = |router: axum::Router| {
            router.layer(axum::middleware::from_fn_with_state(
                Arc::clone(&faults),
                participant_faults,
            ))
        };
        let inv = idem_demo::spawn(
            layer(inventory::router(inventory_db.clone())),
            "127.0.0.1:0",
        )
        .await?;
        let pay =
            idem_demo::spawn(layer(payment::router(payment_db.clone())), "127.0.0.1:0").await?;
        let cou = idem_demo::spawn(layer(coupon::router(coupon_db.clone())), "127.0.0.1:0").await?;
        let urls = BTreeMap::from([
            (Participant::Inventory, inv.url(inventory::RESERVE_PATH)),
            (Participant::Payment, pay.url(payment::FREEZE_PATH)),
            (Participant::Coupon, cou.url(coupon::ISSUE_PATH)),
        ]);
        Ok(Participants {
            inventory: inventory_db,
            payment: payment_db,
            coupon: coupon_db,
            services: vec![inv, pay, cou],
            faults,
            urls,
        })
    }

    pub async fn stop(self) {
        for s in self.services {
            let _ = s.stop().await;
        }
        self.inventory.close().await;
        self.payment.close().await;
        self.coupon.close().await;
    }
}

/// Runs a scenario and checks it. The report lists every violation found.
pub async fn run(scenario: &Scenario, config: &RunConfig) -> Result<Report, Error> {
    crate::transport::install_crypto_provider();
    std::fs::create_dir_all(&config.work_dir)?;
    let started = Instant::now();
    let timeline_file = config.work_dir.join("timeline.jsonl");
    let _ = std::fs::remove_file(&timeline_file);
    let participants = Participants::start(scenario, config).await?;
    let coordinators = Arc::new(Coordinators::start(scenario, config, &timeline_file).await?);
    let client = Arc::new(Client {
        http: reqwest::Client::new(),
        coordinators: Arc::clone(&coordinators),
        urls: participants.urls.clone(),
        settings: scenario.settings.clone(),
    });

    let killer = scenario.settings.kill_every_ms.map(|every| {
        let coordinators = Arc::clone(&coordinators);
        let kills = scenario.settings.kills;
        tokio::spawn(async move {
            for k in 0..kills {
                tokio::time::sleep(Duration::from_millis(every)).await;
                coordinators.kill(k as usize % coordinators.count());
            }
        })
    });

    let progress = config.progress.then(|| {
        let bar = indicatif::ProgressBar::new(scenario.orders.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} orders {msg}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar
    });
    let semaphore = Arc::new(tokio::sync::Semaphore::new(scenario.concurrency.max(1)));
    let mut tasks = Vec::new();
    for (i, order) in scenario.orders.iter().cloned().enumerate() {
        let permit = Arc::clone(&semaphore).acquire_owned().await?;
        let client = Arc::clone(&client);
        let bar = progress.clone();
        tasks.push(tokio::spawn(async move {
            let result = client.run(&order, i).await;
            drop(permit);
            if let Some(bar) = bar {
                bar.inc(1);
            }
            (order.gid, result)
        }));
    }
    let mut report = Report {
        name: scenario.name.clone(),
        ..Report::default()
    };
    for t in tasks {
        let (gid, result) = t.await?;
        match result {
            Ok(true) => report.stalled_seen.push(gid),
            Ok(false) => {}
            Err(e) => report
                .violations
                .push(format!("{gid}: the client could not finish: {e}")),
        }
    }
    if let Some(k) = killer {
        let _ = k.await;
    }
    if let Some(bar) = &progress {
        bar.finish_with_message("done");
    }
    // Final states, through any coordinator.
    for order in &scenario.orders {
        match client.wait_settled(0, &order.gid).await {
            Ok(tx) => {
                if let Ok(status) = tx["status"].as_str().unwrap_or("").parse() {
                    report.statuses.insert(order.gid.clone(), status);
                }
                report.attempts.insert(
                    order.gid.clone(),
                    tx["attempts"].as_i64().unwrap_or(0) as i32,
                );
            }
            Err(e) => report.violations.push(e.to_string()),
        }
    }
    drop(client);
    if scenario.expect.fenced {
        // The stale owner's refused write can come after the client saw the outcome (the
        // new owner finished first); give it the time to be recorded.
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline
            && !Timeline::read(&timeline_file)
                .unwrap_or_default()
                .iter()
                .any(|e| matches!(e, TimelineEvent::Fenced { .. }))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let coordinators = Arc::into_inner(coordinators).expect("the client and killer are done");
    report.restarts = coordinators.stop().await;
    report.timeline = Timeline::read(&timeline_file).unwrap_or_default();
    report.deliveries = participants.faults.deliveries();
    checks::collect(scenario, &participants, &mut report).await?;
    checks::check(scenario, &mut report);
    participants.stop().await;
    report.wall_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// A recorded run: the scenario and what it produced, for `idem replay` to reproduce.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recording {
    pub scenario: Scenario,
    pub statuses: BTreeMap<String, Status>,
    pub faults: Vec<(CallKey, String)>,
    pub participant_faults: Vec<(CallKey, String)>,
    pub stock: BTreeMap<String, [i64; 3]>,
    pub balances: BTreeMap<String, i64>,
    pub coupons: BTreeMap<String, usize>,
    pub timeline: Vec<TimelineEvent>,
}

impl Recording {
    pub fn of(scenario: &Scenario, report: &Report) -> Recording {
        Recording {
            scenario: scenario.clone(),
            statuses: report.statuses.clone(),
            faults: fault_signature(&report.timeline),
            participant_faults: report.participant_faults(),
            stock: report.stock.clone(),
            balances: report.balances.clone(),
            coupons: report.coupons.clone(),
            timeline: report.timeline.clone(),
        }
    }

    /// What differs between a replay and this recording.
    pub fn differences(&self, replay: &Recording) -> Vec<String> {
        let mut out = Vec::new();
        if self.faults != replay.faults {
            out.push(format!(
                "coordinator faults differ: recorded {:?}, replayed {:?}",
                self.faults, replay.faults
            ));
        }
        if self.participant_faults != replay.participant_faults {
            out.push(format!(
                "participant faults differ: recorded {:?}, replayed {:?}",
                self.participant_faults, replay.participant_faults
            ));
        }
        if self.statuses != replay.statuses {
            out.push(format!(
                "final statuses differ: recorded {:?}, replayed {:?}",
                self.statuses, replay.statuses
            ));
        }
        if (&self.stock, &self.balances, &self.coupons)
            != (&replay.stock, &replay.balances, &replay.coupons)
        {
            out.push("final stock, balances or coupons differ".into());
        }
        out
    }
}

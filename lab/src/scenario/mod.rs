//! Scenarios: a workload of orders plus a fault plan, run against the example participants
//! with real `idem serve` processes, and checked afterwards.
//!
//! The participants (inventory, payment, coupon) run in this process behind the
//! participant-side fault layer; the coordinators run as child processes with the
//! coordinator-side rules and crash points of the plan, and a supervisor restarts any that
//! crash (or are killed), dropping the crash rules that already fired. The runner plays the
//! client: it creates transactions, calls TCC Trys itself, submits or aborts, and retries a
//! request whose coordinator died under it — with the same gid, which is what makes that safe.
//! It also plays the operator: it heals long outages once the orders they hit have settled,
//! and retries what stalled. And it can restart the database server mid-run (`restarts`),
//! or freeze, slow down or cut the coordinators' links to it (`db_link`), while it reads
//! the coordinators' rows on the side (`sampler`) to catch any that goes back.
//!
//! Beside those: `client` (the application and the operator), `coordinators` (the children
//! and their supervisor), `participants`, `outage` (long participant outages), `checks`
//! (the invariants; `calls` and `rows` those over the calls and the rows recorded),
//! `report`, and `chaos` with `chaos_links` (the chaos run and its database-link faults).
//!
//! Used by `lab/tests/it/scenarios.rs` (the files in `lab/tests/scenarios/`), `idem-lab
//! replay` and `idem-lab chaos`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::faults::{CallKey, FaultPlan, Timeline, TimelineEvent, fault_signature};
use idem::core::{Kind, Status};

mod calls;
mod chaos;
mod chaos_links;
mod checks;
mod client;
mod coordinators;
mod db_link;
mod outage;
mod participants;
mod report;
mod restarts;
mod rows;
mod sampler;

pub use calls::{CoordinatorProcess, HistoryEntry};
pub use chaos::{ChaosConfig, planned_to_fail, scenario as chaos_scenario};
pub use chaos_links::DbLinkChaos;
pub use checks::check;
pub use db_link::DbLinkApplied;
pub use outage::{Outage, OutageHit};
pub use participants::Participants;
pub use report::Report;
pub use restarts::DbRestart;
pub use rows::{BranchRow, GlobalRow, RowWatch, Sample, StepBack};

use client::Client;
use coordinators::Coordinators;
use db_link::DbLinks;
use outage::Outages;
use restarts::Restarter;
use sampler::Sampler;

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
    /// Participants down for some orders until the runner heals them (see [`Outage`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outages: Vec<Outage>,
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
    /// Restarts of the database server, spread over the orders (the run's
    /// `RunConfig::db_restart_command` does them).
    #[serde(skip_serializing_if = "is_zero")]
    pub db_restarts: u32,
    /// The last coordinator runs with its wall clock shifted by this many ms
    /// (`idem serve --test-clock-offset-ms`): leases and timeouts are compared on the
    /// database's clock, so the skew must change nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skewed_clock_ms: Option<i64>,
    /// The coordinators' bound on one database call (`idem serve
    /// --database-call-timeout-ms`); idem's default when unset. Database-link freezes are
    /// measured against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database_call_timeout_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
            db_restarts: 0,
            skewed_clock_ms: None,
            database_call_timeout_ms: None,
        }
    }
}

pub use crate::participants::Participant;

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
    /// This transaction's retry budget (the create request's `options`), instead of the
    /// coordinators' defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<RetryOptions>,
}

/// Per-transaction retry settings, as the create request's `options` takes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retry_interval_ms: Option<u64>,
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
    /// Every saga step's action has at least this many failed calls in its transaction's
    /// history (e.g. 1 when every step answers 500 once, then succeeds: the 500 must not be
    /// lost from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_failed_calls_per_step: Option<usize>,
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
    /// A shell command that restarts the database server the databases above are on, for
    /// scenarios with `db_restarts`.
    pub db_restart_command: Option<String>,
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
            db_restart_command: None,
        }
    }
}

pub fn branch_id(index: usize) -> String {
    idem::core::step_branch_id(index)
}

// ---- running ---------------------------------------------------------------------------

/// Runs a scenario and checks it. The report lists every violation found.
pub async fn run(scenario: &Scenario, config: &RunConfig) -> Result<Report, Error> {
    idem::transport::install_crypto_provider();
    std::fs::create_dir_all(&config.work_dir)?;
    let started = Instant::now();
    let timeline_file = config.work_dir.join("timeline.jsonl");
    let _ = std::fs::remove_file(&timeline_file);
    let restarter = match (scenario.settings.db_restarts, &config.db_restart_command) {
        (0, _) => None,
        (_, Some(command)) => Some(Restarter::start(
            command.clone(),
            config.coordinator_db.clone(),
            config.work_dir.join("db-restart.log"),
        )),
        (n, None) => {
            return Err(format!(
                "the scenario restarts the database {n} times, but the run has no restart command"
            )
            .into());
        }
    };
    let restart_at = restarts::points(scenario.orders.len(), scenario.settings.db_restarts);
    let outages = Outages::new(scenario);
    let links = DbLinks::start(scenario, &config.coordinator_db).await?;
    let mut participants = Participants::start(scenario, config, &outages).await?;
    let coordinator_urls: Vec<String> = (0..scenario.coordinators.max(1))
        .map(|i| {
            links
                .as_ref()
                .map_or(config.coordinator_db.clone(), |l| l.url(i))
        })
        .collect();
    let coordinators =
        Arc::new(Coordinators::start(scenario, config, &timeline_file, &coordinator_urls).await?);
    // Started once the coordinators have made their tables.
    let sampler = Sampler::start(&config.coordinator_db).await?;
    let client = Arc::new(Client::new(
        Arc::clone(&coordinators),
        participants.urls().clone(),
        scenario.settings.clone(),
    ));

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
        if let Some(restarter) = &restarter {
            for _ in restart_at.iter().filter(|&&at| at == i) {
                restarter.trigger(i);
            }
        }
        if let Some(links) = &links {
            links.order_started(i);
        }
        let client = Arc::clone(&client);
        let outages = Arc::clone(&outages);
        let bar = progress.clone();
        tasks.push(tokio::spawn(async move {
            let settled = client.run(&order, i).await;
            // A stalled order waiting for its outage to heal must not hold a slot: the
            // outage heals only once every order it hits has been started and settled.
            drop(permit);
            outages.settled(&order.gid);
            outages.healed(&order.gid).await;
            let result = match settled {
                Ok(tx) => client.operate(&order, i, tx).await,
                Err(e) => Err(e),
            };
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
            Ok(0) => {}
            Ok(retries) => {
                report.stalled_seen.push(gid.clone());
                report.operator_retries.insert(gid, retries);
            }
            Err(e) => report
                .violations
                .push(format!("{gid}: the client could not finish: {e}")),
        }
    }
    if let Some(k) = killer {
        let _ = k.await;
    }
    if let Some(restarter) = restarter {
        report.db_restarts = restarter.finish().await;
    }
    if let Some(bar) = &progress {
        bar.finish_with_message("done");
    }
    // Final states, through any coordinator.
    for order in &scenario.orders {
        match client.wait_settled(0, &order.gid).await {
            Ok(tx) => {
                report.statuses.insert(order.gid.clone(), tx.status);
                report.attempts.insert(order.gid.clone(), tx.attempts);
                report.record_history(&tx);
            }
            Err(e) => report.violations.push(e.to_string()),
        }
    }
    report.operator_retry_at = client.operator_retries();
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
    (report.restarts, report.processes) = coordinators.stop().await;
    if let Some(links) = &links {
        links.finish(&mut report).await;
    }
    // The final rows, once no coordinator is left to write them.
    let (rows, unread) = sampler.finish().await?;
    report.row_samples = rows.samples;
    report.unread_samples = unread;
    report.step_backs = rows.step_backs.clone();
    report.violations.extend(rows::final_state(&rows.last));
    report.timeline = Timeline::read(&timeline_file).unwrap_or_default();
    report.deliveries = participants.faults.deliveries();
    outages.record(&mut report);
    if !report.db_restarts.is_empty() {
        participants.reconnect().await?;
    }
    checks::collect(scenario, &participants, &mut report).await?;
    checks::check(scenario, &mut report);
    participants.stop().await;
    report.wall_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// A recorded run: the scenario and what it produced, for `idem-lab replay` to reproduce.
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

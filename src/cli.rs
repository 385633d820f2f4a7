//! The `idem` command line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::native::TxView;
use crate::core::{Kind, Status};
use crate::engine::{Engine, EngineConfig, SystemClock};
use crate::faults::FaultPlan;
use crate::server::{self, ServerConfig};
use crate::store::{ConnectOptions, ListFilter};
use crate::transport::HttpTransport;

/// The SQLite file used when no database is named: in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db?mode=rwc";

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "A TCC/Saga branch-transaction coordinator"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// sqlite:PATH, postgres://... or mysql://... (MariaDB too).
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the coordinator (migrates the database first).
    Serve(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Inspect and operate on transactions.
    #[command(subcommand)]
    Tx(TxCommand),
    /// Run a failure scenario file (or re-run a recorded run and compare) against the
    /// example participants on embedded SQLite, and print its timeline.
    Replay(ReplayArgs),
    /// A chaos run: many orders, random faults, coordinators killed with SIGKILL; checks
    /// the invariants at the end.
    Chaos(ChaosArgs),
    /// Load test: C clients run global transactions end to end against an `idem serve`
    /// process and the example participants; prints throughput, latency, SQL per
    /// transaction and the coordinator's peak RSS.
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value = "tcc")]
    pub workload: crate::bench::Workload,
    /// sqlite, postgres or mysql (coordinator and participants on the same server).
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 3)]
    pub warmup: u64,
    /// Transactions in the SQL-counting pass (0 skips it).
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// An extra `idem serve` argument for the coordinator (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Inflight and recovery workloads: how many transactions.
    #[arg(long, default_value_t = 10_000)]
    pub inflight: usize,
    /// Inflight workload: how long the participant takes per call, in ms.
    #[arg(long, default_value_t = 2_000)]
    pub participant_delay_ms: u64,
    /// Then run the limit script (bench/limit/, PostgreSQL with pgbench) with the same
    /// clients and duration, and print idem's share of it. Run from the checkout root.
    #[arg(long)]
    pub limit: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A scenario (JSON or TOML, see tests/scenarios/) or a recording made with --record.
    pub file: std::path::PathBuf,
    /// Write the run (scenario, faults, timeline, final state) here, for a later replay.
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[arg(long, default_value_t = 1_000)]
    pub orders: usize,
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Share of participant calls that meet a fault (some calls meet two, and delivered
    /// duplicates add calls, so the measured share comes out a little lower).
    #[arg(long, default_value_t = 0.3)]
    pub fault_rate: f64,
    /// Coordinator processes sharing the database.
    #[arg(long, default_value_t = 2)]
    pub coordinators: usize,
    /// SIGKILLs of a coordinator during the run.
    #[arg(long, default_value_t = 3)]
    pub kills: u32,
    #[arg(long, default_value_t = 5_000)]
    pub kill_every_ms: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Long outages: a participant refuses every Confirm, Cancel and compensation of a run
    /// of orders (which have a small retry budget) until all of them have stalled or
    /// ended; then it comes back and the operator retries what stalled.
    #[arg(long, default_value_t = 2)]
    pub outages: usize,
    /// Orders each outage hits (0: one in fifty, at least ten).
    #[arg(long, default_value_t = 0)]
    pub outage_orders: usize,
    /// Where the coordinators and participants keep their data: sqlite (files in a
    /// temporary directory), postgres or mysql (fresh databases on the server named by
    /// IDEM_TEST_POSTGRES_URL / IDEM_TEST_MYSQL_URL, default the local one; dropped after).
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Address and port of the HTTP API.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8686")]
    pub listen: SocketAddr,
    /// Name of this coordinator in owner tokens and logs (default: host name and port).
    #[arg(long, env = "IDEM_NODE")]
    pub node: Option<String>,
    /// Lease of a transaction being driven, in ms: how soon another coordinator takes
    /// over after this one dies.
    #[arg(long, default_value_t = 15_000)]
    pub lease_ms: i64,
    /// How often to look for transactions nobody drives, in ms.
    #[arg(long, default_value_t = 1_000)]
    pub recovery_interval_ms: u64,
    /// Default timeout of one call to a participant, in ms.
    #[arg(long, default_value_t = 5_000)]
    pub request_timeout_ms: u64,
    /// Default first retry delay, in ms (doubled per attempt).
    #[arg(long, default_value_t = 1_000)]
    pub retry_interval_ms: u64,
    /// Default cap on the retry delay, in ms.
    #[arg(long, default_value_t = 60_000)]
    pub max_retry_interval_ms: u64,
    /// Default attempts per branch operation before it stalls (or a saga compensates).
    #[arg(long, default_value_t = 12)]
    pub max_attempts: u32,
    /// Default longest time one branch operation may keep answering "in progress" (425
    /// or DTM's ONGOING), in ms; past it the call counts as failed for good (a saga
    /// compensates, a Confirm or Cancel stalls).
    #[arg(long, default_value_t = crate::core::DEFAULT_MAX_IN_PROGRESS_MS)]
    pub max_in_progress_ms: u64,
    /// Default global timeout of a prepared TCC or msg transaction, in ms.
    #[arg(long, default_value_t = 60_000)]
    pub prepared_timeout_ms: u64,
    /// Database connections.
    #[arg(long, default_value_t = 16)]
    pub max_connections: u32,
    /// At start, how long to wait for a database that does not answer yet (retrying with
    /// backoff, logging why), in ms; then idem exits non-zero. 0 tries once.
    #[arg(long, default_value_t = 60_000)]
    pub database_wait_ms: u64,
    /// Opening one database connection, in ms (PostgreSQL, MySQL).
    #[arg(long, default_value_t = 5_000)]
    pub database_connect_timeout_ms: u64,
    /// Waiting for a pooled database connection, opening included, in ms.
    #[arg(long, default_value_t = 5_000)]
    pub database_acquire_timeout_ms: u64,
    /// Longest one database call may take, in ms (statements on an open connection
    /// included); past it the call fails as the database being unavailable, so a network
    /// partition fails requests in bounded time.
    #[arg(long, default_value_t = 10_000)]
    pub database_call_timeout_ms: u64,
    /// SQLite: fsync at every commit (off: a machine crash may lose the last commits;
    /// a crash of idem alone loses nothing).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub sqlite_full_sync: bool,
    /// How long a wait_result request waits at most, in ms.
    #[arg(long, default_value_t = 30_000)]
    pub wait_timeout_ms: u64,
    /// A fault plan (JSON, or TOML by extension) to inject into participant calls and
    /// crash points. For testing and failure replay only.
    #[arg(long)]
    pub fault_plan: Option<std::path::PathBuf>,
    /// Append the timeline of calls, faults and status changes to this file (JSON lines).
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TxCommand {
    /// List transactions, newest first.
    List {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        status: Option<Status>,
        #[arg(long)]
        kind: Option<Kind>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one transaction with its branches and retry history, as JSON.
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
    },
    /// Resume a stalled transaction (or make a backing-off one due now). A running
    /// `idem serve` on the same database picks it up.
    Retry {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
    },
    /// Mark a transaction failed and call nothing more for it.
    ForceStop {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
        #[arg(long, default_value = "force-stopped by an operator")]
        reason: String,
    },
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Migrate(db) => {
            server::open_store(&db.database_url, &ConnectOptions::default()).await?;
            println!("migrated {}", redact(&db.database_url));
            Ok(())
        }
        Command::Tx(cmd) => tx(cmd).await,
        Command::Replay(args) => replay(args).await,
        Command::Chaos(args) => chaos(args).await,
        Command::Bench(args) => bench(args).await,
    }
}

async fn serve(args: ServeArgs) -> Result<(), BoxError> {
    let mut config = ServerConfig::new(args.db.database_url.clone(), args.listen);
    config.engine.node = args.node.unwrap_or_else(|| default_node(args.listen));
    config.engine.lease_ms = args.lease_ms.max(1_000);
    config.engine.recovery_interval = Duration::from_millis(args.recovery_interval_ms.max(10));
    config.engine.defaults.request_timeout_ms = args.request_timeout_ms;
    config.engine.defaults.retry_interval_ms = args.retry_interval_ms;
    config.engine.defaults.max_retry_interval_ms = args.max_retry_interval_ms;
    config.engine.defaults.max_attempts = args.max_attempts.max(1);
    config.engine.defaults.max_in_progress_ms = args.max_in_progress_ms.max(1);
    config.engine.prepared_timeout_ms = args.prepared_timeout_ms;
    config.connect.max_connections = args.max_connections.max(1);
    config.connect.sqlite_full_sync = args.sqlite_full_sync;
    config.database_wait = Duration::from_millis(args.database_wait_ms);
    config.connect.connect_timeout = Duration::from_millis(args.database_connect_timeout_ms.max(1));
    config.connect.acquire_timeout = Duration::from_millis(args.database_acquire_timeout_ms.max(1));
    config.connect.call_timeout = Duration::from_millis(args.database_call_timeout_ms.max(1));
    config.wait_timeout = Duration::from_millis(args.wait_timeout_ms);
    if let Some(path) = &args.fault_plan {
        config.fault_plan = Some(Arc::new(read_plan(path)?));
    }
    config.record = args.record.clone();
    let running = server::start(config).await?;
    println!(
        "idem listening on {} ({})",
        running.url(),
        redact(&args.db.database_url)
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    running.stop().await?;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("can listen for SIGTERM");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

async fn bench(args: BenchArgs) -> Result<(), BoxError> {
    let config = crate::bench::BenchConfig {
        workload: args.workload,
        backend: args.backend,
        clients: args.clients.max(1),
        duration: Duration::from_secs(args.duration.max(1)),
        warmup: Duration::from_secs(args.warmup),
        count: args.count,
        idem_bin: std::env::current_exe()?,
        serve_args: args.serve_args,
        progress: true,
        inflight: args.inflight,
        limit_root: args.limit.then(std::env::current_dir).transpose()?,
        participant_delay: Duration::from_millis(args.participant_delay_ms),
    };
    let result = crate::bench::run(&config).await?;
    print!("{}", result.table());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

async fn replay(args: ReplayArgs) -> Result<(), BoxError> {
    use crate::scenario::{self, Recording, RunConfig, Scenario};
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let recording: Option<Recording> = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .filter(|v| v.get("timeline").is_some() && v.get("scenario").is_some())
        .map(serde_json::from_value)
        .transpose()?;
    let scenario = match &recording {
        Some(r) => r.scenario.clone(),
        None => Scenario::read(&args.file)?,
    };
    let work_dir = std::env::temp_dir().join(format!("idem-replay-{}", std::process::id()));
    let config = RunConfig::sqlite(std::env::current_exe()?, work_dir.clone());
    println!("scenario {}: {}", scenario.name, scenario.description);
    let report = scenario::run(&scenario, &config).await?;
    let _ = std::fs::remove_dir_all(&work_dir);
    println!("\ntimeline:");
    for line in report.describe_timeline() {
        println!("  {line}");
    }
    println!("\nfinal state:");
    for (gid, status) in &report.statuses {
        println!("  {gid}: {status}");
    }
    for (sku, [available, reserved, sold]) in &report.stock {
        println!("  stock {sku}: available {available}, reserved {reserved}, sold {sold}");
    }
    for (account, balance) in &report.balances {
        println!("  balance {account}: {balance}");
    }
    for (user, n) in &report.coupons {
        println!("  coupons of {user}: {n}");
    }
    println!("\n{}", report.summary());
    let replayed = Recording::of(&scenario, &report);
    let mut failed = !report.violations.is_empty();
    for v in &report.violations {
        println!("VIOLATION: {v}");
    }
    if let Some(recorded) = &recording {
        let differences = recorded.differences(&replayed);
        if differences.is_empty() {
            println!("the replay reproduces the recording: same faults, same final state");
        }
        for d in &differences {
            println!("DIFFERENCE: {d}");
        }
        failed |= !differences.is_empty();
    }
    if let Some(path) = &args.record {
        std::fs::write(path, serde_json::to_string_pretty(&replayed)?)?;
        println!("recorded to {}", path.display());
    }
    if failed {
        return Err("the run did not hold".into());
    }
    Ok(())
}

async fn chaos(args: ChaosArgs) -> Result<(), BoxError> {
    use crate::scenario::{self, ChaosConfig, RunConfig};
    use idem_participant::testing::{Backend, TestDatabase};
    let config = ChaosConfig {
        orders: args.orders,
        concurrency: args.concurrency,
        fault_rate: args.fault_rate,
        coordinators: args.coordinators,
        kills: args.kills,
        kill_every_ms: args.kill_every_ms,
        seed: args.seed,
        outages: args.outages,
        outage_orders: args.outage_orders,
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-{}", std::process::id()));
    let mut run = RunConfig::sqlite(std::env::current_exe()?, work_dir.clone());
    run.progress = true;
    let backend = match args.backend.as_str() {
        "sqlite" => None,
        "postgres" => Some(Backend::Postgres),
        "mysql" => Some(Backend::Mysql),
        other => return Err(format!("unknown backend {other}: sqlite, postgres or mysql").into()),
    };
    let mut databases = Vec::new();
    if let Some(backend) = backend {
        for _ in 0..4 {
            let db = TestDatabase::create(backend, "chaos")
                .await
                .ok_or("IDEM_TEST_SKIP names this backend")?;
            databases.push(db);
        }
        run.coordinator_db = databases[0].url.clone();
        run.inventory_db = databases[1].url.clone();
        run.payment_db = databases[2].url.clone();
        run.coupon_db = databases[3].url.clone();
    }
    println!(
        "chaos: {} orders, {} at a time, faults on ~{:.0} % of calls, {} coordinators on {}, {} SIGKILLs every {} ms",
        config.orders,
        config.concurrency,
        config.fault_rate * 100.0,
        config.coordinators,
        args.backend,
        config.kills,
        config.kill_every_ms
    );
    let planned = scenario
        .orders
        .iter()
        .filter(|o| scenario::planned_to_fail(&scenario, o))
        .count();
    println!(
        "planned: {planned} orders refused by design ({:.1} %: over-stock, unknown campaign, client abort); {} long outages of {} orders each",
        100.0 * planned as f64 / config.orders.max(1) as f64,
        scenario.outages.len(),
        config.orders_per_outage()
    );
    let report = scenario::run(&scenario, &run).await;
    for db in databases {
        db.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(&work_dir);
    let report = report?;
    println!("{}", report.summary());
    for v in report.violations.iter().take(50) {
        println!("VIOLATION: {v}");
    }
    if report.violations.is_empty() {
        println!(
            "every transaction is terminal; stock conserved and never negative; balances never negative; succeeded orders applied once; failed orders undone; no coupon issued twice; no call past its attempt cap; every order a long outage met stalled, then ended after the operator's retry"
        );
        Ok(())
    } else {
        Err(format!("{} violations", report.violations.len()).into())
    }
}

/// Reads a fault plan file: TOML if it ends in `.toml`, JSON otherwise.
pub fn read_plan(path: &std::path::Path) -> Result<FaultPlan, BoxError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    FaultPlan::parse(&text, toml)
        .map_err(|e| format!("invalid fault plan {}: {e}", path.display()).into())
}

fn default_node(listen: SocketAddr) -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "idem".into());
    format!("{host}-{}", listen.port())
}

/// Hides a password in a database URL before printing it.
fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// An engine for operator commands: it changes rows but never drives them.
async fn admin_engine(db: &DatabaseArgs) -> Result<Arc<Engine>, BoxError> {
    let store = server::open_store(&db.database_url, &ConnectOptions::default()).await?;
    let config = EngineConfig {
        drive: false,
        ..EngineConfig::default()
    };
    Ok(Engine::new(
        store,
        Arc::new(HttpTransport::new()?),
        Arc::new(SystemClock),
        config,
    ))
}

async fn tx(cmd: TxCommand) -> Result<(), BoxError> {
    match cmd {
        TxCommand::List {
            db,
            status,
            kind,
            limit,
            json,
        } => {
            let engine = admin_engine(&db).await?;
            let filter = ListFilter {
                statuses: status.into_iter().collect(),
                kind,
                limit,
                ..ListFilter::default()
            };
            let page = engine.store().list(&filter).await?;
            if json {
                let views: Vec<TxView> = page.items.iter().map(|s| TxView::new(s, None)).collect();
                println!("{}", serde_json::to_string_pretty(&views)?);
                return Ok(());
            }
            println!(
                "{:<40} {:<5} {:<11} {:>8}  {:<24} LAST ERROR",
                "GID", "KIND", "STATUS", "ATTEMPTS", "CREATED (UTC ms)"
            );
            for s in &page.items {
                let tx = &s.tx;
                println!(
                    "{:<40} {:<5} {:<11} {:>8}  {:<24} {}",
                    tx.gid,
                    tx.kind,
                    tx.status,
                    tx.attempts,
                    tx.created_at,
                    tx.last_error.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        TxCommand::Show { db, gid } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.load(&gid).await?;
            let history = engine.store().attempts(&gid).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&TxView::new(&stored, Some(history)))?
            );
            Ok(())
        }
        TxCommand::Retry { db, gid } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.retry(&gid).await?;
            println!(
                "{gid}: {} (a running idem serve will continue it)",
                stored.tx.status
            );
            Ok(())
        }
        TxCommand::ForceStop { db, gid, reason } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.force_stop(&gid, &reason).await?;
            println!("{gid}: {}", stored.tx.status);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("sqlite://idem.db"), "sqlite://idem.db");
    }

    #[test]
    fn cli_parses() {
        Cli::parse_from(["idem", "serve", "--listen", "0.0.0.0:9000"]);
        Cli::parse_from(["idem", "tx", "list", "--status", "stalled"]);
        Cli::parse_from(["idem", "tx", "force-stop", "g1", "--reason", "x"]);
    }
}

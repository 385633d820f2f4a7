//! `idem-lab bench`: a load generator that measures idem end to end.
//!
//! The coordinator runs as its own `idem serve` process (so its peak RSS is its own); the
//! participants (inventory and payment with the real barrier and business SQL, or an empty
//! one that does no SQL) run in this process as real HTTP services on loopback; C clients
//! run global transactions back to back for a fixed time. A first, separate pass counts
//! the SQL statements and commits of a few hundred transactions (sqlx reports each one;
//! counting costs time, so the timed pass does not count).
//!
//! `coordinator` (the `idem serve` child, its RSS and CPU, SIGTERM), `load` (the clients of
//! the timed workloads, spread over `--coordinators`, through `idem-client`), `inflight`
//! (many in flight, lease renewals, recovery after SIGKILL), `soak`, `bodies` (requests of
//! 1 MiB all at once, every answer and stored transaction checked), `limit` (the database
//! alone with the same SQL: pgbench, or the scripts of `bench/limit/`), `phases` (the
//! coordinator's timing histograms over the measured window), `deadlocks` (the server's
//! deadlock count during the timed pass), `result` (results, tables, the medians of
//! `--rounds`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use idem::metrics::SqlCounts;
use idem_participant::testing::{Backend, TestDatabase};

use crate::participants::{DemoParticipants, Participant, Setup};

mod bodies;
mod coordinator;
mod deadlocks;
mod dtm_doors;
mod inflight;
pub mod limit;
mod load;
pub mod phases;
mod result;
mod soak;

pub use bodies::BodyFigures;
pub use coordinator::Coordinator;
pub use result::{BenchResult, SqlPerTx, medians};
pub use soak::SoakFigures;

use inflight::run_many_in_flight;
use load::{Client, drive, idem_client};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// 2-branch TCC (inventory + payment): create with branches, the client's two Trys,
    /// submit and wait.
    Tcc,
    /// 2-step saga with the same participants, waiting for the result.
    Saga,
    /// 2-step saga whose participant does no SQL: the coordinator alone.
    Empty,
    /// `empty` through DTM's HTTP API (`/api/dtmsvr/submit`), to an HTTP participant: the
    /// reference for `empty_grpc`.
    EmptyDtm,
    /// `empty` through DTM's gRPC service (`--grpc-listen`) to a gRPC participant, the
    /// payloads protobuf bytes.
    EmptyGrpc,
    /// `--inflight` sagas at once against a participant that answers slowly: the
    /// coordinator's memory with that many transactions in flight.
    Inflight,
    /// `--inflight` sagas stuck at a participant, the coordinator killed with SIGKILL,
    /// the participant healed, the coordinator restarted: how long until all are done.
    Recovery,
    /// Sagas at `--rate` per second for `--duration` seconds, 1 % at a slow participant
    /// and 1 % at a failing one: the coordinator's memory over a long run.
    Soak,
    /// `--clients` requests of about 1 MiB sent at once: the coordinator's peak memory,
    /// every answer accounted for, every transaction stored whole or not at all.
    Bodies,
}

#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub workload: Workload,
    /// sqlite, postgres or mysql.
    pub backend: String,
    pub clients: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Transactions in the SQL-counting pass (0: skip it).
    pub count: usize,
    pub idem_bin: PathBuf,
    /// Extra `idem serve` arguments.
    pub serve_args: Vec<String>,
    pub progress: bool,
    /// Inflight and recovery: how many transactions.
    pub inflight: usize,
    /// Also run the limit script (PostgreSQL: pgbench) from this checkout root.
    pub limit_root: Option<PathBuf>,
    /// Inflight: how long the participant takes to answer each call.
    pub participant_delay: Duration,
    /// Soak: sagas started per second.
    pub rate: f64,
    /// Inflight: how long to watch the coordinator once every transaction is created.
    pub observe: Duration,
    /// Timed workloads: coordinator processes sharing the database, the clients spread
    /// over them; CPU is their sum, the peak RSS the largest.
    pub coordinators: usize,
}

/// Databases for one run: the coordinator's and the participants'.
struct Databases {
    coordinator: String,
    inventory: String,
    payment: String,
    dir: Option<PathBuf>,
    servers: Vec<TestDatabase>,
}

impl Databases {
    async fn create(backend: &str) -> Result<Databases, Error> {
        if backend == "sqlite" {
            let dir =
                std::env::temp_dir().join(format!("idem-bench-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir)?;
            let file = |n: &str| format!("sqlite://{}?mode=rwc", dir.join(n).display());
            return Ok(Databases {
                coordinator: file("coordinator.db"),
                inventory: file("inventory.db"),
                payment: file("payment.db"),
                dir: Some(dir),
                servers: Vec::new(),
            });
        }
        let kind = match backend {
            "postgres" => Backend::Postgres,
            "mysql" => Backend::Mysql,
            other => {
                return Err(format!("unknown backend {other}: sqlite, postgres or mysql").into());
            }
        };
        let mut servers = Vec::new();
        for _ in 0..3 {
            servers.push(TestDatabase::create(kind, "bench").await);
        }
        Ok(Databases {
            coordinator: local_socket(&servers[0]),
            inventory: local_socket(&servers[1]),
            payment: local_socket(&servers[2]),
            dir: None,
            servers,
        })
    }

    async fn drop(self) {
        for s in self.servers {
            s.drop_database().await;
        }
        if let Some(dir) = self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub(crate) const SKUS: usize = 1_000;
pub(crate) const ACCOUNTS: usize = 1_000;

/// The participants, in this process: the demo's inventory and payment, or for the
/// `empty` workload one service that answers at once and touches no database, so that
/// what is left is the coordinator.
enum Participants {
    Demo(DemoParticipants),
    Empty(idem_demo::Service),
    Grpc(dtm_doors::GrpcParticipant),
}

impl Participants {
    async fn start(workload: Workload, dbs: &Databases) -> Result<Participants, Error> {
        if workload == Workload::EmptyGrpc {
            return Ok(Participants::Grpc(
                dtm_doors::GrpcParticipant::start().await?,
            ));
        }
        if matches!(workload, Workload::Empty | Workload::EmptyDtm) {
            let router = axum::Router::new()
                .fallback(|| async { axum::Json(json!({"dtm_result": "SUCCESS"})) });
            return Ok(Participants::Empty(
                idem_demo::spawn(router, "127.0.0.1:0").await?,
            ));
        }
        let setup = Setup {
            databases: BTreeMap::from([
                (Participant::Inventory, dbs.inventory.clone()),
                (Participant::Payment, dbs.payment.clone()),
            ]),
            stock: (0..SKUS)
                .map(|i| (format!("sku-{i}"), 1_000_000_000))
                .collect(),
            accounts: (0..ACCOUNTS)
                .map(|i| (format!("acct-{i}"), 1_000_000_000_000))
                .collect(),
            campaigns: Vec::new(),
        };
        Ok(Participants::Demo(
            DemoParticipants::start(&setup, |_, routes| routes).await?,
        ))
    }

    /// The branch URLs the load's transactions name: inventory's, then payment's.
    fn urls(&self) -> Result<[String; 2], Error> {
        Ok(match self {
            Participants::Empty(service) => [service.url("/empty"), service.url("/empty")],
            Participants::Grpc(grpc) => grpc.targets(),
            Participants::Demo(demo) => [
                demo.url(Participant::Inventory)?.to_owned(),
                demo.url(Participant::Payment)?.to_owned(),
            ],
        })
    }

    async fn stop(self) {
        match self {
            Participants::Empty(service) => {
                let _ = service.stop().await;
            }
            Participants::Grpc(grpc) => grpc.stop(),
            Participants::Demo(demo) => demo.stop().await,
        }
    }
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1_000.0
}

/// Runs the benchmark.
pub async fn run(config: &BenchConfig) -> Result<BenchResult, Error> {
    match config.workload {
        Workload::Inflight | Workload::Recovery => return run_many_in_flight(config).await,
        Workload::Soak => return soak::run(config).await,
        Workload::Bodies => return bodies::run(config).await,
        Workload::Tcc
        | Workload::Saga
        | Workload::Empty
        | Workload::EmptyDtm
        | Workload::EmptyGrpc => {}
    }
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .tcp_nodelay(true)
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let participants = Participants::start(config.workload, &dbs).await?;
    let participant_urls = participants.urls()?;
    let mut serve_args = config.serve_args.clone();
    if config.workload == Workload::EmptyGrpc {
        serve_args.extend(["--grpc-listen".to_owned(), "127.0.0.1:0".to_owned()]);
    }
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();

    // Pass 1: count the SQL of `count` transactions (a separate coordinator process, since
    // counting slows it down).
    let mut sql = None;
    if config.count > 0 {
        let coordinator =
            Coordinator::start(&config.idem_bin, &dbs.coordinator, true, &serve_args).await?;
        let client = Client::new(&coordinator, &http, &participant_urls, config.workload)?;
        idem::metrics::set_sql_counting(true);
        let before_here = idem::metrics::sql_counts();
        let before_there = coordinator.sql(&http).await?;
        let commits_before = server_commits(&dbs).await;
        for n in 0..config.count {
            client.one(&format!("count-{run_id}-{n}"), n).await?;
        }
        let here = delta(idem::metrics::sql_counts(), before_here);
        let there = delta(coordinator.sql(&http).await?, before_there);
        idem::metrics::set_sql_counting(false);
        coordinator.stop().await;
        let server_commits_per_tx = match (commits_before, server_commits(&dbs).await) {
            (Some(before), Some(after)) => Some((after - before) as f64 / config.count as f64),
            _ => None,
        };
        let per = |v: u64| v as f64 / config.count as f64;
        sql = Some(SqlPerTx {
            statements: per(here.reads + here.writes + there.reads + there.writes),
            reads: per(here.reads + there.reads),
            writes: per(here.writes + there.writes),
            commits: per(here.commits + there.commits),
            coordinator_statements: per(there.reads + there.writes),
            coordinator_commits: per(there.commits),
            participant_statements: per(here.reads + here.writes),
            participant_commits: per(here.commits),
            server_commits: server_commits_per_tx,
        });
    }

    // Pass 2: timed, with the clients spread over `coordinators` processes sharing the
    // database.
    let mut coordinators = Vec::new();
    for i in 0..config.coordinators.max(1) {
        coordinators.push(
            Coordinator::start_named(
                &config.idem_bin,
                &dbs.coordinator,
                false,
                &serve_args,
                &format!("bench-{i}"),
            )
            .await?,
        );
    }
    let clients = coordinators
        .iter()
        .map(|c| Client::new(c, &http, &participant_urls, config.workload).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let bar = config.progress.then(|| {
        let total = (config.warmup + config.duration).as_secs();
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} s")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("{:?} on {}", config.workload, config.backend));
        bar
    });
    let cpu_of = |cs: &[Coordinator]| cs.iter().map(Coordinator::cpu_seconds).sum::<f64>();
    let cpu_before = cpu_of(&coordinators);
    let deadlocks_before = deadlocks::count(&dbs.servers).await;
    // The first coordinator's timing histograms as the measured window begins.
    let window_start = {
        let (coordinator_url, http, warmup) =
            (coordinators[0].url.clone(), http.clone(), config.warmup);
        tokio::spawn(async move {
            tokio::time::sleep(warmup).await;
            idem_client(&coordinator_url, &http)?
                .metrics()
                .await
                .map_err(Error::from)
        })
    };
    let (mut latencies, failures, measured) = drive(
        clients,
        config.clients,
        config.warmup,
        config.duration,
        &format!("b{run_id}"),
        bar.clone(),
    )
    .await;
    let cpu = cpu_of(&coordinators) - cpu_before;
    let deadlocks = match (deadlocks_before, deadlocks::count(&dbs.servers).await) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    latencies.sort_unstable();
    let phases = match window_start.await {
        Ok(Ok(before)) => phases::between(
            &before,
            &coordinators[0].metrics(&http).await?,
            latencies.len() as u64 / coordinators.len() as u64,
        ),
        _ => Vec::new(),
    };
    let mut retention_deleted = None;
    for c in &coordinators {
        if let Some(n) = c.retention_deleted(&http).await? {
            *retention_deleted.get_or_insert(0) += n;
        }
    }
    let result = BenchResult {
        phases,
        workload: format!("{:?}", config.workload).to_lowercase(),
        backend: config.backend.clone(),
        clients: config.clients,
        coordinators: coordinators.len(),
        seconds: measured.as_secs_f64(),
        transactions: latencies.len() as u64,
        per_second: latencies.len() as f64 / measured.as_secs_f64(),
        p50_ms: percentile(&latencies, 0.50),
        p95_ms: percentile(&latencies, 0.95),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().map_or(0.0, |m| *m as f64 / 1_000.0),
        failures,
        sql,
        coordinator_peak_rss_mb: coordinators
            .iter()
            .map(Coordinator::peak_rss_mb)
            .fold(0.0, f64::max),
        // CPU over warm-up and measurement, scaled to the measured share.
        coordinator_cpu_seconds: cpu * measured.as_secs_f64()
            / (config.warmup + config.duration).as_secs_f64(),
        retention_deleted,
        deadlocks,
        ..BenchResult::default()
    };
    for c in coordinators {
        c.stop().await;
    }
    participants.stop().await;
    dbs.drop().await;
    let mut result = result;
    if let Some(root) = &config.limit_root {
        let limit = match config.backend.as_str() {
            "postgres" => {
                limit::postgres(root, config.workload, config.clients, config.duration).await?
            }
            other => {
                limit::other(
                    root,
                    other,
                    config.workload,
                    config.clients,
                    config.duration,
                )
                .await?
            }
        };
        result.limit_per_second = Some(limit);
        result.share_of_limit = Some(result.per_second / limit);
    }
    Ok(result)
}

fn delta(after: SqlCounts, before: SqlCounts) -> SqlCounts {
    SqlCounts {
        reads: after.reads - before.reads,
        writes: after.writes - before.writes,
        begins: after.begins - before.begins,
        commits: after.commits - before.commits,
        rollbacks: after.rollbacks - before.rollbacks,
    }
}

/// The URL of a test database through the server's Unix socket, when it has the usual
/// one: a local deployment connects that way, and TCP (with TLS by default on Debian's
/// PostgreSQL) costs a third of the throughput on this kind of machine.
pub(crate) fn local_socket(db: &TestDatabase) -> String {
    let name = db.name();
    match db.backend {
        Backend::Postgres if std::path::Path::new("/var/run/postgresql/.s.PGSQL.5432").exists() => {
            format!("postgres://postgres@localhost/{name}?host=/var/run/postgresql")
        }
        Backend::Mysql if std::path::Path::new("/run/mysqld/mysqld.sock").exists() => {
            format!("mysql://root@localhost/{name}?socket=/run/mysqld/mysqld.sock")
        }
        _ => db.url.clone(),
    }
}

const ACTIVE: [idem::core::Status; 4] = idem::core::Status::ACTIVE;

/// PostgreSQL's committed-transaction counter over the benchmark's databases. Statistics
/// reach it within a second of a transaction's end, so this waits that long first.
async fn server_commits(dbs: &Databases) -> Option<u64> {
    use sqlx::Connection;
    let first = dbs
        .servers
        .first()
        .filter(|d| d.backend == Backend::Postgres)?;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut conn = sqlx::PgConnection::connect(&first.url).await.ok()?;
    let names: Vec<String> = dbs.servers.iter().map(|d| d.name().to_owned()).collect();
    let n: Option<i64> = sqlx::query_scalar(
        "SELECT sum(xact_commit)::bigint FROM pg_stat_database WHERE datname = ANY($1)",
    )
    .bind(&names)
    .fetch_one(&mut conn)
    .await
    .ok()?;
    let _ = conn.close().await;
    n.map(|n| n as u64)
}

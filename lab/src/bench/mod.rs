//! `idem-lab bench`: a load generator that measures idem end to end.
//!
//! The coordinator runs as its own `idem serve` process (so its peak RSS is its own); the
//! participants (inventory and payment with the real barrier and business SQL, or an empty
//! one that does no SQL) run in this process as real HTTP services on loopback; C clients
//! run global transactions back to back for a fixed time. A first, separate pass counts
//! the SQL statements and commits of a few hundred transactions (sqlx reports each one;
//! counting costs time, so the timed pass does not count).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use idem::metrics::SqlCounts;
use idem_demo::{inventory, payment};
use idem_participant::testing::{Backend, TestDatabase};

pub mod limit;
mod soak;

pub use soak::SoakFigures;

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
    /// `--inflight` sagas at once against a participant that answers slowly: the
    /// coordinator's memory with that many transactions in flight.
    Inflight,
    /// `--inflight` sagas stuck at a participant, the coordinator killed with SIGKILL,
    /// the participant healed, the coordinator restarted: how long until all are done.
    Recovery,
    /// Sagas at `--rate` per second for `--duration` seconds, 1 % at a slow participant
    /// and 1 % at a failing one: the coordinator's memory over a long run.
    Soak,
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
}

/// SQL per global transaction, counted.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct SqlPerTx {
    pub statements: f64,
    pub reads: f64,
    pub writes: f64,
    pub commits: f64,
    pub coordinator_statements: f64,
    pub coordinator_commits: f64,
    pub participant_statements: f64,
    pub participant_commits: f64,
    /// PostgreSQL's own count of committed transactions (`pg_stat_database.xact_commit`),
    /// which includes single statements committed on their own.
    pub server_commits: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BenchResult {
    pub workload: String,
    pub backend: String,
    pub clients: usize,
    pub seconds: f64,
    pub transactions: u64,
    pub per_second: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub failures: u64,
    pub sql: Option<SqlPerTx>,
    pub coordinator_peak_rss_mb: f64,
    pub coordinator_cpu_seconds: f64,
    /// Inflight: most transactions unfinished at once; recovery: how many were resumed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
    /// Recovery: seconds from the restart until every transaction was finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_seconds: Option<f64>,
    /// The limit script's rate with the same clients, and idem's share of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_per_second: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_of_limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soak: Option<SoakFigures>,
}

impl BenchResult {
    pub fn table(&self) -> String {
        if let Some(soak) = &self.soak {
            return soak.table(self);
        }
        if let Some(n) = self.in_flight {
            let mut out = format!(
                "workload {} on {}: {} transactions, {} failed, {:.1} s\n  coordinator peak RSS {:.1} MB\n",
                self.workload,
                self.backend,
                self.transactions,
                self.failures,
                self.seconds,
                self.coordinator_peak_rss_mb
            );
            match self.recovery_seconds {
                Some(s) => out.push_str(&format!(
                    "  {n} unfinished at the SIGKILL; all finished {s:.1} s after the restart\n"
                )),
                None => out.push_str(&format!("  at most {n} transactions in flight at once\n")),
            }
            return out;
        }
        let mut out = format!(
            "workload {} on {}, {} clients, {:.1} s\n  global transactions/s: {:.0}  ({} done, {} failed)\n  latency ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}\n  coordinator: peak RSS {:.1} MB, CPU {:.2} ms per transaction\n",
            self.workload,
            self.backend,
            self.clients,
            self.seconds,
            self.per_second,
            self.transactions,
            self.failures,
            self.p50_ms,
            self.p95_ms,
            self.p99_ms,
            self.max_ms,
            self.coordinator_peak_rss_mb,
            1_000.0 * self.coordinator_cpu_seconds / self.transactions.max(1) as f64,
        );
        if let (Some(limit), Some(share)) = (self.limit_per_second, self.share_of_limit) {
            out.push_str(&format!(
                "  limit (the same SQL and commits, same clients, database alone): {limit:.0}/s; idem reaches {:.0} %\n",
                share * 100.0
            ));
        }
        if let Some(sql) = &self.sql {
            out.push_str(&format!(
                "  SQL per transaction (counted): {:.2} statements ({:.2} reads, {:.2} writes), {:.2} explicit COMMITs{}\n    coordinator {:.2} statements / {:.2} COMMITs; participants {:.2} / {:.2}\n",
                sql.statements,
                sql.reads,
                sql.writes,
                sql.commits,
                sql.server_commits
                    .map(|c| format!(", {c:.2} commits counted by PostgreSQL"))
                    .unwrap_or_default(),
                sql.coordinator_statements,
                sql.coordinator_commits,
                sql.participant_statements,
                sql.participant_commits
            ));
        }
        out
    }
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
            servers.push(
                TestDatabase::create(kind, "bench")
                    .await
                    .ok_or("IDEM_TEST_SKIP names this backend")?,
            );
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

/// The participants, in this process.
struct Participants {
    services: Vec<idem_demo::Service>,
    urls: [String; 2],
}

impl Participants {
    async fn start(workload: Workload, dbs: &Databases) -> Result<Participants, Error> {
        if workload == Workload::Empty {
            // Answers at once and touches no database: what is left is the coordinator.
            let router = axum::Router::new()
                .fallback(|| async { axum::Json(json!({"dtm_result": "SUCCESS"})) });
            let svc = idem_demo::spawn(router, "127.0.0.1:0").await?;
            let url = svc.url("/empty");
            return Ok(Participants {
                services: vec![svc],
                urls: [url.clone(), url],
            });
        }
        let inv = inventory::open(&dbs.inventory).await?;
        let pay = payment::open(&dbs.payment).await?;
        for i in 0..SKUS {
            inventory::seed(&inv, &format!("sku-{i}"), 1_000_000_000).await?;
        }
        for i in 0..ACCOUNTS {
            payment::seed(&pay, &format!("acct-{i}"), 1_000_000_000_000).await?;
        }
        let inv_svc = inventory::start(inv, "127.0.0.1:0").await?;
        let pay_svc = payment::start(pay, "127.0.0.1:0").await?;
        let urls = [
            inv_svc.url(inventory::RESERVE_PATH),
            pay_svc.url(payment::FREEZE_PATH),
        ];
        Ok(Participants {
            services: vec![inv_svc, pay_svc],
            urls,
        })
    }

    async fn stop(self) {
        for s in self.services {
            let _ = s.stop().await;
        }
    }
}

/// An `idem serve` child process.
pub struct Coordinator {
    pub url: String,
    child: tokio::process::Child,
}

impl Coordinator {
    pub async fn start(
        bin: &PathBuf,
        db: &str,
        count_sql: bool,
        extra: &[String],
    ) -> Result<Coordinator, Error> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(bin)
            .args([
                "serve",
                "--database-url",
                db,
                "--listen",
                "127.0.0.1:0",
                "--node",
                "bench",
            ])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("IDEM_COUNT_SQL", if count_sql { "1" } else { "0" })
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .map_err(|_| "idem serve did not start")??
            .ok_or("idem serve exited")?;
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .ok_or("unexpected output from idem serve")?
            .to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Coordinator { url, child })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Peak resident set (VmHWM) in MB.
    pub fn peak_rss_mb(&self) -> f64 {
        proc_status_kb(self.pid(), "VmHWM:") as f64 / 1024.0
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let Some(pid) = self.pid() else { return 0.0 };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return 0.0;
        };
        // Fields after the command name (which may contain spaces) in parentheses.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
            .sum();
        ticks / 100.0
    }

    async fn sql(&self, http: &reqwest::Client) -> Result<SqlCounts, Error> {
        let text = http
            .get(format!("{}/metrics", self.url))
            .send()
            .await?
            .text()
            .await?;
        let value = |name: &str| -> u64 {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64
        };
        Ok(SqlCounts {
            reads: value("idem_sql_statements_total{kind=\"read\"}"),
            writes: value("idem_sql_statements_total{kind=\"write\"}"),
            begins: value("idem_sql_begins_total"),
            commits: value("idem_sql_commits_total"),
            rollbacks: 0,
        })
    }

    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

fn proc_status_kb(pid: Option<u32>, key: &str) -> u64 {
    let Some(pid) = pid else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// One client's work: global transactions of the workload, back to back.
struct Client {
    http: reqwest::Client,
    api: String,
    urls: [String; 2],
    workload: Workload,
}

impl Client {
    async fn one(&self, gid: &str, n: usize) -> Result<(), Error> {
        let sku = format!("sku-{}", n % SKUS);
        let account = format!("acct-{}", (n / 7) % ACCOUNTS);
        let payloads = [
            json!({"sku": sku, "quantity": 1}),
            json!({"account": account, "amount": 1}),
        ];
        match self.workload {
            Workload::Tcc => {
                let branches: Vec<Value> = (0..2)
                    .map(|i| {
                        json!({"branch_id": format!("0{}", i + 1), "confirm": self.urls[i], "cancel": self.urls[i], "payload": payloads[i]})
                    })
                    .collect();
                self.post(
                    "/api/v1/transactions",
                    json!({"gid": gid, "kind": "tcc", "branches": branches}),
                    201,
                )
                .await?;
                let tries = (0..2).map(|i| self.call_try(gid, i, &payloads[i]));
                for r in futures::future::join_all(tries).await {
                    r?;
                }
                let tx = self
                    .post(
                        &format!("/api/v1/transactions/{gid}/submit"),
                        json!({"wait_result": true}),
                        200,
                    )
                    .await?;
                expect_succeeded(&tx)
            }
            Workload::Saga
            | Workload::Empty
            | Workload::Inflight
            | Workload::Recovery
            | Workload::Soak => {
                let steps: Vec<Value> = (0..2)
                    .map(|i| json!({"action": self.urls[i], "compensate": self.urls[i], "payload": payloads[i]}))
                    .collect();
                let tx = self
                    .post(
                        "/api/v1/transactions",
                        json!({"gid": gid, "kind": "saga", "steps": steps, "wait_result": true}),
                        201,
                    )
                    .await?;
                expect_succeeded(&tx)
            }
        }
    }

    async fn post(&self, path: &str, body: Value, want: u16) -> Result<Value, Error> {
        let r = self
            .http
            .post(format!("{}{path}", self.api))
            .json(&body)
            .send()
            .await?;
        let code = r.status().as_u16();
        let value: Value = r.json().await.unwrap_or(Value::Null);
        if code != want {
            return Err(format!("{path}: HTTP {code}: {value}").into());
        }
        Ok(value)
    }

    async fn call_try(&self, gid: &str, i: usize, payload: &Value) -> Result<(), Error> {
        let mut url = reqwest::Url::parse(&self.urls[i])?;
        url.query_pairs_mut()
            .append_pair("gid", gid)
            .append_pair("trans_type", "tcc")
            .append_pair("branch_id", &format!("0{}", i + 1))
            .append_pair("op", "try");
        let r = self.http.post(url).json(payload).send().await?;
        if !r.status().is_success() {
            return Err(format!("Try {i} of {gid}: HTTP {}", r.status()).into());
        }
        Ok(())
    }
}

fn expect_succeeded(tx: &Value) -> Result<(), Error> {
    match tx["status"].as_str() {
        Some("succeeded") => Ok(()),
        other => Err(format!("ended {other:?}: {}", tx["last_error"]).into()),
    }
}

/// Runs `clients` clients for `duration` (after `warmup`); returns latencies (µs) and failures.
async fn drive(
    client: Arc<Client>,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: &str,
    bar: Option<indicatif::ProgressBar>,
) -> (Vec<u32>, u64, Duration) {
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Arc::clone(&client);
        let bar = bar.clone();
        let run = run.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0u64;
            let mut n = c;
            while Instant::now() < end {
                let gid = format!("{run}-{c}-{n}");
                let t0 = Instant::now();
                let ok = client.one(&gid, n).await;
                let measured = t0 >= measure_from;
                match ok {
                    Ok(()) if measured => {
                        latencies.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32)
                    }
                    Err(e) if measured => {
                        if failures < 3 {
                            eprintln!("failure: {e}");
                        }
                        failures += 1;
                    }
                    _ => {}
                }
                if let Some(bar) = &bar {
                    bar.set_position(start.elapsed().as_secs().min(bar.length().unwrap_or(0)));
                }
                n += clients;
            }
            (latencies, failures)
        }));
    }
    let mut all = Vec::new();
    let mut failures = 0;
    for t in tasks {
        if let Ok((l, f)) = t.await {
            all.extend(l);
            failures += f;
        }
    }
    (all, failures, duration)
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
        Workload::Tcc | Workload::Saga | Workload::Empty => {}
    }
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .tcp_nodelay(true)
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let participants = Participants::start(config.workload, &dbs).await?;
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();

    // Pass 1: count the SQL of `count` transactions (a separate coordinator process, since
    // counting slows it down).
    let mut sql = None;
    if config.count > 0 {
        let coordinator =
            Coordinator::start(&config.idem_bin, &dbs.coordinator, true, &config.serve_args)
                .await?;
        let client = Client {
            http: http.clone(),
            api: coordinator.url.clone(),
            urls: participants.urls.clone(),
            workload: config.workload,
        };
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

    // Pass 2: timed.
    let coordinator = Coordinator::start(
        &config.idem_bin,
        &dbs.coordinator,
        false,
        &config.serve_args,
    )
    .await?;
    let client = Arc::new(Client {
        http: http.clone(),
        api: coordinator.url.clone(),
        urls: participants.urls.clone(),
        workload: config.workload,
    });
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
    let cpu_before = coordinator.cpu_seconds();
    let (mut latencies, failures, measured) = drive(
        client,
        config.clients,
        config.warmup,
        config.duration,
        &format!("b{run_id}"),
        bar.clone(),
    )
    .await;
    let cpu = coordinator.cpu_seconds() - cpu_before;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    latencies.sort_unstable();
    let result = BenchResult {
        workload: format!("{:?}", config.workload).to_lowercase(),
        backend: config.backend.clone(),
        clients: config.clients,
        seconds: measured.as_secs_f64(),
        transactions: latencies.len() as u64,
        per_second: latencies.len() as f64 / measured.as_secs_f64(),
        p50_ms: percentile(&latencies, 0.50),
        p95_ms: percentile(&latencies, 0.95),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().map_or(0.0, |m| *m as f64 / 1_000.0),
        failures,
        sql,
        coordinator_peak_rss_mb: coordinator.peak_rss_mb(),
        // CPU over warm-up and measurement, scaled to the measured share.
        coordinator_cpu_seconds: cpu * measured.as_secs_f64()
            / (config.warmup + config.duration).as_secs_f64(),
        ..BenchResult::default()
    };
    coordinator.stop().await;
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

/// A participant with no database that answers after a delay, or not at all while held.
#[derive(Default)]
struct Gate {
    held: std::sync::atomic::AtomicBool,
    released: tokio::sync::Notify,
}

async fn slow_participant(gate: Arc<Gate>, delay: Duration) -> Result<idem_demo::Service, Error> {
    use std::sync::atomic::Ordering;
    let router = axum::Router::new().fallback(move || {
        let gate = Arc::clone(&gate);
        async move {
            loop {
                let released = gate.released.notified();
                if !gate.held.load(Ordering::SeqCst) {
                    break;
                }
                released.await;
            }
            tokio::time::sleep(delay).await;
            axum::Json(json!({"dtm_result": "SUCCESS"}))
        }
    });
    Ok(idem_demo::spawn(router, "127.0.0.1:0").await?)
}

/// Creates `n` sagas (not waiting for them) through `clients` concurrent clients.
async fn create_sagas(
    http: &reqwest::Client,
    api: &str,
    url: &str,
    run: &str,
    n: usize,
    clients: usize,
) -> Result<(), Error> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, api, url, run, next) = (
            http.clone(),
            api.to_owned(),
            url.to_owned(),
            run.to_owned(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    return Ok::<(), Error>(());
                }
                let steps: Vec<Value> = (0..2)
                    .map(|_| json!({"action": url, "compensate": url, "payload": {}}))
                    .collect();
                let body = json!({"gid": format!("{run}-{i}"), "kind": "saga", "steps": steps});
                let r = http
                    .post(format!("{api}/api/v1/transactions"))
                    .json(&body)
                    .send()
                    .await?;
                if r.status().as_u16() != 201 {
                    return Err(format!("create answered {}", r.status()).into());
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

const ACTIVE: [idem::core::Status; 4] = idem::core::Status::ACTIVE;

/// The inflight and recovery workloads.
async fn run_many_in_flight(config: &BenchConfig) -> Result<BenchResult, Error> {
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let store =
        idem::server::open_store(&dbs.coordinator, &idem::store::ConnectOptions::default())
            .await?;
    let gate = Arc::new(Gate::default());
    let recovery = config.workload == Workload::Recovery;
    gate.held
        .store(recovery, std::sync::atomic::Ordering::SeqCst);
    let delay = if recovery {
        Duration::ZERO
    } else {
        config.participant_delay
    };
    let participant = slow_participant(Arc::clone(&gate), delay).await?;
    let url = participant.url("/slow");
    // Calls wait as long as the participant holds them, instead of timing out and retrying.
    let mut serve_args = config.serve_args.clone();
    serve_args.extend(["--request-timeout-ms".into(), "120000".into()]);
    let mut coordinator =
        Coordinator::start(&config.idem_bin, &dbs.coordinator, false, &serve_args).await?;
    let run_id = format!("f{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let started = Instant::now();
    let api = coordinator.url.clone();
    let creating = create_sagas(&http, &api, &url, &run_id, config.inflight, config.clients);
    // Watch how many are unfinished while they are created and driven.
    let mut most = 0u64;
    tokio::pin!(creating);
    loop {
        tokio::select! {
            done = &mut creating => { done?; break; }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                most = most.max(store.count(&ACTIVE).await?);
            }
        }
    }
    most = most.max(store.count(&ACTIVE).await?);
    let mut result = BenchResult {
        workload: format!("{:?}", config.workload).to_lowercase(),
        backend: config.backend.clone(),
        clients: config.clients,
        transactions: config.inflight as u64,
        ..BenchResult::default()
    };
    if recovery {
        coordinator.kill();
        let _ = coordinator.child.wait().await;
        gate.held.store(false, std::sync::atomic::Ordering::SeqCst);
        gate.released.notify_waiters();
        let unfinished = store.count(&ACTIVE).await?;
        let restart = Instant::now();
        coordinator =
            Coordinator::start(&config.idem_bin, &dbs.coordinator, false, &serve_args).await?;
        while store.count(&ACTIVE).await? > 0 {
            if restart.elapsed() > Duration::from_secs(600) {
                return Err("recovery did not finish in 10 minutes".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        result.recovery_seconds = Some(restart.elapsed().as_secs_f64());
        result.in_flight = Some(unfinished);
    } else {
        while store.count(&ACTIVE).await? > 0 {
            most = most.max(store.count(&ACTIVE).await?);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        result.in_flight = Some(most);
    }
    result.seconds = started.elapsed().as_secs_f64();
    result.per_second = config.inflight as f64 / result.seconds;
    result.coordinator_peak_rss_mb = coordinator.peak_rss_mb();
    let failed = store
        .count(&[idem::core::Status::Failed, idem::core::Status::Stalled])
        .await?;
    result.failures = failed;
    coordinator.stop().await;
    let _ = participant.stop().await;
    drop(store);
    dbs.drop().await;
    Ok(result)
}

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

//! Helpers shared by the integration tests.

use std::sync::Arc;

use idem::store::{self, ConnectOptions, Store};
use idem_participant::testing::{self, IdemProcess, IdemServe, TestDatabase};

/// A migrated store on a fresh database of each backend (SQLite, PostgreSQL, MariaDB).
pub async fn stores(test: &str) -> Vec<(TestDatabase, Arc<dyn Store>)> {
    let mut out = Vec::new();
    for db in testing::all(test).await {
        let store = open(&db.url).await;
        out.push((db, store));
    }
    out
}

pub async fn open(url: &str) -> Arc<dyn Store> {
    let options = ConnectOptions {
        max_connections: 8,
        sqlite_full_sync: false,
        ..ConnectOptions::default()
    };
    let store = store::connect(url, &options)
        .await
        .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    store.migrate().await.expect("migrations apply");
    store
}

/// Drops the test databases.
pub async fn cleanup(dbs: Vec<(TestDatabase, Arc<dyn Store>)>) {
    for (db, store) in dbs {
        drop(store);
        db.drop_database().await;
    }
}

pub mod auth;
pub mod recorder;
pub mod typed;

use std::time::Duration;

use idem::server::{RunningServer, ServerConfig};
use serde_json::Value;

/// A coordinator in this process with short timings, so tests of retries and timeouts
/// take milliseconds.
pub async fn coordinator(url: &str) -> RunningServer {
    coordinator_with(url, |_| {}).await
}

/// [`coordinator`] with `tweak` applied to its configuration.
pub async fn coordinator_with(url: &str, tweak: impl FnOnce(&mut ServerConfig)) -> RunningServer {
    let mut config = ServerConfig::new(url, "127.0.0.1:0".parse().unwrap());
    config.engine.recovery_interval = Duration::from_millis(50);
    config.engine.lease_ms = 3_000;
    config.engine.defaults.retry_interval_ms = 20;
    config.engine.defaults.max_retry_interval_ms = 100;
    config.engine.defaults.max_attempts = 5;
    config.engine.defaults.request_timeout_ms = 2_000;
    config.connect.max_connections = 8;
    config.connect.sqlite_full_sync = false;
    config.wait_timeout = Duration::from_secs(20);
    tweak(&mut config);
    idem::server::start(config)
        .await
        .expect("coordinator starts")
}

/// The outbound policy that lets a coordinator with tokens call the tests' participants,
/// which listen on loopback: the built-in entry of `--auth tokens` refuses this host's
/// addresses, and an operator allows their own networks by CIDR the same way.
pub const LOOPBACK_PARTICIPANTS: &str = "[default]\ncidrs = [\"127.0.0.0/8\", \"::1\"]\n";

/// Sets [`LOOPBACK_PARTICIPANTS`] as `config`'s outbound policy.
pub fn allow_loopback_participants(config: &mut ServerConfig) {
    let policy = idem::outbound::OutboundPolicy::parse(LOOPBACK_PARTICIPANTS).unwrap();
    config.outbound_policy = std::sync::Arc::new(policy);
}

/// The raw, wire-level client of the coordinator's API: exact status codes, malformed or
/// unusual bodies, the JSON shape of answers, DTM's front door. Tests that act as an
/// application or an operator use the typed client instead ([`typed`]).
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: reqwest::Client,
}

impl Api {
    pub fn new(base: impl Into<String>) -> Api {
        idem::transport::install_crypto_provider();
        Api {
            base: base.into(),
            client: reqwest::Client::new(),
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post_raw(&self, path: &str, body: &'static str) -> (u16, Value) {
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Polls `GET /api/v1/transactions/{gid}` until its status is one of `statuses`.
    pub async fn wait_status(&self, gid: &str, statuses: &[&str], timeout: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (code, tx) = self.get(&format!("/api/v1/transactions/{gid}")).await;
            if code == 200 && statuses.contains(&tx["status"].as_str().unwrap_or("")) {
                return tx;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("{gid} did not reach {statuses:?} in {timeout:?}: {tx:#}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An `idem serve` child process with the tests' quick settings: the SDK's
/// [`IdemProcess`](idem_participant::testing::IdemProcess), with its address at hand.
pub struct Child {
    pub url: String,
    process: IdemProcess,
}

impl std::ops::Deref for Child {
    type Target = IdemProcess;
    fn deref(&self) -> &IdemProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Child {
    fn deref_mut(&mut self) -> &mut IdemProcess {
        &mut self.process
    }
}

impl Child {
    /// `idem serve` on `database_url` with short leases and retry delays (an empty `node`
    /// leaves `--node` out: the default name, as most users run it); `extra` replaces any
    /// default flag. Returns once it serves.
    pub async fn serve(database_url: &str, node: &str, extra: &[&str]) -> Child {
        Child::start(Child::command(database_url, node, extra)).await
    }

    /// [`Child::serve`] with more environment variables.
    pub async fn serve_env(
        database_url: &str,
        node: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        let command = env.iter().fold(
            Child::command(database_url, node, extra),
            |command, (key, value)| command.env(key, value),
        );
        Child::start(command).await
    }

    /// [`Child::serve`] with its log (stderr) written to `log`.
    pub async fn serve_logged(database_url: &str, extra: &[&str], log: &std::path::Path) -> Child {
        Child::start(Child::command(database_url, "", extra).log_to(log, false)).await
    }

    /// How the tests start `idem serve`, for those that need more than the above.
    pub fn command(database_url: &str, node: &str, extra: &[&str]) -> IdemServe {
        let command = IdemServe::new(env!("CARGO_BIN_EXE_idem"), database_url).quick();
        let command = if node.is_empty() {
            command
        } else {
            command.default_flag("--node", node)
        };
        command.args(extra)
    }

    pub async fn start(command: IdemServe) -> Child {
        let process = command
            .start(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Child {
            url: process.url().to_owned(),
            process,
        }
    }

    /// SIGKILL: no shutdown, no lease handed back.
    pub fn kill(mut self) {
        self.process.kill();
    }

    /// Sends a signal by name (STOP, CONT, TERM).
    pub fn signal(&self, name: &str) {
        self.process.signal(name).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits until the process exits, up to `timeout`; `None` if it still runs.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.process.wait_exit(timeout).await.unwrap()
    }

    /// `VmRSS` and `VmHWM` (peak) of the process, in KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        self.process.memory_kib().unwrap()
    }
}

/// Runs the `idem` command (an operator's tool) and returns what it printed; panics when it
/// fails.
pub fn idem_cli(args: &[&str]) -> String {
    let out = idem_run(args, &[]);
    assert!(
        out.status.success(),
        "idem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs the `idem` command with these environment variables and returns how it ended.
/// `IDEM_SERVER` and `IDEM_DATABASE_URL` from the developer's shell are left out, so that
/// only what the test says decides where the command goes.
pub fn idem_run(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    idem_command(args, env).output().expect("idem runs")
}

/// The `idem` command, ready to spawn (see [`idem_run`]).
pub fn idem_command(args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("IDEM_SERVER")
        .env_remove("IDEM_DATABASE_URL")
        .envs(env.iter().copied());
    command
}

/// Sends one HTTP/1.1 request on a raw connection and reads its response.
pub async fn exchange<S>(s: &mut S, request: &[u8]) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    s.write_all(request).await.unwrap();
    read_response(s).await
}

/// Reads one HTTP/1.1 response (head and `Content-Length` body) from a raw connection,
/// leaving the connection ready for the next.
pub async fn read_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse::<usize>().unwrap());
            if got.len() >= end + 4 + length {
                return text;
            }
        }
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a whole response: {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Waits up to `timeout` until `counter` is at least `n`, woken by `changed` (which the
/// counter's owner notifies at each change): a participant's calls held at once, say.
/// False if it never got there.
pub async fn until_at_least(
    counter: &std::sync::atomic::AtomicUsize,
    changed: &tokio::sync::Notify,
    n: usize,
    timeout: Duration,
) -> bool {
    tokio::time::timeout(timeout, async {
        loop {
            let notified = changed.notified();
            if counter.load(std::sync::atomic::Ordering::SeqCst) >= n {
                return;
            }
            notified.await;
        }
    })
    .await
    .is_ok()
}

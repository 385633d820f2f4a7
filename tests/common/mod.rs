//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use idem::store::{self, ConnectOptions, Store};
use idem_participant::testing::{self, TestDatabase};

/// A migrated store on a fresh database of each backend (SQLite always; PostgreSQL and
/// MariaDB unless the developer skips them, which is printed).
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
pub mod private_postgres;
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

/// An `idem serve` child process.
pub struct Child {
    pub url: String,
    process: std::process::Child,
    // Kept open so that the child never writes to a closed pipe.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Child {
    /// Starts `idem serve` on `database_url` with short leases and retry delays, and
    /// waits until it listens (it prints its address).
    pub fn serve(database_url: &str, node: &str, extra: &[&str]) -> Child {
        Child::serve_env(database_url, node, extra, &[])
    }

    /// [`Child::serve`] with more environment variables.
    pub fn serve_env(
        database_url: &str,
        node: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Child {
        Child::spawn(
            database_url,
            node,
            extra,
            env,
            std::process::Stdio::inherit(),
        )
    }

    /// [`Child::serve`] with its log (stderr) written to `log`.
    pub fn serve_logged(database_url: &str, extra: &[&str], log: &std::path::Path) -> Child {
        let file = std::fs::File::create(log).unwrap();
        Child::spawn(database_url, "", extra, &[], file.into())
    }

    fn spawn(
        database_url: &str,
        node: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        stderr: std::process::Stdio,
    ) -> Child {
        use std::io::BufRead;
        // An empty node name leaves `--node` out: the default name, as most users run it.
        let defaults = [
            ("--database-url", database_url),
            ("--listen", "127.0.0.1:0"),
            ("--node", node),
            ("--lease-ms", "1500"),
            ("--recovery-interval-ms", "100"),
            ("--retry-interval-ms", "50"),
            ("--max-retry-interval-ms", "200"),
            ("--sqlite-full-sync", "false"),
        ];
        let mut args = vec!["serve".to_owned()];
        for (flag, value) in defaults {
            // An extra argument replaces the default (clap refuses a flag given twice).
            let omitted = flag == "--node" && node.is_empty();
            if !extra.contains(&flag) && !omitted {
                args.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        let mut process = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("idem starts");
        let stdout = process.stdout.take().unwrap();
        let mut line = String::new();
        let mut reader = std::io::BufReader::new(stdout);
        reader.read_line(&mut line).unwrap();
        let url = line
            .split_whitespace()
            .find(|w| w.starts_with("http://") || w.starts_with("https://"))
            .unwrap_or_else(|| panic!("unexpected first line from idem: {line:?}"))
            .to_owned();
        Child {
            url,
            process,
            _stdout: reader,
        }
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// SIGKILL: no shutdown, no lease handed back.
    pub fn kill(mut self) {
        self.process.kill().unwrap();
        self.process.wait().unwrap();
    }

    /// Sends a signal by name (STOP, CONT, TERM).
    pub fn signal(&self, name: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name} failed");
    }
}

impl Child {
    /// Waits until the process exits, polling up to `timeout`; `None` if it still runs.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.process.try_wait().unwrap() {
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// `VmRSS` and `VmHWM` (peak) of the process, in KiB, from `/proc`.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc status"))
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
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

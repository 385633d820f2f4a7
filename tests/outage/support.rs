//! What the outage tests share: an `idem serve` child read asynchronously (its start can
//! wait for the database, and its log is part of what is checked), and a participant whose
//! first step holds its answer until the test lets it go.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::{Notify, watch};

/// An `idem serve` process with its stderr collected line by line.
pub struct Serve {
    child: tokio::process::Child,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    log: Arc<Log>,
}

#[derive(Default)]
struct Log {
    lines: Mutex<Vec<String>>,
    changed: Notify,
}

impl Serve {
    /// Starts `idem serve` on `database_url` with short leases and retries (as the other
    /// process tests do) and short database timeouts; `extra` replaces any default flag.
    pub fn spawn(database_url: &str, extra: &[&str]) -> Serve {
        let defaults = [
            ("--database-url", database_url),
            ("--listen", "127.0.0.1:0"),
            ("--node", "outage"),
            ("--lease-ms", "1500"),
            ("--recovery-interval-ms", "100"),
            ("--retry-interval-ms", "50"),
            ("--max-retry-interval-ms", "200"),
            ("--sqlite-full-sync", "false"),
            ("--database-connect-timeout-ms", "1000"),
            ("--database-acquire-timeout-ms", "1000"),
            ("--database-call-timeout-ms", "2000"),
        ];
        let mut args = vec!["serve".to_owned()];
        for (flag, value) in defaults {
            if !extra.contains(&flag) {
                args.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("idem starts");
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Log::default());
        let sink = Arc::clone(&log);
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                sink.lines.lock().unwrap().push(line);
                sink.changed.notify_waiters();
            }
        });
        Serve { child, stdout, log }
    }

    /// Waits for the line idem prints once it serves, and returns its base URL.
    pub async fn listening(&mut self, within: Duration) -> String {
        let line = tokio::time::timeout(within, self.stdout.next_line())
            .await
            .unwrap_or_else(|_| panic!("idem did not serve in {within:?}; log:\n{}", self.log()))
            .unwrap()
            .unwrap_or_else(|| panic!("idem exited before serving; log:\n{}", self.log()));
        line.split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("unexpected first line from idem: {line:?}"))
            .to_owned()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.log.lines.lock().unwrap().join("\n")
    }

    /// Waits until `done(log lines)` holds, or panics after `within`.
    pub async fn wait_log(&self, within: Duration, done: impl Fn(&[String]) -> bool) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = self.log.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&self.log.lines.lock().unwrap()) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("the log did not show it in {within:?}:\n{}", self.log());
            }
        }
    }

    /// Lines of the log containing `text`.
    pub fn count(&self, text: &str) -> usize {
        count(&self.log.lines.lock().unwrap(), text)
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits for the process to exit.
    pub async fn exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!("idem did not exit in {within:?}; log:\n{}", self.log()),
        }
    }
}

pub fn count(lines: &[String], text: &str) -> usize {
    lines.iter().filter(|l| l.contains(text)).count()
}

/// A participant: `/gated` holds every call until [`Gate::open`], `/ok` answers at once.
pub struct Gate {
    pub base: String,
    open: watch::Sender<bool>,
    arrived: watch::Receiver<usize>,
}

impl Gate {
    pub async fn start() -> Gate {
        let (open, opened) = watch::channel(false);
        let (arrivals, arrived) = watch::channel(0usize);
        let arrivals = Arc::new(arrivals);
        let gated = move || {
            let mut opened = opened.clone();
            let arrivals = Arc::clone(&arrivals);
            async move {
                arrivals.send_modify(|n| *n += 1);
                let _ = opened.wait_for(|open| *open).await;
                "{}"
            }
        };
        let app = Router::new()
            .route("/gated", post(gated))
            .route("/ok", post(|| async { "{}" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Gate {
            base: format!("http://{addr}"),
            open,
            arrived,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Waits until a call is held at the gate.
    pub async fn wait_arrival(&self, within: Duration) {
        let mut arrived = self.arrived.clone();
        tokio::time::timeout(within, arrived.wait_for(|n| *n > 0))
            .await
            .expect("a call reaches the gate")
            .unwrap();
    }

    /// Lets every held call (and every later one) through.
    pub fn open(&self) {
        self.open.send_replace(true);
    }
}

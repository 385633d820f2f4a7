//! What the outage tests share: an `idem serve` child read asynchronously (its start can
//! wait for the database, and its log is part of what is checked), and a participant whose
//! first step holds its answer until the test lets it go.

use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use idem_participant::testing::IdemProcess;
use tokio::sync::watch;

/// An `idem serve` process with its log collected line by line; what it cannot do is a
/// test failure with the log attached.
pub struct Serve(IdemProcess);

impl Serve {
    /// Starts `idem serve` on `database_url` with short leases and retries (as the other
    /// process tests do) and short database timeouts; `extra` replaces any default flag.
    pub fn spawn(database_url: &str, extra: &[&str]) -> Serve {
        let command = crate::common::Child::command(database_url, "outage", extra)
            .default_flag("--database-connect-timeout-ms", 1_000)
            .default_flag("--database-acquire-timeout-ms", 1_000)
            .default_flag("--database-call-timeout-ms", 2_000)
            .env("NO_COLOR", "1")
            .collect_log();
        Serve(command.spawn().unwrap_or_else(|e| panic!("{e}")))
    }

    /// Waits for the line idem prints once it serves, and returns its base URL.
    pub async fn listening(&mut self, within: Duration) -> String {
        self.0
            .listening(within)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.0.log()
    }

    /// Waits until `done(log lines)` holds, or panics after `within`.
    pub async fn wait_log(&self, within: Duration, done: impl Fn(&[String]) -> bool) {
        if !self.0.wait_log(within, done).await {
            panic!("the log did not show it in {within:?}:\n{}", self.log());
        }
    }

    /// Lines of the log containing `text`.
    pub fn count(&self, text: &str) -> usize {
        self.0.count(text)
    }

    pub fn running(&mut self) -> bool {
        self.0.running()
    }

    /// Waits for the process to exit.
    pub async fn exit(&mut self, within: Duration) -> ExitStatus {
        match self.0.wait_exit(within).await.unwrap() {
            Some(status) => status,
            None => panic!("idem did not exit in {within:?}; log:\n{}", self.log()),
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

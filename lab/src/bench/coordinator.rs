//! The coordinator under measurement: an `idem serve` child process, so that its memory
//! and CPU are its own, read from /proc.

use std::path::PathBuf;
use std::time::Duration;

use idem::metrics::SqlCounts;
use idem_participant::testing::{IdemProcess, IdemServe};

use super::Error;
use super::load::idem_client;

/// An `idem serve` child process.
pub struct Coordinator {
    pub url: String,
    /// Where DTM's gRPC service listens, when started with `--grpc-listen`.
    pub grpc: Option<String>,
    process: IdemProcess,
}

impl Coordinator {
    pub async fn start(
        bin: &PathBuf,
        db: &str,
        count_sql: bool,
        extra: &[String],
    ) -> Result<Coordinator, Error> {
        Coordinator::start_named(bin, db, count_sql, extra, "bench").await
    }

    /// [`Coordinator::start`] under a node name of its own: coordinators sharing a
    /// database must not share one (a start releases its node's leases).
    pub async fn start_named(
        bin: &PathBuf,
        db: &str,
        count_sql: bool,
        extra: &[String],
        node: &str,
    ) -> Result<Coordinator, Error> {
        let process = IdemServe::new(bin, db)
            .default_flag("--node", node)
            .args(extra)
            .env("IDEM_COUNT_SQL", if count_sql { "1" } else { "0" })
            .start(Duration::from_secs(60))
            .await?;
        Ok(Coordinator {
            url: process.url().to_owned(),
            grpc: process.grpc_addr().map(str::to_owned),
            process,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Resident set now (VmRSS) in MB; 0 once the process is gone.
    pub fn rss_mb(&self) -> f64 {
        self.process
            .memory_kib()
            .map_or(0.0, |(rss, _)| rss as f64 / 1024.0)
    }

    /// Peak resident set (VmHWM) in MB; 0 once the process is gone.
    pub fn peak_rss_mb(&self) -> f64 {
        self.process
            .memory_kib()
            .map_or(0.0, |(_, peak)| peak as f64 / 1024.0)
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        self.process.cpu_seconds().unwrap_or(0.0)
    }

    /// The coordinator's `/metrics` exposition now.
    pub(super) async fn metrics(&self, http: &reqwest::Client) -> Result<String, Error> {
        Ok(idem_client(&self.url, http)?.metrics().await?)
    }

    pub(super) async fn sql(&self, http: &reqwest::Client) -> Result<SqlCounts, Error> {
        let text = idem_client(&self.url, http)?.metrics().await?;
        let value = |name: &str| series(&text, name).unwrap_or(0);
        Ok(SqlCounts {
            reads: value("idem_sql_statements_total{kind=\"read\"}"),
            writes: value("idem_sql_statements_total{kind=\"write\"}"),
            begins: value("idem_sql_begins_total"),
            commits: value("idem_sql_commits_total"),
            rollbacks: 0,
        })
    }

    /// Transactions retention deleted so far; `None` if it is off (`--retention-ms 0`).
    pub(super) async fn retention_deleted(
        &self,
        http: &reqwest::Client,
    ) -> Result<Option<u64>, Error> {
        let text = idem_client(&self.url, http)?.metrics().await?;
        let name = format!("{}{{table=\"global\"}}", idem::retention::ROWS_DELETED);
        Ok(series(&text, &name))
    }

    /// A counter's value now (0 if the coordinator has none yet).
    pub(super) async fn counter(&self, http: &reqwest::Client, name: &str) -> Result<u64, Error> {
        Ok(series(&self.metrics(http).await?, name).unwrap_or(0))
    }

    /// SIGTERM, then waits up to `within` for the process to exit; the time it took.
    pub(super) async fn terminate(&mut self, within: Duration) -> Result<Duration, Error> {
        Ok(self.process.terminate(within).await?)
    }

    /// SIGKILL; returns once the process is gone.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    pub async fn stop(mut self) {
        self.process.kill();
    }
}

/// The value of one series in a Prometheus text exposition.
pub(super) fn series(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

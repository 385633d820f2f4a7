//! The coordinator under measurement: an `idem serve` child process, so that its memory
//! and CPU are its own, read from /proc.

use std::path::PathBuf;
use std::time::Duration;

use idem::metrics::SqlCounts;

use super::Error;
use super::load::idem_client;

/// An `idem serve` child process.
pub struct Coordinator {
    pub url: String,
    pub(super) child: tokio::process::Child,
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
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(bin)
            .args([
                "serve",
                "--database-url",
                db,
                "--listen",
                "127.0.0.1:0",
                "--node",
                node,
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
        let pid = self.pid().ok_or("the coordinator has exited already")?;
        let started = std::time::Instant::now();
        std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        tokio::time::timeout(within, self.child.wait())
            .await
            .map_err(|_| format!("the coordinator did not exit within {within:?} of SIGTERM"))??;
        Ok(started.elapsed())
    }

    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

pub(super) fn proc_status_kb(pid: Option<u32>, key: &str) -> u64 {
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

/// The value of one series in a Prometheus text exposition.
pub(super) fn series(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

//! What a benchmark run measured, as a table and as JSON, and the medians of several
//! rounds.

use serde::{Deserialize, Serialize};

use super::{BodyFigures, inflight, phases, soak::SoakFigures};

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
    /// Coordinator processes that shared the database (1 unless `--coordinators`).
    #[serde(default)]
    pub coordinators: usize,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bodies: Option<BodyFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scale: Option<inflight::ScaleFigures>,
    /// Where the time went inside the coordinator during the measured window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<phases::Phase>,
    /// Transactions the timed coordinator's retention deleted during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_deleted: Option<u64>,
    /// Deadlocks the database server counted during the timed pass (see `deadlocks.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadlocks: Option<u64>,
}

impl BenchResult {
    pub fn table(&self) -> String {
        if let Some(soak) = &self.soak {
            return soak.table(self);
        }
        if let Some(bodies) = &self.bodies {
            return bodies.table(self);
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
            if let Some(scale) = &self.scale {
                out.push_str(&scale.table());
            }
            return out;
        }
        let mut out = format!(
            "workload {} on {}, {} clients, {} coordinator(s), {:.1} s\n  global transactions/s: {:.0}  ({} done, {} failed)\n  latency ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}\n  coordinator: peak RSS {:.1} MB, CPU {:.2} ms per transaction\n",
            self.workload,
            self.backend,
            self.clients,
            self.coordinators.max(1),
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
        if let Some(n) = self.deadlocks {
            out.push_str(&format!(
                "  deadlocks counted by the database during the timed pass: {n}\n"
            ));
        }
        if !self.phases.is_empty() {
            out.push_str(&phases::table(&self.phases));
        }
        if let Some(n) = self.retention_deleted.filter(|n| *n > 0) {
            out.push_str(&format!(
                "  retention deleted {n} finished transactions during the run\n"
            ));
        }
        out
    }
}

/// The medians of several rounds of one benchmark: rates, CPU per transaction, p99, and
/// the share of the limit each round measured beside its own limit run.
pub fn medians(results: &[BenchResult]) -> String {
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    let of = |f: &dyn Fn(&BenchResult) -> f64| median(results.iter().map(f).collect());
    let mut out = format!(
        "medians of {} rounds: {:.0} transactions/s, coordinator CPU {:.3} ms per transaction, p99 {:.1} ms, peak RSS {:.1} MB\n",
        results.len(),
        of(&|r| r.per_second),
        of(&|r| 1_000.0 * r.coordinator_cpu_seconds / r.transactions.max(1) as f64),
        of(&|r| r.p99_ms),
        of(&|r| r.coordinator_peak_rss_mb),
    );
    let shares: Vec<f64> = results.iter().filter_map(|r| r.share_of_limit).collect();
    if !shares.is_empty() {
        out.push_str(&format!(
            "  limit {:.0}/s; idem's share of it, per round: {} (median {:.0} %)\n",
            median(results.iter().filter_map(|r| r.limit_per_second).collect()),
            shares
                .iter()
                .map(|s| format!("{:.0} %", s * 100.0))
                .collect::<Vec<_>>()
                .join(", "),
            median(shares) * 100.0
        ));
    }
    out
}

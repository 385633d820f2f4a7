//! What a run did and found.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::calls::{self, CoordinatorProcess, HistoryEntry};
use super::rows::{OperatorRetry, StepBack};
use super::{DbLinkApplied, DbRestart, OutageHit};
use crate::faults::{CallKey, Delivery, TimelineEvent, fault_signature};
use idem::core::Status;

/// What a run did and found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub statuses: BTreeMap<String, Status>,
    /// Gids that were stalled at some point before an operator retry.
    pub stalled_seen: Vec<String>,
    /// How many times the operator retried each of them (more than once only when the
    /// transaction stalled again after a retry).
    #[serde(default)]
    pub operator_retries: BTreeMap<String, u32>,
    /// Calls refused by a long outage.
    #[serde(default)]
    pub outage_hits: Vec<OutageHit>,
    /// When each outage was healed.
    #[serde(default)]
    pub healed_at: BTreeMap<String, idem::core::Millis>,
    pub attempts: BTreeMap<String, i32>,
    pub stock: BTreeMap<String, [i64; 3]>,
    pub balances: BTreeMap<String, i64>,
    pub coupons: BTreeMap<String, usize>,
    pub timeline: Vec<TimelineEvent>,
    pub deliveries: Vec<Delivery>,
    /// Coordinator processes restarted after a SIGKILL or a crash point.
    pub restarts: u32,
    /// Restarts of the database server, in order.
    #[serde(default)]
    pub db_restarts: Vec<DbRestart>,
    /// Database-link faults, in the order they fired.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub db_link: Vec<DbLinkApplied>,
    /// Every coordinator process of the run, restarts included.
    #[serde(default)]
    pub processes: Vec<CoordinatorProcess>,
    /// When the operator retried each transaction it retried.
    #[serde(default)]
    pub operator_retry_at: BTreeMap<String, Vec<OperatorRetry>>,
    /// Samples of the coordinator's rows read during the run (and the final one), and
    /// samples that could not be read (the database restarting).
    #[serde(default)]
    pub row_samples: usize,
    #[serde(default)]
    pub unread_samples: u32,
    /// Rows seen going back between two samples.
    #[serde(default)]
    pub step_backs: Vec<StepBack>,
    /// Failed calls in each transaction's history, per `branch_id/action`.
    #[serde(default)]
    pub failed_calls: BTreeMap<String, BTreeMap<String, usize>>,
    pub violations: Vec<String>,
    pub wall_ms: u64,
}

impl Report {
    /// A transaction's history as the coordinator showed it at the end: each failed call
    /// must be in it once.
    pub fn record_history(&mut self, tx: &idem_client::TxView) {
        let history: Vec<HistoryEntry> = tx
            .history
            .iter()
            .flatten()
            .map(|h| HistoryEntry {
                branch_id: h.branch_id.clone(),
                action: h.action.as_str().to_owned(),
                attempt: h.attempt,
                started_at: h.started_at,
            })
            .collect();
        self.violations
            .extend(calls::history_repeats(&tx.gid, &history));
        let counts = self.failed_calls.entry(tx.gid.clone()).or_default();
        for h in &history {
            *counts
                .entry(format!("{}/{}", h.branch_id, h.action))
                .or_default() += 1;
        }
    }

    /// Faults fired on both sides.
    pub fn faults(&self) -> usize {
        fault_signature(&self.timeline).len() + self.participant_faults().len()
    }

    pub fn participant_faults(&self) -> Vec<(CallKey, String)> {
        let mut out: Vec<(CallKey, String)> = self
            .deliveries
            .iter()
            .filter_map(|d| d.fault.clone().map(|f| (d.call.clone(), f)))
            .collect();
        out.sort();
        out
    }

    /// Calls made to participants: idem's (from the timeline) and the client's Trys.
    pub fn calls(&self) -> usize {
        let by_idem = self
            .timeline
            .iter()
            .filter(|e| matches!(e, TimelineEvent::Call { .. }))
            .count();
        let tries = self
            .deliveries
            .iter()
            .filter(|d| d.call.op == "try")
            .count();
        by_idem + tries
    }

    /// A summary: how many transactions ended how, faults, restarts, violations, time.
    pub fn summary(&self) -> String {
        let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
        for s in self.statuses.values() {
            *by_status.entry(s.as_str()).or_default() += 1;
        }
        let calls = self.calls().max(1);
        let mut lines = vec![
            format!(
                "transactions: {} ({})",
                self.statuses.len(),
                by_status
                    .iter()
                    .map(|(s, n)| format!("{n} {s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "participant calls: {}, faults fired: {} ({:.1} % of calls; {} by idem's transport, {} in front of participants)",
                calls,
                self.faults(),
                100.0 * self.faults() as f64 / calls as f64,
                fault_signature(&self.timeline).len(),
                self.participant_faults().len()
            ),
            format!(
                "coordinator restarts after SIGKILL or crash: {}",
                self.restarts
            ),
        ];
        lines.extend(super::restarts::describe(&self.db_restarts));
        lines.extend(super::db_link::describe(&self.db_link));
        lines.push(format!(
            "coordinator rows sampled {} times during the run ({} samples unreadable), {} seen going back",
            self.row_samples,
            self.unread_samples,
            self.step_backs.len()
        ));
        if !self.healed_at.is_empty() || !self.outage_hits.is_empty() {
            let met: BTreeSet<&str> = self.outage_hits.iter().map(|h| h.gid.as_str()).collect();
            lines.push(format!(
                "long outages: {} healed, {} calls refused while down, {} orders met one",
                self.healed_at.len(),
                self.outage_hits.len(),
                met.len()
            ));
        }
        let retries: u32 = self.operator_retries.values().sum();
        let mut stalled = format!(
            "stalled, then retried by the operator: {}",
            self.stalled_seen.len()
        );
        if retries as usize > self.stalled_seen.len() {
            stalled.push_str(&format!(" ({retries} retries: some stalled again)"));
        }
        lines.push(stalled);
        lines.push(format!("violations: {}", self.violations.len()));
        lines.push(format!("wall time: {:.1} s", self.wall_ms as f64 / 1_000.0));
        lines.join("\n")
    }

    /// The violations grouped by the invariant they break, each group with its count and
    /// its first `examples` lines: what a failed run shows first.
    pub fn violation_digest(&self, examples: usize) -> String {
        let mut groups: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
        for v in &self.violations {
            let kind = KINDS
                .iter()
                .position(|(_, marks)| marks.iter().any(|m| v.contains(m)))
                .unwrap_or(KINDS.len());
            groups.entry(kind).or_default().push(v);
        }
        let mut out = Vec::new();
        for (kind, lines) in groups {
            let name = KINDS.get(kind).map_or("other", |(name, _)| name);
            out.push(format!("{} × {name}:", lines.len()));
            out.extend(lines.iter().take(examples).map(|l| format!("    {l}")));
            if lines.len() > examples {
                out.push(format!("    ... and {} more", lines.len() - examples));
            }
        }
        out.join("\n")
    }

    /// The timeline in a readable form, in time order.
    pub fn describe_timeline(&self) -> Vec<String> {
        let mut events: Vec<&TimelineEvent> = self.timeline.iter().collect();
        events.sort_by_key(|e| e.at());
        let mut lines: Vec<String> = events.iter().map(|e| e.describe()).collect();
        for d in &self.deliveries {
            if let Some(f) = &d.fault {
                lines.push(format!(
                    "{} {}/{} #{} at the participant -> HTTP {}  [fault: {f}]",
                    d.call.gid, d.call.branch_id, d.call.op, d.call.attempt, d.status
                ));
            }
        }
        for h in &self.outage_hits {
            lines.push(format!(
                "{} {}/{} at the participant -> refused  [long outage {}]",
                h.gid, h.branch_id, h.op, h.outage
            ));
        }
        for outage in self.healed_at.keys() {
            lines.push(format!("long outage {outage} healed by the runner"));
        }
        lines
    }
}

/// The invariants a violation can break, each known by phrases of its lines.
const KINDS: &[(&str, &[&str])] = &[
    (
        "a coordinator row went back (an older write landed over a newer one)",
        &["went back"],
    ),
    (
        "a saga step called before the previous step answered success",
        &["was called (arrived"],
    ),
    (
        "a step called again by the coordinator process that saw it succeed",
        &["which called it again"],
    ),
    (
        "a coordinator running alone was fenced off, lost a lease or took over",
        &["was the only coordinator running"],
    ),
    (
        "an action a failed saga executed was never compensated",
        &["never compensated"],
    ),
    (
        "a failed call stored more than once",
        &["is in its history"],
    ),
    (
        "a failed call missing from its history",
        &["failed calls in its history, expected at least"],
    ),
    (
        "final rows that disagree with the transaction's outcome",
        &["succeeded, but its branch", "failed, but its step"],
    ),
    (
        "a transaction that did not end as expected",
        &[
            "not succeeded or failed",
            ": expected ",
            "did not settle",
            "could not finish",
        ],
    ),
];

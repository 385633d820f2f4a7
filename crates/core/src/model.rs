//! The data the state machines work on. Plain values: no I/O, no clock.
//!
//! [`Transaction`] (with `tokenless`, set when it was created through DTM's door without a
//! token), [`Branch`] and [`BranchKey`], and [`Access`]: which of a tenant's transactions a
//! request may act on. `Status`, `Action`, `Kind` and `TxOptions` come from `idem-types`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Payload;

// The alphabet of the state machine and the per-transaction options are shared with
// clients of the API (views they can parse), so they are defined in `idem-types`.
pub use idem_types::{
    Action, BranchStatus, DEFAULT_MAX_IN_PROGRESS_MS, Kind, Millis, Protocol, Status, TxOptions,
    UnknownName,
};

/// One branch operation: the unit the coordinator calls and records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    pub branch_id: Arc<str>,
    pub action: Action,
    /// Saga/msg: the step index. TCC: registration order.
    pub seq: i32,
    pub url: Arc<str>,
    /// What the participant receives: the body POSTed, or the gRPC request message.
    pub payload: Payload,
    pub status: BranchStatus,
    pub attempts: i32,
    /// Earliest time of the next call; `None` means as soon as it is due.
    pub next_attempt_at: Option<Millis>,
    pub last_error: Option<String>,
    /// When the participant first answered "in progress" in the current run of answers
    /// of that kind; cleared by any other answer.
    #[serde(default)]
    pub in_progress_since: Option<Millis>,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
}

impl Branch {
    pub fn new(
        branch_id: impl Into<Arc<str>>,
        action: Action,
        seq: i32,
        url: impl Into<Arc<str>>,
        payload: impl Into<Payload>,
        now: Millis,
    ) -> Branch {
        Branch {
            branch_id: branch_id.into(),
            action,
            seq,
            url: url.into(),
            payload: payload.into(),
            status: BranchStatus::Pending,
            attempts: 0,
            next_attempt_at: None,
            last_error: None,
            in_progress_since: None,
            updated_at: now,
            finished_at: None,
        }
    }

    pub fn key(&self) -> BranchKey {
        BranchKey {
            branch_id: self.branch_id.to_string(),
            action: self.action,
        }
    }

    fn is_due(&self, now: Millis) -> bool {
        self.status == BranchStatus::Pending && self.next_attempt_at.is_none_or(|at| at <= now)
    }
}

/// Identifies a branch operation inside one global transaction.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BranchKey {
    pub branch_id: String,
    pub action: Action,
}

impl fmt::Display for BranchKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.branch_id, self.action)
    }
}

/// A global transaction as the state machine sees it. Ownership (owner token, lease) and
/// the row version are storage concerns and live in the store, not here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transaction {
    pub gid: String,
    pub kind: Kind,
    pub status: Status,
    /// Set while `Stalled`: the status to resume.
    pub stalled_from: Option<Status>,
    pub options: TxOptions,
    /// Deadline of the global timeout, if any.
    pub timeout_at: Option<Millis>,
    /// Failed branch attempts so far, over all branches (the retry count users ask for).
    pub attempts: i32,
    /// Calls the coordinator made by itself (every call but a Try, which a client's
    /// request makes) since creation or the last operator's retry: what the call budget
    /// ([`super::Ctx::max_calls`]) counts.
    #[serde(default)]
    pub calls: i64,
    /// Records of calls that did not simply succeed, made in all (the newest one's
    /// number). The engine numbers them; the core does not look at them.
    #[serde(default)]
    pub history: i64,
    /// The oldest of those records that are deleted: numbers 1 to this one.
    #[serde(default)]
    pub history_dropped: i64,
    /// When the coordinator next has something to do; `None` when nothing is scheduled.
    pub next_attempt_at: Option<Millis>,
    pub last_error: Option<String>,
    /// Why it was aborted or failed (a failed step, a timeout, an abort request...).
    pub reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    /// In the order they are stored: saga steps by index, TCC by registration.
    pub branches: Vec<Branch>,
    /// The W3C trace context every branch call of this transaction continues; set once,
    /// when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
    /// Created through DTM's door without a token (`--dtm-tenant`): such callers may read
    /// and change only these. Set when it is created, never changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tokenless: bool,
}

/// Which of its tenant's transactions a request may read or change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Every one: a token's holder, or any caller when authentication is off.
    Tenant,
    /// Only those created the same way: a caller of DTM's door without a token, who must
    /// not see or touch what token holders of the same tenant created.
    Tokenless,
}

/// A W3C trace context as stored: `traceparent` in its version-00 form (55 characters)
/// and `tracestate` as received, both checked before they get here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    pub tracestate: Option<String>,
}

impl Transaction {
    /// A new TCC or msg transaction, prepared and waiting for branches or submit.
    pub fn prepared(
        gid: impl Into<String>,
        kind: Kind,
        options: TxOptions,
        now: Millis,
    ) -> Transaction {
        let timeout_at = options
            .timeout_ms
            .map(|t| now.saturating_add(Millis::try_from(t).unwrap_or(Millis::MAX)));
        Transaction {
            gid: gid.into(),
            kind,
            status: Status::Prepared,
            stalled_from: None,
            options,
            timeout_at,
            attempts: 0,
            calls: 0,
            history: 0,
            history_dropped: 0,
            next_attempt_at: timeout_at,
            last_error: None,
            reason: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
            branches: Vec::new(),
            trace: None,
            tokenless: false,
        }
    }

    /// Whether a request with `access` may read or change this transaction.
    pub fn admits(&self, access: Access) -> bool {
        match access {
            Access::Tenant => true,
            Access::Tokenless => self.tokenless,
        }
    }

    /// A new saga, submitted: its first steps are due at once.
    pub fn saga(
        gid: impl Into<String>,
        steps: Vec<SagaStep>,
        options: TxOptions,
        now: Millis,
    ) -> Transaction {
        let mut tx = Transaction::prepared(gid, Kind::Saga, options, now);
        tx.status = Status::Running;
        tx.next_attempt_at = Some(now);
        for (index, step) in steps.into_iter().enumerate() {
            // A step's two operations share its id and payload.
            let branch_id: Arc<str> = step_branch_id(index).into();
            let payload = step.payload;
            let seq = index as i32;
            tx.branches.push(Branch::new(
                Arc::clone(&branch_id),
                Action::Compensate,
                seq,
                step.compensate,
                payload.clone(),
                now,
            ));
            tx.branches.push(Branch::new(
                branch_id,
                Action::Action,
                seq,
                step.action,
                payload,
                now,
            ));
        }
        tx.sort_branches();
        tx
    }

    /// Puts the branches in their canonical order: by step or registration order, then
    /// branch id, then action name. Stores return them in this order too.
    pub fn sort_branches(&mut self) {
        sort_branches(&mut self.branches);
    }

    /// Adds newly registered branch operations.
    pub fn add_branches(&mut self, branches: impl IntoIterator<Item = Branch>) {
        self.branches.extend(branches);
        self.sort_branches();
    }

    pub fn branch(&self, key: &BranchKey) -> Option<&Branch> {
        self.branches
            .iter()
            .find(|b| b.action == key.action && *b.branch_id == *key.branch_id)
    }

    pub(crate) fn branch_mut(&mut self, key: &BranchKey) -> Option<&mut Branch> {
        self.branches
            .iter_mut()
            .find(|b| b.action == key.action && *b.branch_id == *key.branch_id)
    }

    pub(crate) fn branches_with(&self, action: Action) -> impl Iterator<Item = &Branch> {
        self.branches.iter().filter(move |b| b.action == action)
    }

    pub(crate) fn due(&self, action: Action, now: Millis) -> impl Iterator<Item = &Branch> {
        self.branches_with(action).filter(move |b| b.is_due(now))
    }

    /// Saga/msg: the step index of each step (`seq`), and for each step the steps it waits for.
    pub fn step_dependencies(&self) -> BTreeMap<i32, Vec<i32>> {
        let steps: Vec<i32> = self.branches_with(Action::Action).map(|b| b.seq).collect();
        steps
            .iter()
            .map(|&seq| {
                let deps = if self.options.concurrent {
                    self.options
                        .orders
                        .get(&(seq as usize))
                        .map(|d| d.iter().map(|&i| i as i32).collect())
                        .unwrap_or_default()
                } else if seq > 0 {
                    vec![seq - 1]
                } else {
                    Vec::new()
                };
                (seq, deps)
            })
            .collect()
    }
}

/// Sorts branch operations into their canonical order (see [`Transaction::sort_branches`]).
pub fn sort_branches(branches: &mut [Branch]) {
    branches.sort_by(|a, b| {
        (a.seq, &a.branch_id, a.action.as_str()).cmp(&(b.seq, &b.branch_id, b.action.as_str()))
    });
}

/// The branch id of saga/msg step `index` (0-based): `01`, `02`, ... as DTM numbers them.
pub fn step_branch_id(index: usize) -> String {
    format!("{:02}", index + 1)
}

/// One saga step as submitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaStep {
    pub action: String,
    pub compensate: String,
    pub payload: Payload,
}

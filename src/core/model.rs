//! The data the state machines work on. Plain values: no I/O, no clock.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch. Every timestamp in idem is one of these, so the
/// three databases store the same integer and the core never reads a clock.
pub type Millis = i64;

/// Which protocol a global transaction follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Try on every branch (by the caller), then Confirm all or Cancel all.
    Tcc,
    /// Ordered actions; on failure, compensations in reverse order.
    Saga,
    /// Two-phase message: prepared, then every action must succeed.
    Msg,
}

/// Status of a global transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// TCC: accepting branch registrations. Msg: waiting for the application's submit.
    Prepared,
    /// Saga: actions are being run forward.
    Running,
    /// TCC: the Confirm decision is stored; Confirms are being delivered. Msg: actions
    /// are being delivered (they must succeed).
    Committing,
    /// TCC: Cancels are being delivered. Saga: compensations are being delivered.
    Aborting,
    /// Terminal: every Confirm (or saga action, or msg action) succeeded.
    Succeeded,
    /// Terminal: every Cancel or compensation succeeded, or an operator force-stopped it.
    Failed,
    /// A must-succeed call exhausted its attempts. Nothing is called until an operator
    /// resumes it (`tx retry`); `stalled_from` remembers the phase to resume.
    Stalled,
}

impl Status {
    pub const ALL: [Status; 7] = [
        Status::Prepared,
        Status::Running,
        Status::Committing,
        Status::Aborting,
        Status::Succeeded,
        Status::Failed,
        Status::Stalled,
    ];

    /// Statuses in which the coordinator still has work to do by itself.
    pub const ACTIVE: [Status; 4] = [
        Status::Prepared,
        Status::Running,
        Status::Committing,
        Status::Aborting,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Prepared => "prepared",
            Status::Running => "running",
            Status::Committing => "committing",
            Status::Aborting => "aborting",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Stalled => "stalled",
        }
    }
}

/// What a branch operation does. Together with the gid and branch id it is the unique key
/// of a stored branch operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Try,
    Confirm,
    Cancel,
    /// Saga or msg forward step.
    Action,
    Compensate,
    /// Msg back-check: asks the application whether its local transaction committed.
    QueryPrepared,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Try => "try",
            Action::Confirm => "confirm",
            Action::Cancel => "cancel",
            Action::Action => "action",
            Action::Compensate => "compensate",
            Action::QueryPrepared => "query_prepared",
        }
    }

    /// The `op` query parameter sent to the participant (DTM's names).
    pub fn op(self) -> &'static str {
        match self {
            Action::QueryPrepared => "msg",
            other => other.as_str(),
        }
    }
}

/// Where one branch operation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchStatus {
    /// Not yet answered with success or a final failure.
    Pending,
    Succeeded,
    /// A final business failure (only a saga action, a Try or a msg back-check can fail).
    Failed,
    /// Will never be called: the compensation of a saga step that was never sent.
    Skipped,
    /// A call that must succeed used up its attempts (or stayed in progress past its
    /// cap): nothing calls it again until an operator retries the transaction, which
    /// makes it pending with fresh attempts.
    Stalled,
}

impl BranchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BranchStatus::Pending => "pending",
            BranchStatus::Succeeded => "succeeded",
            BranchStatus::Failed => "failed",
            BranchStatus::Skipped => "skipped",
            BranchStatus::Stalled => "stalled",
        }
    }

    /// Has its final answer (or will never be called). A stalled operation is not done:
    /// it waits for an operator.
    pub fn is_done(self) -> bool {
        matches!(
            self,
            BranchStatus::Succeeded | BranchStatus::Failed | BranchStatus::Skipped
        )
    }
}

macro_rules! str_enum {
    ($ty:ident, $what:literal, [$($variant:ident),+]) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $(if s == $ty::$variant.as_str() { return Ok($ty::$variant); })+
                Err(UnknownName { what: $what, name: s.to_owned() })
            }
        }
    };
}

/// A stored or submitted name that is not one of the known values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {name:?}")]
pub struct UnknownName {
    pub what: &'static str,
    pub name: String,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Tcc => "tcc",
            Kind::Saga => "saga",
            Kind::Msg => "msg",
        }
    }
}

str_enum!(Kind, "kind", [Tcc, Saga, Msg]);
str_enum!(
    Status,
    "status",
    [
        Prepared, Running, Committing, Aborting, Succeeded, Failed, Stalled
    ]
);
str_enum!(
    Action,
    "action",
    [Try, Confirm, Cancel, Action, Compensate, QueryPrepared]
);
str_enum!(
    BranchStatus,
    "branch status",
    [Pending, Succeeded, Failed, Skipped, Stalled]
);

/// How a participant's answer is read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Status codes only: 2xx success, 409 failure, 425 in progress, anything else unknown.
    #[default]
    Native,
    /// DTM's rules: additionally a body containing `FAILURE` is a failure and one
    /// containing `ONGOING` is in progress, whatever the status code.
    Dtm,
}

/// Per-transaction options, resolved against the server defaults when the transaction is
/// created and stored with it, so changing a server default never changes the rules of a
/// transaction already under way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxOptions {
    /// Timeout of one HTTP call to a participant.
    pub request_timeout_ms: u64,
    /// First retry delay; doubled after every failed attempt.
    pub retry_interval_ms: u64,
    /// Cap on the retry delay.
    pub max_retry_interval_ms: u64,
    /// Attempts per branch operation before giving up (saga action: compensate;
    /// Confirm/Cancel/compensation/msg action: stall).
    pub max_attempts: u32,
    /// The longest time one branch operation may keep answering "in progress" (425, or
    /// DTM's `ONGOING`), counted from its first such answer. Past it the call counts as
    /// an unknown result that used up its attempts: a saga action is compensated, a call
    /// that must succeed stalls.
    #[serde(default = "default_max_in_progress_ms")]
    pub max_in_progress_ms: u64,
    /// Global timeout, counted from creation: a TCC still prepared, a saga still running
    /// forward, or a msg not submitted by then is aborted (msg: checked back).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub protocol: Protocol,
    /// Extra headers sent with every branch call.
    #[serde(default)]
    pub branch_headers: BTreeMap<String, String>,
    /// Saga/msg: run steps concurrently, restricted by `orders`.
    #[serde(default)]
    pub concurrent: bool,
    /// Saga with `concurrent`: step index -> indexes of the steps it waits for.
    #[serde(default)]
    pub orders: BTreeMap<usize, Vec<usize>>,
}

/// One hour: a step may be slow, but not silently forever.
pub const DEFAULT_MAX_IN_PROGRESS_MS: u64 = 3_600_000;

fn default_max_in_progress_ms() -> u64 {
    DEFAULT_MAX_IN_PROGRESS_MS
}

impl Default for TxOptions {
    fn default() -> Self {
        TxOptions {
            request_timeout_ms: 5_000,
            retry_interval_ms: 1_000,
            max_retry_interval_ms: 60_000,
            max_attempts: 12,
            max_in_progress_ms: DEFAULT_MAX_IN_PROGRESS_MS,
            timeout_ms: None,
            protocol: Protocol::Native,
            branch_headers: BTreeMap::new(),
            concurrent: false,
            orders: BTreeMap::new(),
        }
    }
}

/// One branch operation: the unit the coordinator calls and records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    pub branch_id: String,
    pub action: Action,
    /// Saga/msg: the step index. TCC: registration order.
    pub seq: i32,
    pub url: String,
    /// The raw body POSTed to the participant.
    pub payload: String,
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
        branch_id: impl Into<String>,
        action: Action,
        seq: i32,
        url: impl Into<String>,
        payload: impl Into<String>,
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
            branch_id: self.branch_id.clone(),
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
            next_attempt_at: timeout_at,
            last_error: None,
            reason: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
            branches: Vec::new(),
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
            let branch_id = step_branch_id(index);
            let seq = index as i32;
            tx.branches.push(Branch::new(
                &branch_id,
                Action::Compensate,
                seq,
                step.compensate,
                step.payload.clone(),
                now,
            ));
            tx.branches.push(Branch::new(
                &branch_id,
                Action::Action,
                seq,
                step.action,
                step.payload,
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
            .find(|b| b.action == key.action && b.branch_id == key.branch_id)
    }

    pub(crate) fn branch_mut(&mut self, key: &BranchKey) -> Option<&mut Branch> {
        self.branches
            .iter_mut()
            .find(|b| b.action == key.action && b.branch_id == key.branch_id)
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
    pub payload: String,
}

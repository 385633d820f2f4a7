//! The types idem's coordinator and its clients share: the statuses, kinds and actions
//! of global transactions and branch operations, the per-transaction options, and the
//! API's answers (views and error bodies). The
//! coordinator's core works on them; `idem-client` parses the API's answers into them.
//! Plain data: serde and nothing else, so any client can depend on it.

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod views;

pub use views::{
    AttemptPageView, AttemptRecord, BranchView, ErrorBody, ErrorView, PageView, PayloadEncoding,
    TxView,
};

/// The tenant of requests that carry no token, and of every transaction (and participant
/// row) stored before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name, in bytes (its characters are ASCII).
pub const MAX_TENANT_LEN: usize = 32;

/// Longest gid or branch id, in bytes: the store's `VARCHAR(128)` columns.
pub const MAX_ID_LEN: usize = 128;

/// Whether `name` is a tenant name: 1 to [`MAX_TENANT_LEN`] characters of `a-z 0-9 _ -`.
/// The coordinator gives tenants no other names, and participants key their rows by them.
pub fn is_tenant_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TENANT_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'))
}

/// Milliseconds since the Unix epoch. Every timestamp in idem is one of these, so the
/// three databases store the same integer and the core never reads a clock.
pub type Millis = i64;

/// Which protocol a global transaction follows.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// Every status.
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

    /// Succeeded or failed: nothing more will happen.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Failed)
    }

    /// The name in the API and the database.
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// TCC phase one, called by the application.
    Try,
    /// TCC phase two after a commit decision.
    Confirm,
    /// TCC phase two after an abort decision.
    Cancel,
    /// Saga or msg forward step.
    Action,
    /// Saga or msg: undoes a forward step.
    Compensate,
    /// Msg back-check: asks the application whether its local transaction committed.
    QueryPrepared,
}

impl Action {
    /// The name in the API and the database.
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BranchStatus {
    /// Not yet answered with success or a final failure.
    Pending,
    /// The call succeeded.
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
    /// The name in the API and the database.
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
    /// What kind of value it was meant to be.
    pub what: &'static str,
    /// The name given.
    pub name: String,
}

impl Kind {
    /// The name in the API and the database.
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// How the participants' answers are read.
    pub protocol: Protocol,
    /// Extra headers sent with every branch call.
    #[serde(default)]
    pub branch_headers: BTreeMap<String, String>,
    /// Saga/msg: run steps concurrently, restricted by `orders`.
    #[serde(default)]
    pub concurrent: bool,
    /// Saga with `concurrent`: step index -> indexes of the steps it waits for.
    #[serde(default)]
    // JSON object keys are strings: the index is written as one.
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, Vec<usize>>))]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_same_in_json_and_as_strings() {
        for status in Status::ALL {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{}\"", status.as_str()));
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
            assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
        }
        assert_eq!(
            "nope".parse::<Status>(),
            Err(UnknownName {
                what: "status",
                name: "nope".into()
            })
        );
    }

    #[test]
    fn options_stored_before_a_field_existed_still_parse() {
        let old = r#"{"request_timeout_ms":1,"retry_interval_ms":2,"max_retry_interval_ms":3,"max_attempts":4}"#;
        let options: TxOptions = serde_json::from_str(old).unwrap();
        assert_eq!(options.max_in_progress_ms, DEFAULT_MAX_IN_PROGRESS_MS);
        assert_eq!(options.protocol, Protocol::Native);
    }
}

//! The vocabulary of a guarded call: its protocol, its op, what became of it, and the
//! checks on the names that make up its key.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The table the barrier uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idem_barrier";

/// Longest gid and branch id accepted, in characters; the barrier table's columns are this
/// wide, and so are the coordinator's.
pub const MAX_ID_LEN: usize = 128;

/// The protocol of the global transaction a call belongs to (`trans_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransType {
    /// Try-Confirm-Cancel.
    Tcc,
    /// Actions with compensations.
    Saga,
    /// A two-phase message.
    Msg,
}

impl TransType {
    /// The name in callbacks and the barrier table.
    pub fn as_str(self) -> &'static str {
        match self {
            TransType::Tcc => "tcc",
            TransType::Saga => "saga",
            TransType::Msg => "msg",
        }
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<TransType> {
        match s {
            "tcc" => Some(TransType::Tcc),
            "saga" => Some(TransType::Saga),
            "msg" => Some(TransType::Msg),
            _ => None,
        }
    }

    /// Whether `op` belongs to this protocol: a `cancel` in a saga is a caller bug, and
    /// guarding it would write barrier rows no real call ever matches.
    pub fn allows(self, op: Op) -> bool {
        matches!(
            (self, op),
            (TransType::Tcc, Op::Try | Op::Confirm | Op::Cancel)
                | (TransType::Saga, Op::Action | Op::Compensate)
                | (TransType::Msg, Op::Action | Op::Msg)
        )
    }
}

impl fmt::Display for TransType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation the coordinator asks for (`op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// TCC phase one.
    Try,
    /// TCC phase two after a commit.
    Confirm,
    /// TCC phase two after an abort.
    Cancel,
    /// A saga or msg forward step.
    Action,
    /// A saga step's undo.
    Compensate,
    /// DTM's name for the local transaction of a two-phase message, and for the
    /// coordinator's check whether it committed (see [`crate::query_prepared`]).
    Msg,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 6] = [
        Op::Try,
        Op::Confirm,
        Op::Cancel,
        Op::Action,
        Op::Compensate,
        Op::Msg,
    ];

    /// The name in callbacks and the barrier table.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Try => "try",
            Op::Confirm => "confirm",
            Op::Cancel => "cancel",
            Op::Action => "action",
            Op::Compensate => "compensate",
            Op::Msg => "msg",
        }
    }

    /// The operation named `s`, if any.
    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == s)
    }

    /// The forward op this op undoes: Cancel undoes Try, compensate undoes action.
    pub fn origin(self) -> Option<Op> {
        match self {
            Op::Cancel => Some(Op::Try),
            Op::Compensate => Some(Op::Action),
            _ => None,
        }
    }

    /// The forward op that must have run (and committed) before this one may run: a TCC
    /// Confirm needs its Try. Nothing else has one: a compensation before its forward op
    /// is an empty rollback instead, and an action or msg starts its branch.
    pub fn prerequisite(self) -> Option<Op> {
        match self {
            Op::Confirm => Some(Op::Try),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A callback that cannot name a barrier: a parameter is missing, unknown or too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCall {
    #[error("missing query parameter `{0}`")]
    /// A required parameter is absent.
    Missing(&'static str),
    #[error("invalid query parameter `{param}`: {reason}")]
    /// A parameter is unknown or too long.
    Invalid {
        /// The parameter.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// What happened to a guarded step. Every variant but [`Outcome::Rejected`] is a success
/// for the coordinator.
///
/// A TCC Confirm whose Try has not committed has no outcome: it is the error
/// [`ParticipantError::ConfirmWithoutTry`](crate::ParticipantError::ConfirmWithoutTry),
/// because nothing of it may commit, not even its own barrier row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The closure ran in this call; its result is stored and committed with it.
    Executed(T),
    /// An earlier call already ran this step; this is its stored result. The closure did
    /// not run.
    Duplicate(T),
    /// A Cancel or compensate whose Try or action never ran (or a repeat of one). Nothing
    /// to undo; recorded so that the late forward call is rejected. The closure did not run.
    EmptyRollback,
    /// A Try or action (or msg) arriving after its Cancel or compensate already ran. The
    /// closure did not run, and the marker stays, so a retried late call is rejected
    /// again. Answered with 409 so the coordinator does not retry it.
    Rejected,
}

impl<T> Outcome<T> {
    /// True unless the call was rejected.
    pub fn is_success(&self) -> bool {
        !matches!(self, Outcome::Rejected)
    }

    /// The step's result, first-time or stored.
    pub fn result(&self) -> Option<&T> {
        match self {
            Outcome::Executed(t) | Outcome::Duplicate(t) => Some(t),
            Outcome::EmptyRollback | Outcome::Rejected => None,
        }
    }

    /// The step's result: `None` for an empty rollback or a rejected step.
    pub fn into_result(self) -> Option<T> {
        match self {
            Outcome::Executed(t) | Outcome::Duplicate(t) => Some(t),
            Outcome::EmptyRollback | Outcome::Rejected => None,
        }
    }

    /// A stable name for logs and response bodies.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Executed(_) => "executed",
            Outcome::Duplicate(_) => "duplicate",
            Outcome::EmptyRollback => "empty_rollback",
            Outcome::Rejected => "rejected",
        }
    }

    /// The same outcome with its result mapped.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Executed(t) => Outcome::Executed(f(t)),
            Outcome::Duplicate(t) => Outcome::Duplicate(f(t)),
            Outcome::EmptyRollback => Outcome::EmptyRollback,
            Outcome::Rejected => Outcome::Rejected,
        }
    }
}

/// How often [`Barrier::run`](super::Barrier::run) re-runs a local transaction that lost a
/// lock conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each time, up to `max_delay`, with jitter.
    pub base_delay: Duration,
    /// Cap on the delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 20,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt number `attempt` (1-based). `unit` in [0, 1) picks the
    /// point in the upper half of the exponential window: the jitter keeps two transactions
    /// that deadlocked each other from colliding again in lockstep.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let capped = exp.min(self.max_delay);
        capped.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// A random number in [0, 1) without a dependency: the standard library seeds each
/// `RandomState` from the OS.
pub(crate) fn jitter_unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// The branch id of a two-phase message's local transaction (DTM's convention).
pub const MSG_BRANCH_ID: &str = "00";

/// Checks a gid or branch id: non-empty, at most [`MAX_ID_LEN`] characters, no control
/// characters (they would end up in logs and URLs).
pub(crate) fn check_id(param: &'static str, value: &str) -> Result<(), InvalidCall> {
    if value.is_empty() {
        return Err(InvalidCall::Missing(param));
    }
    if value.chars().count() > MAX_ID_LEN {
        return Err(InvalidCall::Invalid {
            param,
            reason: format!("longer than {MAX_ID_LEN} characters"),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidCall::Invalid {
            param,
            reason: "contains control characters".into(),
        });
    }
    Ok(())
}

/// Checks a barrier table name: a plain SQL identifier, because it is spliced into SQL text.
pub fn check_table_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "barrier table name `{name}` must be a plain identifier: [A-Za-z_][A-Za-z0-9_]*, at most 48 characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_know_their_origin() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(op));
        }
        assert_eq!(Op::parse("rollback"), None);
        assert_eq!(Op::Cancel.origin(), Some(Op::Try));
        assert_eq!(Op::Compensate.origin(), Some(Op::Action));
        assert_eq!(Op::Try.origin(), None);
        assert_eq!(Op::Confirm.origin(), None);
        assert_eq!(Op::Msg.origin(), None);
        assert_eq!(Op::Confirm.prerequisite(), Some(Op::Try));
        for op in [Op::Try, Op::Cancel, Op::Action, Op::Compensate, Op::Msg] {
            assert_eq!(op.prerequisite(), None, "{op}");
        }
    }

    #[test]
    fn trans_types_allow_their_own_ops_only() {
        assert!(TransType::Tcc.allows(Op::Try));
        assert!(TransType::Tcc.allows(Op::Cancel));
        assert!(!TransType::Tcc.allows(Op::Action));
        assert!(TransType::Saga.allows(Op::Compensate));
        assert!(!TransType::Saga.allows(Op::Confirm));
        assert!(TransType::Msg.allows(Op::Msg));
        assert!(TransType::Msg.allows(Op::Action));
        assert!(!TransType::Msg.allows(Op::Compensate));
        assert_eq!(TransType::parse("saga"), Some(TransType::Saga));
        assert_eq!(TransType::parse("xa"), None);
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_table_name("idem_barrier").is_ok());
        assert!(check_table_name("_b2").is_ok());
        assert!(check_table_name("").is_err());
        assert!(check_table_name("2b").is_err());
        assert!(check_table_name("dtm.barrier").is_err());
        assert!(check_table_name("b; DROP TABLE x").is_err());
        assert!(check_table_name(&"b".repeat(49)).is_err());
    }

    #[test]
    fn outcome_accessors() {
        assert_eq!(Outcome::Executed(3).result(), Some(&3));
        assert_eq!(Outcome::Duplicate(3).into_result(), Some(3));
        assert_eq!(Outcome::<i32>::EmptyRollback.result(), None);
        assert!(Outcome::<i32>::EmptyRollback.is_success());
        assert!(!Outcome::<i32>::Rejected.is_success());
        assert_eq!(Outcome::Executed(2).map(|x| x * 2), Outcome::Executed(4));
        assert_eq!(Outcome::<i32>::Rejected.kind(), "rejected");
    }

    #[test]
    fn retry_delay_grows_caps_and_jitters() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(50),
        };
        assert!(p.delay(1, 0.999_999).as_micros() >= 1999);
        assert!(p.delay(1, 1.0) <= Duration::from_millis(2));
        assert_eq!(p.delay(1, 0.0), Duration::from_millis(1));
        assert_eq!(p.delay(3, 0.0), Duration::from_millis(4));
        assert_eq!(p.delay(30, 0.0), Duration::from_millis(25));
        assert!(p.delay(30, 1.0) <= Duration::from_millis(50));
        let u = jitter_unit();
        assert!((0.0..1.0).contains(&u));
    }
}

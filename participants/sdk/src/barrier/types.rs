//! What became of a guarded step, and the barrier's default table.

/// The table the barrier uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idem_barrier";

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

#[cfg(test)]
mod tests {
    use super::*;

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
}

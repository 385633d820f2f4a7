//! The barrier table's rows: inserting one if absent, recording how a step ended, reading
//! one back, what an existing row means to the op that collided with it, and what a
//! Confirm's Try row means to the Confirm.

use crate::backend::{Arg, BarrierDatabase};
use crate::error::ParticipantError;
use crate::kit::local::{exec, fetch_texts};
use crate::kit::{LocalTx, Op};
use idem_sql::Backend;

use super::Barrier;

/// The values of the `outcome` column.
pub(super) mod outcome_col {
    /// Only ever visible inside the transaction that inserted the row: it is overwritten
    /// with `executed` before commit, or rolled back with the failing step.
    pub const RUNNING: &str = "running";
    pub const EXECUTED: &str = "executed";
    pub const EMPTY_ROLLBACK: &str = "empty_rollback";
    /// A forward op's row inserted by its compensation, to reject the late forward call.
    pub const GUARD: &str = "guard";
    /// Lease mode only (`lease.rs`): a committed claim whose external call has not been
    /// recorded yet; `owner_token` and `lease_until_ms` say who holds it and until when.
    pub const PROCESSING: &str = "processing";
}

/// What an existing row of this op means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Existing {
    Rejected,
    EmptyRollback,
    /// The stored first result, JSON.
    Duplicate(String),
    /// A lease-mode claim still open: the step's external call may be under way.
    Processing,
    Corrupt(String),
}

/// Reads the row that blocked this op's insert. Pure, so every case is unit-tested.
pub(crate) fn interpret_existing(
    op: Op,
    reason: &str,
    outcome: &str,
    result: Option<&str>,
) -> Existing {
    if reason != op.as_str() {
        // Someone else's call wrote this op's row: the compensation's guard.
        return match op {
            Op::Try | Op::Action | Op::Msg => Existing::Rejected,
            _ => Existing::Corrupt(format!(
                "the {op} row was inserted by a `{reason}` call, which only happens for forward ops"
            )),
        };
    }
    match (outcome, result) {
        (outcome_col::EXECUTED, Some(json)) => Existing::Duplicate(json.to_owned()),
        (outcome_col::EXECUTED, None) => Existing::Corrupt("executed step without a stored result".into()),
        (outcome_col::EMPTY_ROLLBACK, _) => Existing::EmptyRollback,
        (outcome_col::PROCESSING, _) => Existing::Processing,
        (outcome_col::RUNNING, _) => Existing::Corrupt(
            "a committed barrier row is still `running`: a transaction whose step failed was committed \
             (with `run_in`, roll back when it returns an error)"
                .into(),
        ),
        (other, _) => Existing::Corrupt(format!("unknown barrier outcome `{other}`")),
    }
}

/// What the row of an op's prerequisite (a Confirm's Try) says about running the op.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Prerequisite {
    /// It executed and committed: the op may run.
    Ran,
    /// No committed row: the Try has not run, or has not committed yet.
    Missing,
    /// The guard its compensation inserted: the Cancel ran first, and the Try never will.
    Guarded,
    /// Any other row; a correct run never commits one (see [`interpret_existing`]).
    Unexpected(String),
}

/// Reads the (reason, outcome) of the `prerequisite` op's row, if there is one. Pure, so
/// every case is unit-tested.
pub(crate) fn interpret_prerequisite(prerequisite: Op, row: Option<(&str, &str)>) -> Prerequisite {
    match row {
        None => Prerequisite::Missing,
        Some((reason, outcome_col::EXECUTED)) if reason == prerequisite.as_str() => {
            Prerequisite::Ran
        }
        Some((reason, outcome_col::GUARD)) if reason != prerequisite.as_str() => {
            Prerequisite::Guarded
        }
        // A lease-mode Try whose external call is not recorded yet: not run, as far as
        // a Confirm may know; a retry goes through once it is.
        Some((reason, outcome_col::PROCESSING)) if reason == prerequisite.as_str() => {
            Prerequisite::Missing
        }
        Some((reason, outcome)) => Prerequisite::Unexpected(format!(
            "its {prerequisite} row was left by a `{reason}` call as `{outcome}`"
        )),
    }
}

/// The barrier table's unique key, in the order of [`key_args`].
pub(crate) const KEY_COLUMNS: &str = "tenant, gid, branch_id, op, barrier_id";

/// The `WHERE` that names one row by [`KEY_COLUMNS`], bound by [`key_args`].
pub(crate) const KEY_WHERE: &str =
    "tenant = ? AND gid = ? AND branch_id = ? AND op = ? AND barrier_id = ?";

/// The values of [`KEY_COLUMNS`] for `barrier`'s row of `op` (its own op, or the op it
/// undoes or needs).
pub(crate) fn key_args(barrier: &Barrier, op: Op) -> Vec<Arg> {
    let call = barrier.call();
    vec![
        Arg::Text(call.tenant().to_owned()),
        Arg::Text(call.gid().to_owned()),
        Arg::Text(call.branch_id().to_owned()),
        Arg::Text(op.as_str().into()),
        Arg::Text(barrier.barrier_id()),
    ]
}

/// Inserts the barrier row of `op` unless it exists; true when this call inserted it.
pub(crate) async fn insert_if_absent<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    barrier: &Barrier,
    op: Op,
    reason: &str,
    outcome: &str,
) -> Result<bool, ParticipantError> {
    let columns =
        format!("(trans_type, {KEY_COLUMNS}, reason, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    let mut args = vec![Arg::Text(barrier.call().trans_type().as_str().into())];
    args.extend(key_args(barrier, op));
    args.push(Arg::Text(reason.into()));
    args.push(Arg::Text(outcome.into()));
    crate::kit::insert_if_absent(tx, barrier.table(), &columns, KEY_COLUMNS, args).await
}

/// Records how this call's own row ended (it was inserted as `running`).
pub(super) async fn set_outcome<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    barrier: &Barrier,
    outcome: &str,
    result: Option<String>,
) -> Result<(), ParticipantError> {
    let sql = format!(
        "UPDATE {} SET outcome = ?, result = ? WHERE {KEY_WHERE}",
        barrier.table()
    );
    let mut args = vec![Arg::Text(outcome.into()), Arg::OptText(result)];
    args.extend(key_args(barrier, barrier.call().op()));
    let updated = exec(tx, &sql, args).await?;
    if updated != 1 {
        return Err(ParticipantError::internal(format!(
            "recording the outcome updated {updated} barrier rows, expected 1"
        )));
    }
    Ok(())
}

/// How [`fetch_row`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// The row that just blocked this call's insert: it exists.
    Collided,
    /// A row that may not exist (a Confirm looking for its Try's): never a locking read.
    Plain,
}

/// Reads (reason, outcome, result) of the barrier row of `op`.
pub(crate) async fn fetch_row<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    barrier: &Barrier,
    op: Op,
    read: Read,
) -> Result<Option<(String, String, Option<String>)>, ParticipantError> {
    // On InnoDB a plain SELECT reads the transaction's snapshot, which can predate the
    // commit of the row that just blocked the insert (when the caller read something
    // earlier in the transaction). A locking read sees the latest committed row; the row
    // exists (the insert just collided with it) and the duplicate-key check already holds a
    // shared lock on it, so this locks nothing new. On a row that may be missing, a locking
    // read would lock the gap where it would go instead, so `Read::Plain` never locks.
    let lock = match (tx.dialect(), read) {
        (Backend::Mysql, Read::Collided) => " LOCK IN SHARE MODE",
        _ => "",
    };
    let sql = format!(
        "SELECT reason, outcome, result FROM {} WHERE {KEY_WHERE}{lock}",
        barrier.table()
    );
    let rows = fetch_texts(tx, &sql, key_args(barrier, op), 3).await?;
    Ok(rows.into_iter().next().map(|mut cols| {
        let result = cols.pop().flatten();
        let outcome = cols.pop().flatten().unwrap_or_default();
        let reason = cols.pop().flatten().unwrap_or_default();
        (reason, outcome, result)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_confirm_runs_only_after_an_executed_try() {
        use Prerequisite::*;
        assert_eq!(
            interpret_prerequisite(Op::Try, Some(("try", "executed"))),
            Ran
        );
        assert_eq!(interpret_prerequisite(Op::Try, None), Missing);
        assert_eq!(
            interpret_prerequisite(Op::Try, Some(("try", "processing"))),
            Missing
        );
        // The guard an empty rollback left.
        assert_eq!(
            interpret_prerequisite(Op::Try, Some(("cancel", "guard"))),
            Guarded
        );
        // Rows a correct run never commits are no licence to confirm either.
        for row in [
            ("try", "running"),
            ("try", "empty_rollback"),
            ("try", "guard"),
            ("cancel", "executed"),
            ("try", "weird"),
        ] {
            assert!(
                matches!(interpret_prerequisite(Op::Try, Some(row)), Unexpected(_)),
                "{row:?}"
            );
        }
    }

    #[test]
    fn existing_rows_are_interpreted() {
        use Existing::*;
        // A late Try finds the guard its Cancel left.
        assert_eq!(
            interpret_existing(Op::Try, "cancel", "guard", None),
            Rejected
        );
        assert_eq!(
            interpret_existing(Op::Action, "compensate", "guard", None),
            Rejected
        );
        assert_eq!(
            interpret_existing(Op::Msg, "rollback", "guard", None),
            Rejected
        );
        // Duplicates get the first result back.
        assert_eq!(
            interpret_existing(Op::Try, "try", "executed", Some("{\"n\":1}")),
            Duplicate("{\"n\":1}".into())
        );
        assert_eq!(
            interpret_existing(Op::Cancel, "cancel", "executed", Some("null")),
            Duplicate("null".into())
        );
        assert_eq!(
            interpret_existing(Op::Cancel, "cancel", "empty_rollback", None),
            EmptyRollback
        );
        assert_eq!(
            interpret_existing(Op::Try, "try", "processing", None),
            Processing
        );
        // States that a correct run never commits.
        assert!(matches!(
            interpret_existing(Op::Try, "try", "running", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Try, "try", "executed", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Cancel, "try", "guard", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Try, "try", "weird", Some("1")),
            Corrupt(_)
        ));
    }
}

//! Lease mode's statements on the barrier table: the claim, the conditional writes that
//! name the owner token (each followed by the read that decides), the compensation's guard,
//! and the upgrade of tables created before lease mode.

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::barrier::rows::{
    Existing, KEY_COLUMNS, insert_if_absent, interpret_existing, outcome_col,
};
pub(super) use crate::barrier::rows::{KEY_WHERE, key_args};
use crate::barrier::{Barrier, DEFAULT_TABLE, Outcome};
use crate::error::ParticipantError;
use crate::kit::Op;
use crate::kit::local::{LocalTx, exec, fetch};

/// The row as lease mode reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct RowView {
    pub(super) reason: String,
    pub(super) outcome: String,
    pub(super) result: Option<String>,
    pub(super) owner_token: Option<String>,
    pub(super) lease_until_ms: Option<i64>,
}

/// What a row found by a claim means, before any fact source is asked.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decision {
    Settled(Existing),
    Live,
    Expired { token: String },
}

/// Pure, so that every case is unit-tested.
pub(super) fn decide(op: Op, row: &RowView, now_ms: i64) -> Decision {
    match interpret_existing(op, &row.reason, &row.outcome, row.result.as_deref()) {
        Existing::Processing => match (&row.owner_token, row.lease_until_ms) {
            (Some(token), Some(until)) if until <= now_ms => Decision::Expired {
                token: token.clone(),
            },
            (Some(_), Some(_)) => Decision::Live,
            _ => Decision::Settled(Existing::Corrupt(
                "a processing barrier row without an owner token or lease".into(),
            )),
        },
        other => Decision::Settled(other),
    }
}

pub(super) fn settled<T: DeserializeOwned>(
    existing: Existing,
    what: &str,
) -> Result<Outcome<T>, ParticipantError> {
    match existing {
        Existing::Rejected => Ok(Outcome::Rejected),
        Existing::EmptyRollback => Ok(Outcome::EmptyRollback),
        Existing::Duplicate(json) => serde_json::from_str(&json).map(Outcome::Duplicate).map_err(
            |e| {
                ParticipantError::internal(format!(
                    "the stored result of {what} does not decode as this step's result type: {e}"
                ))
            },
        ),
        Existing::Processing => Err(ParticipantError::in_progress(format!(
            "{what} is claimed by a call still in progress"
        ))),
        Existing::Corrupt(why) => Err(ParticipantError::internal(why)),
    }
}

pub(super) const ROW_KINDS: &[CellKind] = &[
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Int,
];

/// Reads the row of `op`. Always the first read of its transaction, and every row it can
/// find is committed (an insert that collided waited for the other writer), so a plain read
/// sees the latest state on every backend: no locking read, which on InnoDB would lock a gap
/// when the row is gone.
pub(super) async fn read_row<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    b: &Barrier,
    op: Op,
) -> Result<Option<RowView>, ParticipantError> {
    let sql = format!(
        "SELECT reason, outcome, result, owner_token, lease_until_ms FROM {} WHERE {KEY_WHERE}",
        b.table
    );
    let rows = fetch(tx, &sql, key_args(b, op), ROW_KINDS).await?;
    Ok(rows.into_iter().next().map(|cells| {
        let text = |i: usize| cells.get(i).and_then(Cell::text).map(str::to_owned);
        RowView {
            reason: text(0).unwrap_or_default(),
            outcome: text(1).unwrap_or_default(),
            result: text(2),
            owner_token: text(3),
            lease_until_ms: cells.get(4).and_then(Cell::int),
        }
    }))
}

/// Inserts the claim unless the row exists; `None` when this call inserted it, else the row.
pub(super) async fn claim_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    token: &str,
    until: i64,
) -> Result<Option<RowView>, ParticipantError> {
    let columns = format!(
        "(trans_type, {KEY_COLUMNS}, reason, outcome, owner_token, lease_until_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    );
    let mut args = vec![Arg::Text(b.call().trans_type().as_str().into())];
    args.extend(key_args(b, b.call().op()));
    args.extend([
        Arg::Text(b.call().op().as_str().into()),
        Arg::Text(outcome_col::PROCESSING.into()),
        Arg::Text(token.into()),
        Arg::Int(until),
    ]);
    let inserted = crate::kit::insert_if_absent(&tx, &b.table, &columns, KEY_COLUMNS, args).await?;
    if inserted {
        return Ok(None);
    }
    match read_row(&tx, b, b.call().op()).await? {
        Some(row) => Ok(Some(row)),
        None => Err(ParticipantError::transient(
            "the barrier row that blocked this claim disappeared; retry",
        )),
    }
}

/// `UPDATE <table> SET <set> WHERE <key of op> AND outcome = 'processing' AND owner_token =
/// expected <extra>`, then reads the row: the read, not the count, says what happened.
pub(super) async fn conditional_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    op: Op,
    set: &str,
    mut args: Vec<Arg>,
    expected: &str,
    expired_at: Option<i64>,
) -> Result<Option<RowView>, ParticipantError> {
    let extra = if expired_at.is_some() {
        " AND lease_until_ms <= ?"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE {} SET {set} WHERE {KEY_WHERE} AND outcome = ? AND owner_token = ?{extra}",
        b.table
    );
    args.extend(key_args(b, op));
    args.push(Arg::Text(outcome_col::PROCESSING.into()));
    args.push(Arg::Text(expected.into()));
    if let Some(now) = expired_at {
        args.push(Arg::Int(now));
    }
    exec(&tx, &sql, args).await?;
    read_row(&tx, b, op).await
}

pub(super) fn record_set() -> &'static str {
    "outcome = ?, result = ?, owner_token = ?, lease_until_ms = NULL"
}

pub(super) fn record_args(json: String, token: &str) -> Vec<Arg> {
    vec![
        Arg::Text(outcome_col::EXECUTED.into()),
        Arg::OptText(Some(json)),
        Arg::Text(token.into()),
    ]
}

pub(super) fn to_json<T: Serialize>(value: &T) -> Result<String, ParticipantError> {
    serde_json::to_string(value)
        .map_err(|e| ParticipantError::internal(format!("cannot store the step's result: {e}")))
}

pub(super) fn is_executed_by(row: &Option<RowView>, token: &str) -> bool {
    row.as_ref().is_some_and(|r| {
        r.outcome == outcome_col::EXECUTED && r.owner_token.as_deref() == Some(token)
    })
}

/// The empty rollback of a compensation whose forward step's expired claim did not happen:
/// the compensation's own row first (the order the ordinary barrier inserts in, so that
/// InnoDB locks are taken in one order), then the forward row turned into its guard.
pub(super) async fn guard_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    origin: Op,
    old: &str,
    now: i64,
) -> Result<(), ParticipantError> {
    let op = b.call().op();
    insert_if_absent(&tx, b, op, op.as_str(), outcome_col::EMPTY_ROLLBACK).await?;
    let set = "reason = ?, outcome = ?, result = NULL, owner_token = NULL, lease_until_ms = NULL";
    let args = vec![
        Arg::Text(b.call().op().as_str().into()),
        Arg::Text(outcome_col::GUARD.into()),
    ];
    let row = conditional_tx(tx.clone(), b, origin, set, args, old, Some(now)).await?;
    let guarded = row
        .as_ref()
        .is_some_and(|r| r.outcome == outcome_col::GUARD && r.reason == b.call().op().as_str());
    if guarded {
        tracing::info!(tenant = %b.call().tenant(), gid = %b.call().gid(), branch_id = %b.call().branch_id(), op = %b.call().op(),
            "empty rollback: the fact source says the expired {origin} never took effect");
        Ok(())
    } else {
        // The stale owner recorded its result first: roll our row back, let the rerun
        // compensate what did happen.
        Err(ParticipantError::in_progress(format!(
            "the {origin} of {}/{} settled while its compensation was deciding",
            b.call().gid(),
            b.call().branch_id()
        )))
    }
}

/// Adds the lease columns to a barrier table created before them (the scripts
/// `sql/barrier_lease.*.sql`), the first forward step of
/// [`crate::barrier::schema::upgrade_barrier_table`]. Safe to run again: an existing column is
/// skipped.
pub(crate) async fn add_lease_columns<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    crate::kit::run_forward_step(
        pool,
        include_str!("../../../sql/barrier_lease.sqlite.sql"),
        include_str!("../../../sql/barrier_lease.postgres.sql"),
        include_str!("../../../sql/barrier_lease.mysql.sql"),
        |statement| statement.replace(DEFAULT_TABLE, table),
    )
    .await
}

/// Brings a barrier table made by an older SDK to the current shape: the lease columns, then
/// the tenant key. The name it had when lease mode was the only change; it now does all of
/// [`crate::barrier::schema::upgrade_barrier_table`], which is safe to run again.
pub async fn upgrade_barrier_table_for_lease<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    crate::barrier::schema::upgrade_barrier_table(pool, table).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(reason: &str, outcome: &str, token: Option<&str>, until: Option<i64>) -> RowView {
        RowView {
            reason: reason.into(),
            outcome: outcome.into(),
            result: (outcome == "executed").then(|| "7".to_owned()),
            owner_token: token.map(str::to_owned),
            lease_until_ms: until,
        }
    }

    #[test]
    fn a_claim_is_live_until_its_lease_ends_then_expired() {
        let r = row("try", "processing", Some("t1"), Some(1_000));
        assert_eq!(decide(Op::Try, &r, 999), Decision::Live);
        assert_eq!(
            decide(Op::Try, &r, 1_000),
            Decision::Expired { token: "t1".into() }
        );
        assert!(matches!(
            decide(Op::Try, &row("try", "processing", None, Some(1)), 5),
            Decision::Settled(Existing::Corrupt(_))
        ));
        assert_eq!(
            decide(Op::Try, &row("try", "executed", Some("t1"), None), 5),
            Decision::Settled(Existing::Duplicate("7".into()))
        );
        assert_eq!(
            decide(Op::Try, &row("cancel", "guard", None, None), 5),
            Decision::Settled(Existing::Rejected)
        );
    }
}

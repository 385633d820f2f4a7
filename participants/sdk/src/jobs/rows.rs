//! The statements on `idem_job_unit` and the decoding of its rows.

use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::ParticipantError;
use crate::kit::LocalTx;
use crate::kit::local::{exec, fetch};
use idem_sql::Backend;

use super::{UnitKey, UnitRecord, UnitStatus};

pub(super) const KEY_WHERE: &str =
    "job = ? AND business_date = ? AND shard = ? AND source_id = ? AND batch = ?";

/// The key's bind values, in [`KEY_WHERE`]'s order.
pub(super) fn key_args(job: &str, date: &str, key: &UnitKey) -> Vec<Arg> {
    vec![
        Arg::Text(job.to_owned()),
        Arg::Text(date.to_owned()),
        Arg::Int(key.shard),
        Arg::Text(key.source_id.clone()),
        Arg::Text(key.batch.clone()),
    ]
}

/// Inserts the unit as PENDING unless it exists.
pub(super) async fn ensure<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    now: i64,
) -> Result<bool, ParticipantError> {
    let mut args = key;
    args.extend([Arg::Int(now), Arg::Int(now)]);
    crate::kit::insert_if_absent(
        tx,
        super::JOB_UNIT_TABLE,
        "(job, business_date, shard, source_id, batch, status, attempts, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, 'PENDING', 0, ?, ?)",
        "job, business_date, shard, source_id, batch",
        args,
    )
    .await
}

/// Takes the unit for `token` if nobody may hold it: PENDING, FAILED, or RUNNING under a
/// lease that ran out. The caller reads the row to learn whether it won; the affected-row
/// count is not trusted (MySQL counts a row whose values did not change as 0).
pub(super) async fn claim<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    token: &str,
    execution_id: &str,
    now: i64,
    lease_until: i64,
) -> Result<(), ParticipantError> {
    let sql = format!(
        "UPDATE idem_job_unit SET status = 'RUNNING', owner_token = ?, lease_until_ms = ?, execution_id = ?, attempts = attempts + 1, updated_at_ms = ? \
         WHERE {KEY_WHERE} AND (status IN ('PENDING', 'FAILED') OR (status = 'RUNNING' AND lease_until_ms < ?))"
    );
    let mut args = vec![
        Arg::Text(token.to_owned()),
        Arg::Int(lease_until),
        Arg::Text(execution_id.to_owned()),
        Arg::Int(now),
    ];
    args.extend(key);
    args.push(Arg::Int(now));
    exec(tx, &sql, args).await?;
    Ok(())
}

/// Renews the lease of a RUNNING unit held by `token` (the fence of a chunk: it locks the
/// row, so a takeover waits for the chunk's transaction, and a taken-over owner changes
/// nothing).
pub(super) async fn renew<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    token: &str,
    now: i64,
    lease_until: i64,
) -> Result<(), ParticipantError> {
    let sql = format!(
        "UPDATE idem_job_unit SET lease_until_ms = ?, updated_at_ms = ? WHERE {KEY_WHERE} AND owner_token = ? AND status = 'RUNNING'"
    );
    let mut args = vec![Arg::Int(lease_until), Arg::Int(now)];
    args.extend(key);
    args.push(Arg::Text(token.to_owned()));
    exec(tx, &sql, args).await?;
    Ok(())
}

/// Moves a unit held by `token` to `status` with `checkpoint`; a DONE or FAILED unit
/// keeps no lease.
pub(super) async fn finish<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    token: &str,
    status: UnitStatus,
    checkpoint: Option<String>,
    now: i64,
) -> Result<(), ParticipantError> {
    let lease = if status == UnitStatus::Running {
        "lease_until_ms"
    } else {
        "NULL"
    };
    let sql = format!(
        "UPDATE idem_job_unit SET status = ?, checkpoint = ?, lease_until_ms = {lease}, updated_at_ms = ? WHERE {KEY_WHERE} AND owner_token = ? AND status = 'RUNNING'"
    );
    let mut args = vec![
        Arg::Text(status.as_str().to_owned()),
        Arg::OptText(checkpoint),
        Arg::Int(now),
    ];
    args.extend(key);
    args.push(Arg::Text(token.to_owned()));
    exec(tx, &sql, args).await?;
    Ok(())
}

/// Records a failed attempt of a unit nobody holds (its one-transaction run rolled back).
pub(super) async fn mark_failed<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    execution_id: &str,
    now: i64,
) -> Result<(), ParticipantError> {
    let sql = format!(
        "UPDATE idem_job_unit SET status = 'FAILED', execution_id = ?, attempts = attempts + 1, updated_at_ms = ? \
         WHERE {KEY_WHERE} AND status IN ('PENDING', 'FAILED')"
    );
    let mut args = vec![Arg::Text(execution_id.to_owned()), Arg::Int(now)];
    args.extend(key);
    exec(tx, &sql, args).await?;
    Ok(())
}

const COLUMNS: &str = "shard, source_id, batch, status, execution_id, owner_token, lease_until_ms, checkpoint, attempts, updated_at_ms";
const KINDS: &[CellKind] = &[
    CellKind::Int,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Int,
    CellKind::Text,
    CellKind::Int,
    CellKind::Int,
];

/// Reads the unit. `locking` reads the latest committed row and locks it on the servers
/// (after a claim that changed nothing, REPEATABLE READ's snapshot could be older); SQLite's
/// `BEGIN IMMEDIATE` already excludes every other writer.
pub(super) async fn read<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    key: Vec<Arg>,
    locking: bool,
) -> Result<Option<UnitRecord>, ParticipantError> {
    let lock = match tx.dialect() {
        Backend::Postgres | Backend::Mysql if locking => " FOR UPDATE",
        _ => "",
    };
    let sql = format!("SELECT {COLUMNS} FROM idem_job_unit WHERE {KEY_WHERE}{lock}");
    let rows = fetch(tx, &sql, key, KINDS).await?;
    rows.into_iter().next().map(decode).transpose()
}

/// Reads every unit of a job's business date, in key order.
pub(super) async fn read_all<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    job: &str,
    date: &str,
) -> Result<Vec<UnitRecord>, ParticipantError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM idem_job_unit WHERE job = ? AND business_date = ? ORDER BY shard, source_id, batch"
    );
    let args = vec![Arg::Text(job.to_owned()), Arg::Text(date.to_owned())];
    fetch(tx, &sql, args, KINDS)
        .await?
        .into_iter()
        .map(decode)
        .collect()
}

fn decode(row: Vec<Cell>) -> Result<UnitRecord, ParticipantError> {
    let text = |i: usize| row[i].text().map(str::to_owned);
    let status = text(3).unwrap_or_default();
    Ok(UnitRecord {
        key: UnitKey {
            shard: row[0].int().unwrap_or_default(),
            source_id: text(1).unwrap_or_default(),
            batch: text(2).unwrap_or_default(),
        },
        status: UnitStatus::parse(&status).ok_or_else(|| {
            ParticipantError::internal(format!("job unit with unknown status `{status}`"))
        })?,
        execution_id: text(4),
        owner_token: text(5),
        lease_until_ms: row[6].int(),
        checkpoint: text(7),
        attempts: row[8].int().unwrap_or_default(),
        updated_at_ms: row[9].int().unwrap_or_default(),
    })
}

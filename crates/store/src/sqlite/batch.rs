//! A batch of queued creates, saves and lease renewals in one write transaction, sent to
//! SQLite as one call. sqlx runs SQLite on a thread of its own, and every call is a round
//! trip to it (a wake-up and a context switch each way): a statement or two per write
//! cost the coordinator more than SQLite's own work. So the batch is one multi-statement
//! text, prepared once per connection, whose numbered parameters are the batch's rows as
//! JSON arrays (one per table and kind of write; `jsonb_each` turns each back into rows,
//! and keeps each row's object binary for `->>`).
//!
//! `BEGIN IMMEDIATE` takes SQLite's one write lock first, so nobody writes between the
//! statements: which creates are new and which saves' guards match is decided by reading,
//! into a temporary table, before anything is written, and every later statement writes
//! only those. A batch holds at most one write per transaction (the writers see to it).

use std::collections::HashSet;
use std::sync::LazyLock;

use serde::Serialize;
use sqlx::{Sqlite, SqliteConnection};

use crate::sql::batch_rows::BatchRows;
use crate::sql::group_commit::{JobResult, Work, results};
use crate::sql::{BRANCH_COLUMNS, GLOBAL_COLUMNS, SqlStore};
use crate::{Result, StoreError};

/// The table a batch records what it wrote in; one per connection, empty between batches.
pub(super) const CREATE_WRITTEN: &str =
    "CREATE TEMP TABLE IF NOT EXISTS idem_written (kind TEXT NOT NULL, gid TEXT NOT NULL)";

/// The values of these keys of each object `jsonb_each` yields, in order.
fn values(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| match *k {
            // Bytes travel as hex in the JSON (see `NewBranch`).
            "payload_bin" => format!("unhex(value ->> '{k}')"),
            k => format!("value ->> '{k}'"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rows of the JSON array `param`, one column per key.
fn rows_of(param: &str, keys: &[&str]) -> String {
    let named = keys
        .iter()
        .map(|k| format!("value ->> '{k}' AS {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("(SELECT {named} FROM jsonb_each({param}))")
}

fn columns(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).collect()
}

const CHANGE_KEYS: &[&str] = &[
    "gid",
    "expected",
    "guard_token",
    "guard_version",
    "status",
    "stalled_from",
    "attempts",
    "next_attempt_at",
    "last_error",
    "reason",
    "timeout_at",
    "updated_at",
    "finished_at",
    "owner_token",
    "lease_until",
    "calls",
    "history",
    "history_dropped",
];

const BRANCH_CHANGE_KEYS: &[&str] = &[
    "gid",
    "branch_id",
    "action",
    "status",
    "attempts",
    "next_attempt_at",
    "last_error",
    "in_progress_since",
    "updated_at",
    "finished_at",
];

const ATTEMPT_KEYS: &[&str] = &[
    "gid",
    "number",
    "branch_id",
    "action",
    "attempt",
    "started_at",
    "duration_ms",
    "outcome",
    "detail",
];

/// The whole batch. Its parameters are plain `?`s, bound in the order they appear (see
/// [`PARAMS`]): numbered ones (`?3`) leave the lower numbers as unnamed slots, which
/// sqlx binds in order across the statements of one text and then runs out of. Its one
/// result set is the gids written: creates inserted, saves matched, leases renewed.
static BATCH: LazyLock<String> = LazyLock::new(|| {
    let mut global = columns(GLOBAL_COLUMNS);
    global.retain(|k| *k != "version");
    let branch = columns(BRANCH_COLUMNS);
    let written = |kind: &str| format!("(SELECT gid FROM idem_written WHERE kind = '{kind}')");
    let (created, saved, renewed) = (written("c"), written("s"), written("r"));
    [
        "BEGIN IMMEDIATE".to_owned(),
        "INSERT INTO idem_written (kind, gid) SELECT 'c', value ->> 'gid' FROM jsonb_each(?) \
         WHERE NOT EXISTS (SELECT 1 FROM idem_global g WHERE g.gid = value ->> 'gid')"
            .to_owned(),
        format!(
            "INSERT INTO idem_global ({cols}, version) SELECT {vals}, 0 FROM jsonb_each(?) \
             WHERE value ->> 'gid' IN {created}",
            cols = global.join(", "),
            vals = values(&global),
        ),
        format!(
            "INSERT INTO idem_branch ({BRANCH_COLUMNS}) SELECT {} FROM jsonb_each(?) \
             WHERE value ->> 'gid' IN {created}",
            values(&branch)
        ),
        format!(
            "INSERT INTO idem_written (kind, gid) SELECT 's', v.gid FROM {} AS v \
             JOIN idem_global g ON g.gid = v.gid \
             WHERE g.status = v.expected \
               AND g.version = v.guard_version \
               AND (v.guard_token IS NULL OR g.owner_token = v.guard_token)",
            rows_of("?", CHANGE_KEYS)
        ),
        format!(
            "UPDATE idem_global SET status = v.status, stalled_from = v.stalled_from, \
               attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
               last_error = v.last_error, reason = v.reason, timeout_at = v.timeout_at, \
               updated_at = v.updated_at, finished_at = v.finished_at, \
               owner_token = v.owner_token, version = idem_global.version + 1, \
               lease_until = CASE WHEN idem_global.owner_token = v.owner_token \
                 AND idem_global.lease_until > v.lease_until \
                 THEN idem_global.lease_until ELSE v.lease_until END, \
               calls = v.calls, history = v.history, history_dropped = v.history_dropped \
             FROM {} AS v WHERE idem_global.gid = v.gid AND v.gid IN {saved}",
            rows_of("?", CHANGE_KEYS)
        ),
        format!(
            "UPDATE idem_branch SET status = v.status, attempts = v.attempts, \
               next_attempt_at = v.next_attempt_at, last_error = v.last_error, \
               in_progress_since = v.in_progress_since, updated_at = v.updated_at, \
               finished_at = v.finished_at \
             FROM {} AS v \
             WHERE idem_branch.gid = v.gid AND idem_branch.branch_id = v.branch_id \
               AND idem_branch.action = v.action AND v.gid IN {saved}",
            rows_of("?", BRANCH_CHANGE_KEYS)
        ),
        format!(
            "INSERT INTO idem_attempt ({}) SELECT {} FROM jsonb_each(?) \
             WHERE value ->> 'gid' IN {saved}",
            ATTEMPT_KEYS.join(", "),
            values(ATTEMPT_KEYS)
        ),
        // Found from the batch's rows by the index on (gid, number): a save that trims
        // deletes as many records as it adds, and the others cost an empty statement.
        format!(
            "DELETE FROM idem_attempt WHERE id IN (SELECT a.id FROM {} AS v \
             JOIN idem_attempt a ON a.gid = v.gid AND a.number <= v.upto \
             WHERE v.gid IN {saved})",
            rows_of("?", &["gid", "upto"])
        ),
        format!(
            "INSERT INTO idem_written (kind, gid) SELECT 'r', v.gid FROM {} AS v \
             JOIN idem_global g ON g.gid = v.gid AND g.owner_token = v.token",
            rows_of("?", &["gid", "token", "until", "is_release"])
        ),
        format!(
            "UPDATE idem_global SET lease_until = CASE WHEN v.is_release = 0 \
               AND idem_global.lease_until > v.until THEN idem_global.lease_until ELSE v.until END \
             FROM {} AS v WHERE idem_global.gid = v.gid AND v.gid IN {renewed}",
            rows_of("?", &["gid", "token", "until", "is_release"])
        ),
        "SELECT gid FROM idem_written".to_owned(),
        "DELETE FROM idem_written".to_owned(),
        "COMMIT".to_owned(),
    ]
    .join(";\n")
});

/// Which of the batch's JSON arrays each `?` of [`BATCH`] is, in order: 0 new global rows,
/// 1 their branches, 2 saves' global changes, 3 their branch changes, 4 their attempts,
/// 5 their trims of the history, 6 lease renewals.
const PARAMS: [usize; 10] = [0, 0, 1, 2, 2, 3, 4, 5, 6, 6];

fn json<T: Serialize>(rows: &[T]) -> Result<String> {
    serde_json::to_string(rows).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Writes `works` in one call; results in their order.
pub(super) async fn write(store: &SqlStore<Sqlite>, works: &[Work]) -> Result<Vec<JobResult>> {
    let rows = BatchRows::of(works)?;
    let params = [
        json(&rows.created)?,
        json(&rows.new_branches)?,
        json(&rows.changed)?,
        json(&rows.changed_branches)?,
        json(&rows.attempts)?,
        json(&rows.trims)?,
        json(&rows.leases)?,
    ];
    let lean = store
        .lean()
        .ok_or_else(|| StoreError::Batch("SQLite's store has no writer connection".into()))?;
    let mut conn = lean.get().await?;
    let written = run(&mut conn, params).await;
    // A failure leaves the transaction open: the connection is closed, not reused, and
    // SQLite rolls back what the batch wrote.
    let written: HashSet<String> = conn.keep_if_ok(written)?.into_iter().collect();
    Ok(results(works, &written))
}

async fn run(conn: &mut SqliteConnection, params: [String; 7]) -> sqlx::Result<Vec<String>> {
    let mut query = sqlx::query_scalar::<Sqlite, String>(sqlx::AssertSqlSafe(BATCH.as_str()));
    for i in PARAMS {
        query = query.bind(params[i].as_str());
    }
    query.fetch_all(conn).await
}

//! A batch of queued creates and saves in one write transaction, one statement per table
//! and kind of write: the rows go in as one JSON array each, which `jsonb_each` turns back
//! into rows (`jsonb_each`: each row's object stays binary, not printed as text to be parsed
//! again by `->>`). sqlx runs SQLite on a thread of its own and every statement is a round trip
//! to it (a wake-up and a context switch each way); a statement or two per write cost the
//! coordinator more than SQLite's own work. The texts do not depend on the batch's size,
//! so each is prepared once per connection.
//!
//! A batch holds at most one write per transaction (the writers see to it), so the gids
//! a statement returns say which creates inserted and which saves matched; the branch and
//! attempt rows follow only for those.

use std::collections::HashSet;
use std::sync::LazyLock;

use serde::Serialize;
use sqlx::{Sqlite, SqliteConnection};

use crate::store::sql::batch_rows::BatchRows;
use crate::store::sql::group_commit::{JobResult, Work, results};
use crate::store::sql::{BRANCH_COLUMNS, GLOBAL_COLUMNS, SqlStore};
use crate::store::{Result, StoreError};

/// The values of these keys of each object `jsonb_each` yields, in order.
fn values(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("value ->> '{k}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// [`values`], each named after its key.
fn fields(keys: &[&str]) -> String {
    keys.iter()
        .map(|k| format!("value ->> '{k}' AS {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn columns(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).collect()
}

/// Inserts the created global rows; returns the gids inserted. `WHERE true` keeps SQLite
/// from reading `ON CONFLICT` as a join's constraint.
static INSERT_GLOBALS: LazyLock<String> = LazyLock::new(|| {
    let mut keys = columns(GLOBAL_COLUMNS);
    keys.retain(|k| *k != "version");
    format!(
        "INSERT INTO idem_global ({cols}, version) SELECT {values}, 0 FROM jsonb_each(?) WHERE true \
         ON CONFLICT DO NOTHING RETURNING gid",
        cols = keys.join(", "),
        values = values(&keys),
    )
});

static INSERT_BRANCHES: LazyLock<String> = LazyLock::new(|| {
    let keys = columns(BRANCH_COLUMNS);
    format!(
        "INSERT INTO idem_branch ({BRANCH_COLUMNS}) SELECT {} FROM jsonb_each(?)",
        values(&keys)
    )
});

/// The saves' conditional updates of their global rows; returns the gids that matched.
static UPDATE_GLOBALS: LazyLock<String> = LazyLock::new(|| {
    let v = fields(&[
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
    ]);
    format!(
        "UPDATE idem_global SET status = v.status, stalled_from = v.stalled_from, \
           attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
           last_error = v.last_error, reason = v.reason, timeout_at = v.timeout_at, \
           updated_at = v.updated_at, finished_at = v.finished_at, \
           owner_token = v.owner_token, lease_until = v.lease_until, \
           version = idem_global.version + 1 \
         FROM (SELECT {v} FROM jsonb_each(?)) AS v \
         WHERE idem_global.gid = v.gid AND idem_global.status = v.expected \
           AND (idem_global.owner_token = v.guard_token OR idem_global.version = v.guard_version) \
         RETURNING idem_global.gid"
    )
});

static UPDATE_BRANCHES: LazyLock<String> = LazyLock::new(|| {
    let v = fields(&[
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
    ]);
    format!(
        "UPDATE idem_branch SET status = v.status, attempts = v.attempts, \
           next_attempt_at = v.next_attempt_at, last_error = v.last_error, \
           in_progress_since = v.in_progress_since, updated_at = v.updated_at, \
           finished_at = v.finished_at \
         FROM (SELECT {v} FROM jsonb_each(?)) AS v \
         WHERE idem_branch.gid = v.gid AND idem_branch.branch_id = v.branch_id \
           AND idem_branch.action = v.action"
    )
});

static INSERT_ATTEMPTS: LazyLock<String> = LazyLock::new(|| {
    let keys = [
        "gid",
        "branch_id",
        "action",
        "attempt",
        "started_at",
        "duration_ms",
        "outcome",
        "detail",
    ];
    format!(
        "INSERT INTO idem_attempt ({}) SELECT {} FROM jsonb_each(?)",
        keys.join(", "),
        values(&keys)
    )
});

static RENEW_LEASES: LazyLock<String> = LazyLock::new(|| {
    let v = fields(&["gid", "token", "until"]);
    format!(
        "UPDATE idem_global SET lease_until = v.until \
         FROM (SELECT {v} FROM jsonb_each(?)) AS v \
         WHERE idem_global.gid = v.gid AND idem_global.owner_token = v.token \
         RETURNING idem_global.gid"
    )
});

fn json<T: Serialize>(rows: &[T]) -> Result<String> {
    serde_json::to_string(rows).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Runs a statement with `rows` as its JSON array, unless there are none; returns the
/// gids it returned.
async fn run<T: Serialize>(
    conn: &mut SqliteConnection,
    sql: &'static LazyLock<String>,
    rows: &[T],
    returning: bool,
) -> Result<Vec<String>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let query = sqlx::AssertSqlSafe(sql.as_str());
    let rows = json(rows)?;
    if returning {
        Ok(sqlx::query_scalar::<Sqlite, String>(query)
            .bind(rows)
            .fetch_all(&mut *conn)
            .await?)
    } else {
        sqlx::query(query).bind(rows).execute(&mut *conn).await?;
        Ok(Vec::new())
    }
}

/// Writes `works` in one transaction; results in their order.
pub(super) async fn write(store: &SqlStore<Sqlite>, works: &[Work]) -> Result<Vec<JobResult>> {
    let rows = BatchRows::of(works)?;
    let mut tx = store.begin_write().await?;
    let db = tx.conn();
    let mut written: HashSet<String> = run(db, &INSERT_GLOBALS, &rows.created, true)
        .await?
        .into_iter()
        .collect();
    let new_branches: Vec<_> = rows
        .new_branches
        .iter()
        .filter(|b| written.contains(b.gid))
        .collect();
    run(db, &INSERT_BRANCHES, &new_branches, false).await?;
    let saved: HashSet<String> = run(db, &UPDATE_GLOBALS, &rows.changed, true)
        .await?
        .into_iter()
        .collect();
    let changed: Vec<_> = rows
        .changed_branches
        .iter()
        .filter(|b| saved.contains(b.gid))
        .collect();
    run(db, &UPDATE_BRANCHES, &changed, false).await?;
    let attempts: Vec<_> = rows
        .attempts
        .iter()
        .filter(|a| saved.contains(a.gid))
        .collect();
    run(db, &INSERT_ATTEMPTS, &attempts, false).await?;
    let renewed = run(db, &RENEW_LEASES, &rows.leases, true).await?;
    tx.end(true).await?;
    written.extend(saved);
    written.extend(renewed);
    Ok(results(works, &written))
}

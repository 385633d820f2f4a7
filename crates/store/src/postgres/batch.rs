//! A batch of queued creates and saves in one statement: each column of the batch's rows
//! is bound as one array, `unnest` turns the arrays back into rows, and data-modifying
//! CTEs insert and update them. The text is the same for every batch, so each connection
//! prepares it once; one round trip and one commit serve the whole batch.
//!
//! A batch holds at most one write per transaction (the writers see to it), so the gids
//! the statement returns say which creates inserted and which saves matched. A save is
//! conditional as a single save is: its row must be in the expected status and owned by
//! the token (or at the version) the save names; only then are its branches updated, its
//! attempts inserted and, when it takes its history past the bound, its oldest records
//! deleted.

use std::collections::HashSet;
use std::sync::LazyLock;

use idem_sql::Backend;
use sqlx::Postgres;

use crate::sql::batch_rows::BatchRows;
use crate::sql::group_commit::{self, JobResult, Work};
use crate::sql::{ATTEMPT_COLUMNS, BRANCH_COLUMNS, GLOBAL_COLUMNS, SqlStore};
use crate::{Result, StoreError};

/// The batch statement, rewritten to PostgreSQL's placeholders once.
static BATCH: LazyLock<String> = LazyLock::new(|| {
    let arrays = |types: &[&str]| -> String {
        types
            .iter()
            .map(|t| format!("?::{t}[]"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let created = arrays(&[
        "varchar", "varchar", "varchar", "varchar", "varchar", "text", "bigint", "int", "bigint",
        "text", "text", "varchar", "bigint", "bigint", "bigint", "bigint", "bigint", "varchar",
        "varchar", "boolean",
    ]);
    let created_branches = arrays(&[
        "varchar", "varchar", "varchar", "int", "text", "text", "bytea", "varchar", "int",
        "bigint", "text", "bigint", "bigint", "bigint",
    ]);
    let saved = arrays(&[
        "varchar", "varchar", "varchar", "bigint", "varchar", "varchar", "int", "bigint", "text",
        "text", "bigint", "bigint", "bigint", "varchar", "bigint", "bigint", "bigint", "bigint",
    ]);
    let saved_branches = arrays(&[
        "varchar", "varchar", "varchar", "varchar", "int", "bigint", "text", "bigint", "bigint",
        "bigint",
    ]);
    let attempts = arrays(&[
        "varchar", "bigint", "varchar", "varchar", "int", "bigint", "bigint", "varchar", "text",
    ]);
    let trims = arrays(&["varchar", "bigint"]);
    let leases = arrays(&["varchar", "varchar", "bigint", "int"]);
    let sql = format!(
        "WITH ci AS (\
           INSERT INTO idem_global ({GLOBAL_COLUMNS}) \
           SELECT * FROM unnest({created}) AS v({GLOBAL_COLUMNS}) \
           ON CONFLICT DO NOTHING RETURNING gid), \
         cb AS (\
           INSERT INTO idem_branch ({BRANCH_COLUMNS}) \
           SELECT v.* FROM unnest({created_branches}) AS v({BRANCH_COLUMNS}) \
           WHERE v.gid IN (SELECT gid FROM ci)), \
         su AS (\
           UPDATE idem_global t SET status = v.status, stalled_from = v.stalled_from, \
             attempts = v.attempts, next_attempt_at = v.next_attempt_at, \
             last_error = v.last_error, reason = v.reason, timeout_at = v.timeout_at, \
             updated_at = v.updated_at, finished_at = v.finished_at, \
             owner_token = v.owner_token, version = t.version + 1, \
             lease_until = CASE WHEN t.owner_token = v.owner_token AND t.lease_until > v.lease_until \
               THEN t.lease_until ELSE v.lease_until END, \
             calls = v.calls, history = v.history, history_dropped = v.history_dropped \
           FROM unnest({saved}) AS v(gid, expected, guard_token, guard_version, status, \
             stalled_from, attempts, next_attempt_at, last_error, reason, timeout_at, \
             updated_at, finished_at, owner_token, lease_until, calls, history, history_dropped) \
           WHERE t.gid = v.gid \
             AND (CASE WHEN t.status = v.expected \
                   AND t.version = v.guard_version \
                   AND (v.guard_token IS NULL OR t.owner_token = v.guard_token) \
                  THEN TRUE ELSE FALSE END) \
           RETURNING t.gid), \
         sb AS (\
           UPDATE idem_branch t SET status = v.status, attempts = v.attempts, \
             next_attempt_at = v.next_attempt_at, last_error = v.last_error, \
             in_progress_since = v.in_progress_since, updated_at = v.updated_at, \
             finished_at = v.finished_at \
           FROM unnest({saved_branches}) AS v(gid, branch_id, action, status, attempts, \
             next_attempt_at, last_error, in_progress_since, updated_at, finished_at) \
           WHERE t.gid = v.gid AND t.branch_id = v.branch_id AND t.action = v.action \
             AND v.gid IN (SELECT gid FROM su)), \
         sa AS (\
           INSERT INTO idem_attempt (gid, {ATTEMPT_COLUMNS}) \
           SELECT v.* FROM unnest({attempts}) AS v(gid, {ATTEMPT_COLUMNS}) \
           WHERE v.gid IN (SELECT gid FROM su)), \
         st AS (\
           DELETE FROM idem_attempt t USING unnest({trims}) AS v(gid, upto) \
           WHERE t.gid = v.gid AND t.number <= v.upto AND v.gid IN (SELECT gid FROM su)), \
         sr AS (\
           UPDATE idem_global t SET lease_until = CASE \
             WHEN v.is_release = 0 AND t.lease_until > v.until THEN t.lease_until ELSE v.until END \
           FROM unnest({leases}) AS v(gid, token, until, is_release) \
           WHERE t.gid = v.gid AND t.owner_token = v.token \
           RETURNING t.gid) \
         SELECT gid FROM ci UNION ALL SELECT gid FROM su UNION ALL SELECT gid FROM sr"
    );
    Backend::Postgres.rewrite(&sql)
});

/// One column of `rows`, as the array bound for it.
macro_rules! column {
    ($rows:expr, $field:ident) => {
        $rows.iter().map(|r| r.$field).collect::<Vec<_>>()
    };
    ($rows:expr, values.$field:ident) => {
        $rows.iter().map(|r| r.values.$field).collect::<Vec<_>>()
    };
}

/// Writes `works` in one statement; results in their order.
pub(super) async fn write(store: &SqlStore<Postgres>, works: &[Work]) -> Result<Vec<JobResult>> {
    let rows = BatchRows::of(works)?;
    let (c, b, s, u, a, l) = (
        &rows.created,
        &rows.new_branches,
        &rows.changed,
        &rows.changed_branches,
        &rows.attempts,
        &rows.leases,
    );
    let t = &rows.trims;
    let options: Vec<&str> = c.iter().map(|r| r.options.as_str()).collect();
    let versions = vec![0i64; c.len()];
    let query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(BATCH.as_str()))
        .bind(column!(c, gid))
        .bind(column!(c, kind))
        .bind(column!(c, status))
        .bind(column!(c, stalled_from))
        .bind(column!(c, request_hash))
        .bind(options)
        .bind(column!(c, timeout_at))
        .bind(column!(c, attempts))
        .bind(column!(c, next_attempt_at))
        .bind(column!(c, last_error))
        .bind(column!(c, reason))
        .bind(column!(c, owner_token))
        .bind(column!(c, lease_until))
        .bind(versions)
        .bind(column!(c, created_at))
        .bind(column!(c, updated_at))
        .bind(column!(c, finished_at))
        .bind(column!(c, traceparent))
        .bind(column!(c, tracestate))
        .bind(column!(c, tokenless))
        .bind(column!(b, gid))
        .bind(column!(b, branch_id))
        .bind(column!(b, action))
        .bind(column!(b, seq))
        .bind(column!(b, url))
        .bind(column!(b, payload))
        .bind(column!(b, payload_bin))
        .bind(column!(b, values.status))
        .bind(column!(b, values.attempts))
        .bind(column!(b, values.next_attempt_at))
        .bind(column!(b, values.last_error))
        .bind(column!(b, values.in_progress_since))
        .bind(column!(b, values.updated_at))
        .bind(column!(b, values.finished_at))
        .bind(column!(s, gid))
        .bind(column!(s, expected))
        .bind(column!(s, guard_token))
        .bind(column!(s, guard_version))
        .bind(column!(s, status))
        .bind(column!(s, stalled_from))
        .bind(column!(s, attempts))
        .bind(column!(s, next_attempt_at))
        .bind(column!(s, last_error))
        .bind(column!(s, reason))
        .bind(column!(s, timeout_at))
        .bind(column!(s, updated_at))
        .bind(column!(s, finished_at))
        .bind(column!(s, owner_token))
        .bind(column!(s, lease_until))
        .bind(column!(s, calls))
        .bind(column!(s, history))
        .bind(column!(s, history_dropped))
        .bind(column!(u, gid))
        .bind(column!(u, branch_id))
        .bind(column!(u, action))
        .bind(column!(u, values.status))
        .bind(column!(u, values.attempts))
        .bind(column!(u, values.next_attempt_at))
        .bind(column!(u, values.last_error))
        .bind(column!(u, values.in_progress_since))
        .bind(column!(u, values.updated_at))
        .bind(column!(u, values.finished_at))
        .bind(column!(a, gid))
        .bind(column!(a, number))
        .bind(column!(a, branch_id))
        .bind(column!(a, action))
        .bind(column!(a, attempt))
        .bind(column!(a, started_at))
        .bind(column!(a, duration_ms))
        .bind(column!(a, outcome))
        .bind(column!(a, detail))
        .bind(column!(t, gid))
        .bind(column!(t, upto))
        .bind(column!(l, gid))
        .bind(column!(l, token))
        .bind(column!(l, until))
        .bind(column!(l, is_release));
    let lean = store
        .lean()
        .ok_or_else(|| StoreError::Batch("PostgreSQL's store has no writer pool".into()))?;
    let mut conn = lean.get().await?;
    let written = query.fetch_all(&mut *conn).await;
    let written: HashSet<String> = conn.keep_if_ok(written)?.into_iter().collect();
    Ok(group_commit::results(works, &written))
}

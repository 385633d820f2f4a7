//! A batch of queued writes in one write transaction on MySQL and MariaDB: the new global
//! rows, their branches, the branch changes and the attempts go in as one JSON array per
//! statement, turned back into rows by `JSON_TABLE`. Each save's conditional update of its
//! global row and each lease renewal stay a statement of their own: MySQL's UPDATE has no
//! RETURNING, and only a statement's affected-row count says whether its guard matched.
//!
//! The new global rows go in with one INSERT; if a gid exists already the whole INSERT
//! fails (MySQL has no "skip duplicates" that does not also hide other errors), and the
//! creates are inserted one by one instead, each learning whether its gid was taken.

use std::collections::HashSet;
use std::sync::LazyLock;

use serde::Serialize;
use sqlx::{MySql, MySqlConnection};

use crate::store::Result;
use crate::store::sql::batch_rows::BatchRows;
use crate::store::sql::group_commit::{JobResult, Work, results};
use crate::store::sql::{SqlStore, is_unique_violation, q};

/// `JSON_TABLE` over the array bound at `?`, with these columns (name, type). Strings are
/// wider than the table's columns, so a value too long fails the table's own check
/// instead of being cut here; compared with the tables' binary collation.
fn json_table(columns: &[(&str, &str)]) -> String {
    let columns: Vec<String> = columns
        .iter()
        .map(|(name, kind)| {
            let kind = match *kind {
                "text" => "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                other => other,
            };
            format!("{name} {kind} PATH '$.{name}'")
        })
        .collect();
    format!(
        "JSON_TABLE(?, '$[*]' COLUMNS ({})) AS v",
        columns.join(", ")
    )
}

fn names(columns: &[(&str, &str)]) -> String {
    columns
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

const NEW_GLOBAL: &[(&str, &str)] = &[
    ("gid", "text"),
    ("kind", "text"),
    ("status", "text"),
    ("stalled_from", "text"),
    ("request_hash", "text"),
    ("options", "text"),
    ("timeout_at", "BIGINT"),
    ("attempts", "INT"),
    ("next_attempt_at", "BIGINT"),
    ("last_error", "text"),
    ("reason", "text"),
    ("owner_token", "text"),
    ("lease_until", "BIGINT"),
    ("created_at", "BIGINT"),
    ("updated_at", "BIGINT"),
    ("finished_at", "BIGINT"),
    ("traceparent", "text"),
    ("tracestate", "text"),
];

const NEW_BRANCH: &[(&str, &str)] = &[
    ("gid", "text"),
    ("branch_id", "text"),
    ("action", "text"),
    ("seq", "INT"),
    ("url", "text"),
    ("payload", "text"),
    ("status", "text"),
    ("attempts", "INT"),
    ("next_attempt_at", "BIGINT"),
    ("last_error", "text"),
    ("in_progress_since", "BIGINT"),
    ("updated_at", "BIGINT"),
    ("finished_at", "BIGINT"),
];

const BRANCH_CHANGE: &[(&str, &str)] = &[
    ("gid", "text"),
    ("branch_id", "text"),
    ("action", "text"),
    ("status", "text"),
    ("attempts", "INT"),
    ("next_attempt_at", "BIGINT"),
    ("last_error", "text"),
    ("in_progress_since", "BIGINT"),
    ("updated_at", "BIGINT"),
    ("finished_at", "BIGINT"),
];

const NEW_ATTEMPT: &[(&str, &str)] = &[
    ("gid", "text"),
    ("branch_id", "text"),
    ("action", "text"),
    ("attempt", "INT"),
    ("started_at", "BIGINT"),
    ("duration_ms", "BIGINT"),
    ("outcome", "text"),
    ("detail", "text"),
];

static INSERT_GLOBALS: LazyLock<String> = LazyLock::new(|| {
    let cols = names(NEW_GLOBAL);
    format!(
        "INSERT INTO idem_global ({cols}, version) SELECT {cols}, 0 FROM {}",
        json_table(NEW_GLOBAL)
    )
});

static INSERT_BRANCHES: LazyLock<String> = LazyLock::new(|| {
    let cols = names(NEW_BRANCH);
    format!(
        "INSERT INTO idem_branch ({cols}) SELECT {cols} FROM {}",
        json_table(NEW_BRANCH)
    )
});

/// The batch's rows drive the join (`STRAIGHT_JOIN`), each finding its branch row by the
/// primary key.
static UPDATE_BRANCHES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {} STRAIGHT_JOIN idem_branch AS b \
           ON b.gid = v.gid AND b.branch_id = v.branch_id AND b.action = v.action \
         SET b.status = v.status, b.attempts = v.attempts, b.next_attempt_at = v.next_attempt_at, \
           b.last_error = v.last_error, b.in_progress_since = v.in_progress_since, \
           b.updated_at = v.updated_at, b.finished_at = v.finished_at",
        json_table(BRANCH_CHANGE)
    )
});

static INSERT_ATTEMPTS: LazyLock<String> = LazyLock::new(|| {
    let cols = names(NEW_ATTEMPT);
    format!(
        "INSERT INTO idem_attempt ({cols}) SELECT {cols} FROM {}",
        json_table(NEW_ATTEMPT)
    )
});

/// Runs a statement with `rows` as its JSON array, unless there are none.
async fn run<T: Serialize>(
    conn: &mut MySqlConnection,
    sql: &'static LazyLock<String>,
    rows: &[T],
) -> sqlx::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let rows = serde_json::to_string(rows).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(rows)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Writes `works` in one transaction; results in their order.
pub(super) async fn write(store: &SqlStore<MySql>, works: &[Work]) -> Result<Vec<JobResult>> {
    let rows = BatchRows::of(works)?;
    let mut db = store.begin_write().await?;
    let mut written = HashSet::new();
    if !rows.created.is_empty() {
        match run(db.conn(), &INSERT_GLOBALS, &rows.created).await {
            Ok(()) => {
                written.extend(rows.created.iter().map(|c| c.gid.to_owned()));
                run(db.conn(), &INSERT_BRANCHES, &rows.new_branches).await?;
            }
            // Nothing of the INSERT stayed (a failed statement is undone, the transaction
            // goes on): one by one, each with its branches.
            Err(e) if is_unique_violation(&e) => {
                for work in works {
                    if let Work::Create(c) = work
                        && store
                            .create_in(db.conn(), &c.tx, &c.request_hash, c.lease.as_ref())
                            .await?
                    {
                        written.insert(c.tx.gid.clone());
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut saved = HashSet::new();
    for work in works {
        match work {
            Work::Save(owned) => {
                let save = owned.borrow();
                let done = store.update_global(&save).execute(&mut *db.conn()).await?;
                if done.rows_affected() > 0 {
                    saved.insert(save.after.gid.clone());
                }
            }
            Work::Renew(r) => {
                let done = q::<MySql>(&store.sql.renew)
                    .bind(r.until)
                    .bind(r.gid.as_str())
                    .bind(r.token.as_str())
                    .execute(&mut *db.conn())
                    .await?;
                if done.rows_affected() == 1 {
                    written.insert(r.gid.clone());
                }
            }
            Work::Create(_) => {}
        }
    }
    let changed: Vec<_> = rows
        .changed_branches
        .iter()
        .filter(|b| saved.contains(b.gid))
        .collect();
    run(db.conn(), &UPDATE_BRANCHES, &changed).await?;
    let attempts: Vec<_> = rows
        .attempts
        .iter()
        .filter(|a| saved.contains(a.gid))
        .collect();
    run(db.conn(), &INSERT_ATTEMPTS, &attempts).await?;
    db.end(true).await?;
    written.extend(saved);
    Ok(results(works, &written))
}

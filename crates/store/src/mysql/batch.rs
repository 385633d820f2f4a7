//! A batch of queued writes in one write transaction on MySQL and MariaDB: the new global
//! rows, their branches, the global and branch changes, the renewals and the attempts go in
//! as one JSON array per statement, turned back into rows by `JSON_TABLE`, so a batch costs
//! the same few round trips whatever its size.
//!
//! MySQL's UPDATE has no RETURNING, and one statement's affected-row count cannot say which
//! of its rows matched their guards. So the batch first locks the global rows its saves and
//! renewals touch (one locking read, in gid order like every batch, so two batches cannot
//! deadlock on them; the rows exist, and READ COMMITTED locks no gaps), checks each guard
//! against the locked row, and updates only the rows whose guard held: nobody can change a
//! locked row before the commit, so the check stays true. The UPDATE repeats the guard all
//! the same.
//!
//! The new global rows go in with one INSERT; if a gid exists already the whole INSERT
//! fails (MySQL has no "skip duplicates" that does not also hide other errors), and the
//! creates are inserted one by one instead, each learning whether its gid was taken.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use serde::Serialize;
use sqlx::{MySql, MySqlConnection};

use crate::sql::batch_rows::{BatchRows, GlobalChange};
use crate::sql::group_commit::{JobResult, Work, results};
use crate::sql::{SqlStore, is_unique_violation};
use crate::{Result, StoreError};

/// `JSON_TABLE` over the array bound at `?`, with these columns (name, type). Strings are
/// wider than the table's columns, so a value too long fails the table's own check
/// instead of being cut here; compared with the tables' binary collation.
fn json_table(columns: &[(&str, &str)]) -> String {
    let columns: Vec<String> = columns
        .iter()
        .map(|(name, kind)| {
            let kind = match *kind {
                "text" => "LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
                // Bytes travel as hex in the JSON (see `NewBranch`); `values` unhexes them.
                "hex" => "LONGTEXT CHARACTER SET ascii",
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
    ("tokenless", "BOOLEAN"),
];

const NEW_BRANCH: &[(&str, &str)] = &[
    ("gid", "text"),
    ("branch_id", "text"),
    ("action", "text"),
    ("seq", "INT"),
    ("url", "text"),
    ("payload", "text"),
    ("payload_bin", "hex"),
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
    ("number", "BIGINT"),
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
    let values: Vec<String> = NEW_BRANCH
        .iter()
        .map(|(name, kind)| match *kind {
            "hex" => format!("UNHEX({name})"),
            _ => (*name).to_owned(),
        })
        .collect();
    format!(
        "INSERT INTO idem_branch ({}) SELECT {} FROM {}",
        names(NEW_BRANCH),
        values.join(", "),
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

const GLOBAL_CHANGE: &[(&str, &str)] = &[
    ("gid", "text"),
    ("expected", "text"),
    ("guard_token", "text"),
    ("guard_version", "BIGINT"),
    ("status", "text"),
    ("stalled_from", "text"),
    ("attempts", "INT"),
    ("next_attempt_at", "BIGINT"),
    ("last_error", "text"),
    ("reason", "text"),
    ("timeout_at", "BIGINT"),
    ("updated_at", "BIGINT"),
    ("finished_at", "BIGINT"),
    ("owner_token", "text"),
    ("lease_until", "BIGINT"),
    ("calls", "BIGINT"),
    ("history", "BIGINT"),
    ("history_dropped", "BIGINT"),
];

const LEASE_CHANGE: &[(&str, &str)] = &[
    ("gid", "text"),
    ("token", "text"),
    ("until", "BIGINT"),
    ("is_release", "INT"),
];

/// The global rows of the batch's saves and renewals, locked until the commit.
static LOCK_GLOBALS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT g.gid, g.status, g.owner_token, g.version, g.lease_until FROM {} \
         STRAIGHT_JOIN idem_global AS g ON g.gid = v.gid FOR UPDATE",
        json_table(&[("gid", "text")])
    )
});

/// The saves whose guard held (`GLOBAL_SET` from the batch's rows).
static UPDATE_GLOBALS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {} STRAIGHT_JOIN idem_global AS g \
           ON g.gid = v.gid AND g.status = v.expected AND g.version = v.guard_version \
             AND (v.guard_token IS NULL OR g.owner_token = v.guard_token) \
         SET g.status = v.status, g.stalled_from = v.stalled_from, g.attempts = v.attempts, \
           g.next_attempt_at = v.next_attempt_at, g.last_error = v.last_error, \
           g.reason = v.reason, g.timeout_at = v.timeout_at, g.updated_at = v.updated_at, \
           g.finished_at = v.finished_at, g.owner_token = v.owner_token, \
           g.lease_until = v.lease_until, g.calls = v.calls, g.history = v.history, \
           g.history_dropped = v.history_dropped, g.version = g.version + 1",
        json_table(GLOBAL_CHANGE)
    )
});

/// The renewals whose token still owns the row.
static RENEW_LEASES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE {} STRAIGHT_JOIN idem_global AS g ON g.gid = v.gid AND g.owner_token = v.token \
         SET g.lease_until = CASE WHEN v.is_release = 0 AND g.lease_until > v.until \
           THEN g.lease_until ELSE v.until END",
        json_table(LEASE_CHANGE)
    )
});

static INSERT_ATTEMPTS: LazyLock<String> = LazyLock::new(|| {
    let cols = names(NEW_ATTEMPT);
    format!(
        "INSERT INTO idem_attempt ({cols}) SELECT {cols} FROM {}",
        json_table(NEW_ATTEMPT)
    )
});

/// The oldest records of the saved transactions' histories that go, found by the index on
/// (gid, number) from the batch's rows.
static TRIM_ATTEMPTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE a FROM {} STRAIGHT_JOIN idem_attempt AS a ON a.gid = v.gid AND a.number <= v.upto",
        json_table(&[("gid", "text"), ("upto", "BIGINT")])
    )
});

/// Runs a statement with `rows` as its JSON array, unless there are none; the rows it
/// affected.
async fn run<T: Serialize>(
    conn: &mut MySqlConnection,
    sql: &'static LazyLock<String>,
    rows: &[T],
) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let rows = serde_json::to_string(rows).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(rows)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected())
}

/// A locked global row: what the guards are checked against.
#[derive(sqlx::FromRow)]
struct Locked {
    gid: String,
    status: String,
    owner_token: Option<String>,
    version: i64,
    lease_until: Option<i64>,
}

/// Locks the rows of the saves and renewals, updates those whose guard holds, adds the
/// renewed gids to `written` and returns the saved ones.
async fn update_globals<'a>(
    conn: &mut MySqlConnection,
    rows: &BatchRows<'a>,
    written: &mut HashSet<String>,
) -> Result<HashSet<&'a str>> {
    let mut saved = HashSet::new();
    if rows.changed.is_empty() && rows.leases.is_empty() {
        return Ok(saved);
    }
    #[derive(Serialize)]
    struct Key<'k> {
        gid: &'k str,
    }
    // The saves and the renewals each come in gid order; merged and sorted, the keys (and
    // so the locks taken) are too, as in every other batch.
    let mut keys: Vec<Key<'_>> = rows.changed.iter().map(|c| Key { gid: c.gid }).collect();
    keys.extend(rows.leases.iter().map(|l| Key { gid: l.gid }));
    keys.sort_unstable_by(|a, b| a.gid.cmp(b.gid));
    let keys = serde_json::to_string(&keys).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let locked: Vec<Locked> = sqlx::query_as(sqlx::AssertSqlSafe(LOCK_GLOBALS.as_str()))
        .bind(keys)
        .fetch_all(&mut *conn)
        .await?;
    let locked: HashMap<&str, &Locked> = locked.iter().map(|l| (l.gid.as_str(), l)).collect();
    // The new lease is worked out here, from the locked row: MySQL does not promise the
    // order of a multi-table UPDATE's assignments, so the statement cannot compare the old
    // owner with the new one itself. A save that keeps the owner never shortens its lease.
    let changes: Vec<GlobalChange<'_>> = rows
        .changed
        .iter()
        .filter_map(|c| {
            let row = locked.get(c.gid)?;
            let guard_holds = row.status == c.expected
                && row.version == c.guard_version
                && c.guard_token
                    .is_none_or(|t| row.owner_token.as_deref() == Some(t));
            guard_holds.then(|| {
                let mut change = c.clone();
                if row.owner_token.as_deref() == c.owner_token
                    && c.owner_token.is_some()
                    && row.lease_until > c.lease_until
                {
                    change.lease_until = row.lease_until;
                }
                change
            })
        })
        .collect();
    let renewals: Vec<_> = rows
        .leases
        .iter()
        .filter(|l| {
            locked
                .get(l.gid)
                .is_some_and(|row| row.owner_token.as_deref() == Some(l.token))
        })
        .collect();
    expect_all(run(conn, &UPDATE_GLOBALS, &changes).await?, changes.len())?;
    expect_all(run(conn, &RENEW_LEASES, &renewals).await?, renewals.len())?;
    saved.extend(changes.iter().map(|c| c.gid));
    written.extend(renewals.iter().map(|l| l.gid.to_owned()));
    Ok(saved)
}

/// The rows were locked and checked: an update that matched fewer means the check and the
/// statement disagree, and the batch must not commit on a guess.
fn expect_all(updated: u64, checked: usize) -> Result<()> {
    if updated == checked as u64 {
        Ok(())
    } else {
        Err(StoreError::Batch(format!(
            "{updated} rows updated where {checked} were locked and matched their guards"
        )))
    }
}

/// Writes `works` in one transaction; results in their order.
pub(super) async fn write(store: &SqlStore<MySql>, works: &[Work]) -> Result<Vec<JobResult>> {
    let rows = BatchRows::of(works)?;
    let mut db = store.begin_write().await?;
    let mut written = HashSet::new();
    if !rows.created.is_empty() {
        match run(db.conn(), &INSERT_GLOBALS, &rows.created).await {
            Ok(_) => {
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
    let saved = update_globals(db.conn(), &rows, &mut written).await?;
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
    let trims: Vec<_> = rows
        .trims
        .iter()
        .filter(|t| saved.contains(t.gid))
        .collect();
    run(db.conn(), &TRIM_ATTEMPTS, &trims).await?;
    db.end(true).await?;
    written.extend(saved.into_iter().map(str::to_owned));
    Ok(results(works, &written))
}

//! A batch of queued creates and saves in one statement: each column of the batch's rows
//! is bound as one array, `unnest` turns the arrays back into rows, and data-modifying
//! CTEs insert and update them. The text is the same for every batch, so each connection
//! prepares it once; one round trip and one commit serve the whole batch.
//!
//! A batch holds at most one write per transaction (the writers see to it), so the gids
//! the statement returns say which creates inserted and which saves matched. A save is
//! conditional as a single save is: its row must be in the expected status and owned by
//! the token (or at the version) the save names; only then are its branches updated and
//! its attempts inserted.

use std::collections::HashSet;
use std::sync::LazyLock;

use idem_sql::Backend;
use sqlx::Postgres;

use crate::store::sql::binds::clip;
use crate::store::sql::group_commit::{JobResult, Work};
use crate::store::sql::{BRANCH_COLUMNS, GLOBAL_COLUMNS, SqlStore, branch_groups};
use crate::store::{Guard, Result, Saved, StoreError};

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
        "varchar",
    ]);
    let created_branches = arrays(&[
        "varchar", "varchar", "varchar", "int", "text", "text", "varchar", "int", "bigint", "text",
        "bigint", "bigint", "bigint",
    ]);
    let saved = arrays(&[
        "varchar", "varchar", "varchar", "bigint", "varchar", "varchar", "int", "bigint", "text",
        "text", "bigint", "bigint", "bigint", "varchar", "bigint",
    ]);
    let saved_branches = arrays(&[
        "varchar", "varchar", "varchar", "varchar", "int", "bigint", "text", "bigint", "bigint",
        "bigint",
    ]);
    let attempts = arrays(&[
        "varchar", "varchar", "varchar", "int", "bigint", "bigint", "varchar", "text",
    ]);
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
             owner_token = v.owner_token, lease_until = v.lease_until, version = t.version + 1 \
           FROM unnest({saved}) AS v(gid, expected, guard_token, guard_version, status, \
             stalled_from, attempts, next_attempt_at, last_error, reason, timeout_at, \
             updated_at, finished_at, owner_token, lease_until) \
           WHERE t.gid = v.gid \
             AND (CASE WHEN t.status = v.expected \
                   AND (t.owner_token = v.guard_token OR t.version = v.guard_version) \
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
           INSERT INTO idem_attempt (gid, branch_id, action, attempt, started_at, duration_ms, outcome, detail) \
           SELECT v.* FROM unnest({attempts}) AS v(gid, branch_id, action, attempt, started_at, \
             duration_ms, outcome, detail) \
           WHERE v.gid IN (SELECT gid FROM su)) \
         SELECT gid FROM ci UNION ALL SELECT gid FROM su"
    );
    Backend::Postgres.rewrite(&sql)
});

/// The batch's rows, column by column.
#[derive(Default)]
struct Columns<'a> {
    // Created transactions (GLOBAL_COLUMNS).
    c_gid: Vec<&'a str>,
    c_kind: Vec<&'a str>,
    c_status: Vec<&'a str>,
    c_stalled_from: Vec<Option<&'a str>>,
    c_request_hash: Vec<&'a str>,
    c_options: Vec<String>,
    c_timeout_at: Vec<Option<i64>>,
    c_attempts: Vec<i32>,
    c_next_attempt_at: Vec<Option<i64>>,
    c_last_error: Vec<Option<&'a str>>,
    c_reason: Vec<Option<&'a str>>,
    c_owner_token: Vec<Option<&'a str>>,
    c_lease_until: Vec<Option<i64>>,
    c_version: Vec<i64>,
    c_created_at: Vec<i64>,
    c_updated_at: Vec<i64>,
    c_finished_at: Vec<Option<i64>>,
    c_traceparent: Vec<Option<&'a str>>,
    c_tracestate: Vec<Option<&'a str>>,
    // Their branches (BRANCH_COLUMNS).
    b: BranchColumns<'a>,
    // Saved transactions: the guard, then the new values.
    s_gid: Vec<&'a str>,
    s_expected: Vec<&'a str>,
    s_guard_token: Vec<Option<&'a str>>,
    s_guard_version: Vec<Option<i64>>,
    s_status: Vec<&'a str>,
    s_stalled_from: Vec<Option<&'a str>>,
    s_attempts: Vec<i32>,
    s_next_attempt_at: Vec<Option<i64>>,
    s_last_error: Vec<Option<&'a str>>,
    s_reason: Vec<Option<&'a str>>,
    s_timeout_at: Vec<Option<i64>>,
    s_updated_at: Vec<i64>,
    s_finished_at: Vec<Option<i64>>,
    s_owner_token: Vec<Option<&'a str>>,
    s_lease_until: Vec<Option<i64>>,
    // The branches the saves changed.
    u: BranchColumns<'a>,
    // The saves' attempts.
    a_gid: Vec<&'a str>,
    a_branch_id: Vec<&'a str>,
    a_action: Vec<&'a str>,
    a_attempt: Vec<i32>,
    a_started_at: Vec<i64>,
    a_duration_ms: Vec<i64>,
    a_outcome: Vec<&'a str>,
    a_detail: Vec<Option<&'a str>>,
}

/// Branch rows, column by column: all of `BRANCH_COLUMNS` for inserts; updates use the
/// key and the columns a save sets.
#[derive(Default)]
struct BranchColumns<'a> {
    gid: Vec<&'a str>,
    branch_id: Vec<&'a str>,
    action: Vec<&'a str>,
    seq: Vec<i32>,
    url: Vec<&'a str>,
    payload: Vec<&'a str>,
    status: Vec<&'a str>,
    attempts: Vec<i32>,
    next_attempt_at: Vec<Option<i64>>,
    last_error: Vec<Option<&'a str>>,
    in_progress_since: Vec<Option<i64>>,
    updated_at: Vec<i64>,
    finished_at: Vec<Option<i64>>,
}

impl<'a> BranchColumns<'a> {
    /// A branch a save changed: its key and the values a save sets.
    fn push_update(&mut self, gid: &'a str, branch_id: &'a str, b: &'a crate::core::Branch) {
        self.gid.push(gid);
        self.branch_id.push(branch_id);
        self.action.push(b.action.as_str());
        self.status.push(b.status.as_str());
        self.attempts.push(b.attempts);
        self.next_attempt_at.push(b.next_attempt_at);
        self.last_error.push(clip(&b.last_error));
        self.in_progress_since.push(b.in_progress_since);
        self.updated_at.push(b.updated_at);
        self.finished_at.push(b.finished_at);
    }

    /// A new branch row, every column.
    fn push(&mut self, gid: &'a str, b: &'a crate::core::Branch) {
        self.gid.push(gid);
        self.branch_id.push(&b.branch_id);
        self.action.push(b.action.as_str());
        self.seq.push(b.seq);
        self.url.push(&b.url);
        self.payload.push(&b.payload);
        self.status.push(b.status.as_str());
        self.attempts.push(b.attempts);
        self.next_attempt_at.push(b.next_attempt_at);
        self.last_error.push(clip(&b.last_error));
        self.in_progress_since.push(b.in_progress_since);
        self.updated_at.push(b.updated_at);
        self.finished_at.push(b.finished_at);
    }
}

impl<'a> Columns<'a> {
    fn of(works: &'a [Work]) -> Result<Columns<'a>> {
        let mut c = Columns::default();
        for work in works {
            match work {
                Work::Create(create) => {
                    let (tx, lease) = (&create.tx, create.lease.as_ref());
                    c.c_gid.push(&tx.gid);
                    c.c_kind.push(tx.kind.as_str());
                    c.c_status.push(tx.status.as_str());
                    c.c_stalled_from.push(tx.stalled_from.map(|s| s.as_str()));
                    c.c_request_hash.push(&create.request_hash);
                    c.c_options.push(
                        serde_json::to_string(&tx.options)
                            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    );
                    c.c_timeout_at.push(tx.timeout_at);
                    c.c_attempts.push(tx.attempts);
                    c.c_next_attempt_at.push(tx.next_attempt_at);
                    c.c_last_error.push(clip(&tx.last_error));
                    c.c_reason.push(clip(&tx.reason));
                    c.c_owner_token.push(lease.map(|l| l.token.as_str()));
                    c.c_lease_until.push(lease.map(|l| l.until));
                    c.c_version.push(0);
                    c.c_created_at.push(tx.created_at);
                    c.c_updated_at.push(tx.updated_at);
                    c.c_finished_at.push(tx.finished_at);
                    c.c_traceparent
                        .push(tx.trace.as_ref().map(|t| t.traceparent.as_str()));
                    c.c_tracestate
                        .push(tx.trace.as_ref().and_then(|t| t.tracestate.as_deref()));
                    for b in &tx.branches {
                        c.b.push(&tx.gid, b);
                    }
                }
                Work::Save(owned) => {
                    let save = owned.borrow();
                    let (before, after) = (save.before, save.after);
                    let gid = after.gid.as_str();
                    c.s_gid.push(gid);
                    c.s_expected.push(before.status.as_str());
                    match save.guard {
                        Guard::Owner(token) => {
                            c.s_guard_token.push(Some(token));
                            c.s_guard_version.push(None);
                        }
                        Guard::Version(version) => {
                            c.s_guard_token.push(None);
                            c.s_guard_version.push(Some(version));
                        }
                    }
                    c.s_status.push(after.status.as_str());
                    c.s_stalled_from
                        .push(after.stalled_from.map(|s| s.as_str()));
                    c.s_attempts.push(after.attempts);
                    c.s_next_attempt_at.push(after.next_attempt_at);
                    c.s_last_error.push(clip(&after.last_error));
                    c.s_reason.push(clip(&after.reason));
                    c.s_timeout_at.push(after.timeout_at);
                    c.s_updated_at.push(after.updated_at);
                    c.s_finished_at.push(after.finished_at);
                    c.s_owner_token.push(save.lease.map(|l| l.token.as_str()));
                    c.s_lease_until.push(save.lease.map(|l| l.until));
                    for group in branch_groups(before, after) {
                        for id in group.branch_ids {
                            c.u.push_update(gid, id, group.values);
                        }
                    }
                    for a in save.attempts {
                        c.a_gid.push(gid);
                        c.a_branch_id.push(&a.branch_id);
                        c.a_action.push(a.action.as_str());
                        c.a_attempt.push(a.attempt);
                        c.a_started_at.push(a.started_at);
                        c.a_duration_ms.push(a.duration_ms);
                        c.a_outcome.push(&a.outcome);
                        c.a_detail.push(clip(&a.detail));
                    }
                }
            }
        }
        Ok(c)
    }
}

/// Writes `works` in one statement; results in their order.
pub(super) async fn write(store: &SqlStore<Postgres>, works: &[Work]) -> Result<Vec<JobResult>> {
    let c = Columns::of(works)?;
    let query = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(BATCH.as_str()))
        .bind(&c.c_gid)
        .bind(&c.c_kind)
        .bind(&c.c_status)
        .bind(&c.c_stalled_from)
        .bind(&c.c_request_hash)
        .bind(&c.c_options)
        .bind(&c.c_timeout_at)
        .bind(&c.c_attempts)
        .bind(&c.c_next_attempt_at)
        .bind(&c.c_last_error)
        .bind(&c.c_reason)
        .bind(&c.c_owner_token)
        .bind(&c.c_lease_until)
        .bind(&c.c_version)
        .bind(&c.c_created_at)
        .bind(&c.c_updated_at)
        .bind(&c.c_finished_at)
        .bind(&c.c_traceparent)
        .bind(&c.c_tracestate)
        .bind(&c.b.gid)
        .bind(&c.b.branch_id)
        .bind(&c.b.action)
        .bind(&c.b.seq)
        .bind(&c.b.url)
        .bind(&c.b.payload)
        .bind(&c.b.status)
        .bind(&c.b.attempts)
        .bind(&c.b.next_attempt_at)
        .bind(&c.b.last_error)
        .bind(&c.b.in_progress_since)
        .bind(&c.b.updated_at)
        .bind(&c.b.finished_at)
        .bind(&c.s_gid)
        .bind(&c.s_expected)
        .bind(&c.s_guard_token)
        .bind(&c.s_guard_version)
        .bind(&c.s_status)
        .bind(&c.s_stalled_from)
        .bind(&c.s_attempts)
        .bind(&c.s_next_attempt_at)
        .bind(&c.s_last_error)
        .bind(&c.s_reason)
        .bind(&c.s_timeout_at)
        .bind(&c.s_updated_at)
        .bind(&c.s_finished_at)
        .bind(&c.s_owner_token)
        .bind(&c.s_lease_until)
        .bind(&c.u.gid)
        .bind(&c.u.branch_id)
        .bind(&c.u.action)
        .bind(&c.u.status)
        .bind(&c.u.attempts)
        .bind(&c.u.next_attempt_at)
        .bind(&c.u.last_error)
        .bind(&c.u.in_progress_since)
        .bind(&c.u.updated_at)
        .bind(&c.u.finished_at)
        .bind(&c.a_gid)
        .bind(&c.a_branch_id)
        .bind(&c.a_action)
        .bind(&c.a_attempt)
        .bind(&c.a_started_at)
        .bind(&c.a_duration_ms)
        .bind(&c.a_outcome)
        .bind(&c.a_detail);
    let lean = store
        .lean
        .as_ref()
        .ok_or_else(|| StoreError::Batch("PostgreSQL's store has no writer pool".into()))?;
    let mut conn = lean.get().await?;
    let written = query.fetch_all(&mut *conn).await;
    let written: HashSet<String> = conn.keep_if_ok(written)?.into_iter().collect();
    Ok(works
        .iter()
        .map(|work| {
            let matched = written.contains(work.gid());
            match work {
                Work::Create(_) => JobResult::Created(matched),
                Work::Save(_) => JobResult::Saved(if matched { Saved::Saved } else { Saved::Lost }),
            }
        })
        .collect())
}

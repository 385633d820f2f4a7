//! The SQL texts of the store, written with `?` and rewritten for one database once, when
//! the store is opened.

use std::sync::Arc;

use idem_sql::Backend;

/// The global row's columns a create inserts, as a literal for `concat!`.
macro_rules! global_columns {
    () => {
        "gid, kind, status, stalled_from, request_hash, options, timeout_at, \
         attempts, next_attempt_at, last_error, reason, owner_token, lease_until, version, \
         created_at, updated_at, finished_at, traceparent, tracestate, tokenless"
    };
}
pub(crate) const GLOBAL_COLUMNS: &str = global_columns!();
/// What a read of the global row takes: the inserted columns, then the counters a new
/// transaction starts at 0 (their columns' default), which only saves change.
pub(crate) const GLOBAL_READ: &str =
    concat!(global_columns!(), ", calls, history, history_dropped");
pub(crate) const BRANCH_COLUMNS: &str = "gid, branch_id, action, seq, url, payload, payload_bin, status, attempts, \
     next_attempt_at, last_error, in_progress_since, updated_at, finished_at";
pub(crate) const ATTEMPT_COLUMNS: &str =
    "number, branch_id, action, attempt, started_at, duration_ms, outcome, detail";
pub(crate) const ACTIVE_STATUSES: &str = "('prepared', 'running', 'committing', 'aborting')";
/// The active ones and `stalled`: every status but the terminal two.
pub(crate) const NON_TERMINAL_STATUSES: &str =
    "('prepared', 'running', 'committing', 'aborting', 'stalled')";

/// The statements, rewritten for one database once.
pub struct Statements {
    pub insert_global: Arc<str>,
    pub select_global: Arc<str>,
    pub select_branches: Arc<str>,
    pub update_global_owned: Arc<str>,
    pub update_global_by_version: Arc<str>,
    pub lock_prepared: Arc<str>,
    pub renew: Arc<str>,
    pub release: Arc<str>,
    pub select_attempts: Arc<str>,
    pub trim_attempts: Arc<str>,
    pub(super) insert_branches: Vec<Arc<str>>,
    pub(super) insert_attempts: Vec<Arc<str>>,
    pub(super) update_branches: Vec<Arc<str>>,
    backend: Backend,
}

/// Rows per multi-row statement; more rows take several statements.
pub(crate) const INSERT_BATCH: usize = 16;

impl Statements {
    pub(super) fn new(backend: Backend, on_duplicate: &str) -> Statements {
        let t = |sql: String| -> Arc<str> { backend.rewrite(&sql).into() };
        let rows = |n: usize, width: usize| -> String {
            let row = format!("({})", vec!["?"; width].join(", "));
            vec![row; n].join(", ")
        };
        Statements {
            insert_global: t(format!(
                "INSERT INTO idem_global ({GLOBAL_COLUMNS}) VALUES {}{on_duplicate}",
                rows(1, 20)
            )),
            select_global: t(format!(
                "SELECT {GLOBAL_READ} FROM idem_global WHERE gid = ?"
            )),
            select_branches: t(format!(
                "SELECT {BRANCH_COLUMNS} FROM idem_branch WHERE gid = ? ORDER BY seq, branch_id, action"
            )),
            update_global_owned: t(format!(
                "UPDATE idem_global SET {GLOBAL_SET} WHERE gid = ? AND status = ? AND owner_token = ? AND version = ?"
            )),
            update_global_by_version: t(format!(
                "UPDATE idem_global SET {GLOBAL_SET} WHERE gid = ? AND status = ? AND version = ?"
            )),
            lock_prepared: t(
                "UPDATE idem_global SET version = version + 1, updated_at = ? \
                 WHERE gid = ? AND status = 'prepared' AND (timeout_at IS NULL OR timeout_at > ?)"
                    .into(),
            ),
            renew: t(
                "UPDATE idem_global SET lease_until = CASE WHEN lease_until > ? THEN lease_until ELSE ? END \
                 WHERE gid = ? AND owner_token = ?"
                    .into(),
            ),
            release: t(
                "UPDATE idem_global SET lease_until = ? WHERE gid = ? AND owner_token = ?".into(),
            ),
            select_attempts: t(format!(
                "SELECT {ATTEMPT_COLUMNS} FROM idem_attempt WHERE gid = ? AND number > ? \
                 ORDER BY number LIMIT ?"
            )),
            trim_attempts: t(
                "DELETE FROM idem_attempt WHERE gid = ? AND number <= ?".into(),
            ),
            insert_branches: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "INSERT INTO idem_branch ({BRANCH_COLUMNS}) VALUES {}",
                        rows(n, BRANCH_COLUMNS.split(',').count())
                    ))
                })
                .collect(),
            update_branches: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "UPDATE idem_branch SET {BRANCH_SET} WHERE gid = ? AND action = ? AND branch_id IN ({})",
                        vec!["?"; n].join(", ")
                    ))
                })
                .collect(),
            insert_attempts: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "INSERT INTO idem_attempt (gid, {ATTEMPT_COLUMNS}) VALUES {}",
                        rows(n, ATTEMPT_COLUMNS.split(',').count())
                    ))
                })
                .collect(),
            backend,
        }
    }

    /// Rewrites a `?` statement built at run time (a list filter, an IN list).
    pub fn dynamic(&self, sql: &str) -> String {
        self.backend.rewrite(sql)
    }
}

pub(crate) const BRANCH_SET: &str = "status = ?, attempts = ?, next_attempt_at = ?, \
     last_error = ?, in_progress_since = ?, updated_at = ?, finished_at = ?";

pub(crate) const GLOBAL_SET: &str = "status = ?, stalled_from = ?, attempts = ?, next_attempt_at = ?, \
     last_error = ?, reason = ?, timeout_at = ?, updated_at = ?, finished_at = ?, \
     owner_token = ?, lease_until = ?, calls = ?, history = ?, history_dropped = ?, \
     version = version + 1";

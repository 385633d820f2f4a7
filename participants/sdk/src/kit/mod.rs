//! The SDK's ground floor: what the barrier and every tool of the idempotency kit stand on.
//! The key of a branch call ([`call`]); where a local transaction's connection comes from
//! ([`connections`]); the one local transaction guard, its conflict retries and the
//! insert-if-absent that grants the right to act in it ([`local`], [`retry`]); the clock
//! leases are measured on and the owner tokens that fence a claim; the key, table-name and
//! retention-window checks; the DDL runner; and the bounded delete that retention runs.
//!
//! The tools themselves (the barrier, the Idempotency-Key records, payment callbacks, the
//! consumer log, job units) each keep their table and protocol in their own module; this
//! one holds only what would otherwise be written once per tool, and imports nothing of
//! them (the floors are in the crate's documentation).

pub mod call;
pub mod connections;
pub mod local;
pub mod retry;

pub use call::{BranchCall, MAX_ID_LEN, MSG_BRANCH_ID, Op, TransType};
pub use connections::{OpenedStep, StepConnections};
pub(crate) use local::insert_if_absent;
pub use local::{LocalConn, LocalTx, StepTx, run_local};
pub use retry::RetryPolicy;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use std::time::Duration;

use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase};
use crate::error::ParticipantError;
use idem_sql::Backend;

/// Where leases and retention windows read the time, in Unix milliseconds.
///
/// A lease only decides *when* another instance may take over, never *whether* a write
/// lands (every write after a claim names the owner token in its `WHERE`), so skew between
/// instances cannot let a stale owner overwrite a newer one; it can still hand a live claim
/// to a second instance early, which is why the Idempotency-Key records judge their leases
/// on the database's clock ([`db_now_ms`]) unless given one of these. Tests give a
/// [`ManualClock`] and move it instead of sleeping.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
    }
}

/// A clock that moves only when told to, shared by clones (tests of lease expiry).
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn at(now_ms: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(now_ms)))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock behind an `Arc`, as the tools keep it.
pub type SharedClock = Arc<dyn Clock>;

/// The system clock as a [`SharedClock`].
pub fn system_clock() -> SharedClock {
    Arc::new(SystemClock)
}

/// A new owner token: 32 random hex digits, unguessable and never reused, so that a claim
/// that was taken over can be told from its successor by comparing tokens.
pub fn new_owner_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// SQL for the database's current time in Unix milliseconds, for `backend`: one clock for
/// every instance of a service, so that a lease written by one instance and judged by
/// another means the same moment to both.
///
/// MySQL/MariaDB counts from `UTC_TIMESTAMP`, never `UNIX_TIMESTAMP(NOW())`, whose
/// conversion through the session's time zone is ambiguous for an hour each autumn.
pub fn db_now_ms(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "CAST(floor(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)",
        Backend::Mysql => {
            "(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)) DIV 1000)"
        }
        Backend::Sqlite => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)",
    }
}

/// Deletes at most `batch` rows of `table` that match `predicate` (SQL with `?`
/// placeholders, bound to `args`), and returns how many went.
///
/// One bounded statement per call, so a purge never holds locks on a large part of a table
/// the service is writing; callers loop until fewer than `batch` rows went. `table` and
/// `predicate` are the caller's own text (checked table names, fixed SQL), never input.
pub(crate) async fn delete_batch<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
    predicate: &str,
    args: Vec<Arg>,
    batch: u32,
) -> Result<u64, sqlx::Error> {
    let dialect = DB::pool_dialect(pool);
    let sql = match dialect {
        // PostgreSQL has no DELETE ... LIMIT: pick the rows by their physical address.
        Backend::Postgres => format!(
            "DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} WHERE {predicate} LIMIT {batch}))"
        ),
        Backend::Mysql => format!("DELETE FROM {table} WHERE {predicate} LIMIT {batch}"),
        Backend::Sqlite => format!(
            "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} WHERE {predicate} LIMIT {batch})"
        ),
    };
    let mut conn = pool.acquire().await?;
    DB::exec(&mut conn, dialect.rewrite(&sql), args).await
}

/// Runs [`delete_batch`] until a batch comes back short; returns the rows deleted in all.
pub(crate) async fn delete_all_in_batches<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
    predicate: &str,
    args: Vec<Arg>,
    batch: u32,
) -> Result<u64, sqlx::Error> {
    let batch = batch.max(1);
    let mut total = 0;
    loop {
        let deleted = delete_batch(pool, table, predicate, args.clone(), batch).await?;
        total += deleted;
        if deleted < u64::from(batch) {
            return Ok(total);
        }
    }
}

/// Runs the DDL script of `pool`'s backend, statement by statement.
pub(crate) async fn run_script<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    sqlite: &str,
    postgres: &str,
    mysql: &str,
) -> Result<(), sqlx::Error> {
    run_statements(pool, [sqlite, postgres, mysql], |s| s, false).await
}

/// Runs a forward step of a kit table (the `ALTER TABLE .. ADD COLUMN` statements of
/// `pool`'s backend, each passed through `rename` for tables under another name), so that a
/// table created by an older SDK gains what a newer one reads and writes. A column that is
/// already there is no error: PostgreSQL's scripts say `ADD COLUMN IF NOT EXISTS`, and
/// MySQL/MariaDB (error 1060) and SQLite, which have no such clause, both answer
/// "duplicate column", which is taken as "done". So the step is safe to run at every start.
pub(crate) async fn run_forward_step<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    sqlite: &str,
    postgres: &str,
    mysql: &str,
    rename: impl Fn(String) -> String,
) -> Result<(), sqlx::Error> {
    run_statements(pool, [sqlite, postgres, mysql], rename, true).await
}

/// Runs the script of `pool`'s backend (`scripts`: SQLite, PostgreSQL, MySQL) statement by
/// statement, each passed through `rename`; `existing_columns_done`: "duplicate column" is
/// no error.
async fn run_statements<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    [sqlite, postgres, mysql]: [&str; 3],
    rename: impl Fn(String) -> String,
    existing_columns_done: bool,
) -> Result<(), sqlx::Error> {
    let script = match DB::pool_dialect(pool) {
        Backend::Sqlite => sqlite,
        Backend::Postgres => postgres,
        Backend::Mysql => mysql,
    };
    let mut conn = pool.acquire().await?;
    for statement in split_sql_script(script) {
        match DB::exec(&mut conn, rename(statement), Vec::new()).await {
            Ok(_) => {}
            Err(sqlx::Error::Database(e))
                if existing_columns_done
                    && e.message()
                        .to_ascii_lowercase()
                        .contains("duplicate column") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Splits a DDL script on `;` at line ends, dropping `--` comment lines, so it can be run
/// one statement at a time (prepared statements take one each). Meant for simple DDL
/// files like the SDK's own: a `;` ending a line inside a literal would split it.
pub fn split_sql_script(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let stmt = current.trim().trim_end_matches(';').trim().to_owned();
            out.push(stmt);
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_owned());
    }
    out
}

/// Checks a table name: a plain SQL identifier, because it is spliced into SQL text.
pub fn check_table_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "barrier table name `{name}` must be a plain identifier: [A-Za-z_][A-Za-z0-9_]*, at most 48 characters"
        ));
    }
    Ok(())
}

/// Refuses a retention window below `min`: deleting the record of a repeat that may still
/// arrive re-executes it (seed §24).
pub(crate) fn refuse_short_window(
    what: &str,
    older_than: Duration,
    min: Duration,
) -> Result<(), ParticipantError> {
    if older_than < min {
        return Err(ParticipantError::refused(format!(
            "{what} retention of {}s is shorter than the minimum {}s: a repeat arriving later would run again",
            older_than.as_secs(),
            min.as_secs()
        )));
    }
    Ok(())
}

/// Refuses an empty key part or one longer than `max` characters, before any write: a key
/// the table cannot hold is the caller's mistake, not a database error.
pub(crate) fn check_key(what: &str, value: &str, max: usize) -> Result<(), ParticipantError> {
    let len = value.chars().count();
    if len == 0 || len > max {
        return Err(ParticipantError::refused(format!(
            "invalid {what}: must be 1 to {max} characters, got {len}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_table_name("idem_barrier").is_ok());
        assert!(check_table_name("_b2").is_ok());
        assert!(check_table_name("").is_err());
        assert!(check_table_name("2b").is_err());
        assert!(check_table_name("dtm.barrier").is_err());
        assert!(check_table_name("b; DROP TABLE x").is_err());
        assert!(check_table_name(&"b".repeat(49)).is_err());
    }

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::at(1_000);
        let other = clock.clone();
        assert_eq!(clock.now_ms(), 1_000);
        other.advance(250);
        assert_eq!(clock.now_ms(), 1_250);
    }

    #[test]
    fn owner_tokens_are_32_hex_digits_and_differ() {
        let a = new_owner_token();
        let b = new_owner_token();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}

//! A local transaction for the kit's tools: the record a tool writes and the business
//! change of the closure commit together or not at all (the seed's mode 1, §11 and §17),
//! with the lock-conflict retries the barrier has.

use std::future::Future;
use std::sync::Arc;

use sqlx::AssertSqlSafe;

use crate::backend::{Arg, BarrierDatabase};
use crate::barrier::step::{OpenedStep, Shared, Slot, StepConnections};
use crate::barrier::{RetryPolicy, jitter_unit};
use crate::error::{DbErrorKind, ParticipantError, classify};
use idem_sql::Backend;

/// The local transaction a tool's closure works in: the connection, and the backend for
/// its SQL's placeholders. Like [`StepTx`](crate::StepTx), it is handed over by value so
/// that the closure's future is `Send` and may borrow the request.
pub struct LocalTx<'t, DB: sqlx::Database> {
    pub(crate) slot: Shared<'t, DB>,
    pub(crate) dialect: Backend,
}

impl<DB: sqlx::Database> Clone for LocalTx<'_, DB> {
    fn clone(&self) -> Self {
        LocalTx {
            slot: self.slot.clone(),
            dialect: self.dialect,
        }
    }
}

/// The connection of a [`LocalTx`], borrowed; `.execute(&mut *tx.conn())`.
pub struct LocalConn<'g, 't, DB: sqlx::Database> {
    guard: tokio::sync::MutexGuard<'g, Slot<'t, DB>>,
}

impl<DB: sqlx::Database> std::ops::Deref for LocalConn<'_, '_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &*self.guard {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

impl<DB: sqlx::Database> std::ops::DerefMut for LocalConn<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.conn()
    }
}

impl<'t, DB: sqlx::Database> LocalTx<'t, DB> {
    /// The connection, inside the local transaction.
    ///
    /// # Panics
    /// If an earlier guard of this transaction is still alive (two statements at once on one
    /// connection is a bug; waiting would hang for ever).
    pub fn conn(&self) -> LocalConn<'_, 't, DB> {
        LocalConn {
            guard: self.slot.try_lock().expect(
                "LocalTx::conn: the connection is already borrowed; drop the previous guard first",
            ),
        }
    }

    /// Which database this is.
    pub fn dialect(&self) -> Backend {
        self.dialect
    }

    /// `text` (with `?` placeholders) in this backend's placeholder syntax.
    pub fn sql(&self, text: &str) -> AssertSqlSafe<String> {
        self.dialect.sql(text)
    }
}

/// Runs `work` in one local transaction on `pool` (`BEGIN IMMEDIATE` on SQLite), commits
/// when it returns `Ok` and rolls back otherwise. A lost lock conflict (deadlock,
/// serialization failure, busy database) re-runs the whole transaction under `retry`, so
/// `work` must change nothing outside it; after the last attempt it is a transient error.
///
/// `what` names the tool in logs.
pub async fn run_local<S, T, F, Fut>(
    pool: &S,
    retry: RetryPolicy,
    what: &'static str,
    mut work: F,
) -> Result<T, ParticipantError>
where
    S: StepConnections,
    F: FnMut(LocalTx<'static, S::Database>) -> Fut,
    Fut: Future<Output = Result<T, ParticipantError>>,
{
    let dialect = pool.dialect();
    let mut attempt = 1;
    loop {
        match attempt_once(pool, dialect, &mut work).await {
            Err(e) if e.is_retryable_conflict(dialect) && attempt < retry.max_attempts => {
                tracing::debug!(what, attempt, error = %e, "local transaction lost a lock conflict; retrying");
                tokio::time::sleep(retry.delay(attempt, jitter_unit())).await;
                attempt += 1;
            }
            Err(e) if e.is_retryable_conflict(dialect) => {
                tracing::warn!(what, attempt, error = %e, "local transaction kept losing lock conflicts; giving up");
                return Err(ParticipantError::transient(format!(
                    "lock conflict persisted after {attempt} attempts: {e}"
                )));
            }
            other => return other,
        }
    }
}

async fn attempt_once<S, T, F, Fut>(
    pool: &S,
    dialect: Backend,
    work: &mut F,
) -> Result<T, ParticipantError>
where
    S: StepConnections,
    F: FnMut(LocalTx<'static, S::Database>) -> Fut,
    Fut: Future<Output = Result<T, ParticipantError>>,
{
    let opened = pool.open(dialect.begin_statement()).await?;
    let slot: Shared<'static, S::Database> = Arc::new(tokio::sync::Mutex::new(opened.0));
    let result = work(LocalTx {
        slot: slot.clone(),
        dialect,
    })
    .await;
    let tx = match Arc::try_unwrap(slot).map(tokio::sync::Mutex::into_inner) {
        Ok(slot) => OpenedStep(slot),
        Err(_) => {
            return Err(ParticipantError::internal(
                "a LocalTx outlived its closure; the transaction was abandoned",
            ));
        }
    };
    match result {
        Ok(value) => {
            tx.finish(true).await?;
            Ok(value)
        }
        Err(e) => {
            if let Err(rollback) = tx.finish(false).await {
                tracing::debug!(error = %rollback, "rollback after a failed local transaction failed; the connection is discarded");
            }
            Err(e)
        }
    }
}

/// Runs one of the backend's primitives on a [`LocalTx`]'s connection.
pub(crate) async fn exec<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    sql: &str,
    args: Vec<Arg>,
) -> Result<u64, sqlx::Error> {
    let mut conn = tx.conn();
    DB::exec(&mut conn, tx.dialect.rewrite(sql), args).await
}

/// Reads rows on a [`LocalTx`]'s connection, typed by `kinds`.
pub(crate) async fn fetch<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    sql: &str,
    args: Vec<Arg>,
    kinds: &'static [crate::backend::CellKind],
) -> Result<Vec<Vec<crate::backend::Cell>>, sqlx::Error> {
    let mut conn = tx.conn();
    DB::fetch_cells(&mut conn, tx.dialect.rewrite(sql), args, kinds).await
}

/// Inserts one row into `table` unless a row with the same unique key (`conflict`, its
/// columns) exists; true when this call inserted it. `columns` is `(a, b) VALUES (?, ?)`.
///
/// The insert itself decides, never a read before it (two readers would both see
/// "absent"): PostgreSQL and SQLite skip the row with `ON CONFLICT DO NOTHING` (which does
/// not abort PostgreSQL's transaction); MySQL/MariaDB get a plain `INSERT` and error 1062,
/// which rolls back only that statement. A concurrent inserter of the same key waits for
/// the first transaction and then sees its row, or inserts if it rolled back.
pub(crate) async fn insert_if_absent<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    table: &str,
    columns: &str,
    conflict: &str,
    args: Vec<Arg>,
) -> Result<bool, ParticipantError> {
    let sql = match tx.dialect() {
        Backend::Postgres | Backend::Sqlite => {
            format!("INSERT INTO {table} {columns} ON CONFLICT ({conflict}) DO NOTHING")
        }
        Backend::Mysql => format!("INSERT INTO {table} {columns}"),
    };
    match exec(tx, &sql, args).await {
        Ok(n) => Ok(n == 1),
        Err(e)
            if tx.dialect() == Backend::Mysql
                && classify(tx.dialect(), &e) == DbErrorKind::UniqueViolation =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

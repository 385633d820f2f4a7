//! The one local transaction every guarded write runs in: the barrier's step and each kit
//! tool's record commit with the closure's business change, or not at all (the seed's
//! mode 1, §11 and §17), and a lost lock conflict re-runs the whole transaction.
//!
//! The closure gets a [`LocalTx`] by value (`|tx| async move { ... }`): an owned handle
//! keeps the closure's future free of higher-ranked lifetimes, which is what lets it borrow
//! the request and still be `Send` for axum. A barrier step's handle also carries the call
//! it guards ([`StepTx`]), for ledger rows keyed like the barrier's.

use std::future::Future;
use std::sync::Arc;

use sqlx::{AssertSqlSafe, Database};

use super::call::BranchCall;
use super::connections::{Slot, StepConnections};
use super::retry::{RetryPolicy, jitter_unit};
use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::{DbErrorKind, ParticipantError, classify};
use idem_sql::Backend;

type Shared<'t, DB> = Arc<tokio::sync::Mutex<Slot<'t, DB>>>;

/// The local transaction a closure works in: the connection, the backend for its SQL's
/// placeholders, and `C`, what the transaction is for: nothing for a kit tool's, the
/// [`BranchCall`] for a barrier step's ([`StepTx`]).
///
/// Do not keep it beyond the closure's future: the transaction is committed (or rolled
/// back) once every handle is gone, and one that outlives its closure fails the attempt.
pub struct LocalTx<'t, DB: Database, C = ()> {
    slot: Shared<'t, DB>,
    dialect: Backend,
    call: C,
}

/// The transaction of a barrier step ([`Barrier::run`](crate::Barrier::run)): a
/// [`LocalTx`] that knows the call it guards ([`LocalTx::call`]).
pub type StepTx<'t, DB> = LocalTx<'t, DB, BranchCall>;

impl<DB: Database, C: Clone> Clone for LocalTx<'_, DB, C> {
    fn clone(&self) -> Self {
        LocalTx {
            slot: self.slot.clone(),
            dialect: self.dialect,
            call: self.call.clone(),
        }
    }
}

/// The connection of a [`LocalTx`], borrowed: dereferences to the backend's connection, so
/// `.execute(&mut *tx.conn())` runs a statement in the transaction.
pub struct LocalConn<'g, 't, DB: Database> {
    guard: tokio::sync::MutexGuard<'g, Slot<'t, DB>>,
}

impl<DB: Database> std::ops::Deref for LocalConn<'_, '_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.guard.conn()
    }
}

impl<DB: Database> std::ops::DerefMut for LocalConn<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.conn_mut()
    }
}

impl<'t, DB: Database, C> LocalTx<'t, DB, C> {
    /// The connection, inside the local transaction. Execute statements on
    /// `&mut *tx.conn()`.
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

    /// Which database this is (for its SQL's placeholders).
    pub fn dialect(&self) -> Backend {
        self.dialect
    }

    /// `text` (with `?` placeholders) in this backend's placeholder syntax.
    pub fn sql(&self, text: &str) -> AssertSqlSafe<String> {
        self.dialect.sql(text)
    }

    /// The connection for the SDK's own statements: waits for a guard the closure may
    /// still hold instead of panicking.
    async fn lock(&self) -> LocalConn<'_, 't, DB> {
        LocalConn {
            guard: self.slot.lock().await,
        }
    }

    /// The same transaction, for `call`.
    pub(crate) fn for_call<K>(&self, call: K) -> LocalTx<'t, DB, K> {
        LocalTx {
            slot: Arc::clone(&self.slot),
            dialect: self.dialect,
            call,
        }
    }
}

impl<DB: Database> StepTx<'_, DB> {
    /// The call being guarded: its tenant and gid key every ledger row a participant shared
    /// by tenants writes; its branch and op say which step this is.
    pub fn call(&self) -> &BranchCall {
        &self.call
    }
}

/// One attempt's transaction, from its start to its end.
pub(crate) struct Attempt<'t, DB: Database> {
    slot: Shared<'t, DB>,
    dialect: Backend,
}

impl<'t, DB: BarrierDatabase> Attempt<'t, DB> {
    async fn open<S>(pool: &S, dialect: Backend) -> Result<Attempt<'static, DB>, sqlx::Error>
    where
        S: StepConnections<Database = DB>,
    {
        let opened = pool.open(dialect.begin_statement()).await?;
        Ok(Attempt {
            slot: Arc::new(tokio::sync::Mutex::new(opened.0)),
            dialect,
        })
    }

    /// An attempt inside the caller's transaction, which the caller ends.
    pub(crate) fn borrowed(conn: &'t mut DB::Connection) -> Attempt<'t, DB> {
        let dialect = DB::conn_dialect(conn);
        Attempt {
            slot: Arc::new(tokio::sync::Mutex::new(Slot::Borrowed(conn))),
            dialect,
        }
    }

    pub(crate) fn tx(&self) -> LocalTx<'t, DB> {
        LocalTx {
            slot: Arc::clone(&self.slot),
            dialect: self.dialect,
            call: (),
        }
    }

    /// Commits when `result` is `Ok` and rolls back otherwise (a borrowed transaction is
    /// left to its owner), and passes `result` on.
    pub(crate) async fn end<T>(
        self,
        result: Result<T, ParticipantError>,
    ) -> Result<T, ParticipantError> {
        let Ok(slot) = Arc::try_unwrap(self.slot).map(tokio::sync::Mutex::into_inner) else {
            // The closure kept its LocalTx alive (spawned it, stored it). The transaction
            // rolls back when the last handle drops; the caller of `run_in` must roll back.
            return Err(ParticipantError::internal(
                "a LocalTx outlived its closure; the transaction must roll back",
            ));
        };
        match result {
            Ok(value) => {
                slot.finish(true).await?;
                Ok(value)
            }
            Err(e) => {
                if let Err(rollback) = slot.finish(false).await {
                    tracing::debug!(error = %rollback, "rollback after a failed local transaction failed; the connection is discarded");
                }
                Err(e)
            }
        }
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
    work: F,
) -> Result<T, ParticipantError>
where
    S: StepConnections,
    F: FnMut(LocalTx<'static, S::Database>) -> Fut,
    Fut: Future<Output = Result<T, ParticipantError>>,
{
    let retrying = Retrying {
        retry,
        what,
        call: None,
    };
    retrying
        .run(
            pool,
            || {},
            work,
            |tx, mut work| async move {
                let attempt = work(tx);
                (attempt.await, work)
            },
        )
        .await
}

/// How [`run_local`] and the barrier re-run a transaction that lost a lock conflict, and
/// what they name in the logs when they do.
pub(crate) struct Retrying<'a> {
    pub(crate) retry: RetryPolicy,
    pub(crate) what: &'static str,
    /// The barrier's call, for its logs.
    pub(crate) call: Option<&'a BranchCall>,
}

impl Retrying<'_> {
    /// Runs `attempt` in a transaction of its own on `pool`, again after each lost lock
    /// conflict (calling `on_retry`), until one ends otherwise or the attempts run out.
    ///
    /// `state` (the caller's closure) goes into each attempt and comes back out of it, so
    /// that the attempt's future owns it instead of borrowing it from a closure, which an
    /// `FnMut` cannot lend.
    pub(crate) async fn run<S, St, T, F, Fut>(
        &self,
        pool: &S,
        mut on_retry: impl FnMut(),
        mut state: St,
        mut attempt: F,
    ) -> Result<T, ParticipantError>
    where
        S: StepConnections,
        F: FnMut(LocalTx<'static, S::Database>, St) -> Fut,
        Fut: Future<Output = (Result<T, ParticipantError>, St)>,
    {
        let dialect = pool.dialect();
        let call = self.call;
        let (tenant, gid) = (call.map(|c| c.tenant()), call.map(|c| c.gid()));
        let (branch_id, op) = (call.map(|c| c.branch_id()), call.map(|c| c.op().as_str()));
        let mut number = 1;
        loop {
            let result = match Attempt::open(pool, dialect).await {
                Ok(opened) => {
                    let (result, back) = attempt(opened.tx(), state).await;
                    state = back;
                    opened.end(result).await
                }
                Err(e) => Err(e.into()),
            };
            match result {
                Err(e) if e.is_retryable_conflict(dialect) && number < self.retry.max_attempts => {
                    tracing::debug!(what = self.what, tenant, gid, branch_id, op, attempt = number, error = %e,
                        "local transaction lost a lock conflict; retrying");
                    on_retry();
                    tokio::time::sleep(self.retry.delay(number, jitter_unit())).await;
                    number += 1;
                }
                Err(e) if e.is_retryable_conflict(dialect) => {
                    tracing::warn!(what = self.what, tenant, gid, branch_id, op, attempt = number, error = %e,
                        "local transaction kept losing lock conflicts; giving up");
                    return Err(ParticipantError::transient(format!(
                        "lock conflict persisted after {number} attempts: {e}"
                    )));
                }
                other => return other,
            }
        }
    }
}

/// Runs one of the backend's primitives on a [`LocalTx`]'s connection.
pub(crate) async fn exec<DB: BarrierDatabase, C>(
    tx: &LocalTx<'_, DB, C>,
    sql: &str,
    args: Vec<Arg>,
) -> Result<u64, sqlx::Error> {
    let mut conn = tx.lock().await;
    DB::exec(&mut conn, tx.dialect.rewrite(sql), args).await
}

/// Reads rows on a [`LocalTx`]'s connection, typed by `kinds`.
pub(crate) async fn fetch<DB: BarrierDatabase, C>(
    tx: &LocalTx<'_, DB, C>,
    sql: &str,
    args: Vec<Arg>,
    kinds: &'static [CellKind],
) -> Result<Vec<Vec<Cell>>, sqlx::Error> {
    let mut conn = tx.lock().await;
    DB::fetch_cells(&mut conn, tx.dialect.rewrite(sql), args, kinds).await
}

/// Reads rows of `columns` text columns on a [`LocalTx`]'s connection.
pub(crate) async fn fetch_texts<DB: BarrierDatabase, C>(
    tx: &LocalTx<'_, DB, C>,
    sql: &str,
    args: Vec<Arg>,
    columns: usize,
) -> Result<Vec<Vec<Option<String>>>, sqlx::Error> {
    let mut conn = tx.lock().await;
    DB::fetch_texts(&mut conn, tx.dialect.rewrite(sql), args, columns).await
}

/// Inserts one row into `table` unless a row with the same unique key (`conflict`, its
/// columns) exists; true when this call inserted it. `columns` is `(a, b) VALUES (?, ?)`.
///
/// The insert itself decides, never a read before it (two readers would both see
/// "absent"): PostgreSQL and SQLite skip the row with `ON CONFLICT DO NOTHING` (which does
/// not abort PostgreSQL's transaction; catching a unique violation instead would);
/// MySQL/MariaDB get a plain `INSERT` and error 1062, which rolls back only that statement
/// (`INSERT IGNORE` would also turn truncation and NULL errors into warnings). A
/// concurrent inserter of the same key waits for the first transaction and then sees its
/// row, or inserts if it rolled back.
pub(crate) async fn insert_if_absent<DB: BarrierDatabase, C>(
    tx: &LocalTx<'_, DB, C>,
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

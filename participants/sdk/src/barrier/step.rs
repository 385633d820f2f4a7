//! The step's connection: the local transaction [`Barrier::run`](super::Barrier::run)
//! opens (on a `sqlx::Pool` or a [`LeanPool`]) or the caller's
//! ([`Barrier::run_in`](super::Barrier::run_in)), and the [`StepTx`] handle the closure
//! works through.

use std::future::Future;
use std::sync::Arc;

use sqlx::{AssertSqlSafe, Database, Pool, Transaction};

use super::{Barrier, Op, TransType};
use crate::backend::BarrierDatabase;
use crate::pool::{LeanPool, Leased};
use idem_sql::Backend;

/// Where the step's connection lives: a transaction the barrier opened and will commit
/// ([`Barrier::run`], on a `sqlx::Pool` or on a [`LeanPool`] connection), or the caller's
/// ([`Barrier::run_in`]).
pub(crate) enum Slot<'t, DB: Database> {
    Owned(Transaction<'static, DB>),
    /// A leased connection on which the barrier began a transaction.
    Leased(Leased<DB>),
    Borrowed(&'t mut DB::Connection),
}

impl<DB: Database> Slot<'_, DB> {
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        match self {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

/// A local transaction [`Barrier::run`] opened for one attempt of a step.
pub struct OpenedStep<DB: Database>(pub(crate) Slot<'static, DB>);

impl<DB: BarrierDatabase> OpenedStep<DB> {
    pub(crate) async fn finish(self, commit: bool) -> Result<(), sqlx::Error> {
        match self.0 {
            Slot::Owned(tx) if commit => tx.commit().await,
            Slot::Owned(tx) => tx.rollback().await,
            Slot::Leased(mut conn) => {
                let end = if commit { "COMMIT" } else { "ROLLBACK" };
                let done = DB::exec_unprepared(&mut conn, end).await;
                // Back to the pool only when the transaction ended cleanly.
                conn.keep_if_ok(done)
            }
            Slot::Borrowed(_) => unreachable!("run owns its transaction"),
        }
    }
}

/// Where [`Barrier::run`] opens each step's local transaction: a `sqlx::Pool`, or a
/// [`LeanPool`] (no round trip to hand the connection back).
pub trait StepConnections: Sync {
    /// The database the connections are to.
    type Database: BarrierDatabase;

    /// The SQL dialect of the database behind it.
    fn dialect(&self) -> Backend;

    /// Takes a connection and begins a transaction on it (with `begin`, if given, instead of
    /// the backend's default statement).
    fn open(
        &self,
        begin: Option<&'static str>,
    ) -> impl Future<Output = Result<OpenedStep<Self::Database>, sqlx::Error>> + Send;
}

impl<DB: BarrierDatabase> StepConnections for Pool<DB> {
    type Database = DB;

    fn dialect(&self) -> Backend {
        DB::pool_dialect(self)
    }

    async fn open(&self, begin: Option<&'static str>) -> Result<OpenedStep<DB>, sqlx::Error> {
        let tx = match begin {
            Some(statement) => self.begin_with(statement).await?,
            None => self.begin().await?,
        };
        Ok(OpenedStep(Slot::Owned(tx)))
    }
}

impl<DB: BarrierDatabase> StepConnections for LeanPool<DB> {
    type Database = DB;

    fn dialect(&self) -> Backend {
        DB::options_dialect(self.connect_options())
    }

    async fn open(&self, begin: Option<&'static str>) -> Result<OpenedStep<DB>, sqlx::Error> {
        let mut conn = self.get().await?;
        // Dropped on failure: the pool closes a connection nobody vouched for.
        DB::exec_unprepared(&mut conn, begin.unwrap_or("BEGIN")).await?;
        Ok(OpenedStep(Slot::Leased(conn)))
    }
}

pub(crate) type Shared<'t, DB> = Arc<tokio::sync::Mutex<Slot<'t, DB>>>;

/// The local transaction a guarded closure works in, plus what it needs to write its own
/// statements for whichever backend this is.
///
/// The closure receives it by value (`|tx| async move { ... }`): an owned handle keeps the
/// closure's future free of higher-ranked lifetimes, which is what lets it borrow the
/// request payload and still be `Send` for axum. Do not keep it beyond the closure's
/// future; the barrier needs the transaction back to commit it.
pub struct StepTx<'t, DB: Database> {
    pub(super) slot: Shared<'t, DB>,
    pub(super) dialect: Backend,
    pub(super) barrier: Arc<Barrier>,
}

/// The connection of a [`StepTx`], borrowed: dereferences to the backend's connection, so
/// `.execute(&mut *tx.conn())` runs a statement in the step's transaction.
pub struct StepConn<'g, 't, DB: Database> {
    guard: tokio::sync::MutexGuard<'g, Slot<'t, DB>>,
}

impl<DB: Database> std::ops::Deref for StepConn<'_, '_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &*self.guard {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

impl<DB: Database> std::ops::DerefMut for StepConn<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.conn()
    }
}

impl<'t, DB: Database> StepTx<'t, DB> {
    /// The connection, inside the barrier's transaction. Execute business statements on
    /// `&mut *tx.conn()`.
    ///
    /// # Panics
    /// If an earlier `conn()` guard of this step is still alive (two statements at once on
    /// one connection is a bug; waiting would hang forever).
    pub fn conn(&self) -> StepConn<'_, 't, DB> {
        StepConn {
            guard: self.slot.try_lock().expect(
                "StepTx::conn: the connection is already borrowed; drop the previous guard first",
            ),
        }
    }

    /// Which database the step runs on (for its SQL's placeholders).
    pub fn dialect(&self) -> Backend {
        self.dialect
    }

    /// `text` (with `?` placeholders) in this backend's placeholder syntax.
    pub fn sql(&self, text: &str) -> AssertSqlSafe<String> {
        self.dialect.sql(text)
    }

    /// The gid of the call being guarded; handy as a ledger key.
    pub fn gid(&self) -> &str {
        &self.barrier.gid
    }

    /// The branch within the global transaction.
    pub fn branch_id(&self) -> &str {
        &self.barrier.branch_id
    }

    /// The operation being performed.
    pub fn op(&self) -> Op {
        self.barrier.op
    }

    /// The transaction kind.
    pub fn trans_type(&self) -> TransType {
        self.barrier.trans_type
    }
}

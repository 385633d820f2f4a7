//! Where a local transaction's connection comes from: a `sqlx::Pool` or a [`LeanPool`]
//! ([`StepConnections`]), on which [`run_local`](super::run_local) and
//! [`Barrier::run`](crate::Barrier::run) open each attempt's transaction, or the caller's
//! own transaction ([`Barrier::run_in`](crate::Barrier::run_in)).

use std::future::Future;

use sqlx::{Database, Pool, Transaction};

use crate::backend::BarrierDatabase;
use idem_sql::Backend;
use idem_sql::pool::{LeanPool, Leased};

/// Where a local transaction's connection lives: a transaction opened here and committed
/// here (on a `sqlx::Pool` or on a [`LeanPool`] connection), or the caller's, which the
/// caller ends.
pub(crate) enum Slot<'t, DB: Database> {
    Owned(Transaction<'static, DB>),
    /// A leased connection on which a transaction was begun here.
    Leased(Leased<DB>),
    Borrowed(&'t mut DB::Connection),
}

impl<DB: Database> Slot<'_, DB> {
    pub(crate) fn conn(&self) -> &DB::Connection {
        match self {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }

    pub(crate) fn conn_mut(&mut self) -> &mut DB::Connection {
        match self {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

impl<DB: BarrierDatabase> Slot<'_, DB> {
    /// Commits or rolls back a transaction opened here; the caller's own is left to the
    /// caller.
    pub(crate) async fn finish(self, commit: bool) -> Result<(), sqlx::Error> {
        match self {
            Slot::Owned(tx) if commit => tx.commit().await,
            Slot::Owned(tx) => tx.rollback().await,
            Slot::Leased(mut conn) => {
                let end = if commit { "COMMIT" } else { "ROLLBACK" };
                let done = DB::exec_unprepared(&mut conn, end).await;
                // Back to the pool only when the transaction ended cleanly.
                conn.keep_if_ok(done)
            }
            Slot::Borrowed(_) => Ok(()),
        }
    }
}

/// A local transaction opened for one attempt ([`StepConnections::open`]).
pub struct OpenedStep<DB: Database>(pub(crate) Slot<'static, DB>);

/// Where each attempt's local transaction is opened: a `sqlx::Pool`, or a [`LeanPool`] (no
/// round trip to hand the connection back).
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

//! A connection pool whose hand-back costs no round trip.
//!
//! `sqlx::Pool` pings every connection when it is released (a `Sync` round trip on
//! PostgreSQL, a `COM_PING` on MySQL), to flush a rollback left by a future that was dropped
//! mid-statement. For a step that is one short transaction, that is one more round trip for
//! every transaction, paid by the participant and by the database server: measured on the
//! project's 2-core machine, removing it raised `idem bench --workload tcc` on PostgreSQL
//! by about a quarter.
//!
//! [`LeanPool`] gets the same safety differently: a [`Leased`] connection goes back to the
//! pool only when its user said the work on it finished cleanly ([`Leased::keep`]). An
//! error, a panic or a cancelled future drops it instead, closing the connection, so a
//! connection in an unknown state is never handed out again. Connections are opened lazily,
//! up to the maximum, and a broken idle connection fails its next statement and is dropped
//! the same way (the caller's retry gets a fresh one).

use std::future::Future;
use std::sync::{Arc, Mutex};

use sqlx::{ConnectOptions, Connection, Database, Pool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Up to `max` connections to one database, handed out as [`Leased`].
pub struct LeanPool<DB: Database> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Database> Clone for LeanPool<DB> {
    fn clone(&self) -> Self {
        LeanPool {
            inner: self.inner.clone(),
        }
    }
}

/// Runs on every new connection before its first use (session settings).
pub type AfterConnect<DB> = Arc<
    dyn for<'c> Fn(
            &'c mut <DB as Database>::Connection,
        )
            -> std::pin::Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>>
        + Send
        + Sync,
>;

struct Inner<DB: Database> {
    options: <DB::Connection as Connection>::Options,
    after_connect: Option<AfterConnect<DB>>,
    idle: Mutex<Vec<DB::Connection>>,
    permits: Arc<Semaphore>,
}

impl<DB: Database> LeanPool<DB> {
    /// A pool that opens up to `max` connections with `options`, when they are first needed.
    pub fn new(options: <DB::Connection as Connection>::Options, max: u32) -> Self {
        let max = max.max(1);
        LeanPool {
            inner: Arc::new(Inner {
                options,
                after_connect: None,
                idle: Mutex::new(Vec::new()),
                permits: Arc::new(Semaphore::new(max as usize)),
            }),
        }
    }

    /// Runs `init` on every connection this pool opens, before anyone uses it. Call it
    /// before the pool is shared.
    pub fn after_connect(mut self, init: AfterConnect<DB>) -> Self {
        Arc::get_mut(&mut self.inner)
            .expect("after_connect is set before the pool is cloned")
            .after_connect = Some(init);
        self
    }

    /// A pool with the connect options and the size of a `sqlx::Pool`, beside it.
    pub fn like(pool: &Pool<DB>) -> Self {
        LeanPool::new(
            (*pool.connect_options()).clone(),
            pool.options().get_max_connections(),
        )
    }

    /// The options connections are opened with.
    pub fn connect_options(&self) -> &<DB::Connection as Connection>::Options {
        &self.inner.options
    }

    /// Waits for a free connection (opening one if none is idle).
    pub async fn get(&self) -> Result<Leased<DB>, sqlx::Error> {
        let permit = self
            .inner
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let idle = self.inner.idle.lock().expect("idle list lock").pop();
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let mut conn = self.inner.options.connect().await?;
                if let Some(init) = &self.inner.after_connect {
                    init(&mut conn).await?;
                }
                conn
            }
        };
        Ok(Leased {
            conn: Some(conn),
            pool: self.inner.clone(),
            reusable: false,
            _permit: permit,
        })
    }

    /// Closes the idle connections (those in use close when they are dropped).
    pub async fn close(&self) {
        let idle = std::mem::take(&mut *self.inner.idle.lock().expect("idle list lock"));
        for conn in idle {
            let _ = conn.close().await;
        }
    }
}

/// A connection taken from a [`LeanPool`]; dereferences to the backend's connection.
///
/// Dropped without [`Leased::keep`], it is closed rather than returned.
pub struct Leased<DB: Database> {
    conn: Option<DB::Connection>,
    pool: Arc<Inner<DB>>,
    reusable: bool,
    // Released after `drop` has put the connection back, so a waiter finds it idle.
    _permit: OwnedSemaphorePermit,
}

impl<DB: Database> Leased<DB> {
    /// Marks the connection clean: nothing in flight, no transaction open. It goes back to
    /// the pool when this is dropped.
    pub fn keep(&mut self) {
        self.reusable = true;
    }

    /// [`Leased::keep`] if `result` is `Ok`; passes `result` through.
    pub fn keep_if_ok<T, E>(&mut self, result: Result<T, E>) -> Result<T, E> {
        if result.is_ok() {
            self.keep();
        }
        result
    }
}

impl<DB: Database> std::ops::Deref for Leased<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_ref().expect("present until drop")
    }
}

impl<DB: Database> std::ops::DerefMut for Leased<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        // Whoever uses it may leave it mid-statement; only `keep` vouches for it again.
        self.reusable = false;
        self.conn.as_mut().expect("present until drop")
    }
}

impl<DB: Database> Drop for Leased<DB> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && self.reusable
        {
            self.pool.idle.lock().expect("idle list lock").push(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;
    use std::time::Duration;

    use sqlx::Sqlite;
    use sqlx::sqlite::SqliteConnectOptions;

    fn memory_pool(max: u32) -> LeanPool<Sqlite> {
        LeanPool::new(
            // `cache=private`: sqlx opens `sqlite::memory:` in shared-cache mode, where every
            // connection of one options value sees the same database for as long as any of
            // them is open, and a dropped connection closes on its worker thread a moment
            // later; the tests then saw the dropped connection's table on a fresh one.
            SqliteConnectOptions::from_str("sqlite://?mode=memory&cache=private").unwrap(),
            max,
        )
    }

    async fn marker(conn: &mut sqlx::SqliteConnection) -> i64 {
        // Each private in-memory connection is its own database: a table made on one
        // connection tells whether a later lease got that same connection back.
        sqlx::query_scalar("SELECT count(*) FROM sqlite_master WHERE name = 'seen'")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_kept_connection_is_reused_and_an_unkept_one_is_closed() {
        let pool = memory_pool(1);
        let mut first = pool.get().await.unwrap();
        sqlx::query("CREATE TABLE seen (x INTEGER)")
            .execute(&mut *first)
            .await
            .unwrap();
        first.keep();
        drop(first);

        let mut second = pool.get().await.unwrap();
        assert_eq!(
            marker(&mut second).await,
            1,
            "the kept connection came back"
        );
        // Used again and not vouched for: it must not come back.
        drop(second);

        let mut third = pool.get().await.unwrap();
        assert_eq!(
            marker(&mut third).await,
            0,
            "a fresh connection replaced it"
        );
    }

    #[tokio::test]
    async fn keep_if_ok_keeps_only_on_success() {
        let pool = memory_pool(1);
        let mut leased = pool.get().await.unwrap();
        sqlx::query("CREATE TABLE seen (x INTEGER)")
            .execute(&mut *leased)
            .await
            .unwrap();
        let failed: Result<(), &str> = leased.keep_if_ok(Err("boom"));
        assert!(failed.is_err());
        drop(leased);
        let mut next = pool.get().await.unwrap();
        assert_eq!(marker(&mut next).await, 0);
    }

    #[tokio::test]
    async fn at_most_max_connections_are_out_at_once() {
        let pool = memory_pool(2);
        let a = pool.get().await.unwrap();
        let _b = pool.get().await.unwrap();
        let third = tokio::time::timeout(Duration::from_millis(20), pool.get()).await;
        assert!(third.is_err(), "a third lease waits while two are out");
        drop(a);
        pool.get().await.unwrap();
    }
}

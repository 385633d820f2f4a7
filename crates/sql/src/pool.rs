//! A connection pool whose hand-back costs no round trip.
//!
//! `sqlx::Pool` pings every connection when it is released (a `Sync` round trip on
//! PostgreSQL, a `COM_PING` on MySQL), to flush a rollback left by a future that was dropped
//! mid-statement. For a participant's step or a coordinator's write that is one short
//! transaction, that is one more round trip for every transaction, paid by the client and by
//! the database server: measured on the project's 2-core machine, removing it raised
//! `idem-lab bench --workload tcc` on PostgreSQL by about a quarter.
//!
//! [`LeanPool`] gets the same safety differently: a [`Leased`] connection goes back to the
//! pool only when its user said the work on it finished cleanly ([`Leased::keep`]). An
//! error, a panic or a cancelled future drops it instead, closing the connection, so a
//! connection in an unknown state is never handed out again. Connections are opened lazily,
//! up to the maximum.
//!
//! Outages are bounded by [`LeanPoolOptions`]: opening a connection and waiting for one
//! both time out (a partitioned server fails a step in seconds, not after the operating
//! system's TCP timeout), connections are retired after a maximum lifetime, and an idle
//! connection is pinged before it is handed out when it sat unused past a bound, or when
//! something since suggested the server went away (another connection of the pool failed,
//! or the owner called [`LeanPool::check_idle`]). After a database restart the idle
//! connections are all dead; the ping finds that out instead of the caller's first
//! statement. The ping costs a round trip only on those connections: under load a
//! connection is reused within milliseconds and never checked.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{ConnectOptions, Connection, Database, Pool};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Limits of a [`LeanPool`]. [`Default`] gives sqlx's lifetimes and timeouts short enough
/// that an outage shows as an error within seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeanPoolOptions {
    /// Connections open at once, at most (at least 1).
    pub max_connections: u32,
    /// Opening one connection: TCP, TLS, authentication and the `after_connect` hook.
    pub connect_timeout: Duration,
    /// [`LeanPool::get`] as a whole: waiting for a free slot, checking an idle connection
    /// and opening a new one. Past it `get` fails with `sqlx::Error::PoolTimedOut`.
    pub acquire_timeout: Duration,
    /// A connection older than this is closed instead of being reused (`None`: never).
    pub max_lifetime: Option<Duration>,
    /// A connection idle longer than this is closed instead of being reused (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// A connection idle longer than this is pinged before it is handed out.
    pub check_idle_after: Duration,
}

impl Default for LeanPoolOptions {
    fn default() -> Self {
        LeanPoolOptions {
            max_connections: 10,
            connect_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(10),
            max_lifetime: Some(Duration::from_secs(30 * 60)),
            idle_timeout: Some(Duration::from_secs(10 * 60)),
            // A database restart takes longer than this, so a connection that sat through
            // one is checked; a busy connection is reused well within it and costs nothing.
            check_idle_after: Duration::from_secs(1),
        }
    }
}

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
    limits: LeanPoolOptions,
    after_connect: Option<AfterConnect<DB>>,
    idle: Mutex<IdleList<DB>>,
    permits: Arc<Semaphore>,
}

struct IdleList<DB: Database> {
    conns: Vec<Idle<DB>>,
    /// Connections that went idle before this instant are pinged before reuse: something
    /// at that instant suggested the server may have dropped them.
    suspect_before: Option<Instant>,
}

struct Idle<DB: Database> {
    conn: DB::Connection,
    created: Instant,
    since: Instant,
}

/// What to do with an idle connection taken off the list.
enum Reuse {
    AsIs,
    Ping,
    Retire,
}

impl<DB: Database> Inner<DB> {
    fn idle(&self) -> std::sync::MutexGuard<'_, IdleList<DB>> {
        // A panic while holding this lock leaves only a list of connections behind.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expired(&self, created: Instant, now: Instant) -> bool {
        self.limits
            .max_lifetime
            .is_some_and(|max| now.duration_since(created) > max)
    }

    fn take_idle(&self) -> Option<(Idle<DB>, Reuse)> {
        let mut list = self.idle();
        let idle = list.conns.pop()?;
        let now = Instant::now();
        let idle_for = now.duration_since(idle.since);
        let reuse = if self.expired(idle.created, now)
            || self.limits.idle_timeout.is_some_and(|t| idle_for > t)
        {
            Reuse::Retire
        } else if idle_for > self.limits.check_idle_after
            || list.suspect_before.is_some_and(|t| idle.since <= t)
        {
            Reuse::Ping
        } else {
            Reuse::AsIs
        };
        Some((idle, reuse))
    }

    fn suspect_idle(&self) {
        self.idle().suspect_before = Some(Instant::now());
    }
}

impl<DB: Database> LeanPool<DB> {
    /// A pool that opens up to `max` connections with `options`, when they are first
    /// needed, with the default limits otherwise.
    pub fn new(options: <DB::Connection as Connection>::Options, max: u32) -> Self {
        LeanPool::with_options(
            options,
            LeanPoolOptions {
                max_connections: max,
                ..LeanPoolOptions::default()
            },
        )
    }

    /// A pool with these limits.
    pub fn with_options(
        options: <DB::Connection as Connection>::Options,
        limits: LeanPoolOptions,
    ) -> Self {
        let max = limits.max_connections.max(1);
        LeanPool {
            inner: Arc::new(Inner {
                options,
                limits: LeanPoolOptions {
                    max_connections: max,
                    ..limits
                },
                after_connect: None,
                idle: Mutex::new(IdleList {
                    conns: Vec::new(),
                    suspect_before: None,
                }),
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

    /// A pool with the connect options, the size, the acquire timeout and the lifetimes of
    /// a `sqlx::Pool`, beside it.
    pub fn like(pool: &Pool<DB>) -> Self {
        let sqlx = pool.options();
        let defaults = LeanPoolOptions::default();
        LeanPool::with_options(
            (*pool.connect_options()).clone(),
            LeanPoolOptions {
                max_connections: sqlx.get_max_connections(),
                connect_timeout: defaults.connect_timeout.min(sqlx.get_acquire_timeout()),
                acquire_timeout: sqlx.get_acquire_timeout(),
                max_lifetime: sqlx.get_max_lifetime(),
                idle_timeout: sqlx.get_idle_timeout(),
                ..defaults
            },
        )
    }

    /// The options connections are opened with.
    pub fn connect_options(&self) -> &<DB::Connection as Connection>::Options {
        &self.inner.options
    }

    /// The limits this pool keeps.
    pub fn limits(&self) -> &LeanPoolOptions {
        &self.inner.limits
    }

    /// Pings every connection idle now before it is next handed out. For an owner that
    /// learned the server may have restarted (a failed statement elsewhere, a failed health
    /// check): the first statements after it then find live connections.
    pub fn check_idle(&self) {
        self.inner.suspect_idle();
    }

    /// Waits for a free connection (reusing an idle one, or opening one), for at most the
    /// acquire timeout.
    pub async fn get(&self) -> Result<Leased<DB>, sqlx::Error> {
        let limits = &self.inner.limits;
        let deadline = Instant::now() + limits.acquire_timeout;
        let permit = tokio::time::timeout_at(deadline, self.inner.permits.clone().acquire_owned())
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)?
            .expect("the semaphore is never closed");
        while let Some((mut idle, reuse)) = self.inner.take_idle() {
            match reuse {
                Reuse::AsIs => return Ok(self.lease(idle.conn, idle.created, permit)),
                Reuse::Retire => close_politely::<DB>(idle.conn),
                Reuse::Ping => {
                    let bound = deadline.min(Instant::now() + limits.connect_timeout);
                    match tokio::time::timeout_at(bound, idle.conn.ping()).await {
                        Ok(Ok(())) => return Ok(self.lease(idle.conn, idle.created, permit)),
                        // Dead (or not answering): dropped without a goodbye, which could
                        // hang too. One dead connection means the others idle as long are
                        // likely dead as well: check them all.
                        _ => self.inner.suspect_idle(),
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(sqlx::Error::PoolTimedOut);
            }
        }
        let connect_by = Instant::now() + limits.connect_timeout;
        let conn = match tokio::time::timeout_at(deadline.min(connect_by), self.open()).await {
            Ok(conn) => conn?,
            Err(_) if connect_by < deadline => {
                return Err(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "opening a database connection took longer than {:?}",
                        limits.connect_timeout
                    ),
                )));
            }
            Err(_) => return Err(sqlx::Error::PoolTimedOut),
        };
        Ok(self.lease(conn, Instant::now(), permit))
    }

    async fn open(&self) -> Result<DB::Connection, sqlx::Error> {
        let mut conn = self.inner.options.connect().await?;
        if let Some(init) = &self.inner.after_connect {
            init(&mut conn).await?;
        }
        Ok(conn)
    }

    fn lease(
        &self,
        conn: DB::Connection,
        created: Instant,
        permit: OwnedSemaphorePermit,
    ) -> Leased<DB> {
        Leased {
            conn: Some(conn),
            created,
            pool: self.inner.clone(),
            reusable: false,
            _permit: permit,
        }
    }

    /// Closes the idle connections (those in use close when they are dropped).
    pub async fn close(&self) {
        let idle = std::mem::take(&mut self.inner.idle().conns);
        for idle in idle {
            let _ = idle.conn.close().await;
        }
    }
}

/// Closes a healthy connection that is only retired (too old, idle too long), saying
/// goodbye to the server in the background so that it does not log an abrupt disconnect.
fn close_politely<DB: Database>(conn: DB::Connection) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let close = conn.close();
        runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
        });
    }
}

/// A connection taken from a [`LeanPool`]; dereferences to the backend's connection.
///
/// Dropped without [`Leased::keep`], it is closed rather than returned.
pub struct Leased<DB: Database> {
    conn: Option<DB::Connection>,
    created: Instant,
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
        let Some(conn) = self.conn.take() else { return };
        let now = Instant::now();
        if !self.reusable {
            // A failed statement, a panic or a cancelled future. Most of these are the
            // connection's own trouble, but a lost server loses every connection: check the
            // idle ones before their next use (one ping each, and only this once).
            self.pool.suspect_idle();
        } else if self.pool.expired(self.created, now) {
            close_politely::<DB>(conn);
        } else {
            self.pool.idle().conns.push(Idle {
                conn,
                created: self.created,
                since: now,
            });
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

    fn limited_pool(limits: LeanPoolOptions) -> LeanPool<Sqlite> {
        LeanPool::with_options(
            SqliteConnectOptions::from_str("sqlite://?mode=memory&cache=private").unwrap(),
            limits,
        )
    }

    #[tokio::test]
    async fn a_connection_past_its_lifetime_is_not_reused() {
        let pool = limited_pool(LeanPoolOptions {
            max_connections: 1,
            max_lifetime: Some(Duration::ZERO),
            ..LeanPoolOptions::default()
        });
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
            0,
            "a fresh connection replaced it"
        );
    }

    #[tokio::test]
    async fn a_checked_idle_connection_that_answers_is_reused() {
        let pool = limited_pool(LeanPoolOptions {
            max_connections: 1,
            ..LeanPoolOptions::default()
        });
        let mut first = pool.get().await.unwrap();
        sqlx::query("CREATE TABLE seen (x INTEGER)")
            .execute(&mut *first)
            .await
            .unwrap();
        first.keep();
        drop(first);
        pool.check_idle();
        let mut second = pool.get().await.unwrap();
        assert_eq!(marker(&mut second).await, 1, "the ping found it alive");
    }

    #[tokio::test]
    async fn get_gives_up_after_the_acquire_timeout() {
        let pool = limited_pool(LeanPoolOptions {
            max_connections: 1,
            acquire_timeout: Duration::from_millis(100),
            ..LeanPoolOptions::default()
        });
        let _held = pool.get().await.unwrap();
        let started = std::time::Instant::now();
        let err = pool.get().await.err().expect("no connection is free");
        assert!(matches!(err, sqlx::Error::PoolTimedOut), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn opening_a_connection_gives_up_after_the_connect_timeout() {
        // A server that accepts connections and never says a word: a partition during the
        // handshake, which would otherwise wait for the operating system's TCP timeout.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let options = sqlx::postgres::PgConnectOptions::new()
            .host("127.0.0.1")
            .port(port)
            .username("nobody");
        let pool = LeanPool::<sqlx::Postgres>::with_options(
            options,
            LeanPoolOptions {
                connect_timeout: Duration::from_millis(200),
                acquire_timeout: Duration::from_secs(10),
                ..LeanPoolOptions::default()
            },
        );
        let started = std::time::Instant::now();
        let err = pool.get().await.err().expect("the server never answers");
        let elapsed = started.elapsed();
        assert!(
            matches!(&err, sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut),
            "{err}"
        );
        assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
        silent.abort();
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

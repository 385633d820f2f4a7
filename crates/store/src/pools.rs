//! How the server databases' connections are pooled and kept healthy.
//!
//! Each PostgreSQL or MySQL store has two pools on the same server: sqlx's, for the reads,
//! claims and registrations, and a [`LeanPool`](idem_sql::LeanPool) for the hot writes (see `idem_sql::pool`).
//! Both get the same limits from [`ConnectOptions`]: opening a connection and waiting for
//! one are bounded, connections are retired after a lifetime and an idle time, and an idle
//! connection is pinged before use when it sat unused past `check_idle_after` or when a
//! failure since ([`Suspicion`]) suggests the server dropped it.
//!
//! Why not sqlx's `test_before_acquire`: it pings on every acquire, one more round trip per
//! statement, which on PostgreSQL costs a measurable share of throughput. Under load a
//! connection is reused within milliseconds and the idle check costs nothing; after a
//! database restart (which takes longer than the bound, or makes some statement fail
//! first) every stale connection is checked once and replaced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use idem_sql::LeanPoolOptions;
use sqlx::pool::PoolOptions;
use sqlx::{Connection, Database};

use super::ConnectOptions;

/// "Connections idle since before now may be dead": set when a store call fails for a
/// reason that is not the data, read when a connection is taken from a pool.
#[derive(Clone)]
pub struct Suspicion(Arc<SuspicionInner>);

struct SuspicionInner {
    base: Instant,
    /// Microseconds after `base` of the last mark, plus one; 0 for never.
    marked: AtomicU64,
    /// Passes the mark on to the lean pool beside the sqlx pool.
    also: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Default for Suspicion {
    fn default() -> Self {
        Suspicion(Arc::new(SuspicionInner {
            base: Instant::now(),
            marked: AtomicU64::new(0),
            also: OnceLock::new(),
        }))
    }
}

impl Suspicion {
    /// Something failed: check every connection idle now before its next use.
    pub fn mark(&self) {
        self.mark_at(self.0.base.elapsed());
        if let Some(also) = self.0.also.get() {
            also();
        }
    }

    fn mark_at(&self, since_base: Duration) {
        let at = since_base.as_micros() as u64 + 1;
        self.0.marked.fetch_max(at, Ordering::Relaxed);
    }

    /// Runs `f` at every mark too (set once).
    pub fn also(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.0.also.set(Box::new(f));
    }

    /// True when a connection idle for `idle_for` went idle at or before the last mark.
    fn covers(&self, idle_for: Duration) -> bool {
        self.covers_at(self.0.base.elapsed(), idle_for)
    }

    fn covers_at(&self, now: Duration, idle_for: Duration) -> bool {
        let marked = self.0.marked.load(Ordering::Relaxed);
        marked != 0 && (now.saturating_sub(idle_for).as_micros() as u64) < marked
    }
}

/// sqlx's pool options for a server database.
pub fn server_pool<DB: Database>(
    options: &ConnectOptions,
    suspicion: &Suspicion,
) -> PoolOptions<DB> {
    let suspicion = suspicion.clone();
    let check_after = options.check_idle_after;
    let ping_within = options.connect_timeout;
    PoolOptions::<DB>::new()
        .max_connections(options.max_connections)
        .acquire_timeout(options.acquire_timeout)
        .idle_timeout(options.idle_timeout)
        .max_lifetime(options.max_lifetime)
        // Not on every acquire: see the module's comment.
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            let check = meta.idle_for > check_after || suspicion.covers(meta.idle_for);
            let suspicion = suspicion.clone();
            async move {
                if !check {
                    return Ok(true);
                }
                // An error makes sqlx drop this connection and open another one.
                let failed = match tokio::time::timeout(ping_within, conn.ping()).await {
                    Ok(Ok(())) => return Ok(true),
                    Ok(Err(e)) => e,
                    Err(_) => sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "an idle connection did not answer its ping",
                    )),
                };
                // Its neighbours went idle as long ago: check them too.
                suspicion.mark();
                Err(failed)
            }
            .boxed()
        })
}

/// Opens one connection and closes it, within `within`: the first contact with the server,
/// made directly so that a failure says why. sqlx's pool retries a refused connection until
/// its acquire timeout and then reports only that it timed out.
pub async fn probe<C>(options: &C, within: Duration) -> sqlx::Result<()>
where
    C: sqlx::ConnectOptions,
    C::Connection: Sized,
{
    match tokio::time::timeout(within, options.connect()).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("opening a database connection took longer than {within:?}"),
        ))),
    }
}

/// The lean pool's limits, the same as sqlx's pool beside it.
/// The server-side bounds of the writers' statements: below the coordinator's own call
/// timeout, so that a statement the coordinator stopped waiting for (its connection is
/// closed, or the link froze) is cut by the server itself instead of committing later.
/// A write that commits while its answer is lost stays possible, as on any network; the
/// save's compare-and-set keeps that one from landing over a newer write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerCut {
    /// One statement at most (PostgreSQL `statement_timeout`, MariaDB
    /// `max_statement_time`).
    pub statement: Duration,
    /// Waiting for a row lock at most (PostgreSQL `lock_timeout`, InnoDB
    /// `innodb_lock_wait_timeout`, whole seconds, at least one).
    pub lock: Duration,
}

impl ServerCut {
    pub fn below(call_timeout: Duration) -> ServerCut {
        ServerCut {
            statement: call_timeout.mul_f64(0.75),
            lock: call_timeout / 2,
        }
    }
}

pub fn lean(options: &ConnectOptions) -> LeanPoolOptions {
    LeanPoolOptions {
        max_connections: options.max_connections,
        connect_timeout: options.connect_timeout,
        acquire_timeout: options.acquire_timeout,
        max_lifetime: Some(options.max_lifetime),
        idle_timeout: Some(options.idle_timeout),
        check_idle_after: options.check_idle_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_covers_connections_idle_since_before_it() {
        let s = Suspicion::default();
        let second = Duration::from_secs(1);
        assert!(!s.covers_at(10 * second, 10 * second), "never marked");
        s.mark_at(5 * second);
        assert!(s.covers_at(10 * second, 6 * second), "idle since 4 s");
        assert!(s.covers_at(10 * second, 5 * second), "idle since the mark");
        assert!(!s.covers_at(10 * second, 4 * second), "idle since 6 s");
        assert!(
            s.covers_at(10 * second, 60 * second),
            "idle since before the store"
        );
    }

    #[test]
    fn a_mark_is_passed_on() {
        let s = Suspicion::default();
        let seen = Arc::new(AtomicU64::new(0));
        let counter = seen.clone();
        s.also(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        });
        s.mark();
        assert_eq!(seen.load(Ordering::Relaxed), 1);
    }
}

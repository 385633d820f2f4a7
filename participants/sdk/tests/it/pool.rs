//! The lean pool against real PostgreSQL and MariaDB servers, through a proxy that stages
//! the outages: a restart (every connection closed) and a partition (bytes stop flowing).

use std::str::FromStr;
use std::time::{Duration, Instant};

use idem_participant::testing::{Backend, TcpProxy, TestBackend};
use idem_participant::{LeanPool, LeanPoolOptions};
use sqlx::Any;
use sqlx::any::AnyConnectOptions;

/// The servers to test on, each behind a fresh proxy.
async fn servers() -> Vec<(Backend, TcpProxy, AnyConnectOptions)> {
    sqlx::any::install_default_drivers();
    let mut out = Vec::new();
    for backend in [Backend::Postgres, Backend::Mysql] {
        let url = backend.admin_url().expect("a server backend");
        let (proxy, proxied) = TcpProxy::for_url(&url).await.expect("proxy starts");
        out.push((
            backend,
            proxy,
            AnyConnectOptions::from_str(&proxied).unwrap(),
        ));
    }
    out
}

async fn select_one(pool: &LeanPool<Any>) -> Result<(), sqlx::Error> {
    let mut conn = pool.get().await?;
    let done = sqlx::raw_sql("SELECT 1")
        .execute(&mut *conn)
        .await
        .map(|_| ());
    conn.keep_if_ok(done)
}

/// Opens `n` connections at once and puts them back idle.
async fn warm(pool: &LeanPool<Any>, n: usize) {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut conn = pool.get().await.expect("connects");
        sqlx::raw_sql("SELECT 1").execute(&mut *conn).await.unwrap();
        conn.keep();
        held.push(conn);
    }
}

#[tokio::test]
async fn after_a_restart_the_idle_connections_are_checked_before_use() {
    for (backend, proxy, options) in servers().await {
        // Never old enough to be checked for their idle time: only the other signals count.
        let pool = LeanPool::<Any>::with_options(
            options.clone(),
            LeanPoolOptions {
                max_connections: 3,
                check_idle_after: Duration::from_secs(3600),
                ..LeanPoolOptions::default()
            },
        );
        warm(&pool, 3).await;
        proxy.restart().await;
        // Nothing told the pool: the first statement meets a dead connection and fails.
        // That failure makes the pool check the other idle connections, so the next
        // statements succeed, on new connections.
        assert!(
            select_one(&pool).await.is_err(),
            "{backend}: a dead connection"
        );
        for _ in 0..3 {
            select_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{backend}: after one failure: {e}"));
        }

        // Told (by a failed health check, say): not even the first statement fails.
        warm(&pool, 3).await;
        proxy.restart().await;
        pool.check_idle();
        for _ in 0..3 {
            select_one(&pool)
                .await
                .unwrap_or_else(|e| panic!("{backend}: after check_idle: {e}"));
        }

        // Idle past the bound (zero here): checked on their own.
        let eager = LeanPool::<Any>::with_options(
            options,
            LeanPoolOptions {
                max_connections: 3,
                check_idle_after: Duration::ZERO,
                ..LeanPoolOptions::default()
            },
        );
        warm(&eager, 3).await;
        proxy.restart().await;
        for _ in 0..3 {
            select_one(&eager)
                .await
                .unwrap_or_else(|e| panic!("{backend}: idle past the bound: {e}"));
        }
    }
}

#[tokio::test]
async fn a_partition_fails_get_within_its_timeouts_and_heals() {
    for (backend, proxy, options) in servers().await {
        let pool = LeanPool::<Any>::with_options(
            options,
            LeanPoolOptions {
                max_connections: 2,
                connect_timeout: Duration::from_millis(300),
                acquire_timeout: Duration::from_secs(1),
                check_idle_after: Duration::ZERO,
                ..LeanPoolOptions::default()
            },
        );
        warm(&pool, 1).await;
        proxy.partition();
        // The idle connection's ping gets no answer, nor does a new connection's handshake:
        // each is cut at the connect timeout, and `get` fails instead of hanging.
        let started = Instant::now();
        let err = pool.get().await.err().expect("nothing answers");
        let elapsed = started.elapsed();
        assert!(
            matches!(&err, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)),
            "{backend}: {err}"
        );
        assert!(
            elapsed < Duration::from_secs(3),
            "{backend}: took {elapsed:?}"
        );
        proxy.heal();
        select_one(&pool)
            .await
            .unwrap_or_else(|e| panic!("{backend}: after the partition healed: {e}"));
    }
}

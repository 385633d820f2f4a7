//! The database-link proxy the lab puts between a coordinator and its database
//! (`idem_participant::testing::TcpProxy`), against the real PostgreSQL and MariaDB
//! servers: a freeze holds a statement until it heals on its own, on the same connection;
//! latency delays each chunk each way; a cut resets the open connections (the client reads
//! "connection reset", not an orderly close) while new ones are accepted.

use std::time::{Duration, Instant};

use idem_participant::testing::{Backend, TcpProxy, TestBackend};
use sqlx::{Connection, MySqlConnection, PgConnection};

/// One connection through the proxy, to either server.
enum Conn {
    Pg(PgConnection),
    My(MySqlConnection),
}

impl Conn {
    async fn open(backend: Backend, url: &str) -> Result<Conn, sqlx::Error> {
        Ok(match backend {
            Backend::Postgres => Conn::Pg(PgConnection::connect(url).await?),
            _ => Conn::My(MySqlConnection::connect(url).await?),
        })
    }

    /// The server's id of this session: the same id after a stall means the same
    /// connection lived through it.
    async fn session(&mut self) -> Result<i64, sqlx::Error> {
        match self {
            Conn::Pg(c) => {
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(c)
                    .await?;
                Ok(pid as i64)
            }
            Conn::My(c) => {
                let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                    .fetch_one(c)
                    .await?;
                Ok(id as i64)
            }
        }
    }
}

/// The servers to test on, each behind a fresh proxy.
async fn servers() -> Vec<(Backend, TcpProxy, String)> {
    let mut out = Vec::new();
    for backend in [Backend::Postgres, Backend::Mysql] {
        let url = backend.admin_url().expect("a server backend");
        let (proxy, proxied) = TcpProxy::for_url(&url).await.expect("the proxy starts");
        out.push((backend, proxy, proxied));
    }
    out
}

#[tokio::test]
async fn a_freeze_holds_statements_on_open_connections_then_heals_itself() {
    for (backend, proxy, url) in servers().await {
        let mut conn = Conn::open(backend, &url).await.unwrap();
        let before = conn.session().await.unwrap();
        let hold = Duration::from_millis(700);
        let frozen_at = Instant::now();
        proxy.freeze(hold);
        assert!(proxy.is_partitioned(), "{backend}");
        // Sent while frozen: it waits for the heal, then gets its answer on the same
        // session (the sockets stayed open).
        let during = conn.session().await.unwrap();
        assert!(
            frozen_at.elapsed() >= hold,
            "{backend}: answered after {:?}, inside the freeze",
            frozen_at.elapsed()
        );
        assert_eq!(during, before, "{backend}: a new session after the freeze");
        assert!(!proxy.is_partitioned(), "{backend}: healed on its own");
        // A connection opened during a freeze hears nothing until it ends.
        proxy.freeze(hold);
        let opening = Instant::now();
        let mut late = Conn::open(backend, &url).await.unwrap();
        assert!(
            opening.elapsed() >= hold,
            "{backend}: {:?}",
            opening.elapsed()
        );
        late.session().await.unwrap();
        // An explicit partition is not healed by an earlier freeze's timer.
        proxy.freeze(Duration::from_millis(100));
        proxy.partition();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            proxy.is_partitioned(),
            "{backend}: a freeze healed a partition"
        );
        proxy.heal();
        assert_eq!(conn.session().await.unwrap(), before, "{backend}");
    }
}

#[tokio::test]
async fn latency_delays_every_chunk_each_way() {
    for (backend, proxy, url) in servers().await {
        let mut conn = Conn::open(backend, &url).await.unwrap();
        let session = conn.session().await.unwrap();
        let (to_server, to_client) = (Duration::from_millis(120), Duration::from_millis(80));
        proxy.set_latency(to_server, to_client);
        // A statement is at least one chunk out and one chunk back.
        let started = Instant::now();
        assert_eq!(conn.session().await.unwrap(), session, "{backend}");
        assert!(
            started.elapsed() >= to_server + to_client,
            "{backend}: a round trip took {:?}",
            started.elapsed()
        );
        // Only one way: the other adds nothing (the bound below is the one way's).
        proxy.set_latency(Duration::ZERO, to_client);
        let started = Instant::now();
        conn.session().await.unwrap();
        assert!(started.elapsed() >= to_client, "{backend}");
        proxy.set_latency(Duration::ZERO, Duration::ZERO);
        assert_eq!(conn.session().await.unwrap(), session, "{backend}");
    }
}

#[tokio::test]
async fn a_cut_resets_open_connections_and_new_ones_work() {
    for (backend, proxy, url) in servers().await {
        let mut old = Conn::open(backend, &url).await.unwrap();
        let old_session = old.session().await.unwrap();
        proxy.cut().await;
        // The proxy answered the old connection with RST: the client's next statement
        // fails on the reset socket, not on the orderly end of a stopped server.
        let err = old
            .session()
            .await
            .expect_err("a cut connection still works");
        assert!(
            was_reset(&err),
            "{backend}: expected a connection reset, got {err:?}"
        );
        // New connections are accepted at once, and are new sessions.
        let mut new = Conn::open(backend, &url).await.unwrap();
        let new_session = new.session().await.unwrap();
        assert_ne!(new_session, old_session, "{backend}");
        // The server saw its end of the old connection go, too.
        let admin = backend.admin_url().unwrap();
        let mut watcher = Conn::open(backend, &admin).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while session_exists(&mut watcher, old_session).await {
            assert!(
                Instant::now() < deadline,
                "{backend}: session {old_session} outlived the cut"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // A stop, for contrast, closes in order (EOF, no reset).
        proxy.restart().await;
        let err = new
            .session()
            .await
            .expect_err("a stopped connection still works");
        assert!(
            !was_reset(&err),
            "{backend}: a stop reset the connection: {err:?}"
        );
    }
}

/// A socket that received RST fails its next write with ECONNRESET, or with EPIPE once
/// the reset was noticed by a read; a socket the peer closed in order (FIN) accepts the
/// write and then reads the end of the stream.
fn was_reset(err: &sqlx::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
    matches!(err, sqlx::Error::Io(e) if matches!(e.kind(), ConnectionReset | BrokenPipe))
}

async fn session_exists(conn: &mut Conn, session: i64) -> bool {
    let found: Option<i64> = match conn {
        Conn::Pg(c) => {
            sqlx::query_scalar("SELECT pid::bigint FROM pg_stat_activity WHERE pid = $1")
                .bind(session as i32)
                .fetch_optional(c)
                .await
                .unwrap()
        }
        Conn::My(c) => sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST WHERE ID = ?",
        )
        .bind(session)
        .fetch_optional(c)
        .await
        .unwrap(),
    };
    found.is_some()
}

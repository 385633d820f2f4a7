//! Database outages seen from outside, against real `idem serve` processes.
//!
//! Each server test puts a TCP proxy (`idem_participant::testing::TcpProxy`) between idem
//! and a fresh database on the shared server, and breaks only that proxy: a stop (every
//! connection closed, new ones refused: the server is down or restarting) or a partition
//! (connections stay open, bytes stop flowing). The shared servers are never touched.
//!
//! What must hold: during an outage every request answers `503 unavailable` with a generic
//! message and nothing of the database in it (the driver's text is in the log, with the
//! route); `/health/ready` (and `/health`) answer 503 and `/health/live` 200; a partition
//! fails a request within the database timeouts instead of hanging; afterwards the same
//! process serves and finishes what it was driving, and the first requests after a restart
//! succeed; at start, idem waits for an unreachable database (and gives up past the bound).

use crate::common;
mod support;

use std::time::{Duration, Instant};

use common::Api;
use idem_participant::testing::{Backend, TcpProxy, TestDatabase};
use serde_json::{Value, json};
use support::{Gate, Serve, count};

const WAIT: Duration = Duration::from_secs(30);
const UNAVAILABLE: &str = "the database is unavailable; retry later";

fn unavailable() -> Value {
    json!({"error": {"code": "unavailable", "message": UNAVAILABLE}})
}

/// A saga of two steps; the first held at the gate when `held`.
fn saga(gate: &Gate, gid: &str, held: bool, wait: bool) -> Value {
    let first = if held { "/gated" } else { "/ok" };
    json!({
        "gid": gid,
        "kind": "saga",
        "steps": [
            {"action": gate.url(first), "compensate": gate.url("/ok")},
            {"action": gate.url("/ok"), "compensate": gate.url("/ok")},
        ],
        "wait_result": wait,
    })
}

/// A fresh database on `backend` behind its own proxy, with the URL through the proxy.
async fn proxied(backend: Backend, test: &str) -> (TestDatabase, TcpProxy, String) {
    let db = TestDatabase::create(backend, test).await;
    let (proxy, url) = TcpProxy::for_url(&db.url).await.expect("the proxy starts");
    (db, proxy, url)
}

/// Polls `/health/ready` until it answers `code`.
async fn wait_ready(api: &Api, code: u16) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (got, body) = api.get("/health/ready").await;
        if got == code {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/health/ready still {got} after {WAIT:?}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts that an answer says nothing of the database behind it.
fn names_nothing(db: &TestDatabase, proxy: &TcpProxy, body: &Value) {
    let text = body.to_string();
    for secret in [
        db.name(),
        &proxy.addr().port().to_string(),
        &proxy.target().port().to_string(),
        "127.0.0.1",
        "sqlx",
        "error returned",
        "os error",
        "pool timed out",
    ] {
        assert!(!text.contains(secret), "{secret:?} leaked in {text}");
    }
}

/// Runs `$body(db, proxy, url)` on PostgreSQL and on MariaDB, as one test each.
macro_rules! on_servers {
    ($name:ident, $pg:ident, $my:ident) => {
        #[tokio::test]
        async fn $pg() {
            let (db, proxy, url) = proxied(Backend::Postgres, stringify!($pg)).await;
            $name(&db, &proxy, &url).await;
            drop(proxy);
            db.drop_database().await;
        }

        #[tokio::test]
        async fn $my() {
            let (db, proxy, url) = proxied(Backend::Mysql, stringify!($my)).await;
            $name(&db, &proxy, &url).await;
            drop(proxy);
            db.drop_database().await;
        }
    };
}

on_servers!(
    outage_answers_503_and_the_same_process_recovers,
    outage_answers_503_and_recovers_postgres,
    outage_answers_503_and_recovers_mysql
);

async fn outage_answers_503_and_the_same_process_recovers(
    db: &TestDatabase,
    proxy: &TcpProxy,
    url: &str,
) {
    let backend = db.backend;
    let mut serve = Serve::spawn(url, &[]);
    let api = Api::new(serve.listening(WAIT).await);
    let gate = Gate::start().await;
    let (code, body) = api
        .post("/api/v1/transactions", saga(&gate, "before", true, false))
        .await;
    assert_eq!(code, 201, "{backend}: {body}");
    // The saga is in flight, its first step held by the participant, when the database
    // goes away.
    gate.wait_arrival(WAIT).await;
    proxy.stop().await;

    let answers = [
        (
            "create",
            api.post("/api/v1/transactions", saga(&gate, "during", false, true))
                .await,
        ),
        ("show", api.get("/api/v1/transactions/before").await),
        ("list", api.get("/api/v1/transactions?limit=5").await),
        (
            "register",
            api.post(
                "/api/v1/transactions/tcc-during/branches",
                json!({"branch_id": "b", "confirm": gate.url("/ok"), "cancel": gate.url("/ok")}),
            )
            .await,
        ),
    ];
    for (what, (code, body)) in answers {
        assert_eq!(
            (code, &body),
            (503, &unavailable()),
            "{backend}: {what} during the outage"
        );
        names_nothing(db, proxy, &body);
    }
    // DTM's door: 503 with idem's error and no `dtm_result` (a body with FAILURE would
    // read as a business failure to DTM's clients).
    let dtm = [
        (
            "prepare",
            api.post(
                "/api/dtmsvr/prepare",
                json!({"gid": "dtm-during", "trans_type": "tcc"}),
            )
            .await,
        ),
        ("query", api.get("/api/dtmsvr/query?gid=before").await),
    ];
    for (what, (code, body)) in dtm {
        assert_eq!(code, 503, "{backend}: DTM {what}: {body}");
        assert_eq!(body["error"], unavailable()["error"], "{backend}: {what}");
        assert_eq!(body["message"], UNAVAILABLE, "{backend}: {what}");
        assert!(
            body.get("dtm_result").is_none(),
            "{backend}: {what}: {body}"
        );
        names_nothing(db, proxy, &body);
    }

    for path in ["/health/ready", "/health"] {
        let (code, body) = api.get(path).await;
        assert_eq!(code, 503, "{backend}: {path}: {body}");
        assert_eq!(body["status"], "unavailable");
        assert_eq!(body["error"]["code"], "unavailable");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("the database is unavailable"),
            "{message}"
        );
        names_nothing(db, proxy, &body);
    }
    let (code, live) = api.get("/health/live").await;
    assert_eq!((code, &live), (200, &json!({"status": "ok"})), "{backend}");

    // What the answers left out is in the log, at error level, with the route.
    serve
        .wait_log(WAIT, |lines| {
            lines.iter().any(|l| {
                l.contains("ERROR")
                    && l.contains("request failed on the database")
                    && l.contains("/api/v1/transactions/{gid}")
            })
        })
        .await;

    // The participant answers while the database is still away: the engine cannot store
    // it and leaves the saga to recovery.
    gate.open();
    proxy.start_again().await;
    wait_ready(&api, 200).await;
    let (code, live) = api.get("/health/live").await;
    assert_eq!(code, 200, "{backend}: {live}");
    let done = api.wait_status("before", &["succeeded"], WAIT).await;
    assert_eq!(done["status"], "succeeded", "{backend}: {done}");
    // The refused requests changed nothing.
    let (code, _) = api.get("/api/v1/transactions/during").await;
    assert_eq!(code, 404, "{backend}: the refused create stored nothing");
    let (code, body) = api
        .post("/api/v1/transactions", saga(&gate, "after", false, true))
        .await;
    assert_eq!(code, 201, "{backend}: {body}");
    assert_eq!(body["status"], "succeeded", "{backend}: {body}");
    assert!(serve.running(), "the same process served throughout");
}

on_servers!(
    partition_fails_requests_in_bounded_time,
    partition_fails_requests_in_bounded_time_postgres,
    partition_fails_requests_in_bounded_time_mysql
);

async fn partition_fails_requests_in_bounded_time(db: &TestDatabase, proxy: &TcpProxy, url: &str) {
    let backend = db.backend;
    let mut serve = Serve::spawn(
        url,
        &[
            "--database-connect-timeout-ms",
            "500",
            "--database-acquire-timeout-ms",
            "1000",
            "--database-call-timeout-ms",
            "1500",
        ],
    );
    let api = Api::new(serve.listening(WAIT).await);
    let gate = Gate::start().await;
    let (code, body) = api
        .post("/api/v1/transactions", saga(&gate, "warm", false, true))
        .await;
    assert_eq!(
        (code, body["status"].as_str()),
        (201, Some("succeeded")),
        "{backend}: {body}"
    );

    // Packets dropped, nothing closed: without bounds these would wait for the TCP
    // timeout, many minutes.
    proxy.partition();
    let bound = Duration::from_secs(6);
    let cut = saga(&gate, "cut", false, true);
    for what in ["create", "show", "ready"] {
        let started = Instant::now();
        let call = async {
            match what {
                "create" => api.post("/api/v1/transactions", cut.clone()).await,
                "show" => api.get("/api/v1/transactions/warm").await,
                _ => api.get("/health/ready").await,
            }
        };
        let (code, body) = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .unwrap_or_else(|_| panic!("{backend}: {what} hung through the partition"));
        let took = started.elapsed();
        assert_eq!(code, 503, "{backend}: {what}: {body}");
        assert!(took < bound, "{backend}: {what} took {took:?}");
        names_nothing(db, proxy, &body);
        if what != "ready" {
            assert_eq!(body, unavailable(), "{backend}: {what}");
        }
    }
    let (code, _) = api.get("/health/live").await;
    assert_eq!(code, 200, "{backend}: live during the partition");

    proxy.heal();
    wait_ready(&api, 200).await;
    // A cut write may have reached the database (its bytes were in flight): the client
    // repeats it under the same gid, which is what the gid is for.
    let (code, body) = api.post("/api/v1/transactions", cut).await;
    assert!(code == 200 || code == 201, "{backend}: {code} {body}");
    let done = api.wait_status("cut", &["succeeded"], WAIT).await;
    assert_eq!(done["status"], "succeeded");
    let (code, body) = api
        .post("/api/v1/transactions", saga(&gate, "after", false, true))
        .await;
    assert_eq!(
        (code, body["status"].as_str()),
        (201, Some("succeeded")),
        "{backend}: {body}"
    );
}

on_servers!(
    first_requests_after_a_restart_succeed,
    first_requests_after_a_restart_succeed_postgres,
    first_requests_after_a_restart_succeed_mysql
);

async fn first_requests_after_a_restart_succeed(db: &TestDatabase, proxy: &TcpProxy, url: &str) {
    let backend = db.backend;
    let mut serve = Serve::spawn(url, &[]);
    let api = Api::new(serve.listening(WAIT).await);
    let gate = Gate::start().await;
    // Several requests at once, so that both pools hold several idle connections.
    let warm = futures::future::join_all((0..6).map(|i| {
        api.post(
            "/api/v1/transactions",
            saga(&gate, &format!("warm-{i}"), false, true),
        )
    }))
    .await;
    for (code, body) in warm {
        assert_eq!(code, 201, "{backend}: {body}");
    }
    // The database restarts: every connection idem holds is dead. The coordinator notices
    // (its recovery scan fails, a load balancer's readiness probe fails).
    proxy.stop().await;
    wait_ready(&api, 503).await;
    proxy.start_again().await;

    // No warm-up, no retry: the first requests find live connections.
    let (code, body) = api
        .post("/api/v1/transactions", saga(&gate, "first", false, true))
        .await;
    assert_eq!(
        (code, body["status"].as_str()),
        (201, Some("succeeded")),
        "{backend}: {body}"
    );
    let (code, body) = api.get("/api/v1/transactions/warm-0").await;
    assert_eq!(code, 200, "{backend}: {body}");
    let (code, body) = api.get("/api/v1/transactions?limit=10").await;
    assert_eq!(code, 200, "{backend}: {body}");
    let (code, body) = api.get("/api/dtmsvr/query?gid=first").await;
    assert_eq!(code, 200, "{backend}: {body}");
    let (code, body) = api.get("/health/ready").await;
    assert_eq!(code, 200, "{backend}: {body}");
    assert_eq!(
        serve.count("request failed on the database"),
        0,
        "{backend}: no request failed:\n{}",
        serve.log()
    );
}

on_servers!(
    serve_waits_for_the_database_at_start,
    serve_waits_for_the_database_at_start_postgres,
    serve_waits_for_the_database_at_start_mysql
);

async fn serve_waits_for_the_database_at_start(db: &TestDatabase, proxy: &TcpProxy, url: &str) {
    let backend = db.backend;
    proxy.stop().await;
    let mut serve = Serve::spawn(url, &["--database-wait-ms", "60000"]);
    serve
        .wait_log(WAIT, |lines| count(lines, "waiting for the database") >= 2)
        .await;
    assert!(serve.running(), "{backend}: it waits instead of exiting");
    let log = serve.log();
    assert!(
        log.contains("the database refused the connection"),
        "{backend}: the reason is logged:\n{log}"
    );
    proxy.start_again().await;
    let api = Api::new(serve.listening(WAIT).await);
    let (code, body) = api.get("/health/ready").await;
    assert_eq!(code, 200, "{backend}: {body}");
}

on_servers!(
    serve_gives_up_past_the_wait_bound,
    serve_gives_up_past_the_wait_bound_postgres,
    serve_gives_up_past_the_wait_bound_mysql
);

async fn serve_gives_up_past_the_wait_bound(db: &TestDatabase, proxy: &TcpProxy, url: &str) {
    let backend = db.backend;
    proxy.stop().await;
    let started = Instant::now();
    let mut serve = Serve::spawn(url, &["--database-wait-ms", "1500"]);
    let status = serve.exit(WAIT).await;
    assert!(!status.success(), "{backend}: {status}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{backend}: it waited"
    );
    serve
        .wait_log(WAIT, |lines| {
            count(lines, "the database was not reachable within 1500 ms") == 1
        })
        .await;
    assert!(
        serve.count("waiting for the database") >= 2,
        "{backend}: it retried"
    );
}

on_servers!(
    serve_exits_at_once_when_waiting_cannot_help,
    serve_exits_at_once_when_waiting_cannot_help_postgres,
    serve_exits_at_once_when_waiting_cannot_help_mysql
);

async fn serve_exits_at_once_when_waiting_cannot_help(
    db: &TestDatabase,
    _proxy: &TcpProxy,
    url: &str,
) {
    let backend = db.backend;
    // The server answers, but the database does not exist: no wait cures that.
    let missing = url.replace(db.name(), "idem_no_such_database");
    let started = Instant::now();
    let mut serve = Serve::spawn(&missing, &["--database-wait-ms", "60000"]);
    let status = serve.exit(WAIT).await;
    assert!(!status.success(), "{backend}: {status}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{backend}: it did not wait"
    );
    serve
        .wait_log(WAIT, |lines| count(lines, "waiting would not help") == 1)
        .await;
    assert_eq!(serve.count("waiting for the database"), 0, "{backend}");
}

// ---- SQLite: no server to lose, but a file to lose -------------------------------------

fn scratch_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("idem-outage-{}", uuid::Uuid::new_v4().simple()))
}

#[tokio::test]
async fn sqlite_serve_waits_for_its_directory_then_starts() {
    let dir = scratch_dir();
    let url = format!("sqlite://{}/idem.db?mode=rwc", dir.display());
    let mut serve = Serve::spawn(&url, &["--database-wait-ms", "60000"]);
    serve
        .wait_log(WAIT, |lines| count(lines, "waiting for the database") >= 2)
        .await;
    assert!(serve.running(), "it waits instead of exiting");
    // The volume is mounted at last.
    std::fs::create_dir_all(&dir).unwrap();
    let api = Api::new(serve.listening(WAIT).await);
    let (code, body) = api.get("/health/ready").await;
    assert_eq!(code, 200, "{body}");
    drop(serve);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sqlite_serve_gives_up_past_the_wait_bound() {
    let dir = scratch_dir();
    let url = format!("sqlite://{}/idem.db?mode=rwc", dir.display());
    let mut serve = Serve::spawn(&url, &["--database-wait-ms", "1000"]);
    let status = serve.exit(WAIT).await;
    assert!(!status.success(), "{status}");
    serve
        .wait_log(WAIT, |lines| {
            count(lines, "the database was not reachable within 1000 ms") == 1
        })
        .await;
}

#[tokio::test]
async fn sqlite_a_removed_or_replaced_database_file_is_not_ready() {
    let db = TestDatabase::create(Backend::Sqlite, "sqlite removed file").await;
    let mut serve = Serve::spawn(&db.url, &[]);
    let api = Api::new(serve.listening(WAIT).await);
    let (code, body) = api.get("/health/ready").await;
    assert_eq!(code, 200, "{body}");
    // Commits would still succeed, into a file nobody will open again.
    let path = db.url.trim_start_matches("sqlite://");
    let path = path.split('?').next().unwrap();
    std::fs::remove_file(path).unwrap();
    let body = wait_ready(&api, 503).await;
    assert_eq!(
        body["error"]["message"],
        "the database is unavailable: the database file is missing"
    );
    assert!(!body.to_string().contains(db.name()), "{body}");
    // Another file at the same path (a restore, say) is not the one idem writes to either.
    std::fs::write(path, b"").unwrap();
    let (code, body) = api.get("/health/ready").await;
    assert_eq!(code, 503, "a replaced file: {body}");
    let (code, _) = api.get("/health/live").await;
    assert_eq!(code, 200);
    drop(serve);
    db.drop_database().await;
}

//! The API's HTTP server as a client meets it, on a real `idem serve` process over raw TCP:
//! half-sent requests and idle keep-alive connections are closed by their timeouts, a
//! connection past the cap waits until one closes, and a SIGTERM stops the server at once
//! whatever its clients hold open, after answering the requests in progress.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use common::recorder::Recorder;
use common::{Api, Child, exchange, read_response};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How late a timer may close a connection on a busy test machine.
const SLACK: Duration = Duration::from_secs(3);

async fn sqlite(test: &str) -> TestDatabase {
    TestDatabase::create(Backend::Sqlite, test).await
}

fn addr(idem: &Child) -> SocketAddr {
    idem.url.trim_start_matches("http://").parse().unwrap()
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Reads until the server closes `s`; returns what it sent and when it closed.
async fn until_closed(s: &mut TcpStream, limit: Duration) -> (String, Instant) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read_all)
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {limit:?}"));
    (String::from_utf8_lossy(&got).into_owned(), Instant::now())
}

#[tokio::test]
async fn half_sent_requests_are_closed_at_the_read_timeout() {
    let db = sqlite("half_sent_requests").await;
    let timeout = Duration::from_millis(1_000);
    let idem = Child::serve(&db.url, "half", &["--request-read-timeout-ms", "1000"]).await;
    let mut sent = Vec::new();
    for i in 0..50 {
        let mut s = TcpStream::connect(addr(&idem)).await.unwrap();
        // Half stop inside the head, half inside the body.
        let part: &[u8] = if i % 2 == 0 {
            b"POST /api/v1/transactions HTTP/1.1\r\nHost: localhost\r\nContent-Ty"
        } else {
            b"POST /api/v1/transactions HTTP/1.1\r\nHost: localhost\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"gid\""
        };
        s.write_all(part).await.unwrap();
        sent.push((i, Instant::now(), s));
    }
    // Meanwhile the server serves everyone else.
    let (status, health) = Api::new(idem.url.clone()).get("/health").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));

    let closed = futures::future::join_all(sent.into_iter().map(|(i, at, mut s)| async move {
        let (answer, closed_at) = until_closed(&mut s, timeout + SLACK).await;
        (i, closed_at - at, answer)
    }))
    .await;
    for (i, after, answer) in closed {
        assert!(
            after >= timeout - Duration::from_millis(50),
            "{i} closed after {after:?}"
        );
        if i % 2 == 0 {
            assert_eq!(answer, "", "{i}: a half head gets no answer");
        } else {
            assert!(answer.starts_with("HTTP/1.1 400"), "{i}: {answer}");
            assert!(answer.contains("invalid_body"), "{i}: {answer}");
        }
    }
    drop(idem);
    db.drop_database().await;
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout_and_silent_ones_at_the_read_timeout() {
    let db = sqlite("idle_connections").await;
    let idem = Child::serve(
        &db.url,
        "idle",
        &[
            "--request-read-timeout-ms",
            "300",
            "--idle-timeout-ms",
            "1500",
        ],
    )
    .await;
    let silent_from = Instant::now();
    let mut silent = TcpStream::connect(addr(&idem)).await.unwrap();
    let silent = tokio::spawn(async move { until_closed(&mut silent, SLACK).await });

    let mut s = TcpStream::connect(addr(&idem)).await.unwrap();
    assert!(exchange(&mut s, HEALTH).await.starts_with("HTTP/1.1 200"));
    // Idle for longer than the read timeout: kept alive, the next request is served.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(exchange(&mut s, HEALTH).await.starts_with("HTTP/1.1 200"));
    let idle_from = Instant::now();
    let (_, closed_at) = until_closed(&mut s, Duration::from_millis(1_500) + SLACK).await;
    let idle = closed_at - idle_from;
    assert!(
        idle >= Duration::from_millis(1_450),
        "closed after {idle:?} idle"
    );

    // A connection that never sends a byte has the read timeout from its accept.
    let (answer, closed_at) = silent.await.unwrap();
    assert_eq!(answer, "");
    let silent_for = closed_at - silent_from;
    assert!(silent_for < Duration::from_millis(1_450), "{silent_for:?}");
    drop(idem);
    db.drop_database().await;
}

#[tokio::test]
async fn a_request_in_progress_outlives_both_timeouts() {
    let db = sqlite("request_in_progress").await;
    let p = Recorder::start().await;
    p.delay("/try", None, 1, Duration::from_millis(1_200));
    let idem = Child::serve(
        &db.url,
        "busy",
        &[
            "--request-read-timeout-ms",
            "300",
            "--idle-timeout-ms",
            "300",
        ],
    )
    .await;
    let api = Api::new(idem.url.clone());
    let (status, _) = api
        .post("/api/v1/transactions", json!({"gid": "t", "kind": "tcc"}))
        .await;
    assert_eq!(status, 201);
    // The handler calls the Try and waits 1.2 s for it: four read or idle timeouts.
    let reg = json!({"branch_id": "a", "confirm": p.url("/confirm"), "cancel": p.url("/cancel"),
                     "try": p.url("/try")});
    let (status, answer) = api.post("/api/v1/transactions/t/branches", reg).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["try"]["outcome"], "success", "{answer}");
    drop(idem);
    db.drop_database().await;
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    let db = sqlite("connection_cap").await;
    let idem = Child::serve(&db.url, "cap", &["--max-http-connections", "2"]).await;
    let mut first = TcpStream::connect(addr(&idem)).await.unwrap();
    let mut second = TcpStream::connect(addr(&idem)).await.unwrap();
    assert!(
        exchange(&mut first, HEALTH)
            .await
            .starts_with("HTTP/1.1 200")
    );
    assert!(
        exchange(&mut second, HEALTH)
            .await
            .starts_with("HTTP/1.1 200")
    );

    // The kernel completes the handshake (listen backlog), but idem does not take it.
    let mut third = TcpStream::connect(addr(&idem)).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(500), read_response(&mut third)).await;
    assert!(waiting.is_err(), "served past the cap: {waiting:?}");

    drop(first);
    let answer = tokio::time::timeout(SLACK, read_response(&mut third))
        .await
        .expect("served once a connection closed");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        exchange(&mut second, HEALTH)
            .await
            .starts_with("HTTP/1.1 200")
    );
    drop(idem);
    db.drop_database().await;
}

/// A Try that holds its answer until the test releases it.
struct HeldTry {
    url: String,
    called: Arc<Notify>,
    release: Arc<Notify>,
}

async fn held_try() -> HeldTry {
    let called = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (c, r) = (Arc::clone(&called), Arc::clone(&release));
    let app = Router::new().route(
        "/try",
        post(move || async move {
            c.notify_one();
            r.notified().await;
            "{}"
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/try", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    HeldTry {
        url,
        called,
        release,
    }
}

#[tokio::test]
async fn sigterm_answers_requests_in_progress_and_waits_for_no_idle_or_half_sent_connection() {
    let db = sqlite("sigterm_connections").await;
    let held = held_try().await;
    // The default timeouts (10 s read, 60 s idle): the stop must not wait for them.
    let mut idem = Child::serve(&db.url, "stop", &[]).await;
    let api = Api::new(idem.url.clone());
    let (status, _) = api
        .post("/api/v1/transactions", json!({"gid": "t", "kind": "tcc"}))
        .await;
    assert_eq!(status, 201);
    let mut half = TcpStream::connect(addr(&idem)).await.unwrap();
    half.write_all(b"POST /api/v1/transactions HTTP/1.1\r\nHost: localhost\r\nContent-Le")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(addr(&idem)).await.unwrap();
    assert!(
        exchange(&mut idle, HEALTH)
            .await
            .starts_with("HTTP/1.1 200")
    );
    let reg = json!({"branch_id": "a", "confirm": "http://127.0.0.1:9/c",
                     "cancel": "http://127.0.0.1:9/x", "try": held.url});
    let in_progress = {
        let api = api.clone();
        tokio::spawn(async move { api.post("/api/v1/transactions/t/branches", reg).await })
    };
    tokio::time::timeout(SLACK, held.called.notified())
        .await
        .expect("the Try is called");

    let term_at = Instant::now();
    idem.signal("TERM");
    // The listener closes first.
    let deadline = term_at + SLACK;
    while TcpStream::connect(addr(&idem)).await.is_ok() {
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Idle and half-sent connections are closed at once, not at their timeouts.
    let (answer, _) = until_closed(&mut half, SLACK).await;
    assert_eq!(answer, "");
    let (answer, _) = until_closed(&mut idle, SLACK).await;
    assert_eq!(answer, "");
    // The request in progress still gets its answer.
    held.release.notify_one();
    let (status, answer) = in_progress.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["try"]["outcome"], "success", "{answer}");
    let exit = idem.wait_exit(SLACK).await.expect("idem exits");
    assert!(exit.success(), "{exit:?}");
    let stopped_in = term_at.elapsed();
    assert!(stopped_in < Duration::from_secs(8), "{stopped_in:?}");
    db.drop_database().await;
}

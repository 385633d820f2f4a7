//! The Idempotency-Key layer over real HTTP on loopback, on every backend: 50 concurrent
//! identical POSTs run the handler once, other bodies conflict, failures replay or re-run,
//! and a server killed with SIGKILL during PROCESSING is recovered from the source of truth.

use std::io::BufRead;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem_participant::idempotency::http::{IdempotencyLayer, NothingHappened, RouteRule};
use idem_participant::idempotency::{IdempotencyStore, Status};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{Clock, ManualClock, SharedClock, SystemClock};
use sqlx::AnyPool;

use crate::kit_support::keys;
use keys::{ChargeLookup, charge, charge_result, charges, client, send, serve, setup};

/// The handler of the layer tests: counts its runs; answers 422 for `"bad": true`, 503
/// marked "nothing happened" on the first run of `"flaky": true`, otherwise 201 with a fresh id (so a replay is
/// provably the first answer, not a second run). It first waits until `arrivals` reaches
/// `hold`, so that concurrent requests really overlap with it.
#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    arrivals: tokio::sync::watch::Sender<usize>,
    hold: usize,
}

async fn handler(State(app): State<App>, body: String) -> Response {
    let mut seen = app.arrivals.subscribe();
    let _ = seen.wait_for(|n| *n >= app.hold).await;
    let run = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let value: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    if value["bad"] == true {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            axum::Json(serde_json::json!({"error": "bad", "run": run})),
        )
            .into_response();
    }
    if value["flaky"] == true && run == 1 {
        // Down before acting: the next repeat may run it again.
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            Extension(NothingHappened),
            "down",
        )
            .into_response();
    }
    (
        StatusCode::CREATED,
        axum::Json(serde_json::json!({"id": uuid::Uuid::new_v4().to_string(), "run": run})),
    )
        .into_response()
}

async fn count_arrival(State(app): State<App>, req: Request, next: Next) -> Response {
    app.arrivals.send_modify(|n| *n += 1);
    next.run(req).await
}

async fn layer_app(pool: &AnyPool, hold: usize) -> (String, App) {
    let app = App {
        runs: Arc::new(AtomicUsize::new(0)),
        arrivals: tokio::sync::watch::channel(0).0,
        hold,
    };
    let router = Router::new()
        .route("/orders", post(handler))
        .with_state(app.clone());
    let router = IdempotencyLayer::new(IdempotencyStore::new(pool.clone()))
        .route(
            Method::POST,
            "/orders",
            RouteRule::new("create_order")
                .ignore("trace")
                .wait(Duration::from_secs(30)),
        )
        .apply(router)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            count_arrival,
        ));
    (format!("{}/orders", serve(router).await), app)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_posts_run_the_handler_once() {
    for db in testing::all("fifty_concurrent_identical_posts_run_the_handler_once").await {
        let pool = setup(&db).await;
        let (url, app) = layer_app(&pool, 50).await;
        let client = client();
        let mut tasks = Vec::new();
        for i in 0..50 {
            let (client, url) = (client.clone(), url.clone());
            // The same intent; only the ignored trace field differs between retries.
            let body = format!(r#"{{"sku": "a", "n": 2, "trace": "t{i}"}}"#);
            tasks.push(tokio::spawn(async move {
                send(&client, &url, Some("order-50"), "acme", &body).await
            }));
        }
        let mut replies = Vec::new();
        for task in tasks {
            replies.push(task.await.unwrap());
        }
        let b = db.backend;
        assert_eq!(
            app.runs.load(Ordering::SeqCst),
            1,
            "{b}: the handler ran once"
        );
        assert!(
            replies.iter().all(|r| r.status == 201),
            "{b}: {:?}",
            replies.iter().map(|r| r.status).collect::<Vec<_>>()
        );
        assert!(
            replies.iter().all(|r| r.bytes == replies[0].bytes),
            "{b}: one body for all"
        );
        assert_eq!(
            replies.iter().filter(|r| !r.replayed).count(),
            1,
            "{b}: 49 flagged replays"
        );
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_conflicts_and_failures_answer_as_the_seed_says() {
    for db in testing::all("keys_conflicts_and_failures_answer_as_the_seed_says").await {
        let pool = setup(&db).await;
        let (url, app) = layer_app(&pool, 0).await;
        let client = client();
        let b = db.backend;
        let runs = || app.runs.load(Ordering::SeqCst);

        let first = send(
            &client,
            &url,
            Some("k-1"),
            "acme",
            r#"{"sku": "a", "n": 1}"#,
        )
        .await;
        assert_eq!((first.status, first.replayed), (201, false), "{b}");
        // Key order and number spelling do not make another request.
        let same = send(
            &client,
            &url,
            Some("k-1"),
            "acme",
            r#"{"n": 1.0, "sku": "a"}"#,
        )
        .await;
        assert_eq!(
            (same.status, same.replayed, &same.bytes),
            (201, true, &first.bytes),
            "{b}"
        );
        let other = send(
            &client,
            &url,
            Some("k-1"),
            "acme",
            r#"{"sku": "a", "n": 2}"#,
        )
        .await;
        assert_eq!(other.status, 409, "{b}");
        assert!(
            other.text().contains("idempotency_key_conflict"),
            "{b}: {}",
            other.text()
        );
        // Another tenant's same key is another record.
        let tenant = send(
            &client,
            &url,
            Some("k-1"),
            "globex",
            r#"{"sku": "a", "n": 2}"#,
        )
        .await;
        assert_eq!((tenant.status, tenant.replayed), (201, false), "{b}");
        assert_eq!(runs(), 2, "{b}");

        let missing = send(&client, &url, None, "acme", "{}").await;
        assert_eq!(missing.status, 400, "{b}");
        assert!(missing.text().contains("idempotency_key_required"), "{b}");
        for bad in ["has space", &"k".repeat(129), "ü"] {
            let r = send(&client, &url, Some(bad), "acme", "{}").await;
            assert_eq!(r.status, 400, "{b}: {bad}");
            assert!(
                r.text().contains("invalid_idempotency_key"),
                "{b}: {}",
                r.text()
            );
        }
        assert_eq!(runs(), 2, "{b}: refused before the handler");

        // 4xx: FAILED_FINAL, the first failure replays without a run.
        let bad = send(&client, &url, Some("k-bad"), "acme", r#"{"bad": true}"#).await;
        assert_eq!((bad.status, bad.replayed), (422, false), "{b}");
        let again = send(&client, &url, Some("k-bad"), "acme", r#"{"bad": true}"#).await;
        assert_eq!(
            (again.status, again.replayed, &again.bytes),
            (422, true, &bad.bytes),
            "{b}"
        );
        assert_eq!(runs(), 3, "{b}");

        // A 5xx marked "nothing happened": FAILED_RETRYABLE, re-acquired and run again,
        // then replayed.
        app.runs.store(0, Ordering::SeqCst);
        let down = send(
            &client,
            &url,
            Some("k-flaky2"),
            "acme",
            r#"{"flaky": true}"#,
        )
        .await;
        assert_eq!(down.status, 503, "{b}");
        let up = send(
            &client,
            &url,
            Some("k-flaky2"),
            "acme",
            r#"{"flaky": true}"#,
        )
        .await;
        assert_eq!((up.status, up.replayed), (201, false), "{b}: run again");
        let store = IdempotencyStore::new(pool.clone());
        assert_eq!(
            store.lookup("acme:create_order", "k-flaky2").await.unwrap(),
            Some((Status::Succeeded, 2))
        );
        let replay = send(
            &client,
            &url,
            Some("k-flaky2"),
            "acme",
            r#"{"flaky": true}"#,
        )
        .await;
        assert_eq!(
            (replay.status, replay.replayed, &replay.bytes),
            (201, true, &up.bytes),
            "{b}"
        );
        assert_eq!(runs(), 2, "{b}");
        db.drop_database().await;
    }
}

// ---- kill -9 during PROCESSING -------------------------------------------------------

const CHILD_DB: &str = "IDEM_KEYS_CHILD_DB";
const CHILD_PHASE: &str = "IDEM_KEYS_CHILD_PHASE";

/// The child server (a re-run of this test binary): a 60 s lease on the database's clock, and
/// a handler that blocks for ever before (`before`) or after (`after`) its external call,
/// saying so on stdout. Does nothing when not started as the child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_server() {
    let (Ok(url), Ok(phase)) = (std::env::var(CHILD_DB), std::env::var(CHILD_PHASE)) else {
        return;
    };
    let pool = idem_participant::connect(&url, 4).await.unwrap();
    // Leases on the database's clock, as in production.
    let store = IdempotencyStore::new(pool.clone()).with_lease(Duration::from_secs(60));
    let router = Router::new().route(
        "/charges",
        post(move |req: axum::http::HeaderMap| {
            let (pool, phase) = (pool.clone(), phase.clone());
            async move {
                let key = req["idempotency-key"].to_str().unwrap().to_owned();
                if phase == "after" {
                    charge(&pool, &key).await;
                }
                println!("IDEMCHILD {phase}");
                std::future::pending::<()>().await;
                StatusCode::OK
            }
        }),
    );
    let router = IdempotencyLayer::new(store)
        .route(Method::POST, "/charges", RouteRule::new("charge"))
        .apply(router);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("IDEMCHILD port {}", listener.local_addr().unwrap().port());
    axum::serve(listener, router).await.unwrap();
}

/// Kills the child server if the test fails before it does (no orphaned servers).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the child, sends it one POST, waits until its handler is blocked in `phase`,
/// and kills it with SIGKILL.
async fn crash_during_processing(db: &TestDatabase, phase: &str, key: &str, body: &str) {
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "idempotency_http::child_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &db.url)
        .env(CHILD_PHASE, phase)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the child server");
    let mut child = KillOnDrop(child);
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            // The harness may print `test idempotency_http::child_server ... ` before it on
            // the same line.
            if let Some(at) = line.find("IDEMCHILD ") {
                let _ = lines_tx.send(line[at + "IDEMCHILD ".len()..].to_owned());
            }
        }
    });
    let next_line = |lines: &std::sync::mpsc::Receiver<String>| {
        lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the child's line")
    };
    let port = next_line(&lines)
        .strip_prefix("port ")
        .expect("port line")
        .to_owned();
    let url = format!("http://127.0.0.1:{port}/charges");
    let (client, key_owned, body_owned) = (client(), key.to_owned(), body.to_owned());
    let request = tokio::spawn(async move {
        client
            .post(url)
            .header("idempotency-key", key_owned)
            .body(body_owned)
            .send()
            .await
    });
    let lines = tokio::task::spawn_blocking(move || {
        let line = next_line(&lines);
        (line, lines)
    });
    let (line, _lines) = lines.await.unwrap();
    assert_eq!(line, phase);
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().unwrap();
    assert!(
        request.await.unwrap().is_err(),
        "the killed server never answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_during_processing_is_recovered_from_the_source_of_truth() {
    for db in
        testing::all("a_server_killed_during_processing_is_recovered_from_the_source_of_truth")
            .await
    {
        let pool = setup(&db).await;
        let b = db.backend;
        let body = r#"{"amount": 100}"#;
        crash_during_processing(&db, "after", "pay-after", body).await;
        crash_during_processing(&db, "before", "pay-before", body).await;
        assert_eq!(
            charges(&pool).await,
            1,
            "{b}: only the `after` child charged"
        );

        // The restarted service, its clock past the dead owner's 60 s lease.
        let clock = ManualClock::at(SystemClock.now_ms() + 61_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let store = IdempotencyStore::new(pool.clone()).with_clock(shared);
        assert_eq!(
            store.lookup("-:charge", "pay-after").await.unwrap(),
            Some((Status::Processing, 1)),
            "{b}"
        );
        assert_eq!(
            store.lookup("-:charge", "pay-before").await.unwrap(),
            Some((Status::Processing, 1)),
            "{b}"
        );
        let runs = Arc::new(AtomicUsize::new(0));
        let hook = ChargeLookup::new(&pool);
        let handler_pool = pool.clone();
        let handler_runs = runs.clone();
        let router = Router::new().route(
            "/charges",
            post(move |headers: axum::http::HeaderMap| {
                let (pool, runs) = (handler_pool.clone(), handler_runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
                    charge(&pool, &key).await;
                    let r = charge_result(&key);
                    (
                        StatusCode::CREATED,
                        [("content-type", "application/json")],
                        r.body,
                    )
                        .into_response()
                }
            }),
        );
        let router = IdempotencyLayer::new(store)
            .route(Method::POST, "/charges", RouteRule::new("charge"))
            .recovery(hook.clone())
            .apply(router);
        let url = format!("{}/charges", serve(router).await);
        let client = client();

        // The effect happened before the crash: answered from the charge, no second run.
        let r = send(&client, &url, Some("pay-after"), "-", body).await;
        assert_eq!((r.status, r.replayed), (201, true), "{b}: {}", r.text());
        assert_eq!(r.bytes, charge_result("pay-after").body, "{b}");
        assert_eq!((runs.load(Ordering::SeqCst), hook.asked()), (0, 1), "{b}");
        // The effect did not happen: taken over under a new owner and run once.
        let r = send(&client, &url, Some("pay-before"), "-", body).await;
        assert_eq!((r.status, r.replayed), (201, false), "{b}: {}", r.text());
        assert_eq!((runs.load(Ordering::SeqCst), hook.asked()), (1, 2), "{b}");
        assert_eq!(
            IdempotencyStore::new(pool.clone())
                .lookup("-:charge", "pay-before")
                .await
                .unwrap(),
            Some((Status::Succeeded, 2))
        );
        // Both settled: repeats replay without the hook or the handler.
        for key in ["pay-after", "pay-before"] {
            let r = send(&client, &url, Some(key), "-", body).await;
            assert_eq!((r.status, r.replayed), (201, true), "{b}");
        }
        assert_eq!((runs.load(Ordering::SeqCst), hook.asked()), (1, 2), "{b}");
        assert_eq!(charges(&pool).await, 2, "{b}: one charge per key");
        db.drop_database().await;
    }
}

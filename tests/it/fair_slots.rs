//! Call and driver slots are shared fairly between tenants (issue 28, point 5), over real
//! HTTP on SQLite, PostgreSQL and MariaDB: a tenant whose participant never answers (it
//! holds every connection until idem's call timeout) holds at most its share of the
//! slots, and a healthy tenant's sagas beside it finish within the time they take without
//! it. The same tarpit with no share shows that it does bite: the healthy tenant waits.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::auth::{Setup, get, post};
use idem::auth::Role;
use idem_participant::testing::{self, TestDatabase};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Small enough that a handful of hanging calls fill them: per tenant at half, 2 calls
/// and 4 transactions driven.
const CALLS: usize = 4;
const DRIVING: usize = 8;
/// How long each of the tarpit's calls hangs before idem gives up on it.
const TARPIT_TIMEOUT_MS: u64 = 6_000;

/// A participant that accepts connections, reads what comes and never answers; it counts
/// the connections open at once, and the most there were.
#[derive(Clone)]
struct Tarpit {
    url: String,
    open: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    changed: Arc<Notify>,
}

impl Tarpit {
    async fn start() -> Tarpit {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tarpit = Tarpit {
            url: format!("http://{}", listener.local_addr().unwrap()),
            open: Arc::default(),
            peak: Arc::default(),
            changed: Arc::default(),
        };
        let t = tarpit.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let t = t.clone();
                tokio::spawn(async move {
                    let now = t.open.fetch_add(1, Ordering::SeqCst) + 1;
                    t.peak.fetch_max(now, Ordering::SeqCst);
                    t.changed.notify_waiters();
                    let mut buf = [0u8; 4096];
                    // Until idem hangs up: its call timed out, or it stopped.
                    while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                    t.open.fetch_sub(1, Ordering::SeqCst);
                    t.changed.notify_waiters();
                });
            }
        });
        tarpit
    }

    /// Waits until `n` calls hang here at once.
    async fn until_open(&self, n: usize) {
        let wait = Duration::from_secs(20);
        let open = common::until_at_least(&self.open, &self.changed, n, wait).await;
        assert!(open, "never {n} calls at the tarpit at once");
    }
}

fn saga(gid: &str, steps: &[String], compensate: &str, options: Value) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .map(|action| json!({"action": action, "compensate": compensate}))
        .collect();
    json!({"gid": gid, "kind": "saga", "steps": steps, "options": options, "wait_result": true})
}

/// One of the healthy tenant's sagas, two steps: how long it takes to finish (the create
/// waits for its result).
async fn healthy_saga(s: &Setup, token: &str, gid: &str) -> Duration {
    let steps = [s.recorder.url("/h1"), s.recorder.url("/h2")];
    let body = saga(gid, &steps, &s.recorder.url("/hc"), json!({}));
    let started = Instant::now();
    let (status, tx) = post(s, "/api/v1/transactions", Some(token), body).await;
    let took = started.elapsed();
    assert_eq!(
        (status, tx["status"].as_str()),
        (201, Some("succeeded")),
        "{tx}"
    );
    took
}

/// The tarpit tenant's sagas: every call hangs until it times out; two attempts each,
/// then the compensation, which hangs too.
async fn start_tarpit_sagas(s: &Setup, token: &str, tarpit: &Tarpit, n: usize) {
    let options = json!({"request_timeout_ms": TARPIT_TIMEOUT_MS, "max_attempts": 2,
                         "retry_interval_ms": 10, "max_retry_interval_ms": 10});
    for i in 0..n {
        let mut body = saga(
            &format!("stuck-{i}"),
            &[format!("{}/a", tarpit.url)],
            &format!("{}/c", tarpit.url),
            options.clone(),
        );
        body["wait_result"] = json!(false);
        let (status, tx) = post(s, "/api/v1/transactions", Some(token), body).await;
        assert_eq!(status, 201, "{tx}");
    }
}

async fn coordinator(db: TestDatabase, share: u8) -> Setup {
    Setup::with(db, |c| {
        c.engine.max_concurrent_calls = CALLS;
        c.engine.max_driving = DRIVING;
        c.engine.tenant_share_percent = share;
        // Stopped with calls still hanging: no need to wait for them.
        c.shutdown_grace = Duration::from_millis(100);
    })
    .await
}

#[tokio::test]
async fn a_tenant_whose_participant_hangs_leaves_the_others_their_normal_time() {
    let mut control_done = false;
    for db in testing::all("fair_slots").await {
        let (b, backend) = (db.backend.name(), db.backend);
        let s = coordinator(db, 50).await;
        let healthy = s.token("healthy", Role::Client).await;
        let stuck = s.token("stuck", Role::Client).await;

        // The healthy tenant's normal time, alone (after one to warm up).
        healthy_saga(&s, &healthy, "warm-up").await;
        let mut alone = Duration::ZERO;
        for i in 0..5 {
            alone = alone.max(healthy_saga(&s, &healthy, &format!("alone-{i}")).await);
        }
        // Generous for a busy machine, and still far below one hanging call.
        let bound = alone * 4 + Duration::from_millis(500);
        assert!(
            bound < Duration::from_millis(TARPIT_TIMEOUT_MS / 2),
            "{b}: the healthy tenant alone took {alone:?}: too slow to tell"
        );

        // More tarpit sagas than the whole coordinator drives, every call hanging.
        let tarpit = Tarpit::start().await;
        start_tarpit_sagas(&s, &stuck, &tarpit, 3 * DRIVING).await;
        tarpit.until_open(CALLS / 2).await;

        let mut beside = Duration::ZERO;
        for i in 0..5 {
            beside = beside.max(healthy_saga(&s, &healthy, &format!("beside-{i}")).await);
        }
        eprintln!(
            "{b}: the healthy tenant's slowest saga alone {alone:?}, beside the tarpit {beside:?}"
        );
        assert!(
            beside <= bound,
            "{b}: beside the tarpit the healthy tenant took {beside:?}, alone {alone:?}"
        );
        // The tarpit tenant never had more than its share of the calls.
        assert_eq!(tarpit.peak.load(Ordering::SeqCst), CALLS / 2, "{b}");
        // Its history is its own: another tenant's token does not find it.
        let path = "/api/v1/transactions/stuck-0/attempts";
        assert_eq!(get(&s, path, Some(&healthy)).await.0, 404, "{b}");
        let (status, page) = get(&s, path, Some(&stuck)).await;
        assert_eq!(
            (status, page["gid"].as_str()),
            (200, Some("stuck-0")),
            "{b}: {page}"
        );
        s.finish().await;

        // Once (on the first database): the same without a share starves the healthy
        // tenant for at least one hanging call, so the bound above is a real test.
        if !control_done {
            control_done = true;
            let db = TestDatabase::create(backend, "fair_slots_control").await;
            let s = coordinator(db, 100).await;
            let healthy = s.token("healthy", Role::Client).await;
            let stuck = s.token("stuck", Role::Client).await;
            let tarpit = Tarpit::start().await;
            start_tarpit_sagas(&s, &stuck, &tarpit, 3 * DRIVING).await;
            tarpit.until_open(CALLS).await;
            let starved = tokio::time::timeout(bound, healthy_saga(&s, &healthy, "starved")).await;
            assert!(
                starved.is_err(),
                "{b}: without a share the healthy tenant still finished within {bound:?}"
            );
            assert_eq!(tarpit.peak.load(Ordering::SeqCst), CALLS, "{b}");
            s.finish().await;
        }
    }
}

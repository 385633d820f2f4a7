//! How much a coordinator takes on at once: it drives at most `max_driving` transactions;
//! the rest wait in the database, unowned, and are claimed in order as drivers finish. A
//! participant that holds every call open longer than the bound shows it, with several
//! transactions at once, on every backend; and a request dropped by its client still
//! starts the saga it stored.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::FutureExt;
use idem::core::{SagaStep, Status, TxOptions};
use idem::engine::NewSaga;
use idem::store::ListFilter;
use serde_json::json;
use tokio::sync::{Notify, watch};

const WAIT: Duration = Duration::from_secs(30);

/// A participant that holds every call until opened, and counts the calls held at once.
struct Gate {
    url: String,
    open: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
    arrived: Arc<Notify>,
}

impl Gate {
    async fn start() -> Gate {
        let (open, opened) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let calls = Arc::new(AtomicUsize::new(0));
        let arrived = Arc::new(Notify::new());
        let state = (
            opened,
            Arc::clone(&held),
            Arc::clone(&most),
            Arc::clone(&calls),
            Arc::clone(&arrived),
        );
        let app = axum::Router::new().fallback(move || {
            let (mut opened, held, most, calls, arrived) = state.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                arrived.notify_waiters();
                let _ = opened.wait_for(|open| *open).await;
                held.fetch_sub(1, Ordering::SeqCst);
                axum::Json(json!({"dtm_result": "SUCCESS"}))
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/step", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Gate {
            url,
            open,
            held,
            most,
            calls,
            arrived,
        }
    }

    /// Waits until `n` calls are held.
    async fn held(&self, n: usize) {
        let together = common::until_at_least(&self.held, &self.arrived, n, WAIT).await;
        assert!(together, "{n} calls never arrived together");
    }
}

/// Held calls outlast the bound: twelve two-step sagas, room to drive three. Every create
/// is answered and stored; three are called, the other nine wait unowned in the database;
/// once the participant answers, all twelve finish with each step called once, and never
/// more than three at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_bound_a_coordinator_leaves_new_sagas_in_the_database_and_claims_them_in_turn() {
    for db in idem_participant::testing::all("admission_bound").await {
        let b = db.backend;
        let server = common::coordinator_with(&db.url, |c| {
            c.engine.max_driving = 3;
            c.engine.max_concurrent_calls = 8;
            c.engine.lease_ms = 60_000;
            c.engine.defaults.request_timeout_ms = 60_000;
        })
        .await;
        let api = common::Api::new(server.url());
        let gate = Gate::start().await;
        let gids: Vec<String> = (0..12).map(|i| format!("bounded-{i:02}")).collect();
        for gid in &gids {
            let body = json!({"gid": gid, "kind": "saga", "steps": [
                {"action": gate.url, "compensate": gate.url, "payload": {}},
                {"action": gate.url, "compensate": gate.url, "payload": {}},
            ]});
            let (code, answer) = api.post("/api/v1/transactions", body).await;
            assert_eq!(code, 201, "{b}: {answer}");
        }
        gate.held(3).await;
        // Still three: the bound holds while the calls outlast it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(gate.held.load(Ordering::SeqCst), 3, "{b}");
        assert_eq!(server.engine.driving(), 3, "{b}");
        let store = common::open(&db.url).await;
        let page = store
            .list(&ListFilter {
                statuses: vec![Status::Running],
                limit: 100,
                ..ListFilter::default()
            })
            .await
            .unwrap();
        let unowned = page
            .items
            .iter()
            .filter(|s| s.owner_token.is_none())
            .count();
        assert_eq!((page.items.len(), unowned), (12, 9), "{b}");
        gate.open.send_replace(true);
        for gid in &gids {
            api.wait_status(gid, &["succeeded"], WAIT).await;
        }
        assert_eq!(gate.calls.load(Ordering::SeqCst), 24, "{b}: each step once");
        assert_eq!(
            gate.most.load(Ordering::SeqCst),
            3,
            "{b}: never more than the bound"
        );
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// Seen in the side-by-side benchmark: a client that hung up while its create was being
/// written dropped the request after the write and before the driver started, and the
/// saga waited for its lease to lapse. Here the create is polled once (queued for the
/// writer) and dropped; the lease is a minute, so only a driver started by the request
/// itself finishes the saga in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_client_hangs_up_mid_write_still_drives_its_saga() {
    for db in idem_participant::testing::all("dropped_create").await {
        let b = db.backend;
        let server = common::coordinator_with(&db.url, |c| c.engine.lease_ms = 60_000).await;
        let api = common::Api::new(server.url());
        let gate = Gate::start().await;
        gate.open.send_replace(true);
        let step = SagaStep {
            action: gate.url.clone(),
            compensate: gate.url.clone(),
            payload: "{}".into(),
        };
        let create = server.engine.create_saga(NewSaga {
            gid: "hung-up".into(),
            steps: vec![step.clone(), step],
            options: TxOptions::default(),
            request: std::sync::Arc::new(json!({"gid": "hung-up"})),
            trace: None,
            tokenless: false,
        });
        let polled = create.now_or_never();
        assert!(
            polled.is_none(),
            "{b}: the write takes a moment: {polled:?}"
        );
        api.wait_status("hung-up", &["succeeded"], Duration::from_secs(20))
            .await;
        assert_eq!(gate.calls.load(Ordering::SeqCst), 2, "{b}");
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

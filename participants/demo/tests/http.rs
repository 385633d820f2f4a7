//! The example participants raced over real HTTP, on SQLite, PostgreSQL and MariaDB: each
//! test starts the axum services on 127.0.0.1:0 and calls them the way the coordinator does
//! (`POST <url>?gid=..&trans_type=..&branch_id=..&op=..`, body = the registered payload).

use std::collections::HashSet;
use std::sync::Arc;

use idem_demo::{Service, coupon, inventory, payment};
use idem_participant::barrier_records;
use idem_participant::testing::{self, TestDatabase};
use serde_json::{Value, json};
use sqlx::AnyPool;

/// A participant service on a fresh database, and a client for it.
struct Env {
    db: TestDatabase,
    pool: AnyPool,
    service: Service,
    client: reqwest::Client,
}

impl Env {
    async fn inventory(db: TestDatabase) -> Env {
        let pool = inventory::open(&db.url).await.expect("open inventory");
        let service = inventory::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    async fn payment(db: TestDatabase) -> Env {
        let pool = payment::open(&db.url).await.expect("open payment");
        let service = payment::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    async fn coupon(db: TestDatabase) -> Env {
        let pool = coupon::open(&db.url).await.expect("open coupon");
        let service = coupon::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    fn new(db: TestDatabase, pool: AnyPool, service: Service) -> Env {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Env {
            db,
            pool,
            service,
            client: reqwest::Client::new(),
        }
    }

    fn name(&self) -> &'static str {
        self.db.backend.name()
    }

    /// One coordinator-style callback; returns the status and the JSON body.
    async fn call(
        &self,
        path: &str,
        trans_type: &str,
        gid: &str,
        branch: &str,
        op: &str,
        body: &Value,
    ) -> (u16, Value) {
        call(
            &self.client,
            &self.service.url(path),
            trans_type,
            gid,
            branch,
            op,
            body,
        )
        .await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.service.url(path))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    async fn finish(self) {
        self.service.stop().await.unwrap();
        self.pool.close().await;
        self.db.drop_database().await;
    }
}

async fn call(
    client: &reqwest::Client,
    url: &str,
    trans_type: &str,
    gid: &str,
    branch: &str,
    op: &str,
    body: &Value,
) -> (u16, Value) {
    let r = client
        .post(format!(
            "{url}?gid={gid}&trans_type={trans_type}&branch_id={branch}&op={op}"
        ))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("participant answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn gid(prefix: &str) -> String {
    format!("{prefix}-{}", uuid_like())
}

/// A unique suffix without another dependency: the tests' own process-wide counter plus
/// the clock is unique enough across parallel tests of one run, and the databases are
/// fresh per test anyway.
fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos:x}{:x}", N.fetch_add(1, Ordering::Relaxed))
}

async fn stock(env: &Env, sku: &str) -> inventory::Stock {
    inventory::stock(&env.pool, sku)
        .await
        .unwrap()
        .expect("sku exists")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_tries_reserve_once() {
    for db in testing::all("http_fifty_concurrent_identical_tries").await {
        let env = Arc::new(Env::inventory(db).await);
        inventory::seed(&env.pool, "apple", 100).await.unwrap();
        let g = gid("fifty");
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (env, g, start) = (env.clone(), g.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                env.call(
                    inventory::RESERVE_PATH,
                    "tcc",
                    &g,
                    "01",
                    "try",
                    &json!({"sku": "apple", "quantity": 2}),
                )
                .await
            }));
        }
        let mut outcomes = Vec::new();
        let mut results = HashSet::new();
        for task in tasks {
            let (status, body) = task.await.unwrap();
            assert_eq!(status, 200, "{}: {body}", env.name());
            assert_eq!(body["dtm_result"], "SUCCESS");
            outcomes.push(body["outcome"].as_str().unwrap().to_owned());
            results.insert(body["result"].to_string());
        }
        assert_eq!(
            outcomes.iter().filter(|o| *o == "executed").count(),
            1,
            "{}",
            env.name()
        );
        assert_eq!(
            outcomes.iter().filter(|o| *o == "duplicate").count(),
            49,
            "{}",
            env.name()
        );
        assert_eq!(
            results.len(),
            1,
            "{}: all 50 got the same result",
            env.name()
        );
        let s = stock(&env, "apple").await;
        assert_eq!(
            (s.available, s.reserved, s.sold),
            (98, 2, 0),
            "{}",
            env.name()
        );
        let r = inventory::reservation(&env.pool, &g, "01")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((r.quantity, r.status.as_str()), (2, "reserved"));
        let env = Arc::into_inner(env).expect("tasks are done");
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_first_is_an_empty_rollback_and_late_tries_are_rejected() {
    for db in testing::all("http_cancel_first_then_try").await {
        let env = Env::inventory(db).await;
        inventory::seed(&env.pool, "apple", 10).await.unwrap();
        let g = gid("hang");
        let payload = json!({"sku": "apple", "quantity": 3});
        let (status, body) = env
            .call(inventory::RESERVE_PATH, "tcc", &g, "01", "cancel", &payload)
            .await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("empty_rollback")),
            "{}: {body}",
            env.name()
        );
        for _ in 0..2 {
            let (status, body) = env
                .call(inventory::RESERVE_PATH, "tcc", &g, "01", "try", &payload)
                .await;
            assert_eq!(status, 409, "{}: {body}", env.name());
            assert_eq!(body["dtm_result"], "FAILURE");
            assert_eq!(body["outcome"], "rejected");
        }
        let s = stock(&env, "apple").await;
        assert_eq!(
            (s.available, s.reserved, s.sold),
            (10, 0, 0),
            "{}",
            env.name()
        );
        assert_eq!(
            inventory::reservation(&env.pool, &g, "01").await.unwrap(),
            None
        );
        let rows = barrier_records(&env.pool, &g).await.unwrap();
        let summary: Vec<_> = rows
            .iter()
            .map(|r| (r.op.as_str(), r.reason.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("cancel", "cancel", "empty_rollback"),
                ("try", "cancel", "guard")
            ],
            "{}",
            env.name()
        );
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_try_200_rounds_both_or_neither() {
    const ROUNDS: usize = 200;
    for db in testing::all("http_cancel_racing_try").await {
        let env = Arc::new(Env::inventory(db).await);
        inventory::seed(&env.pool, "apple", 1_000).await.unwrap();
        let started = std::time::Instant::now();
        let (mut both, mut neither) = (0, 0);
        for round in 0..ROUNDS {
            let g = gid("race");
            let start = Arc::new(tokio::sync::Barrier::new(2));
            let payload = json!({"sku": "apple", "quantity": 1 + (round % 5)});
            let spawn_op = |op: &'static str| {
                let (env, g, start, payload) =
                    (env.clone(), g.clone(), start.clone(), payload.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    env.call(inventory::RESERVE_PATH, "tcc", &g, "01", op, &payload)
                        .await
                })
            };
            let (t, c) = (spawn_op("try"), spawn_op("cancel"));
            let ((ts, tb), (cs, cb)) = (t.await.unwrap(), c.await.unwrap());
            assert_eq!(cs, 200, "{} round {round}: cancel {cb}", env.name());
            let reservation = inventory::reservation(&env.pool, &g, "01").await.unwrap();
            match (ts, tb["outcome"].as_str(), cb["outcome"].as_str()) {
                (200, Some("executed"), Some("executed")) => {
                    both += 1;
                    assert_eq!(reservation.unwrap().status, "cancelled");
                }
                (409, Some("rejected"), Some("empty_rollback")) => {
                    neither += 1;
                    assert_eq!(reservation, None);
                }
                other => panic!(
                    "{} round {round}: try {tb}, cancel {cb}: {other:?}",
                    env.name()
                ),
            }
            let s = stock(&env, "apple").await;
            assert_eq!(
                (s.available, s.reserved, s.sold),
                (1_000, 0, 0),
                "{} round {round}",
                env.name()
            );
        }
        println!(
            "{}: {ROUNDS} rounds over HTTP in {:?}: both ran {both}, neither ran {neither}",
            env.name(),
            started.elapsed()
        );
        let env = Arc::into_inner(env).expect("tasks are done");
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_confirm_and_cancel_apply_once() {
    for db in testing::all("http_duplicate_confirm_and_cancel").await {
        // Inventory: concurrent duplicate Confirms.
        let env = Arc::new(Env::inventory(db).await);
        inventory::seed(&env.pool, "apple", 10).await.unwrap();
        let g = gid("confirm");
        let payload = json!({"sku": "apple", "quantity": 4});
        let (status, _) = env
            .call(inventory::RESERVE_PATH, "tcc", &g, "01", "try", &payload)
            .await;
        assert_eq!(status, 200);
        let confirms: Vec<_> = (0..5)
            .map(|_| {
                let (env, g, payload) = (env.clone(), g.clone(), payload.clone());
                tokio::spawn(async move {
                    env.call(
                        inventory::RESERVE_PATH,
                        "tcc",
                        &g,
                        "01",
                        "confirm",
                        &payload,
                    )
                    .await
                })
            })
            .collect();
        let mut kinds = Vec::new();
        for c in confirms {
            let (status, body) = c.await.unwrap();
            assert_eq!(status, 200, "{}: {body}", env.name());
            assert_eq!(body["result"]["status"], "confirmed");
            kinds.push(body["outcome"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            kinds.iter().filter(|k| *k == "executed").count(),
            1,
            "{}",
            env.name()
        );
        let s = stock(&env, "apple").await;
        assert_eq!(
            (s.available, s.reserved, s.sold),
            (6, 0, 4),
            "{}",
            env.name()
        );
        // A Cancel after the Confirm is a protocol violation; the step keeps failing (5xx)
        // instead of touching the sold stock.
        let env = Arc::into_inner(env).unwrap();
        let db = env.db.backend;
        env.finish().await;

        // Payment: concurrent duplicate Cancels.
        let Some(db) = TestDatabase::create(db, "http_duplicate_cancel_payment").await else {
            continue;
        };
        let env = Arc::new(Env::payment(db).await);
        payment::seed(&env.pool, "alice", 100).await.unwrap();
        let g = gid("cancel");
        let payload = json!({"account": "alice", "amount": 30});
        let (status, body) = env
            .call(payment::FREEZE_PATH, "tcc", &g, "01", "try", &payload)
            .await;
        assert_eq!(status, 200, "{body}");
        let b = payment::balance(&env.pool, "alice").await.unwrap().unwrap();
        assert_eq!((b.balance, b.frozen), (100, 30));
        let cancels: Vec<_> = (0..5)
            .map(|_| {
                let (env, g, payload) = (env.clone(), g.clone(), payload.clone());
                tokio::spawn(async move {
                    env.call(payment::FREEZE_PATH, "tcc", &g, "01", "cancel", &payload)
                        .await
                })
            })
            .collect();
        let mut kinds = Vec::new();
        for c in cancels {
            let (status, body) = c.await.unwrap();
            assert_eq!(status, 200, "{}: {body}", env.name());
            assert_eq!(body["result"]["status"], "released");
            kinds.push(body["outcome"].as_str().unwrap().to_owned());
        }
        assert_eq!(
            kinds.iter().filter(|k| *k == "executed").count(),
            1,
            "{}",
            env.name()
        );
        let b = payment::balance(&env.pool, "alice").await.unwrap().unwrap();
        assert_eq!((b.balance, b.frozen), (100, 0), "{}", env.name());
        let env = Arc::into_inner(env).unwrap();
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_try_leaves_no_barrier_row_and_its_retry_runs() {
    for db in testing::all("http_refused_try_then_retry").await {
        let env = Env::inventory(db).await;
        inventory::seed(&env.pool, "apple", 1).await.unwrap();
        let g = gid("short");
        let payload = json!({"sku": "apple", "quantity": 3});
        let (status, body) = env
            .call(inventory::RESERVE_PATH, "tcc", &g, "01", "try", &payload)
            .await;
        assert_eq!(status, 409, "{}: {body}", env.name());
        assert_eq!(body["dtm_result"], "FAILURE");
        assert!(
            body["message"]
                .as_str()
                .unwrap()
                .contains("insufficient stock"),
            "{body}"
        );
        assert!(
            barrier_records(&env.pool, &g).await.unwrap().is_empty(),
            "{}",
            env.name()
        );
        assert_eq!(stock(&env, "apple").await.available, 1);

        inventory::seed(&env.pool, "apple", 5).await.unwrap();
        let (status, body) = env
            .call(inventory::RESERVE_PATH, "tcc", &g, "01", "try", &payload)
            .await;
        assert_eq!(
            (status, body["outcome"].as_str()),
            (200, Some("executed")),
            "{}: {body}",
            env.name()
        );
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved), (2, 3));

        // Payment refuses to overdraw, and a Cancel of the refused Try is an empty rollback.
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_never_overdraws_and_confirm_debits() {
    for db in testing::all("http_payment").await {
        let env = Env::payment(db).await;
        payment::seed(&env.pool, "alice", 50).await.unwrap();
        let (g1, g2) = (gid("pay1"), gid("pay2"));
        let (s, b) = env
            .call(
                payment::FREEZE_PATH,
                "tcc",
                &g1,
                "01",
                "try",
                &json!({"account": "alice", "amount": 30}),
            )
            .await;
        assert_eq!(s, 200, "{b}");
        let (s, b) = env
            .call(
                payment::FREEZE_PATH,
                "tcc",
                &g2,
                "01",
                "try",
                &json!({"account": "alice", "amount": 30}),
            )
            .await;
        assert_eq!(s, 409, "{}: only 20 left to freeze: {b}", env.name());
        let (s, b) = env
            .call(
                payment::FREEZE_PATH,
                "tcc",
                &g2,
                "01",
                "cancel",
                &json!({"account": "alice", "amount": 30}),
            )
            .await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("empty_rollback")),
            "{b}"
        );
        let (s, b) = env
            .call(
                "/payment/freeze/confirm",
                "tcc",
                &g1,
                "01",
                "confirm",
                &json!({}),
            )
            .await;
        assert_eq!(
            (s, b["result"]["status"].as_str()),
            (200, Some("debited")),
            "{b}"
        );
        let bal = payment::balance(&env.pool, "alice").await.unwrap().unwrap();
        assert_eq!(
            (bal.balance, bal.frozen, bal.available()),
            (20, 0, 20),
            "{}",
            env.name()
        );
        let (s, b) = env.get("/payment/accounts/alice").await;
        assert_eq!((s, b["balance"].as_i64()), (200, Some(20)));
        let e = payment::ledger_entry(&env.pool, &g1, "01")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((e.amount, e.status.as_str()), (30, "debited"));
        // Unknown account: refused, not retried.
        let (s, _) = env
            .call(
                payment::FREEZE_PATH,
                "tcc",
                &gid("pay3"),
                "01",
                "try",
                &json!({"account": "bob", "amount": 1}),
            )
            .await;
        assert_eq!(s, 409);
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coupon_compensation_revokes_the_same_coupon() {
    for db in testing::all("http_coupon").await {
        let env = Env::coupon(db).await;
        coupon::seed(&env.pool, "WELCOME10", 5).await.unwrap();
        let g = gid("saga");
        let payload = json!({"user": "alice", "coupon": "WELCOME10"});
        let (s, first) = env
            .call(coupon::ISSUE_PATH, "saga", &g, "01", "action", &payload)
            .await;
        assert_eq!(
            (s, first["outcome"].as_str()),
            (200, Some("executed")),
            "{}: {first}",
            env.name()
        );
        let (s, dup) = env
            .call(coupon::ISSUE_PATH, "saga", &g, "01", "action", &payload)
            .await;
        assert_eq!((s, dup["outcome"].as_str()), (200, Some("duplicate")));
        assert_eq!(
            dup["result"], first["result"],
            "the duplicate gets the first coupon id"
        );
        let id = first["result"]["coupon_id"].as_str().unwrap().to_owned();
        assert_eq!(
            coupon::campaign(&env.pool, "WELCOME10")
                .await
                .unwrap()
                .unwrap()
                .remaining,
            4
        );

        for expected in ["executed", "duplicate"] {
            let (s, b) = env
                .call(coupon::ISSUE_PATH, "saga", &g, "01", "compensate", &payload)
                .await;
            assert_eq!((s, b["outcome"].as_str()), (200, Some(expected)), "{b}");
            assert_eq!(b["result"]["coupon_id"], id.as_str());
            assert_eq!(b["result"]["status"], "revoked");
        }
        let mine = coupon::coupons_of(&env.pool, "alice").await.unwrap();
        assert_eq!(mine.len(), 1, "{}: never a second coupon", env.name());
        assert_eq!(
            (mine[0].coupon_id.as_str(), mine[0].status.as_str()),
            (id.as_str(), "revoked")
        );
        assert_eq!(
            coupon::campaign(&env.pool, "WELCOME10")
                .await
                .unwrap()
                .unwrap()
                .remaining,
            5
        );

        // Compensate before action, then the late action.
        let g2 = gid("saga-hang");
        let (s, b) = env
            .call(
                coupon::ISSUE_PATH,
                "saga",
                &g2,
                "02",
                "compensate",
                &payload,
            )
            .await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("empty_rollback")),
            "{b}"
        );
        let (s, b) = env
            .call(
                "/coupon/issue/action",
                "saga",
                &g2,
                "02",
                "action",
                &payload,
            )
            .await;
        assert_eq!((s, b["outcome"].as_str()), (409, Some("rejected")), "{b}");
        assert_eq!(
            coupon::coupon_of_branch(&env.pool, &g2, "02")
                .await
                .unwrap(),
            None
        );
        let (s, list) = env.get("/coupon/users/alice/coupons").await;
        assert_eq!((s, list.as_array().map(Vec::len)), (200, Some(1)));

        // An exhausted campaign refuses the action: the saga would compensate.
        coupon::seed(&env.pool, "RARE", 0).await.unwrap();
        let (s, b) = env
            .call(
                coupon::ISSUE_PATH,
                "saga",
                &gid("rare"),
                "01",
                "action",
                &json!({"user": "bob", "coupon": "RARE"}),
            )
            .await;
        assert_eq!(s, 409, "{b}");
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_saga_sells_and_compensation_returns_the_same_stock_once() {
    for db in testing::all("http_inventory_saga").await {
        let env = Env::inventory(db).await;
        inventory::seed(&env.pool, "pear", 10).await.unwrap();
        let g = gid("saga-inv");
        let payload = json!({"sku": "pear", "quantity": 3});
        let (s, b) = env
            .call(
                inventory::RESERVE_PATH,
                "saga",
                &g,
                "01",
                "action",
                &payload,
            )
            .await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("executed")),
            "{}: {b}",
            env.name()
        );
        let after = stock(&env, "pear").await;
        assert_eq!(
            (after.available, after.reserved, after.sold),
            (7, 0, 3),
            "{}",
            env.name()
        );
        for expected in ["executed", "duplicate", "duplicate"] {
            let (s, b) = env
                .call(
                    inventory::RESERVE_PATH,
                    "saga",
                    &g,
                    "01",
                    "compensate",
                    &payload,
                )
                .await;
            assert_eq!((s, b["outcome"].as_str()), (200, Some(expected)), "{b}");
            assert_eq!(b["result"]["status"], "returned");
        }
        let back = stock(&env, "pear").await;
        assert_eq!(
            (back.available, back.reserved, back.sold),
            (10, 0, 0),
            "{}",
            env.name()
        );

        // Compensate first (empty rollback), then the late action is rejected.
        let g2 = gid("saga-inv-late");
        let (s, b) = env
            .call(
                inventory::RESERVE_PATH,
                "saga",
                &g2,
                "01",
                "compensate",
                &payload,
            )
            .await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("empty_rollback")),
            "{b}"
        );
        let (s, _) = env
            .call(
                inventory::RESERVE_PATH,
                "saga",
                &g2,
                "01",
                "action",
                &payload,
            )
            .await;
        assert_eq!(s, 409, "{}: a late action is rejected", env.name());
        let still = stock(&env, "pear").await;
        assert_eq!((still.available, still.sold), (10, 0));
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_saga_debits_and_compensation_refunds_once() {
    for db in testing::all("http_payment_saga").await {
        let env = Env::payment(db).await;
        payment::seed(&env.pool, "zoe", 100).await.unwrap();
        let g = gid("saga-pay");
        let payload = json!({"account": "zoe", "amount": 40});
        let (s, b) = env
            .call(payment::FREEZE_PATH, "saga", &g, "02", "action", &payload)
            .await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("executed")),
            "{}: {b}",
            env.name()
        );
        let after = payment::balance(&env.pool, "zoe").await.unwrap().unwrap();
        assert_eq!((after.balance, after.frozen), (60, 0), "{}", env.name());
        for expected in ["executed", "duplicate"] {
            let (s, b) = env
                .call(
                    payment::FREEZE_PATH,
                    "saga",
                    &g,
                    "02",
                    "compensate",
                    &payload,
                )
                .await;
            assert_eq!((s, b["outcome"].as_str()), (200, Some(expected)), "{b}");
            assert_eq!(b["result"]["status"], "refunded");
        }
        let back = payment::balance(&env.pool, "zoe").await.unwrap().unwrap();
        assert_eq!((back.balance, back.frozen), (100, 0), "{}", env.name());
        // More than the balance: refused, nothing moves.
        let (s, _) = env
            .call(
                payment::FREEZE_PATH,
                "saga",
                &gid("saga-pay-big"),
                "02",
                "action",
                &json!({"account": "zoe", "amount": 500}),
            )
            .await;
        assert_eq!(s, 409);
        env.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_callbacks_are_answered_clearly() {
    // Parameter validation does not depend on the backend.
    let db = TestDatabase::create(testing::Backend::Sqlite, "http_bad_callbacks")
        .await
        .unwrap();
    let env = Env::inventory(db).await;
    inventory::seed(&env.pool, "apple", 1).await.unwrap();
    let url = env.service.url(inventory::RESERVE_PATH);

    let r = env
        .client
        .post(format!("{url}?trans_type=tcc&branch_id=01&op=try"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "invalid_callback");
    assert!(
        body["message"].as_str().unwrap().contains("`gid`"),
        "{body}"
    );

    let (s, b) = env
        .call(
            inventory::RESERVE_PATH,
            "tcc",
            "g1",
            "01",
            "launch",
            &json!({}),
        )
        .await;
    assert_eq!(s, 400, "{b}");
    assert!(b["message"].as_str().unwrap().contains("`op`"));
    let (s, b) = env
        .call(
            inventory::RESERVE_PATH,
            "saga",
            "g1",
            "01",
            "try",
            &json!({}),
        )
        .await;
    assert_eq!(s, 400, "a saga has no Try: {b}");
    let (s, _) = env
        .call(
            "/inventory/reserve/confirm",
            "tcc",
            "g1",
            "01",
            "cancel",
            &json!({}),
        )
        .await;
    assert_eq!(s, 400, "URL and op disagree");

    // A payload that can never be processed: refused (409), so the coordinator rolls back.
    let (s, b) = env
        .call(
            inventory::RESERVE_PATH,
            "tcc",
            "g1",
            "01",
            "try",
            &json!({"sku": "apple"}),
        )
        .await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["dtm_result"], "FAILURE");
    let (s, _) = env
        .call(
            inventory::RESERVE_PATH,
            "tcc",
            "g1",
            "01",
            "try",
            &json!({"sku": "pear", "quantity": 1}),
        )
        .await;
    assert_eq!(s, 409, "unknown sku");
    // Confirm of a branch whose Try has not run: refused by the barrier as retryable (503),
    // neither a silent success nor a 409 that would stop the coordinator's retries.
    let (s, b) = env
        .call(
            inventory::RESERVE_PATH,
            "tcc",
            "g2",
            "01",
            "confirm",
            &json!({}),
        )
        .await;
    assert_eq!(s, 503, "{b}");
    assert_eq!(b["error"], "confirm_without_try", "{b}");
    assert!(barrier_records(&env.pool, "g2").await.unwrap().is_empty());

    let (s, b) = env.get("/inventory/stock/apple").await;
    assert_eq!((s, b["available"].as_i64()), (200, Some(1)));
    let (s, _) = env.get("/inventory/stock/pear").await;
    assert_eq!(s, 404);
    env.finish().await;
}

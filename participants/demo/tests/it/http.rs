//! The example participants raced over real HTTP, on SQLite, PostgreSQL and MariaDB: each
//! test starts the axum services on 127.0.0.1:0 and calls them the way the coordinator does
//! (`POST <url>?gid=..&trans_type=..&branch_id=..&op=..`, body = the registered payload).

//! This file: the TCC steps (Try, Confirm, Cancel); `sagas.rs`: saga steps and bad callbacks.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;

use idem_demo::{inventory, payment};
use idem_participant::barrier_records;
use idem_participant::testing::{self, TestDatabase};
use serde_json::json;
use support::*;

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
        let db = TestDatabase::create(db, "http_duplicate_cancel_payment").await;
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

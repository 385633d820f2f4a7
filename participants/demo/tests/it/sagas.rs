//! The example participants' saga steps raced over real HTTP, and bad callbacks, on
//! SQLite, PostgreSQL and MariaDB (see `http.rs` for how the tests call them).

use crate::support;

use idem_demo::{coupon, inventory, payment};
use idem_participant::barrier_records;
use idem_participant::testing::{self, TestDatabase};
use serde_json::{Value, json};
use support::*;

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
    let db = TestDatabase::create(testing::Backend::Sqlite, "http_bad_callbacks").await;
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

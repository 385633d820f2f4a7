//! The inventory's Confirm over HTTP when its Try is not there yet, on SQLite, PostgreSQL
//! and MariaDB: the stock never moves until the Try has reserved it, and a Try that comes
//! late still ends sold, not reserved for ever.

use idem_demo::inventory;
use idem_participant::barrier_records;
use idem_participant::testing;
use serde_json::{Value, json};

async fn call(client: &reqwest::Client, url: &str, gid: &str, op: &str) -> (u16, Value) {
    let r = client
        .post(format!(
            "{url}?gid={gid}&trans_type=tcc&branch_id=01&op={op}"
        ))
        .body(json!({"sku": "apple", "quantity": 3}).to_string())
        .send()
        .await
        .expect("participant answers");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_before_its_try_is_retried_not_applied() {
    for db in testing::all("demo_confirm_before_try").await {
        let pool = inventory::open(&db.url).await.expect("open inventory");
        inventory::seed(&pool, "apple", 10).await.unwrap();
        let service = inventory::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let url = service.url(inventory::RESERVE_PATH);
        let stock = || async {
            let s = inventory::stock(&pool, "apple").await.unwrap().unwrap();
            (s.available, s.reserved, s.sold)
        };
        let backend = db.backend;

        // The Confirm overtakes its Try: refused as retryable, nothing written.
        let g = format!("early-{}", uuid::Uuid::new_v4().simple());
        let (s, b) = call(&client, &url, &g, "confirm").await;
        assert_eq!(
            (s, b["error"].as_str()),
            (503, Some("confirm_without_try")),
            "{backend}: {b}"
        );
        assert!(
            barrier_records(&pool, &g).await.unwrap().is_empty(),
            "{backend}"
        );
        assert_eq!(stock().await, (10, 0, 0), "{backend}");
        // The late Try reserves, and the coordinator's retry of the Confirm sells it.
        let (s, b) = call(&client, &url, &g, "try").await;
        assert_eq!(s, 200, "{backend}: {b}");
        assert_eq!(stock().await, (7, 3, 0), "{backend}");
        let (s, b) = call(&client, &url, &g, "confirm").await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("executed")),
            "{backend}: {b}"
        );
        assert_eq!(b["result"]["status"], "confirmed", "{backend}");
        assert_eq!(stock().await, (7, 0, 3), "{backend}");

        // After a Cancel's empty rollback, the Confirm is refused on every retry and the
        // late Try stays rejected: the stock is not touched.
        let g = format!("cancelled-{}", uuid::Uuid::new_v4().simple());
        let (s, b) = call(&client, &url, &g, "cancel").await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (200, Some("empty_rollback")),
            "{backend}: {b}"
        );
        for _ in 0..2 {
            let (s, b) = call(&client, &url, &g, "confirm").await;
            assert_eq!(s, 503, "{backend}: {b}");
        }
        let (s, b) = call(&client, &url, &g, "try").await;
        assert_eq!(
            (s, b["outcome"].as_str()),
            (409, Some("rejected")),
            "{backend}: {b}"
        );
        let (s, _) = call(&client, &url, &g, "confirm").await;
        assert_eq!(s, 503, "{backend}");
        assert_eq!(stock().await, (7, 0, 3), "{backend}");
        assert!(
            inventory::reservation(&pool, &g, "01")
                .await
                .unwrap()
                .is_none()
        );

        service.stop().await.unwrap();
        pool.close().await;
        db.drop_database().await;
    }
}

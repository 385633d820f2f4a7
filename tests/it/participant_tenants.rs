//! Tenants end to end at a shared participant (issue 28, point 4), on SQLite, PostgreSQL
//! and MariaDB: a coordinator with tokens, two tenants each running TCC `order-1` against
//! one inventory service (the demo's, on the SDK's barrier). Each tenant's Try reserves,
//! beta's abort releases only beta's reservation, acme's commit is unaffected, and each
//! tenant's repeat is answered with its own stored result.

use crate::common;

use std::sync::Arc;

use common::auth::{Setup, post, wait_status};
use idem::auth::Role;
use idem_demo::inventory;
use idem_participant::{barrier_records, testing};
use serde_json::{Value, json};

const GID: &str = "order-1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_run_order_1_at_one_shared_inventory() {
    for db in testing::all("participant_tenants_order_1").await {
        let name = db.backend.name().to_owned();
        // The inventory listens on loopback: allow it explicitly, whatever the default
        // policy of a coordinator with tokens.
        let policy =
            idem::outbound::OutboundPolicy::parse("[default]\ncidrs = [\"127.0.0.0/8\"]\n")
                .unwrap();
        let s = Setup::with(db, |c| c.outbound_policy = Arc::new(policy)).await;
        let stock = inventory::open(&s.db.url).await.unwrap();
        inventory::seed(&stock, "apple", 10).await.unwrap();
        let service = inventory::start(stock.clone(), "127.0.0.1:0")
            .await
            .unwrap();
        let url = service.url(inventory::RESERVE_PATH);
        let acme = s.token("acme", Role::Client).await;
        let beta = s.token("beta", Role::Client).await;
        let level = || async {
            let s = inventory::stock(&stock, "apple").await.unwrap().unwrap();
            (s.available, s.reserved, s.sold)
        };

        // Each tenant creates its order-1 and registers the branch; idem calls its Try.
        for (token, quantity) in [(&acme, 2), (&beta, 3)] {
            let tcc = json!({"gid": GID, "kind": "tcc"});
            let (status, body) = post(&s, "/api/v1/transactions", Some(token), tcc).await;
            assert_eq!(status, 201, "{name}: {body}");
            let branch = json!({"branch_id": "01", "try": url, "confirm": url, "cancel": url,
                                "payload": {"sku": "apple", "quantity": quantity}});
            let path = format!("/api/v1/transactions/{GID}/branches");
            let (status, body) = post(&s, &path, Some(token), branch).await;
            assert_eq!(status, 200, "{name}: quantity {quantity}: {body}");
        }
        assert_eq!(level().await, (5, 5, 0), "{name}: both Tries reserved");

        let wait = json!({"wait_result": true});
        let abort = format!("/api/v1/transactions/{GID}/abort");
        let (status, body) = post(&s, &abort, Some(&beta), wait.clone()).await;
        assert!(status < 300, "{name}: {status} {body}");
        wait_status(&s, &beta, GID, "failed").await;
        assert_eq!(
            level().await,
            (8, 2, 0),
            "{name}: beta's 3 released, acme's 2 kept"
        );

        let submit = format!("/api/v1/transactions/{GID}/submit");
        let (status, body) = post(&s, &submit, Some(&acme), wait).await;
        assert!(status < 300, "{name}: {status} {body}");
        wait_status(&s, &acme, GID, "succeeded").await;
        assert_eq!(level().await, (8, 0, 2), "{name}: acme's 2 sold");

        let row = |tenant| inventory::reservation_in(&stock, tenant, GID, "01");
        let acme_row = row("acme").await.unwrap().unwrap();
        let beta_row = row("beta").await.unwrap().unwrap();
        assert_eq!(
            (acme_row.quantity, acme_row.status.as_str()),
            (2, "confirmed")
        );
        assert_eq!(
            (beta_row.quantity, beta_row.status.as_str()),
            (3, "cancelled")
        );
        let mut keys: Vec<_> = barrier_records(&stock, GID)
            .await
            .unwrap()
            .into_iter()
            .map(|r| format!("{}:{}:{}", r.tenant, r.op, r.outcome))
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "acme:confirm:executed",
                "acme:try:executed",
                "beta:cancel:executed",
                "beta:try:executed"
            ],
            "{name}"
        );

        // A repeat of each tenant's Try, as the coordinator sends it, gets that tenant's
        // stored reservation.
        let http = reqwest::Client::new();
        for (tenant, quantity) in [("acme", 2), ("beta", 3)] {
            let answer: Value = http
                .post(format!(
                    "{url}?gid={GID}&trans_type=tcc&branch_id=01&op=try"
                ))
                .header("Idem-Tenant", tenant)
                .body(json!({"sku": "apple", "quantity": 9}).to_string())
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(answer["outcome"], "duplicate", "{name}: {answer}");
            assert_eq!(answer["result"]["quantity"], quantity, "{name}: {tenant}");
            assert_eq!(answer["result"]["status"], "reserved", "{name}: {tenant}");
        }
        assert_eq!(level().await, (8, 0, 2), "{name}");

        service.stop().await.unwrap();
        stock.close().await;
        s.finish().await;
    }
}

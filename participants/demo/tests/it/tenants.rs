//! Two tenants of one coordinator, both running gid `order-1`, against the shared example
//! participants over real HTTP (issue 28, point 4), on SQLite, PostgreSQL and MariaDB: the
//! calls carry `Idem-Tenant` as the coordinator sends it, and each tenant's reservation,
//! frozen money and coupon stay its own.

use crate::support;

use idem_demo::{coupon, inventory, payment};
use idem_participant::testing;
use serde_json::{Value, json};
use support::*;

const GID: &str = "order-1";

fn outcome(answer: &(u16, Value)) -> (u16, &str) {
    (answer.0, answer.1["outcome"].as_str().unwrap_or(""))
}

/// The issue's collision: acme's Try then beta's Try both reserve; beta's Cancel releases
/// only beta's reservation; acme's Confirm is unaffected; each tenant's repeat is answered
/// with its own stored result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_reserve_the_same_gid_at_one_inventory() {
    for db in testing::all("demo_tenants_inventory").await {
        let env = Env::inventory(db).await;
        let name = env.name();
        inventory::seed(&env.pool, "apple", 10).await.unwrap();
        let call = |tenant: &'static str, op: &'static str, quantity: i64| {
            let body = json!({"sku": "apple", "quantity": quantity});
            let env = &env;
            async move {
                env.call_as(tenant, inventory::RESERVE_PATH, "tcc", GID, "01", op, &body)
                    .await
            }
        };
        let acme = call("acme", "try", 2).await;
        assert_eq!(outcome(&acme), (200, "executed"), "{name}: {acme:?}");
        let beta = call("beta", "try", 3).await;
        assert_eq!(outcome(&beta), (200, "executed"), "{name}: {beta:?}");
        assert_eq!(
            beta.1["result"]["quantity"], 3,
            "{name}: beta's own reservation"
        );
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved, s.sold), (5, 5, 0), "{name}");

        let cancel = call("beta", "cancel", 3).await;
        assert_eq!(outcome(&cancel), (200, "executed"), "{name}: {cancel:?}");
        assert_eq!(cancel.1["result"]["quantity"], 3, "{name}");
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved, s.sold), (8, 2, 0), "{name}");

        let confirm = call("acme", "confirm", 2).await;
        assert_eq!(outcome(&confirm), (200, "executed"), "{name}: {confirm:?}");
        assert_eq!(confirm.1["result"]["status"], "confirmed", "{name}");
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved, s.sold), (8, 0, 2), "{name}");

        for (tenant, first) in [("acme", &acme), ("beta", &beta)] {
            let again = call(tenant, "try", 9).await;
            assert_eq!(outcome(&again), (200, "duplicate"), "{name}: {again:?}");
            assert_eq!(again.1["result"], first.1["result"], "{name}: {tenant}");
        }
        // A repeat of beta's Cancel and of acme's Confirm changes nothing either.
        assert_eq!(
            outcome(&call("beta", "cancel", 3).await),
            (200, "duplicate")
        );
        assert_eq!(
            outcome(&call("acme", "confirm", 2).await),
            (200, "duplicate")
        );
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved, s.sold), (8, 0, 2), "{name}");

        let mine = |tenant| inventory::reservation_in(&env.pool, tenant, GID, "01");
        let acme_row = mine("acme").await.unwrap().unwrap();
        let beta_row = mine("beta").await.unwrap().unwrap();
        assert_eq!(
            (acme_row.quantity, acme_row.status.as_str()),
            (2, "confirmed")
        );
        assert_eq!(
            (beta_row.quantity, beta_row.status.as_str()),
            (3, "cancelled")
        );
        assert_eq!(
            inventory::reservation(&env.pool, GID, "01").await.unwrap(),
            None
        );
        let (status, row) = env
            .get(&format!("/inventory/reservations/{GID}/01?tenant=beta"))
            .await;
        assert_eq!(
            (status, row["status"].as_str()),
            (200, Some("cancelled")),
            "{name}"
        );
        let (status, _) = env.get(&format!("/inventory/reservations/{GID}/01")).await;
        assert_eq!(status, 404, "{name}: the default tenant reserved nothing");

        // The default tenant's own order-1 is a third one, and a malformed tenant is refused.
        let plain = env
            .call(
                inventory::RESERVE_PATH,
                "tcc",
                GID,
                "01",
                "try",
                &json!({"sku": "apple", "quantity": 1}),
            )
            .await;
        assert_eq!(outcome(&plain), (200, "executed"), "{name}: {plain:?}");
        let bad = call("Not-A-Tenant", "try", 1).await;
        assert_eq!(bad.0, 400, "{name}: {bad:?}");
        assert_eq!(bad.1["error"], "invalid_callback", "{name}");
        let s = stock(&env, "apple").await;
        assert_eq!((s.available, s.reserved, s.sold), (7, 1, 2), "{name}");
        env.finish().await;
    }
}

/// The payment service: two tenants freeze for the same gid, one cancels, the other's
/// frozen money stays and is debited by its Confirm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_freeze_the_same_gid_at_one_payment_service() {
    for db in testing::all("demo_tenants_payment").await {
        let env = Env::payment(db).await;
        let name = env.name();
        payment::seed(&env.pool, "alice", 100).await.unwrap();
        let call = |tenant: &'static str, op: &'static str, amount: i64| {
            let body = json!({"account": "alice", "amount": amount});
            let env = &env;
            async move {
                env.call_as(tenant, payment::FREEZE_PATH, "tcc", GID, "01", op, &body)
                    .await
            }
        };
        assert_eq!(outcome(&call("acme", "try", 30).await), (200, "executed"));
        assert_eq!(outcome(&call("beta", "try", 20).await), (200, "executed"));
        let frozen = |env: &Env| {
            let pool = env.pool.clone();
            async move {
                let b = payment::balance(&pool, "alice").await.unwrap().unwrap();
                (b.balance, b.frozen)
            }
        };
        assert_eq!(frozen(&env).await, (100, 50), "{name}");
        assert_eq!(
            outcome(&call("beta", "cancel", 20).await),
            (200, "executed")
        );
        assert_eq!(frozen(&env).await, (100, 30), "{name}: beta's 20 only");
        assert_eq!(
            outcome(&call("acme", "confirm", 30).await),
            (200, "executed")
        );
        assert_eq!(frozen(&env).await, (70, 0), "{name}");
        let acme = payment::ledger_entry_in(&env.pool, "acme", GID, "01")
            .await
            .unwrap()
            .unwrap();
        let beta = payment::ledger_entry_in(&env.pool, "beta", GID, "01")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (acme.amount, acme.status.as_str()),
            (30, "debited"),
            "{name}"
        );
        assert_eq!(
            (beta.amount, beta.status.as_str()),
            (20, "released"),
            "{name}"
        );
        env.finish().await;
    }
}

/// The coupon saga: two tenants' action of one gid issue two coupons; beta's compensation
/// revokes beta's coupon, not acme's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_issue_coupons_for_the_same_gid() {
    for db in testing::all("demo_tenants_coupon").await {
        let env = Env::coupon(db).await;
        let name = env.name();
        coupon::seed(&env.pool, "WELCOME10", 5).await.unwrap();
        let body = json!({"user": "alice", "coupon": "WELCOME10"});
        let call = |tenant: &'static str, op: &'static str| {
            env.call_as(tenant, coupon::ISSUE_PATH, "saga", GID, "01", op, &body)
        };
        let acme = call("acme", "action").await;
        let beta = call("beta", "action").await;
        assert_eq!(outcome(&acme), (200, "executed"), "{name}: {acme:?}");
        assert_eq!(outcome(&beta), (200, "executed"), "{name}: {beta:?}");
        assert_ne!(acme.1["result"]["coupon_id"], beta.1["result"]["coupon_id"]);
        let revoked = call("beta", "compensate").await;
        assert_eq!(outcome(&revoked), (200, "executed"), "{name}");
        assert_eq!(
            revoked.1["result"]["coupon_id"],
            beta.1["result"]["coupon_id"]
        );
        let of = |tenant| coupon::coupon_of_branch_in(&env.pool, tenant, GID, "01");
        assert_eq!(
            of("acme").await.unwrap().unwrap().status,
            "issued",
            "{name}"
        );
        assert_eq!(
            of("beta").await.unwrap().unwrap().status,
            "revoked",
            "{name}"
        );
        let left = coupon::campaign(&env.pool, "WELCOME10")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(left.remaining, 4, "{name}: acme's coupon is still out");
        env.finish().await;
    }
}

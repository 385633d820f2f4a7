//! Tenants, on SQLite, PostgreSQL and MariaDB: two tenants use one gid without meeting
//! (answers, lists, the participant's calls), the cap on a tenant's unfinished
//! transactions, and each tenant's outbound policy entry.

use crate::common;

use common::auth::{Setup, code, get, post, wait_status};
use idem::auth::Role;
use idem_participant::testing;
use serde_json::json;

#[tokio::test]
async fn two_tenants_share_a_gid_without_meeting() {
    for db in testing::all("auth_two_tenants").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let acme = s.token("acme", Role::Client).await;
        let globex = s.token("globex", Role::Client).await;

        // The same gid with different bodies: in one tenant this would be a 409.
        let (a, body_a) = post(
            &s,
            "/api/v1/transactions",
            Some(&acme),
            s.saga("order-1", "a"),
        )
        .await;
        let (b, body_b) = post(
            &s,
            "/api/v1/transactions",
            Some(&globex),
            s.saga("order-1", "b"),
        )
        .await;
        assert_eq!((a, b), (201, 201), "{name}: {body_a} {body_b}");
        assert_eq!(body_a["gid"], "order-1");
        assert_eq!(
            (body_a["tenant"].as_str(), body_b["tenant"].as_str()),
            (Some("acme"), Some("globex"))
        );

        let seen_a = wait_status(&s, &acme, "order-1", "succeeded").await;
        let seen_b = wait_status(&s, &globex, "order-1", "succeeded").await;
        assert!(
            seen_a["branches"][0]["payload"]
                .as_str()
                .unwrap()
                .contains("\"a\""),
            "{name}"
        );
        assert!(
            seen_b["branches"][0]["payload"]
                .as_str()
                .unwrap()
                .contains("\"b\""),
            "{name}"
        );

        // Each list holds its own tenant's only.
        for (token, tenant) in [(&acme, "acme"), (&globex, "globex")] {
            let (status, page) = get(&s, "/api/v1/transactions", Some(token)).await;
            assert_eq!(status, 200, "{name}");
            let items = page["transactions"].as_array().unwrap();
            assert_eq!(items.len(), 1, "{name}: {page}");
            assert_eq!(items[0]["tenant"], tenant, "{name}");
        }

        // The participant got the client's gid both times, and which tenant called.
        let mut tenants: Vec<_> = s
            .recorder
            .calls()
            .into_iter()
            .map(|c| {
                assert_eq!(c.gid, "order-1", "{name}");
                c.tenant.unwrap_or_default()
            })
            .collect();
        tenants.sort();
        assert_eq!(tenants, ["acme", "globex"], "{name}");

        // A third tenant sees neither and cannot act on them.
        let initech = s.token("initech", Role::Operator).await;
        let (status, _) = get(&s, "/api/v1/transactions/order-1", Some(&initech)).await;
        assert_eq!(status, 404, "{name}");
        let (status, _) = post(
            &s,
            "/api/v1/transactions/order-1/force-stop",
            Some(&initech),
            json!({}),
        )
        .await;
        assert_eq!(status, 404, "{name}");
        s.finish().await;
    }
}

#[tokio::test]
async fn the_per_tenant_cap_refuses_new_work_but_not_repeats() {
    for db in testing::all("auth_active_cap").await {
        let name = db.name().to_owned();
        let s = Setup::with(db, |c| c.max_active_per_tenant = 2).await;
        let acme = s.token("acme", Role::Client).await;
        let globex = s.token("globex", Role::Client).await;
        for gid in ["p-1", "p-2"] {
            let tcc = json!({"gid": gid, "kind": "tcc"});
            assert_eq!(
                post(&s, "/api/v1/transactions", Some(&acme), tcc).await.0,
                201,
                "{name}"
            );
        }
        let (status, answer) = post(
            &s,
            "/api/v1/transactions",
            Some(&acme),
            json!({"gid": "p-3", "kind": "tcc"}),
        )
        .await;
        assert_eq!(
            (status, code(&answer)),
            (429, "tenant_active_limit"),
            "{name}: {answer}"
        );
        assert_eq!(
            get(&s, "/api/v1/transactions/p-3", Some(&acme)).await.0,
            404,
            "{name}"
        );
        // A repeat of an existing create still gets what is stored.
        let (status, _) = post(
            &s,
            "/api/v1/transactions",
            Some(&acme),
            json!({"gid": "p-1", "kind": "tcc"}),
        )
        .await;
        assert_eq!(status, 200, "{name}");
        // Another tenant has its own count.
        let (status, _) = post(
            &s,
            "/api/v1/transactions",
            Some(&globex),
            json!({"gid": "p-3", "kind": "tcc"}),
        )
        .await;
        assert_eq!(status, 201, "{name}");
        s.finish().await;
    }
}

/// The outbound policy applies the caller's tenant's entry: the URL one tenant may register
/// is refused for another whose entry does not list it (and the refused create stores
/// nothing).
#[tokio::test]
async fn each_tenant_registers_under_its_own_outbound_entry() {
    for db in testing::all("auth_outbound_tenant").await {
        let name = db.name().to_owned();
        let policy = idem::outbound::OutboundPolicy::parse(
            "[default]\ncidrs = [\"127.0.0.0/8\"]\n[tenants.acme]\nhosts = [\"payments.acme.internal\"]\n",
        )
        .unwrap();
        let s = Setup::with(db, |c| c.outbound_policy = std::sync::Arc::new(policy)).await;
        let acme = s.token("acme", Role::Client).await;
        let globex = s.token("globex", Role::Client).await;
        let (status, answer) =
            post(&s, "/api/v1/transactions", Some(&acme), s.saga("o-1", "a")).await;
        assert_eq!(
            (status, code(&answer)),
            (400, "url_not_allowed"),
            "{name}: {answer}"
        );
        assert_eq!(
            get(&s, "/api/v1/transactions/o-1", Some(&acme)).await.0,
            404,
            "{name}"
        );
        let (status, answer) = post(
            &s,
            "/api/v1/transactions",
            Some(&globex),
            s.saga("o-1", "g"),
        )
        .await;
        assert_eq!(status, 201, "{name}: {answer}");
        wait_status(&s, &globex, "o-1", "succeeded").await;
        s.finish().await;
    }
}

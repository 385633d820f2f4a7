//! Tokens and roles through both doors, on SQLite, PostgreSQL and MariaDB: a coordinator
//! in this process with `--auth tokens`, tokens issued on its database, a recording
//! participant over real HTTP. A request without a valid token is refused before anything
//! is stored; a client may not retry or force-stop; a revoked token stops working; DTM's
//! door maps to a tenant by token or by the configured default; `/metrics` and readiness
//! can be protected; known tokens are verified without the database; an admin manages its
//! tenant's tokens through the API.

use crate::common;

use std::time::Duration;

use common::auth::{Setup, WAIT, call, code, get, post, wait_status};
use idem::auth::Role;
use idem::auth::tokens::issue;
use idem_participant::testing::{self, TestDatabase};
use serde_json::json;

#[tokio::test]
async fn requests_without_a_valid_token_are_refused_and_store_nothing() {
    for db in testing::all("auth_refused").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let good = s.token("acme", Role::Admin).await;
        let (_, wrong_secret) = good.rsplit_once('_').unwrap();
        let forged = good.replace(wrong_secret, &"0".repeat(wrong_secret.len()));
        let url = format!("{}/api/v1/transactions", s.server.url());
        let cases = [
            (None, "token_missing"),
            (Some("Basic dXNlcjpwYXNz".to_owned()), "token_malformed"),
            (Some("Bearer not-a-token".to_owned()), "token_malformed"),
            (Some(format!("Bearer {forged}")), "token_invalid"),
            (
                Some(format!("Bearer idem_0123456789ab_{}", "f".repeat(64))),
                "token_invalid",
            ),
        ];
        for (i, (auth, want)) in cases.iter().enumerate() {
            let body = s.saga(&format!("refused-{i}"), "x");
            let (status, answer) = call(
                reqwest::Method::POST,
                url.clone(),
                auth.as_deref(),
                Some(body),
            )
            .await;
            assert_eq!(
                (status, code(&answer)),
                (401, *want),
                "{name}: case {i}: {answer}"
            );
        }
        for i in 0..cases.len() {
            let (status, _) = get(
                &s,
                &format!("/api/v1/transactions/refused-{i}"),
                Some(&good),
            )
            .await;
            assert_eq!(status, 404, "{name}: a refused create stored refused-{i}");
        }
        // DTM's door without a default tenant needs a token too.
        let dtm = json!({"gid": "dtm-refused", "trans_type": "saga", "steps": [], "payloads": []});
        let (status, answer) = post(&s, "/api/dtmsvr/submit", None, dtm).await;
        assert_eq!(
            (status, code(&answer)),
            (401, "token_missing"),
            "{name}: {answer}"
        );
        assert!(s.recorder.calls().is_empty(), "{name}");
        // The liveness probe and the API's description stay open.
        assert_eq!(get(&s, "/health/live", None).await.0, 200, "{name}");
        assert_eq!(get(&s, "/api/v1/openapi.json", None).await.0, 200, "{name}");
        s.finish().await;
    }
}

#[tokio::test]
async fn only_operators_retry_and_force_stop() {
    for db in testing::all("auth_roles").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let client = s.token("acme", Role::Client).await;
        let operator = s.token("acme", Role::Operator).await;
        // A Try-less TCC stays prepared: something to act on.
        let tcc = json!({"gid": "t-1", "kind": "tcc"});
        assert_eq!(
            post(&s, "/api/v1/transactions", Some(&client), tcc).await.0,
            201,
            "{name}"
        );
        for op in ["retry", "force-stop"] {
            let path = format!("/api/v1/transactions/t-1/{op}");
            let (status, answer) = post(&s, &path, Some(&client), json!({})).await;
            assert_eq!(
                (status, code(&answer)),
                (403, "forbidden"),
                "{name}: {op}: {answer}"
            );
        }
        let (_, still) = get(&s, "/api/v1/transactions/t-1", Some(&client)).await;
        assert_eq!(
            still["status"], "prepared",
            "{name}: a refused force-stop changed it"
        );
        let (status, stopped) = post(
            &s,
            "/api/v1/transactions/t-1/force-stop",
            Some(&operator),
            json!({}),
        )
        .await;
        assert_eq!(
            (status, stopped["status"].as_str()),
            (200, Some("failed")),
            "{name}: {stopped}"
        );
        // DTM's forceStop is an operator's too.
        let (status, answer) = post(
            &s,
            "/api/dtmsvr/forceStop",
            Some(&client),
            json!({"gid": "t-1"}),
        )
        .await;
        assert_eq!(
            (status, code(&answer)),
            (403, "forbidden"),
            "{name}: {answer}"
        );
        s.finish().await;
    }
}

/// A wrong secret for a token id that exists is refused no sooner than a made-up id: both
/// wait for the refresh that an unknown id causes (at most one per `MISS_REFRESH_GAP`), so
/// the time of a refusal does not tell which ids exist.
#[tokio::test]
async fn a_wrong_secret_is_refused_like_an_unknown_id() {
    for db in testing::all("auth_refusal_time").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let good = s.token("acme", Role::Client).await;
        let (_, secret) = good.rsplit_once('_').unwrap();
        let wrong = good.replace(secret, &"0".repeat(secret.len()));
        let made_up = format!("idem_0123456789ab_{}", "f".repeat(64));
        // A made-up id: the refresh after a miss runs now, and the next may run only
        // a gap later.
        let (status, _) = get(&s, "/api/v1/transactions", Some(&made_up)).await;
        assert_eq!(status, 401, "{name}");
        let started = std::time::Instant::now();
        let (status, answer) = get(&s, "/api/v1/transactions", Some(&wrong)).await;
        assert_eq!((status, code(&answer)), (401, "token_invalid"), "{name}");
        assert!(
            started.elapsed() >= idem::auth::cache::MISS_REFRESH_GAP / 2,
            "{name}: the wrong secret was refused at once ({:?}), a made-up id would wait",
            started.elapsed()
        );
        s.finish().await;
    }
}

#[tokio::test]
async fn a_revoked_token_stops_working() {
    for db in testing::all("auth_revoked").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        // Issued after the coordinator started: found by the refresh an unknown id causes.
        let token = s.token("acme", Role::Client).await;
        assert_eq!(
            get(&s, "/api/v1/transactions", Some(&token)).await.0,
            200,
            "{name}"
        );
        let id = token.split('_').nth(1).unwrap();
        let now = s.store.db_now().await.unwrap();
        assert!(s.store.revoke_token(id, now).await.unwrap(), "{name}");
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let (status, answer) = get(&s, "/api/v1/transactions", Some(&token)).await;
            if status == 401 {
                assert_eq!(code(&answer), "token_revoked", "{name}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}: still accepted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        s.finish().await;
    }
}

#[tokio::test]
async fn dtm_maps_to_the_default_tenant_or_the_tokens() {
    for db in testing::all("auth_dtm_tenant").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |a| a.dtm_tenant = Some("legacy".into())).await;
        let legacy = s.token("legacy", Role::Client).await;
        let acme = s.token("acme", Role::Client).await;
        let saga = |gid: &str| {
            json!({"gid": gid, "trans_type": "saga", "wait_result": true,
                   "steps": [{"action": s.recorder.url("/d/action"), "compensate": s.recorder.url("/d/compensate")}],
                   "payloads": ["{}"]})
        };
        // No token: the configured tenant.
        let (status, answer) = post(&s, "/api/dtmsvr/submit", None, saga("dtm-1")).await;
        assert_eq!(
            (status, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{name}: {answer}"
        );
        let (status, seen) = get(&s, "/api/v1/transactions/dtm-1", Some(&legacy)).await;
        assert_eq!(
            (status, seen["tenant"].as_str()),
            (200, Some("legacy")),
            "{name}: {seen}"
        );
        // A token: its own tenant, on DTM's door as on the native one.
        let (status, _) = post(&s, "/api/dtmsvr/submit", Some(&acme), saga("dtm-2")).await;
        assert_eq!(status, 200, "{name}");
        let (status, queried) = get(&s, "/api/dtmsvr/query?gid=dtm-2", Some(&acme)).await;
        assert_eq!(
            (status, queried["transaction"]["gid"].as_str()),
            (200, Some("dtm-2")),
            "{name}"
        );
        let (_, other) = get(&s, "/api/dtmsvr/query?gid=dtm-2", None).await;
        assert!(
            other["transaction"].is_null(),
            "{name}: the default tenant saw acme's: {other}"
        );
        // The native door gives no default: a token is needed there.
        assert_eq!(get(&s, "/api/v1/transactions", None).await.0, 401, "{name}");
        s.finish().await;
    }
}

#[tokio::test]
async fn metrics_and_readiness_can_be_protected() {
    let db = TestDatabase::create(idem_participant::Backend::Sqlite, "auth_protected").await;
    let s = Setup::new(db, |a| {
        a.protect_metrics = true;
        a.protect_readiness = true;
    })
    .await;
    let client = s.token("acme", Role::Client).await;
    let operator = s.token("acme", Role::Operator).await;
    for path in ["/metrics", "/health", "/health/ready"] {
        assert_eq!(get(&s, path, None).await.0, 401, "{path}");
        assert_eq!(get(&s, path, Some(&client)).await.0, 403, "{path}");
        let url = format!("{}{path}", s.server.url());
        let auth = format!("Bearer {operator}");
        let r = reqwest::Client::new()
            .get(url)
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    assert_eq!(get(&s, "/health/live", None).await.0, 200);
    s.finish().await;
}

/// A known token is verified from memory: with the token table gone from the database,
/// it is still accepted, and an unknown one is refused without an error escaping.
#[tokio::test]
async fn known_tokens_are_verified_without_the_database() {
    for db in testing::all("auth_cache").await {
        let name = db.name().to_owned();
        let store = common::open(&db.url).await;
        let now = store.db_now().await.unwrap();
        let token = issue(store.as_ref(), "acme", Role::Client, "", now)
            .await
            .unwrap()
            .token;
        let cache = idem::auth::cache::TokenCache::load(idem::auth::TokenAdmin::new(
            std::sync::Arc::clone(&store),
        ))
        .await
        .unwrap();
        drop_token_table(&db).await;
        for _ in 0..3 {
            let who = cache.verify(&token).await.expect("verified from memory");
            assert_eq!(
                (who.tenant.as_str(), who.role),
                ("acme", Role::Client),
                "{name}"
            );
        }
        let unknown = format!("idem_0123456789ab_{}", "e".repeat(64));
        assert_eq!(
            cache.verify(&unknown).await,
            Err(idem::auth::cache::Refusal::Invalid),
            "{name}"
        );
        drop(cache);
        drop(store);
        db.drop_database().await;
    }
}

async fn drop_token_table(db: &TestDatabase) {
    use sqlx::Connection;
    match db.backend {
        idem_participant::Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::query("DROP TABLE idem_token")
                .execute(&mut c)
                .await
                .unwrap();
        }
        idem_participant::Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query("DROP TABLE idem_token")
                .execute(&mut c)
                .await
                .unwrap();
        }
        idem_participant::Backend::Mysql => {
            let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::query("DROP TABLE idem_token")
                .execute(&mut c)
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn an_admin_manages_its_tenants_tokens_through_the_api() {
    for db in testing::all("auth_token_api").await {
        let name = db.name().to_owned();
        // A long refresh: what holds below holds because this coordinator made the change.
        let s = Setup::new(db, |a| a.refresh = Duration::from_secs(3_600)).await;
        let admin = s.token("acme", Role::Admin).await;
        let other_admin = s.token("globex", Role::Admin).await;
        let (status, issued) = post(
            &s,
            "/api/v1/tokens",
            Some(&admin),
            json!({"role": "client", "label": "ci"}),
        )
        .await;
        assert_eq!(status, 201, "{name}: {issued}");
        assert_eq!(
            (issued["tenant"].as_str(), issued["role"].as_str()),
            (Some("acme"), Some("client"))
        );
        let client = issued["token"].as_str().unwrap().to_owned();
        let id = issued["id"].as_str().unwrap().to_owned();
        // Works at once, and is not an admin.
        assert_eq!(
            get(&s, "/api/v1/transactions", Some(&client)).await.0,
            200,
            "{name}"
        );
        let (status, answer) = get(&s, "/api/v1/tokens", Some(&client)).await;
        assert_eq!((status, code(&answer)), (403, "forbidden"), "{name}");
        let (status, answer) =
            post(&s, "/api/v1/tokens", Some(&admin), json!({"role": "root"})).await;
        assert_eq!((status, code(&answer)), (400, "invalid_role"), "{name}");
        // Listed without secrets, only to its own tenant's admin.
        let (_, listed) = get(&s, "/api/v1/tokens", Some(&admin)).await;
        let ids: Vec<&str> = listed["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        assert!(ids.contains(&id.as_str()), "{name}: {listed}");
        assert!(
            !listed
                .to_string()
                .contains(client.rsplit('_').next().unwrap()),
            "{name}: a secret was listed"
        );
        let (_, theirs) = get(&s, "/api/v1/tokens", Some(&other_admin)).await;
        assert!(
            !theirs.to_string().contains(&id),
            "{name}: globex saw acme's token"
        );
        // Another tenant's admin cannot revoke it; its own can, and it stops at once.
        let revoke = format!("/api/v1/tokens/{id}/revoke");
        assert_eq!(
            post(&s, &revoke, Some(&other_admin), json!({})).await.0,
            404,
            "{name}"
        );
        assert_eq!(
            get(&s, "/api/v1/transactions", Some(&client)).await.0,
            200,
            "{name}"
        );
        let (status, revoked) = post(&s, &revoke, Some(&admin), json!({})).await;
        assert_eq!(status, 200, "{name}: {revoked}");
        assert!(revoked["revoked_at"].is_i64(), "{name}");
        let (status, answer) = get(&s, "/api/v1/transactions", Some(&client)).await;
        assert_eq!((status, code(&answer)), (401, "token_revoked"), "{name}");
        assert_eq!(
            post(&s, &revoke, Some(&admin), json!({})).await.0,
            404,
            "{name}: revoked twice"
        );
        s.finish().await;
    }
}

/// `branch_headers` carry credentials: every view shows their names with `***` for the
/// values (the native view, its list, DTM's query), while the participant still gets them.
#[tokio::test]
async fn branch_header_values_are_shown_redacted_and_still_sent() {
    for db in testing::all("auth_branch_headers").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |a| a.dtm_tenant = Some("acme".into())).await;
        let token = s.token("acme", Role::Client).await;
        let mut saga = s.saga("with-headers", "x");
        saga["options"] = json!({"branch_headers": {"Authorization": "Bearer s3cret"}});
        let (status, created) = post(&s, "/api/v1/transactions", Some(&token), saga).await;
        assert_eq!(status, 201, "{name}: {created}");
        let done = wait_status(&s, &token, "with-headers", "succeeded").await;
        let calls = s.recorder.calls();
        assert!(
            calls
                .iter()
                .any(|c| c.authorization.as_deref() == Some("Bearer s3cret")),
            "{name}: the participant gets the header as given: {calls:?}"
        );
        let (_, list) = get(&s, "/api/v1/transactions", Some(&token)).await;
        let (_, dtm) = get(&s, "/api/dtmsvr/query?gid=with-headers", Some(&token)).await;
        for (view, text) in [
            ("created", created.to_string()),
            ("view", done.to_string()),
            ("list", list.to_string()),
            ("dtm", dtm.to_string()),
        ] {
            assert!(
                !text.contains("s3cret"),
                "{name}: {view} shows the value: {text}"
            );
        }
        assert_eq!(
            done["options"]["branch_headers"]["Authorization"], "***",
            "{name}: the name stays, the value does not"
        );
        s.finish().await;
    }
}

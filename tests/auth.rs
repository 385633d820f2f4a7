//! Tokens, tenants and roles through both doors, on SQLite, PostgreSQL and MariaDB: a
//! coordinator in this process with `--auth tokens`, tokens issued on its database, a
//! recording participant over real HTTP. Two tenants use one gid without meeting; a request
//! without a valid token is refused before anything is stored; a client may not retry or
//! force-stop; a revoked token stops working; DTM's door maps to a tenant by token or by the
//! configured default; `/metrics` and readiness can be protected.

mod common;

use std::time::Duration;

use common::recorder::Recorder;
use idem::auth::tokens::issue;
use idem::auth::{AuthConfig, AuthMode, Role};
use idem::server::RunningServer;
use idem::store::Store;
use idem_participant::testing::{self, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

struct Setup {
    db: TestDatabase,
    store: std::sync::Arc<dyn Store>,
    server: RunningServer,
    recorder: Recorder,
}

impl Setup {
    async fn new(db: TestDatabase, tweak: impl FnOnce(&mut AuthConfig)) -> Setup {
        let store = common::open(&db.url).await;
        let mut auth = AuthConfig {
            mode: AuthMode::Tokens,
            refresh: Duration::from_millis(100),
            ..AuthConfig::default()
        };
        tweak(&mut auth);
        let server = common::coordinator_with(&db.url, |c| c.auth = auth).await;
        Setup {
            db,
            store,
            server,
            recorder: Recorder::start().await,
        }
    }

    async fn token(&self, tenant: &str, role: Role) -> String {
        let now = self.store.db_now().await.unwrap();
        issue(self.store.as_ref(), tenant, role, "test", now)
            .await
            .unwrap()
            .token
    }

    fn saga(&self, gid: &str, note: &str) -> Value {
        json!({"gid": gid, "kind": "saga", "steps": [{
            "action": self.recorder.url("/step/action"),
            "compensate": self.recorder.url("/step/compensate"),
            "payload": {"note": note},
        }]})
    }

    async fn finish(self) {
        self.server.stop().await.unwrap();
        drop(self.store);
        self.db.drop_database().await;
    }
}

/// One request with an optional `Authorization` header value.
async fn call(
    method: reqwest::Method,
    url: String,
    auth: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    idem::transport::install_crypto_provider();
    let mut request = reqwest::Client::new().request(method, url);
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn post(s: &Setup, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let url = format!("{}{path}", s.server.url());
    call(reqwest::Method::POST, url, auth.as_deref(), Some(body)).await
}

async fn get(s: &Setup, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let url = format!("{}{path}", s.server.url());
    call(reqwest::Method::GET, url, auth.as_deref(), None).await
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

async fn wait_status(s: &Setup, token: &str, gid: &str, want: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (status, body) = get(s, &format!("/api/v1/transactions/{gid}"), Some(token)).await;
        if status == 200 && body["status"] == want {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{gid} never became {want}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

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
    let db = TestDatabase::create(idem_participant::Backend::Sqlite, "auth_protected")
        .await
        .expect("SQLite is always there");
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

#[tokio::test]
async fn the_per_tenant_cap_refuses_new_work_but_not_repeats() {
    for db in testing::all("auth_active_cap").await {
        let name = db.name().to_owned();
        let store = common::open(&db.url).await;
        let auth = AuthConfig {
            mode: AuthMode::Tokens,
            ..AuthConfig::default()
        };
        let server = common::coordinator_with(&db.url, |c| {
            c.auth = auth;
            c.max_active_per_tenant = 2;
        })
        .await;
        let s = Setup {
            db,
            store,
            server,
            recorder: Recorder::start().await,
        };
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
        let cache = idem::auth::cache::TokenCache::load(std::sync::Arc::clone(&store))
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

/// The outbound policy applies the caller's tenant's entry: the URL one tenant may register
/// is refused for another whose entry does not list it (and the refused create stores
/// nothing).
#[tokio::test]
async fn each_tenant_registers_under_its_own_outbound_entry() {
    for db in testing::all("auth_outbound_tenant").await {
        let name = db.name().to_owned();
        let store = common::open(&db.url).await;
        let policy = idem::outbound::OutboundPolicy::parse(
            "[default]\ncidrs = [\"127.0.0.0/8\"]\n[tenants.acme]\nhosts = [\"payments.acme.internal\"]\n",
        )
        .unwrap();
        let server = common::coordinator_with(&db.url, |c| {
            c.auth = AuthConfig {
                mode: AuthMode::Tokens,
                ..AuthConfig::default()
            };
            c.outbound_policy = std::sync::Arc::new(policy);
        })
        .await;
        let s = Setup {
            db,
            store,
            server,
            recorder: Recorder::start().await,
        };
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

//! The in-process coordinator with `--auth tokens` that the token and tenant tests share
//! (its outbound policy lets it call the loopback participants), and raw requests with or
//! without a bearer token.

use std::time::Duration;

use idem::auth::tokens::issue;
use idem::auth::{AuthConfig, AuthMode, Role};
use idem::server::{RunningServer, ServerConfig};
use idem::store::Store;
use idem_participant::testing::TestDatabase;
use serde_json::{Value, json};

use super::recorder::Recorder;

pub const WAIT: Duration = Duration::from_secs(30);

pub struct Setup {
    pub db: TestDatabase,
    pub store: std::sync::Arc<dyn Store>,
    pub server: RunningServer,
    pub recorder: Recorder,
}

impl Setup {
    pub async fn new(db: TestDatabase, tweak: impl FnOnce(&mut AuthConfig)) -> Setup {
        let store = super::open(&db.url).await;
        let mut auth = AuthConfig {
            mode: AuthMode::Tokens,
            refresh: Duration::from_millis(100),
            ..AuthConfig::default()
        };
        tweak(&mut auth);
        let server = super::coordinator_with(&db.url, |c| {
            c.auth = auth;
            super::allow_loopback_participants(c);
        })
        .await;
        Setup {
            db,
            store,
            server,
            recorder: Recorder::start().await,
        }
    }

    pub async fn token(&self, tenant: &str, role: Role) -> String {
        let now = self.store.db_now().await.unwrap();
        issue(self.store.as_ref(), tenant, role, "test", now)
            .await
            .unwrap()
            .token
    }

    pub fn saga(&self, gid: &str, note: &str) -> Value {
        json!({"gid": gid, "kind": "saga", "steps": [{
            "action": self.recorder.url("/step/action"),
            "compensate": self.recorder.url("/step/compensate"),
            "payload": {"note": note},
        }]})
    }

    pub async fn finish(self) {
        self.server.stop().await.unwrap();
        drop(self.store);
        self.db.drop_database().await;
    }
}

/// One request with an optional `Authorization` header value.
pub async fn call(
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

pub async fn post(s: &Setup, path: &str, token: Option<&str>, body: Value) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let url = format!("{}{path}", s.server.url());
    call(reqwest::Method::POST, url, auth.as_deref(), Some(body)).await
}

pub async fn get(s: &Setup, path: &str, token: Option<&str>) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let url = format!("{}{path}", s.server.url());
    call(reqwest::Method::GET, url, auth.as_deref(), None).await
}

pub fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("")
}

pub async fn wait_status(s: &Setup, token: &str, gid: &str, want: &str) -> Value {
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

impl Setup {
    /// A coordinator requiring tokens, configured further by `tweak`.
    pub async fn with(db: TestDatabase, tweak: impl FnOnce(&mut ServerConfig)) -> Setup {
        let store = super::open(&db.url).await;
        let server = super::coordinator_with(&db.url, |c| {
            c.auth = AuthConfig {
                mode: AuthMode::Tokens,
                ..AuthConfig::default()
            };
            super::allow_loopback_participants(c);
            tweak(c);
        })
        .await;
        Setup {
            db,
            store,
            server,
            recorder: Recorder::start().await,
        }
    }
}

/// An outbound policy that lets transactions call participants on loopback only (the
/// tests' recorder), whatever the default policy allows.
pub fn loopback_participants() -> std::sync::Arc<idem::outbound::OutboundPolicy> {
    let policy = "[default]\ncidrs = [\"127.0.0.0/8\"]\n";
    std::sync::Arc::new(idem::outbound::OutboundPolicy::parse(policy).unwrap())
}

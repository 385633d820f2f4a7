//! What the Idempotency-Key tests over real HTTP share: the tables, a server on loopback, a
//! client, the external effect (`charges`, one row per key: a second charge of one key is
//! a primary-key error, so it cannot pass unseen) and the fact source that reads it.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use idem_participant::idempotency::{
    BoxFuture, ExpiredClaim, IdempotencyStore, Recovery, RecoveryHook, Status, StoredResult,
    create_idempotency_tables,
};
use idem_participant::testing::TestDatabase;
use sqlx::{AnyPool, Row};

/// A pool on `db` with the idempotency table and `charges`.
pub async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
    create_idempotency_tables(&pool)
        .await
        .expect("idempotency table");
    sqlx::query("CREATE TABLE charges (charge_key VARCHAR(128) PRIMARY KEY)")
        .execute(&pool)
        .await
        .expect("charges");
    pool
}

/// Serves `app` on a loopback port; returns its base URL.
pub async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

pub fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

/// An answer as a client sees it.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub content_type: Option<String>,
    pub bytes: Vec<u8>,
}

impl Reply {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The stable error code of a JSON error answer.
    pub fn code(&self) -> Option<String> {
        let value: serde_json::Value = serde_json::from_slice(&self.bytes).ok()?;
        value["error"].as_str().map(str::to_owned)
    }
}

/// POSTs `body` with the key and tenant.
pub async fn send(
    client: &reqwest::Client,
    url: &str,
    key: Option<&str>,
    tenant: &str,
    body: &str,
) -> Reply {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("idem-tenant", tenant)
        .body(body.to_owned());
    if let Some(key) = key {
        req = req.header("idempotency-key", key);
    }
    let resp = req.send().await.expect("send");
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    Reply {
        status: resp.status().as_u16(),
        replayed: header("idempotency-replayed").as_deref() == Some("true"),
        retry_after: header("retry-after"),
        content_type: header("content-type"),
        bytes: resp.bytes().await.unwrap().to_vec(),
    }
}

fn backend_of(pool: &AnyPool) -> idem_participant::Backend {
    idem_participant::Backend::from_url(pool.connect_options().database_url.as_ref()).unwrap()
}

/// The external effect: one `charges` row for `key`. Panics on a second charge of a key.
pub async fn charge(pool: &AnyPool, key: &str) {
    sqlx::query(backend_of(pool).sql("INSERT INTO charges (charge_key) VALUES (?)"))
        .bind(key.to_owned())
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("charge {key}: {e}"));
}

/// How many charges were made.
pub async fn charges(pool: &AnyPool) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM charges")
        .fetch_one(pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

async fn charged(pool: &AnyPool, key: &str) -> Result<bool, sqlx::Error> {
    let row =
        sqlx::query(backend_of(pool).sql("SELECT COUNT(*) FROM charges WHERE charge_key = ?"))
            .bind(key.to_owned())
            .fetch_one(pool)
            .await?;
    Ok(row.get::<i64, _>(0) > 0)
}

/// The answer a charge gets, the first time and from the fact source.
pub fn charge_result(key: &str) -> StoredResult {
    StoredResult {
        status: 201,
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::json!({"charge": key}).to_string().into_bytes(),
        resource_id: Some(key.to_owned()),
    }
}

/// The fact source of these tests: a `charges` row says the effect happened, none says it
/// did not; a key starting with `unsure` cannot be told. Counts its questions.
#[derive(Clone)]
pub struct ChargeLookup {
    pub pool: AnyPool,
    pub asked: Arc<AtomicUsize>,
}

impl ChargeLookup {
    pub fn new(pool: &AnyPool) -> ChargeLookup {
        ChargeLookup {
            pool: pool.clone(),
            asked: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

impl RecoveryHook for ChargeLookup {
    fn recover<'a>(&'a self, expired: &'a ExpiredClaim) -> BoxFuture<'a, Recovery> {
        Box::pin(async move {
            self.asked.fetch_add(1, Ordering::SeqCst);
            if expired.key.starts_with("unsure") {
                return Recovery::Unknown;
            }
            match charged(&self.pool, &expired.key).await {
                Ok(true) => Recovery::Succeeded(charge_result(&expired.key)),
                Ok(false) => Recovery::NotHappened,
                Err(_) => Recovery::Unknown,
            }
        })
    }
}

/// Polls the record of (scope, key) until it is in `status`; panics after 30 s.
pub async fn wait_for_status<DB: idem_participant::BarrierDatabase>(
    store: &IdempotencyStore<DB>,
    scope: &str,
    key: &str,
    status: Status,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = store.lookup(scope, key).await.unwrap();
        if now.map(|(s, _)| s) == Some(status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{scope}/{key} never became {status:?}: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

//! What the HTTP tests of the example participants share: a service on a fresh database
//! and a client that calls it the way the coordinator does.

use idem_demo::{Service, coupon, inventory, payment};
use idem_participant::testing::TestDatabase;
use serde_json::Value;
use sqlx::AnyPool;

/// A participant service on a fresh database, and a client for it.
pub struct Env {
    pub db: TestDatabase,
    pub pool: AnyPool,
    pub service: Service,
    pub client: reqwest::Client,
}

impl Env {
    pub async fn inventory(db: TestDatabase) -> Env {
        let pool = inventory::open(&db.url).await.expect("open inventory");
        let service = inventory::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    pub async fn payment(db: TestDatabase) -> Env {
        let pool = payment::open(&db.url).await.expect("open payment");
        let service = payment::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    pub async fn coupon(db: TestDatabase) -> Env {
        let pool = coupon::open(&db.url).await.expect("open coupon");
        let service = coupon::start(pool.clone(), "127.0.0.1:0").await.unwrap();
        Env::new(db, pool, service)
    }

    pub fn new(db: TestDatabase, pool: AnyPool, service: Service) -> Env {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Env {
            db,
            pool,
            service,
            client: reqwest::Client::new(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.db.backend.name()
    }

    /// One coordinator-style callback; returns the status and the JSON body.
    pub async fn call(
        &self,
        path: &str,
        trans_type: &str,
        gid: &str,
        branch: &str,
        op: &str,
        body: &Value,
    ) -> (u16, Value) {
        call(
            &self.client,
            &self.service.url(path),
            trans_type,
            gid,
            branch,
            op,
            body,
        )
        .await
    }

    /// [`Env::call`] with `Idem-Tenant: tenant`, as the coordinator calls for a tenant.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_as(
        &self,
        tenant: &str,
        path: &str,
        trans_type: &str,
        gid: &str,
        branch: &str,
        op: &str,
        body: &Value,
    ) -> (u16, Value) {
        let url = callback_url(&self.service.url(path), trans_type, gid, branch, op);
        let request = self.client.post(url).header("idem-tenant", tenant);
        send(request, body).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client
            .get(self.service.url(path))
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
    }

    pub async fn finish(self) {
        self.service.stop().await.unwrap();
        self.pool.close().await;
        self.db.drop_database().await;
    }
}

pub async fn call(
    client: &reqwest::Client,
    url: &str,
    trans_type: &str,
    gid: &str,
    branch: &str,
    op: &str,
    body: &Value,
) -> (u16, Value) {
    let request = client.post(callback_url(url, trans_type, gid, branch, op));
    send(request, body).await
}

/// `url` with the callback parameters the coordinator adds.
fn callback_url(url: &str, trans_type: &str, gid: &str, branch: &str, op: &str) -> String {
    format!("{url}?gid={gid}&trans_type={trans_type}&branch_id={branch}&op={op}")
}

async fn send(request: reqwest::RequestBuilder, body: &Value) -> (u16, Value) {
    let r = request
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("participant answers");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

pub fn gid(prefix: &str) -> String {
    format!("{prefix}-{}", uuid_like())
}

/// A unique suffix without another dependency: the tests' own process-wide counter plus
/// the clock is unique enough across parallel tests of one run, and the databases are
/// fresh per test anyway.
pub fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{nanos:x}{:x}", N.fetch_add(1, Ordering::Relaxed))
}

pub async fn stock(env: &Env, sku: &str) -> inventory::Stock {
    inventory::stock(&env.pool, sku)
        .await
        .unwrap()
        .expect("sku exists")
}

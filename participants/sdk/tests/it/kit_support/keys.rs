//! What the Idempotency-Key tests over real HTTP share: the tables, a server on loopback, a
//! client, the external effect (`charges`, one row per key: a second charge of one key is
//! a primary-key error, so it cannot pass unseen) and the fact source that reads it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use idem_participant::idempotency::{
    BoxFuture, ExpiredClaim, IdempotencyStore, Recovery, RecoveryHook, Status, StoredResult,
    create_idempotency_tables,
};
use idem_participant::kit::db_now_ms;
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

fn backend_of(pool: &AnyPool) -> idem_participant::testing::Backend {
    idem_participant::testing::Backend::from_url(pool.connect_options().database_url.as_ref())
        .unwrap()
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

/// The scope of the charge route (no tenant header: `-`).
pub const SCOPE: &str = "-:charge";

/// The handler of the unknown-outcome tests. The first run of a key does what the body's
/// `mode` says; every later run charges and answers 201 with [`charge_result`]. Runs are
/// counted per key, so "never run again" is asserted, not assumed.
#[derive(Clone)]
pub struct Charger {
    pub pool: AnyPool,
    runs: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// How many runs reached their hang point (after charging) or hold point (before).
    pub parked: tokio::sync::watch::Sender<usize>,
    /// Lets held (`slow`) runs answer.
    pub release: tokio::sync::watch::Sender<bool>,
}

impl Charger {
    pub fn new(pool: &AnyPool) -> Charger {
        Charger {
            pool: pool.clone(),
            runs: Arc::default(),
            parked: tokio::sync::watch::channel(0).0,
            release: tokio::sync::watch::channel(false).0,
        }
    }

    /// How many times the handler ran for `key`.
    pub fn runs(&self, key: &str) -> usize {
        self.runs.lock().unwrap().get(key).copied().unwrap_or(0)
    }

    /// Waits until `n` runs have parked.
    pub async fn parked(&self, n: usize) {
        let mut parked = self.parked.subscribe();
        tokio::time::timeout(Duration::from_secs(30), parked.wait_for(|p| *p >= n))
            .await
            .expect("the handler parks")
            .unwrap();
    }

    fn park(&self) {
        self.parked.send_modify(|p| *p += 1);
    }
}

/// The body of a request in `mode`.
pub fn mode(mode: &str) -> String {
    serde_json::json!({ "mode": mode }).to_string()
}

/// A body of `size` bytes: every byte value in turn when `binary` (NUL and bytes no UTF-8
/// text has), else `x`s.
pub fn sized_body(size: usize, binary: bool) -> Vec<u8> {
    if binary {
        (0..size).map(|i| (i % 256) as u8).collect()
    } else {
        vec![b'x'; size]
    }
}

async fn charger_handler(
    axum::extract::State(app): axum::extract::State<Charger>,
    headers: axum::http::HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let key = headers["idempotency-key"].to_str().unwrap().to_owned();
    let run = {
        let mut runs = app.runs.lock().unwrap();
        let run = runs.entry(key.clone()).or_insert(0);
        *run += 1;
        *run
    };
    let request: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mode = request["mode"].as_str().unwrap_or("ok");
    let nothing = axum::Extension(idem_participant::idempotency::http::NothingHappened);
    if run == 1 {
        match mode {
            "502-after" => {
                charge(&app.pool, &key).await;
                return (StatusCode::BAD_GATEWAY, "the provider timed out").into_response();
            }
            "504-before" => return StatusCode::GATEWAY_TIMEOUT.into_response(),
            "panic" => {
                charge(&app.pool, &key).await;
                panic!("the handler of {key} panicked after charging");
            }
            "hang" => {
                charge(&app.pool, &key).await;
                app.park();
                std::future::pending::<()>().await;
            }
            "408" => return StatusCode::REQUEST_TIMEOUT.into_response(),
            "429" => return StatusCode::TOO_MANY_REQUESTS.into_response(),
            "503" => return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response(),
            "marked-500" => {
                return (StatusCode::INTERNAL_SERVER_ERROR, nothing, "refused").into_response();
            }
            "slow" => {
                // Charges (below) once released.
                app.park();
                let mut release = app.release.subscribe();
                release.wait_for(|go| *go).await.unwrap();
            }
            "bytes" => {
                charge(&app.pool, &key).await;
                let size = request["size"].as_u64().unwrap() as usize;
                let binary = request["binary"] == true;
                let body = match request["nul"] == true {
                    true => b"a\0b".to_vec(),
                    false => sized_body(size, binary),
                };
                return (
                    StatusCode::OK,
                    [("content-type", "application/octet-stream")],
                    body,
                )
                    .into_response();
            }
            _ => {}
        }
    } else {
        assert_ne!(
            mode, "bytes",
            "a stored answer is replayed, never made again"
        );
    }
    charge(&app.pool, &key).await;
    let result = charge_result(&key);
    (
        StatusCode::CREATED,
        [("content-type", "application/json")],
        result.body,
    )
        .into_response()
}

/// Serves the charge route behind the layer on `store` (503 marked "nothing happened" by
/// the route, every other 5xx unknown), with `hook` if given. Returns the route's URL.
pub async fn serve_charger<DB: idem_participant::BarrierDatabase>(
    store: IdempotencyStore<DB>,
    charger: &Charger,
    hook: Option<ChargeLookup>,
) -> String {
    use axum::http::{Method, StatusCode};
    use idem_participant::idempotency::http::{IdempotencyLayer, RouteRule};
    let router = Router::new()
        .route("/charges", axum::routing::post(charger_handler))
        .with_state(charger.clone());
    let mut layer = IdempotencyLayer::new(store).route(
        Method::POST,
        "/charges",
        RouteRule::new("charge").nothing_happened_on(StatusCode::SERVICE_UNAVAILABLE),
    );
    if let Some(hook) = hook {
        layer = layer.recovery(hook);
    }
    format!("{}/charges", serve(layer.apply(router)).await)
}

/// Sends a POST of `body` with `key` over a raw connection, waits until `charger` has
/// `parked` runs, and closes the connection without reading an answer: a client that
/// hangs up while its request runs.
pub async fn hang_up(url: &str, key: &str, body: &str, charger: &Charger, parked: usize) {
    use tokio::io::AsyncWriteExt;
    let authority = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&authority).await.unwrap();
    let request = format!(
        "POST /charges HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\nidempotency-key: {key}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    charger.parked(parked).await;
    drop(stream);
}

/// The database's clock, in Unix ms.
pub async fn db_now(pool: &AnyPool, backend: idem_participant::testing::Backend) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT {}",
        db_now_ms(backend)
    )))
    .fetch_one(pool)
    .await
    .unwrap()
    .get::<i64, _>(0)
}

/// A record's lease expiry as stored.
pub async fn lease_until(
    pool: &AnyPool,
    backend: idem_participant::testing::Backend,
    key: &str,
) -> i64 {
    sqlx::query(backend.sql("SELECT lease_until_ms FROM idem_idempotency WHERE idem_key = ?"))
        .bind(key.to_owned())
        .fetch_one(pool)
        .await
        .unwrap()
        .get::<i64, _>(0)
}

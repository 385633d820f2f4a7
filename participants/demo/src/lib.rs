//! Example idem participants, each a small axum service over its own database:
//!
//! * [`inventory`]: a TCC branch that reserves stock (Try), sells it (Confirm) or releases it
//!   (Cancel); or a saga step that sells at once (action) and takes the sale back
//!   (compensate);
//! * [`payment`]: a TCC branch that freezes money (Try), debits it (Confirm) or unfreezes it
//!   (Cancel); or a saga step that debits at once (action) and refunds (compensate);
//! * [`coupon`]: a saga step that issues a coupon (action) and revokes that same coupon
//!   (compensate).
//!
//! Each is written once against `sqlx::Any` and runs on SQLite (the default), PostgreSQL or
//! MySQL/MariaDB, picked by the database URL. Every step goes through the
//! [`idem_participant`] barrier, so each handler can be called any number of times, in any
//! order, concurrently.
//!
//! To run one in-process (tests, the coordinator's example):
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = idem_demo::inventory::open("sqlite://inventory.db?mode=rwc").await?;
//! idem_demo::inventory::seed(&pool, "apple", 10).await?;
//! let service = idem_demo::inventory::start(pool.clone(), "127.0.0.1:0").await?;
//! let try_url = service.url(idem_demo::inventory::RESERVE_PATH);
//! # let _ = try_url;
//! # Ok(())
//! # }
//! ```
//!
//! `router_with(pool, Some(verifier))` puts the branch routes behind the SDK's signature
//! check ([`idem_participant::signature`]); `idem-demo --signing-secret-file PATH` does so.

pub mod coupon;
pub mod events;
pub mod grpc_busi;
pub mod inventory;
pub mod order;
pub mod payment;

use std::io;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::FromRef;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use idem_participant::LeanPool;
use idem_participant::signature::{Verifier, require_signature};
use idem_participant::{Dialect, ParticipantError};
use sqlx::{Any, AnyPool};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use idem_participant;

/// What a participant's handlers share: the pool for queries and set-up, and a
/// [`LeanPool`] of the same size for the barrier steps, whose connections go back without
/// the round trip `sqlx::Pool` spends on every release (one per step otherwise).
#[derive(Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub steps: LeanPool<Any>,
}

impl Db {
    pub fn new(pool: AnyPool) -> Db {
        let steps = LeanPool::like(&pool);
        Db { pool, steps }
    }
}

impl FromRef<Db> for AnyPool {
    fn from_ref(db: &Db) -> AnyPool {
        db.pool.clone()
    }
}

impl FromRef<Db> for LeanPool<Any> {
    fn from_ref(db: &Db) -> LeanPool<Any> {
        db.steps.clone()
    }
}

/// `branch` behind [`require_signature`] when `verifier` is given: a call without a valid
/// signature gets 401 and never reaches a handler.
pub(crate) fn guard(branch: Router<Db>, verifier: Option<Verifier>) -> Router<Db> {
    match verifier {
        Some(verifier) => branch.route_layer(axum::middleware::from_fn_with_state(
            verifier,
            require_signature,
        )),
        None => branch,
    }
}

/// A participant service running on a tokio task.
pub struct Service {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<io::Result<()>>,
}

impl Service {
    /// Where it listens (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Stops accepting, lets in-flight requests finish, and waits for the server task.
    pub async fn stop(mut self) -> io::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.await {
            Ok(result) => result,
            Err(e) => Err(io::Error::other(e)),
        }
    }
}

/// Serves `router` on `listen` (for example `127.0.0.1:0`) on a new task.
pub async fn spawn(router: Router, listen: &str) -> io::Result<Service> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    Ok(spawn_on(router, listener))
}

/// Serves `router` on an already bound listener on a new task.
pub fn spawn_on(router: Router, listener: tokio::net::TcpListener) -> Service {
    let addr = listener
        .local_addr()
        .expect("bound listener has an address");
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Service {
        addr,
        shutdown: Some(tx),
        task,
    }
}

/// Connects to a participant database: a pool of `sqlx::Any` (the backend comes from the
/// URL). A small pool: each step is one short transaction. On SQLite only one connection
/// writes at a time anyway; with one, steps queue in the pool in order instead of
/// retrying on a busy database file, which made the latency tail long.
pub async fn connect(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let max = match Dialect::from_url(database_url) {
        Some(Dialect::Sqlite) => 1,
        _ => 8,
    };
    idem_participant::connect(database_url, max).await
}

/// Runs one of the per-backend DDL scripts below `participants/demo/sql/`.
pub(crate) async fn run_script(
    pool: &AnyPool,
    sqlite: &str,
    postgres: &str,
    mysql: &str,
) -> Result<(), sqlx::Error> {
    idem_participant::create_barrier_table(pool).await?;
    let script = match dialect_of(pool) {
        Dialect::Sqlite => sqlite,
        Dialect::Postgres => postgres,
        Dialect::Mysql => mysql,
    };
    for statement in idem_participant::split_sql_script(script) {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await?;
    }
    Ok(())
}

/// The dialect of a pool made by [`connect`].
pub fn dialect_of(pool: &AnyPool) -> Dialect {
    Dialect::from_url(pool.connect_options().database_url.as_str())
        .expect("an AnyPool URL of a supported backend")
}

/// `?tenant=` on a query route that shows one branch's ledger row: the ledgers key by
/// (tenant, gid, branch), like the barrier; without it, the default tenant's row.
#[derive(serde::Deserialize)]
pub(crate) struct OfTenant {
    tenant: Option<String>,
}

impl OfTenant {
    pub(crate) fn tenant(&self) -> &str {
        self.tenant
            .as_deref()
            .unwrap_or(idem_participant::DEFAULT_TENANT)
    }
}

/// The answer of a read-only query endpoint.
pub(crate) enum QueryError {
    NotFound(String),
    Database(sqlx::Error),
}

impl From<sqlx::Error> for QueryError {
    fn from(e: sqlx::Error) -> Self {
        QueryError::Database(e)
    }
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        match self {
            QueryError::NotFound(what) => (
                StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({"error": "not_found", "message": what})),
            )
                .into_response(),
            QueryError::Database(e) => ParticipantError::Database(e).into_response(),
        }
    }
}

/// The step answer every branch handler returns: an outcome, a refusal or error, or a bad
/// callback (400).
pub(crate) type StepResponse<T> = Result<idem_participant::Outcome<T>, Response>;

pub(crate) fn err_response(e: impl IntoResponse) -> Response {
    e.into_response()
}

/// Parses a Try/action payload: a body that is not the expected JSON is a permanent
/// refusal (409), since retrying the same registered payload cannot fix it.
pub(crate) fn parse_payload<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, ParticipantError> {
    serde_json::from_slice(body)
        .map_err(|e| ParticipantError::refused(format!("invalid payload: {e}")))
}

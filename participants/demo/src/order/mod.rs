//! The order service: a whole participant service made safe by the SDK's idempotency kit,
//! end to end (issue 16's second demo).
//!
//! | what is retried | by whom | the kit's tool | module |
//! |---|---|---|---|
//! | `POST /orders` | the client, after a timeout | Idempotency-Key layer (lease mode) + a recovery hook reading the `orders` row | [`create`] |
//! | starting the order's saga | the handler, its retries, the recovery | the coordinator's own key: the saga's gid is the order's | [`create`] |
//! | the saga's step at the inventory service | the coordinator | the barrier | [`crate::inventory`] |
//! | `POST /payments/callback` | the payment provider, until it hears success | payment callbacks (signature, amounts, provider transaction id, `WAIT_PAY → PAID`) | [`payment`] |
//! | the "order paid" event | the outbox relay after a crash; JetStream's redelivery | the outbox + the consumer log | [`outbox`], [`points`] |
//! | the nightly settlement | the scheduler; an operator's manual rerun | job units | [`nightly`] |
//!
//! ```text
//! idem-demo order --coordinator http://127.0.0.1:8686 --inventory http://127.0.0.1:8081 \
//!     --provider-secret-file provider.key --nats nats://127.0.0.1:4222
//! idem-demo order-settle --date 2026-12-01      # the nightly job, safe to rerun
//! ```

pub mod create;
pub mod nightly;
pub mod outbox;
pub mod payment;
pub mod points;
pub mod store;

use std::io;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idem_participant::callback::PaymentCallbacks;
use idem_participant::idempotency::IdempotencyStore;
use idem_participant::idempotency::http::{IdempotencyLayer, RouteRule, TENANT_HEADER};
use idem_participant::kit::SharedClock;
use sqlx::{Any, AnyPool};

use crate::{QueryError, Service};

/// The nightly settlement's shards (units per business date).
pub const SETTLEMENT_SHARDS: u64 = 4;
/// How long a repeat of `POST /orders` waits for the first request's answer before it is
/// told 202 (the first one is still submitting its saga).
pub const CREATE_WAIT: Duration = Duration::from_secs(10);
/// The tenant of a request without `Idem-Tenant` (the layer's own default).
pub const DEFAULT_TENANT: &str = "-";

/// How the order service is set up.
#[derive(Clone)]
pub struct OrderConfig {
    /// The coordinator the order sagas are submitted to.
    pub idem: idem_client::Client,
    /// The inventory service's base URL (`http://host:port`).
    pub inventory_url: String,
    /// This shop's merchant id at the payment provider.
    pub merchant: String,
    /// The payment provider's name.
    pub provider: String,
    /// The secret the provider signs callbacks with.
    pub provider_secret: Vec<u8>,
    /// Where leases and timestamps read the time.
    pub clock: SharedClock,
    /// How long `POST /orders` holds its claim before a repeat may recover it.
    pub create_lease: Duration,
    /// The subject "order paid" events are published on ([`payment::ORDER_PAID_SUBJECT`]
    /// by default).
    pub paid_subject: String,
}

/// What the handlers share.
#[derive(Clone)]
pub struct OrderApp {
    pub pool: AnyPool,
    pub idem: idem_client::Client,
    pub inventory_url: String,
    pub merchant: String,
    pub clock: SharedClock,
    pub callbacks: PaymentCallbacks<Any>,
}

pub(crate) fn tenant_of(headers: &HeaderMap) -> String {
    headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or(DEFAULT_TENANT)
        .to_owned()
}

/// Opens the order database (creating its tables and the kit's).
pub async fn open(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let pool = crate::connect(database_url).await?;
    store::migrate(&pool).await?;
    Ok(pool)
}

/// The service's routes: `POST /orders` behind the Idempotency-Key layer, the payment
/// callback, and reads.
pub fn router(pool: AnyPool, config: OrderConfig) -> Result<Router, String> {
    let callbacks = payment::callbacks(
        &config.provider,
        &config.provider_secret,
        &config.paid_subject,
        config.clock.clone(),
    )?;
    let app = OrderApp {
        pool: pool.clone(),
        idem: config.idem,
        inventory_url: config.inventory_url.trim_end_matches('/').to_owned(),
        merchant: config.merchant,
        clock: config.clock.clone(),
        callbacks,
    };
    // Leases on the database's clock: every instance of the service judges them alike.
    let store = IdempotencyStore::new(pool).with_lease(config.create_lease);
    let keyed = Router::new().route("/orders", post(create::create_order));
    let keyed = IdempotencyLayer::new(store)
        .route(
            Method::POST,
            "/orders",
            RouteRule::new(create::OPERATION).wait(CREATE_WAIT),
        )
        .recovery(create::OrderRecovery { app: app.clone() })
        .apply(keyed);
    Ok(keyed
        .route("/payments/callback", post(payment_callback))
        .route("/orders/{id}", get(get_order))
        .with_state(app))
}

async fn payment_callback(
    State(app): State<OrderApp>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    app.callbacks.respond(&app.pool, &headers, &body).await
}

async fn get_order(State(app): State<OrderApp>, Path(id): Path<String>) -> Response {
    match store::order(&app.pool, &id).await {
        Ok(Some(order)) => axum::Json(order).into_response(),
        Ok(None) => QueryError::NotFound(format!("no order {id}")).into_response(),
        Err(e) => QueryError::Database(e).into_response(),
    }
}

/// Serves the order service on `listen` on a new task.
pub async fn start(pool: AnyPool, config: OrderConfig, listen: &str) -> io::Result<Service> {
    let router = router(pool, config).map_err(io::Error::other)?;
    crate::spawn(router, listen).await
}

//! HTTP front doors to the engine: idem's own API and (in `dtm`) DTM's.
//!
//! Handlers write only through the engine and read only through its read handle
//! (`engine::Reads`); tokens go through `auth::TokenAdmin`. A request meets, in order:
//! `same_origin` (what a web page could send is refused first), `auth` (the caller's token,
//! verified from memory, and its tenant), `rate_limit` and `in_flight` (the per-tenant rate,
//! the caps on requests and body bytes in flight), then its handler, which checks it with
//! `validate` before the engine sees it. Beside them: `active_cap` (unfinished transactions
//! per tenant), `identity` (a create's canonical form and hash), `error` (stable codes,
//! database errors as generic 503/500), `openapi` (the served description) and
//! `http_metrics`. Here: the router, the health endpoints and the log of database errors
//! with their route.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::engine::{Engine, READY_TIMEOUT};

pub mod active_cap;
pub mod auth;
pub mod console;
pub mod dtm;
pub mod dtm_grpc;
pub mod error;
mod http_metrics;
pub mod identity;
pub mod in_flight;
pub mod native;
pub mod openapi;
pub mod rate_limit;
pub mod same_origin;
pub mod validate;

/// What every handler can reach.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// How long a `wait_result` request waits at most.
    pub wait_timeout: Duration,
    /// Branches (TCC) or steps (saga, msg) one transaction may have, and the size of each
    /// one's payload.
    pub limits: validate::Limits,
    /// The per-tenant request rate; `None`: no limit.
    pub rate_limit: Option<Arc<rate_limit::TenantRateLimit>>,
    /// Who may call, and the token cache.
    pub auth: Arc<auth::Auth>,
    /// The token table, for `/api/v1/tokens`.
    pub tokens: crate::auth::TokenAdmin,
    /// The cap on a tenant's unfinished transactions.
    pub active_cap: active_cap::ActiveCap,
    /// The caps on requests in flight and the body bytes they hold.
    pub in_flight: Arc<in_flight::InFlight>,
    /// Where participant calls may go: every URL a request names is checked against its
    /// tenant's entry before anything is stored.
    pub outbound_policy: Arc<crate::outbound::OutboundPolicy>,
    /// What the console's `config.json` tells it.
    pub console: console::ConsoleConfig,
}

impl AppState {
    /// The handle every read of the doors goes through.
    pub fn reads(&self) -> &crate::engine::Reads {
        self.engine.reads()
    }

    /// Refuses a create past the tenant's cap, unless `key` exists already (a repeat of
    /// a create gets what is stored, as it would below the cap).
    pub async fn admit_create(&self, tenant: &str, key: &str) -> Result<(), error::ApiError> {
        match self.active_cap.admit(&self.engine, tenant).await {
            Err(refused) if self.reads().find(key).await?.is_none() => Err(refused),
            _ => Ok(()),
        }
    }

    /// The outbound policy's check of the participant URLs `(field, url)` a request
    /// names, for `tenant`: `400 url_not_allowed` naming the field and the rule.
    pub fn check_outbound<'a>(
        &self,
        tenant: &str,
        urls: impl IntoIterator<Item = (String, &'a str)>,
    ) -> Result<(), error::ApiError> {
        validate::check_outbound(&self.outbound_policy, tenant, urls)
    }
}

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;

/// The API. The caps on requests in flight and the rate limit cover the transaction routes
/// of both doors, not the probes, `/metrics` or the OpenAPI document (see `in_flight`,
/// `rate_limit`); an authentication layer that puts the `Principal` on a request must wrap
/// them (a layer added here, after them). The rate limit is outside the caps: a request it
/// refuses never takes a place in flight.
pub fn router(state: Arc<AppState>) -> Router {
    let in_flight = Arc::clone(&state.in_flight);
    let mut native = native::routes().route_layer(middleware::from_fn_with_state(
        Arc::clone(&in_flight),
        in_flight::native,
    ));
    let mut dtm =
        dtm::routes().route_layer(middleware::from_fn_with_state(in_flight, in_flight::dtm));
    if let Some(limit) = &state.rate_limit {
        let native_limit = middleware::from_fn_with_state(Arc::clone(limit), rate_limit::native);
        native = native.route_layer(native_limit);
        let dtm_limit = middleware::from_fn_with_state(Arc::clone(limit), rate_limit::dtm);
        dtm = dtm.route_layer(dtm_limit);
    }
    Router::new()
        // A load balancer should ask `ready`; `/health` is the same check, so one that
        // was pointed at `/health` before these existed stops routing to an instance whose
        // database is down.
        .route("/health", get(ready))
        .route("/health/ready", get(ready))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics))
        .merge(native::document_routes())
        .merge(dtm::probe_routes())
        .merge(console::routes())
        .merge(native)
        .merge(dtm)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        // Outside the body limit: a refused caller's body is never read.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.auth),
            auth::authenticate,
        ))
        // Outside authentication: what a web page sent is refused before a token is
        // looked at.
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state.auth),
            same_origin::guard,
        ))
        .layer(middleware::from_fn(log_server_errors))
        .layer(middleware::from_fn(http_metrics::count_requests))
        .with_state(state)
}

async fn metrics() -> String {
    crate::metrics::render()
}

/// The process answers: nothing else is checked, so a database outage does not make an
/// orchestrator restart a coordinator that will recover by itself.
async fn live() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

/// The database answers within [`READY_TIMEOUT`]: this coordinator can serve requests.
async fn ready(State(app): State<Arc<AppState>>) -> (StatusCode, Json<serde_json::Value>) {
    let (engine, reads) = (&app.engine, app.reads());
    match reads.ping_database(READY_TIMEOUT).await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({
                "status": "ok",
                "database": reads.database(),
                "driving": engine.driving(),
            })),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed: the database does not answer");
            let message = format!("the database is unavailable: {}", e.reason());
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({
                    "status": "unavailable",
                    "database": reads.database(),
                    "error": {"code": "unavailable", "message": message},
                })),
            )
        }
    }
}

/// Logs every answer that carries an [`error::ErrorDetail`] (a database error), at error
/// level with the method and route, and takes the detail off the response: the client
/// gets the generic message only.
async fn log_server_errors(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(error::ErrorDetail(detail)) = response.extensions_mut().remove() {
        tracing::error!(
            %method,
            route = route.as_ref().map_or("?", |r| r.as_str()),
            status = response.status().as_u16(),
            error = %detail,
            "request failed on the database"
        );
    }
    response
}

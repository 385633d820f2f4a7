//! HTTP front doors to the engine: idem's own API and (in `dtm`) DTM's.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::engine::Engine;

pub mod dtm;
pub mod error;
mod http_metrics;
pub mod native;
pub mod openapi;
pub mod validate;

/// What every handler can reach.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// How long a `wait_result` request waits at most.
    pub wait_timeout: Duration,
    /// Branches (TCC) or steps (saga, msg) one transaction may have.
    pub max_branches: usize,
    /// Where participant calls may go: every URL a request names is checked against its
    /// tenant's entry before anything is stored.
    pub outbound_policy: Arc<crate::outbound::OutboundPolicy>,
}

impl AppState {
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

/// The tenant of a request, whose outbound policy entry applies to the URLs it names.
/// Every request is the default tenant's until the API knows its caller.
pub(crate) fn request_tenant() -> &'static str {
    crate::tenant::DEFAULT_TENANT
}

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;

/// How long `/health/ready` waits for the database's answer.
pub const READY_TIMEOUT: Duration = Duration::from_millis(1_500);

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        // A load balancer should ask `ready`; `/health` is the same check, so one that
        // was pointed at `/health` before these existed stops routing to an instance whose
        // database is down.
        .route("/health", get(ready))
        .route("/health/ready", get(ready))
        .route("/health/live", get(live))
        .route("/metrics", get(metrics))
        .merge(native::routes())
        .merge(dtm::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY))
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
    let engine = &app.engine;
    match engine.ping_database(READY_TIMEOUT).await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({
                "status": "ok",
                "database": engine.database(),
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
                    "database": engine.database(),
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

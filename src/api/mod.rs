//! HTTP front doors to the engine: idem's own API and (in `dtm`) DTM's.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::engine::Engine;

pub mod dtm;
pub mod error;
pub mod native;
pub mod validate;

/// What every handler can reach.
pub struct AppState {
    pub engine: Arc<Engine>,
    /// How long a `wait_result` request waits at most.
    pub wait_timeout: Duration,
    /// Branches (TCC) or steps (saga, msg) one transaction may have.
    pub max_branches: usize,
}

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(native::routes())
        .merge(dtm::routes())
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn metrics() -> String {
    crate::metrics::render()
}

async fn health(State(app): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(json!({
        "status": "ok",
        "database": app.engine.store().backend(),
        "driving": app.engine.driving(),
    }))
}

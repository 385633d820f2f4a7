//! idem's own HTTP API, under `/api/v1`. Documented in `docs/api.md`.
//!
//! `requests` holds what a request may say, `handlers` what each route does with it (through
//! the engine only), `views` what an answer shows.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};

use super::AppState;

mod handlers;
mod requests;
mod views;

use handlers::{abort, create, force_stop, list, register, retry, show, submit};
pub use requests::OptionsRequest;
pub use views::{BranchView, PageView, TxView, page_view, tx_view};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/v1/transactions", post(create).get(list))
        .route("/api/v1/transactions/{gid}", get(show))
        .route("/api/v1/transactions/{gid}/branches", post(register))
        .route("/api/v1/transactions/{gid}/submit", post(submit))
        .route("/api/v1/transactions/{gid}/abort", post(abort))
        .route("/api/v1/transactions/{gid}/retry", post(retry))
        .route("/api/v1/transactions/{gid}/force-stop", post(force_stop))
}

/// How long `wait_result` waits by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

//! idem's own HTTP API, under `/api/v1`. Documented in `docs/api.md`.
//!
//! `requests` holds what a request may say, `handlers` what each route does with it (through
//! the engine only), `bulk` an operator's action on many transactions, `attempts` the paged
//! read of a transaction's history, `views` what an answer shows.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;

mod attempts;
mod bulk;
mod handlers;
mod overview;
mod requests;
mod tokens;
mod views;

pub use bulk::{BulkItemView, BulkView, bulk_view, operation_name};
pub use overview::{CoordinatorView, CountsView, MinuteView, OverviewView, WhoamiView};
pub use requests::{CheckedCreate, NewTransaction, OptionsRequest, check_create};
pub use views::{
    AttemptPageView, BranchView, HISTORY_IN_VIEW, PageView, RegisterView, TryView, TxView,
    page_view, shown_records, tx_view,
};

/// The native routes with their OpenAPI description: one list, so the spec cannot miss a
/// route the router has (`api::openapi` serves it).
pub fn api() -> OpenApiRouter<Arc<AppState>> {
    transactions().merge(document())
}

/// The transaction routes, which the rate limit covers.
pub fn routes() -> Router<Arc<AppState>> {
    transactions().split_for_parts().0
}

/// The OpenAPI document, which it does not: a tool reading the spec is no tenant's traffic.
pub fn document_routes() -> Router<Arc<AppState>> {
    document().split_for_parts().0
}

fn transactions() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(handlers::create, handlers::list))
        .routes(routes!(handlers::show))
        .routes(routes!(attempts::attempts))
        .routes(routes!(handlers::register))
        .routes(routes!(handlers::submit))
        .routes(routes!(handlers::abort))
        .routes(routes!(handlers::retry))
        .routes(routes!(handlers::force_stop))
        .routes(routes!(bulk::bulk))
        .routes(routes!(tokens::issue_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(overview::whoami))
        .routes(routes!(overview::overview))
}

fn document() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new().routes(routes!(super::openapi::serve))
}

/// How long `wait_result` waits by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

//! `GET /api/v1/transactions/{gid}/attempts`: a transaction's kept history of calls that
//! did not simply succeed, page by page, oldest first. A transaction's own view shows only
//! the newest; this reads every record kept, by number.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;

use super::views::{AttemptPageView, HISTORY_IN_VIEW};
use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::validate::{check_id, list_limit, shown};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct AttemptsQuery {
    /// A `next_cursor` this server gave: the page starts after it.
    cursor: Option<String>,
    /// Records per page (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[utoipa::path(
    get,
    path = "/api/v1/transactions/{gid}/attempts",
    operation_id = "attempts",
    tag = "transactions",
    description = "The kept history of the transaction's calls that did not simply succeed, \
                   by number (oldest first), with how many were recorded in all and how many \
                   of the oldest are no longer kept.",
    params(("gid" = String, Path, description = "The transaction's gid"), AttemptsQuery),
    responses((status = 200, description = "A page of the history", body = AttemptPageView))
)]
pub(super) async fn attempts(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    query: Result<Query<AttemptsQuery>, QueryRejection>,
) -> Result<Json<AttemptPageView>, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let after = q.cursor.as_deref().map(decode_cursor).transpose()?;
    let limit = list_limit("limit", q.limit, HISTORY_IN_VIEW)?;
    let key = caller.key(&gid);
    let page = app
        .reads()
        .attempts(&key, after.unwrap_or(0), limit)
        .await?;
    Ok(Json(page))
}

/// A cursor is the number of the last record of the page before.
fn decode_cursor(cursor: &str) -> Result<i64, ApiError> {
    cursor
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0 && cursor.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("cursor {} is not one this server gave", shown(cursor)),
            )
        })
}

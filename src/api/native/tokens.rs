//! `/api/v1/tokens`: an admin's view of its tenant's API tokens. The first admin token of
//! a tenant comes from `idem token issue` on the database; with it, tokens of that tenant
//! are issued, listed and revoked here. A token's secret is in the answer that issues it
//! and nowhere else.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::validate::parse_body;
use crate::auth::Role;
use crate::auth::admin::TokenRecord;
use crate::auth::tokens::{ID_LEN, IssueError};

/// `POST /api/v1/tokens`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct IssueRequest {
    /// `client`, `operator` or `admin`.
    role: String,
    /// Who or what holds it (at most 128 bytes).
    #[serde(default)]
    label: Option<String>,
}

/// A token as listed: never its secret.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct TokenView {
    id: String,
    tenant: String,
    role: String,
    label: String,
    created_at: i64,
    revoked_at: Option<i64>,
}

/// A token just issued: the only answer that holds its full text.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct IssuedView {
    /// Present it as `Authorization: Bearer <token>`.
    token: String,
    #[serde(flatten)]
    view: TokenView,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct TokenList {
    tokens: Vec<TokenView>,
}

fn view(t: TokenRecord) -> TokenView {
    TokenView {
        id: t.id,
        tenant: t.tenant,
        role: t.role,
        label: t.label,
        created_at: t.created_at,
        revoked_at: t.revoked_at,
    }
}

#[utoipa::path(
    post,
    path = "/api/v1/tokens",
    operation_id = "issue_token",
    tag = "tokens",
    description = "Issues a token of the caller's tenant (admin).",
    request_body = IssueRequest,
    responses((status = 201, description = "Issued", body = IssuedView))
)]
pub(super) async fn issue_token(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<IssuedView>), ApiError> {
    caller.require(Role::Admin, "tokens")?;
    let req: IssueRequest = parse_body(body, None)?;
    let role: Role = req
        .role
        .parse()
        .map_err(|e: String| ApiError::bad_request("invalid_role", e))?;
    let label = req.label.unwrap_or_default();
    let issued = app
        .tokens
        .issue(caller.tenant(), role, &label, app.engine.now())
        .await
        .map_err(|e| match e {
            IssueError::Invalid(message) => ApiError::bad_request("invalid_text", message),
            IssueError::Store(e) => e.into(),
        })?;
    app.auth.refreshed().await;
    Ok((
        StatusCode::CREATED,
        Json(IssuedView {
            token: issued.token,
            view: view(issued.record),
        }),
    ))
}

#[utoipa::path(
    get,
    path = "/api/v1/tokens",
    operation_id = "list_tokens",
    tag = "tokens",
    description = "The caller's tenant's tokens, revoked ones too (admin).",
    responses((status = 200, description = "The tokens, oldest first", body = TokenList))
)]
pub(super) async fn list_tokens(
    State(app): State<Arc<AppState>>,
    caller: Caller,
) -> Result<Json<TokenList>, ApiError> {
    caller.require(Role::Admin, "tokens")?;
    let tokens = app.tokens.list().await?;
    let tokens = tokens
        .into_iter()
        .filter(|t| t.tenant == caller.tenant())
        .map(view)
        .collect();
    Ok(Json(TokenList { tokens }))
}

#[utoipa::path(
    post,
    path = "/api/v1/tokens/{id}/revoke",
    operation_id = "revoke_token",
    tag = "tokens",
    description = "Revokes one of the caller's tenant's tokens (admin); it stops working on \
                   this coordinator at once and on others within their token refresh.",
    params(("id" = String, Path, description = "The token's id")),
    responses((status = 200, description = "Revoked", body = TokenView))
)]
pub(super) async fn revoke_token(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TokenView>, ApiError> {
    caller.require(Role::Admin, "tokens")?;
    let not_found = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no live token with that id",
        )
    };
    if id.len() != ID_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(not_found());
    }
    // Another tenant's token is not found: its id says nothing to this caller.
    let token = app
        .tokens
        .list()
        .await?
        .into_iter()
        .find(|t| t.id == id && t.tenant == caller.tenant() && t.revoked_at.is_none())
        .ok_or_else(not_found)?;
    let now = app.engine.now();
    if !app.tokens.revoke(&token.id, now).await? {
        return Err(not_found());
    }
    app.auth.refreshed().await;
    Ok(Json(view(TokenRecord {
        revoked_at: Some(now),
        ..token
    })))
}

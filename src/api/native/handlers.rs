//! The native API's handlers: each checks its request, asks the engine, and answers
//! with the views.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_types::ErrorView;

use super::requests::{
    ActionRequest, BranchSpec, CreateRequest, ListQuery, NewTransaction, RegisterRequest,
    check_create,
};
use super::views::{PageView, RegisterView, TryView, TxView, tx_view};
use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::validate::{
    DEFAULT_LIST_LIMIT, branch_urls, check_id, check_reason, check_url, decode_cursor, list_limit,
    parse_body, registration_error,
};
use crate::auth::Role;
use crate::core::{Access, Action, Branch, CallOutcome, Kind, Status};
use crate::engine::{ListFilter, NewPrepared, NewSaga};

// The `#[utoipa::path]` attributes describe each route's success answers; `api::openapi`
// adds the error answers (their codes) and the option ranges from the validation tables.

#[utoipa::path(
    post,
    path = "/api/v1/transactions",
    operation_id = "create",
    tag = "transactions",
    params(("Idempotency-Key" = Option<String>, Header, description = "The gid, when the body names none (the same rules as a gid); a body gid that differs is 400 idempotency_key_mismatch. A create with neither gets a generated gid and is not safe to retry.")),
    request_body = CreateRequest,
    responses(
        (status = 201, description = "Created", body = TxView),
        (status = 200, description = "A repeat of the same request: what is stored, its outcome known", body = TxView),
        (status = 202, description = "A repeat of the same request while the first's transaction is still being driven: what is stored now", body = TxView),
    )
)]
pub(super) async fn create(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let defaults = &app.engine.config().defaults;
    let key_header = idempotency_key(&headers)?;
    let checked = check_create(
        body,
        key_header.as_deref(),
        defaults,
        &app.limits,
        app.engine.now(),
    )?;
    let key = caller.key(&checked.gid);
    app.check_outbound(caller.tenant(), checked.new.urls())?;
    app.admit_create(caller.tenant(), &key).await?;
    let trace = crate::trace::from_headers(&headers);
    let outcome = match checked.new {
        NewTransaction::Saga(saga) => {
            let gid = key.clone();
            app.engine
                .create_saga(NewSaga { gid, trace, ..saga })
                .await?
        }
        NewTransaction::Prepared(prepared) => {
            let gid = key.clone();
            app.engine
                .create_prepared(NewPrepared {
                    gid,
                    trace,
                    ..prepared
                })
                .await?
        }
    };
    let stored = if checked.wait_result && checked.kind == Kind::Saga {
        app.engine.wait_settled(&key, app.wait_timeout).await?
    } else {
        outcome.stored
    };
    // A repeat answers what is stored now: 202 while the first request's transaction is
    // still being driven (its outcome is not known yet), 200 once it has one.
    let status = if outcome.created {
        StatusCode::CREATED
    } else if is_driven(stored.tx.status) {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(tx_view(&stored, None))).into_response())
}

#[utoipa::path(
    post,
    path = "/api/v1/transactions/{gid}/branches",
    operation_id = "register",
    tag = "transactions",
    params(("gid" = String, Path, description = "The transaction's gid")),
    request_body = RegisterRequest,
    responses(
        (status = 200, description = "Registered (and the Try, if given, succeeded)", body = RegisterView),
        (status = 409, description = "`try_failed`: the Try idem called refused", body = RegisterView),
        (status = 425, description = "`try_in_progress`", body = RegisterView),
        (status = 502, description = "`try_unknown`: the Try had no definite answer", body = RegisterView),
    )
)]
pub(super) async fn register(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let key = caller.key(&gid);
    let req: RegisterRequest = parse_body(body, None)?;
    let spec = BranchSpec {
        branch_id: req.branch_id.clone(),
        confirm: req.confirm,
        cancel: req.cancel,
        payload: req.payload,
    };
    let now = app.engine.now();
    let mut branches = spec.operations("", &app.limits, now)?.to_vec();
    if let Some(url) = &req.try_url {
        check_url("try", url)?;
        // The Confirm's text: the same payload.
        let payload = branches[0].payload.clone();
        branches.push(Branch::new(
            req.branch_id.as_str(),
            Action::Try,
            0,
            url.as_str(),
            payload,
            now,
        ));
    }
    app.check_outbound(caller.tenant(), branch_urls(&branches))?;
    app.engine
        .register(&key, branches, caller.access())
        .await
        .map_err(registration_error)?;
    let Some(_) = req.try_url else {
        let view = RegisterView {
            gid,
            branch_id: req.branch_id,
            try_outcome: None,
            error: None,
        };
        return Ok((StatusCode::OK, Json(view)).into_response());
    };
    let (outcome, _) = app.engine.call_try(&key, &req.branch_id).await?;
    let (status, code) = match &outcome {
        CallOutcome::Success => (StatusCode::OK, None),
        CallOutcome::Failure(_) => (StatusCode::CONFLICT, Some("try_failed")),
        CallOutcome::InProgress(_) => (StatusCode::TOO_EARLY, Some("try_in_progress")),
        CallOutcome::Unknown(_) => (StatusCode::BAD_GATEWAY, Some("try_unknown")),
    };
    let detail = outcome.detail().map(str::to_owned);
    let view = RegisterView {
        gid,
        branch_id: req.branch_id,
        error: code.map(|code| ErrorView {
            code: code.to_owned(),
            message: detail.clone().unwrap_or_default(),
        }),
        try_outcome: Some(TryView {
            outcome: outcome.label().to_owned(),
            detail,
        }),
    };
    Ok((status, Json(view)).into_response())
}

/// The `Idempotency-Key` header, which names the gid of a create whose body has none.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let text = value.to_str().map_err(|_| {
        ApiError::bad_request(
            "invalid_idempotency_key",
            "the Idempotency-Key header must be visible ASCII",
        )
    })?;
    Ok(Some(text.trim().to_owned()))
}

/// A status in which the coordinator is still calling participants.
fn is_driven(status: Status) -> bool {
    matches!(
        status,
        Status::Running | Status::Committing | Status::Aborting
    )
}

/// The four operations on one transaction, which share their request and answer.
#[derive(Clone, Copy)]
enum Operation {
    Submit,
    Abort,
    Retry,
    ForceStop,
}

async fn operate(
    app: &AppState,
    caller: Caller,
    gid: String,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
) -> Result<Json<TxView>, ApiError> {
    match operation {
        Operation::Retry => caller.require(Role::Operator, "retry")?,
        Operation::ForceStop => caller.require(Role::Operator, "force-stop")?,
        Operation::Submit | Operation::Abort => {}
    }
    check_id("gid", "invalid_gid", &gid)?;
    let gid = caller.key(&gid);
    let req: ActionRequest = parse_body(body, Some("{}"))?;
    check_reason("reason", req.reason.as_deref())?;
    let reason = |default: &str| req.reason.clone().unwrap_or_else(|| default.into());
    let engine = &app.engine;
    let stored = match operation {
        Operation::Submit => engine.submit(&gid, caller.access()).await?,
        Operation::Abort => {
            let reason = reason("aborted by the client");
            engine.abort(&gid, &reason, caller.access()).await?.0
        }
        Operation::Retry => engine.retry(&gid).await?,
        Operation::ForceStop => {
            let reason = reason("force-stopped by an operator");
            engine.force_stop(&gid, &reason).await?
        }
    };
    let stored = if req.wait_result {
        engine
            .wait_settled(&stored.tx.gid, app.wait_timeout)
            .await?
    } else {
        stored
    };
    Ok(Json(tx_view(&stored, None)))
}

#[utoipa::path(
    post,
    path = "/api/v1/transactions/{gid}/submit",
    operation_id = "submit",
    tag = "transactions",
    description = "Stores the commit decision.",
    params(("gid" = String, Path, description = "The transaction's gid")),
    request_body(content = ActionRequest, description = "Optional: an empty body is `{}`"),
    responses((status = 200, description = "The transaction after the operation", body = TxView))
)]
pub(super) async fn submit(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, caller, gid, body, Operation::Submit).await
}

#[utoipa::path(
    post,
    path = "/api/v1/transactions/{gid}/abort",
    operation_id = "abort",
    tag = "transactions",
    description = "Aborts.",
    params(("gid" = String, Path, description = "The transaction's gid")),
    request_body(content = ActionRequest, description = "Optional: an empty body is `{}`"),
    responses((status = 200, description = "The transaction after the operation", body = TxView))
)]
pub(super) async fn abort(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, caller, gid, body, Operation::Abort).await
}

#[utoipa::path(
    post,
    path = "/api/v1/transactions/{gid}/retry",
    operation_id = "retry",
    tag = "transactions",
    description = "An operator's retry of a stalled transaction.",
    params(("gid" = String, Path, description = "The transaction's gid")),
    request_body(content = ActionRequest, description = "Optional: an empty body is `{}`"),
    responses((status = 200, description = "The transaction after the operation", body = TxView))
)]
pub(super) async fn retry(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, caller, gid, body, Operation::Retry).await
}

#[utoipa::path(
    post,
    path = "/api/v1/transactions/{gid}/force-stop",
    operation_id = "force_stop",
    tag = "transactions",
    description = "An operator marks it failed; nothing more is called.",
    params(("gid" = String, Path, description = "The transaction's gid")),
    request_body(content = ActionRequest, description = "Optional: an empty body is `{}`"),
    responses((status = 200, description = "The transaction after the operation", body = TxView))
)]
pub(super) async fn force_stop(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, caller, gid, body, Operation::ForceStop).await
}

#[utoipa::path(
    get,
    path = "/api/v1/transactions/{gid}",
    operation_id = "show",
    tag = "transactions",
    params(("gid" = String, Path, description = "The transaction's gid")),
    responses((status = 200, description = "The transaction with the newest of its history of calls (at most 100; `GET .../attempts` pages through the rest kept)", body = TxView))
)]
pub(super) async fn show(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(gid): Path<String>,
) -> Result<Json<TxView>, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let gid = caller.key(&gid);
    Ok(Json(app.reads().view(&gid).await?))
}

#[utoipa::path(
    get,
    path = "/api/v1/transactions",
    operation_id = "list",
    tag = "transactions",
    params(ListQuery),
    responses((status = 200, description = "A page, newest first", body = PageView))
)]
pub(super) async fn list(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<PageView>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let status = q
        .status
        .map(|s| s.parse::<Status>())
        .transpose()
        .map_err(|e| ApiError::bad_request("invalid_query", e.to_string()))?;
    let kind = q
        .kind
        .map(|s| s.parse::<Kind>())
        .transpose()
        .map_err(|e| ApiError::bad_request("invalid_query", e.to_string()))?;
    let after = q
        .cursor
        .map(|c| decode_cursor("cursor", &c))
        .transpose()?
        .map(|(at, gid)| (at, caller.key(&gid)));
    let limit = list_limit("limit", q.limit, DEFAULT_LIST_LIMIT)?;
    let filter = ListFilter {
        tenant: Some(caller.tenant().to_owned()),
        tokenless_only: caller.access() == Access::Tokenless,
        statuses: status.into_iter().collect(),
        kind,
        created_from: q.created_from,
        created_to: q.created_to,
        after,
        limit,
        oldest_first: false,
    };
    Ok(Json(app.reads().page(&filter).await?))
}

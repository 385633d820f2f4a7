//! The native API's handlers: each checks its request, asks the engine, and answers
//! with the views.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::requests::{
    ActionRequest, BranchSpec, CreateRequest, ListQuery, RegisterRequest, identity, payload_text,
};
use super::views::{PageView, TxView, page_view, tx_view};
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::validate::{
    DEFAULT_LIST_LIMIT, check_branch_count, check_id, check_payload, check_reason, check_url,
    decode_cursor, list_limit, parse_body, registration_error,
};
use crate::core::{Action, Branch, CallOutcome, Kind, SagaStep, Status};
use crate::engine::{NewPrepared, NewSaga};
use crate::store::ListFilter;

pub(super) async fn create(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let trace = crate::trace::from_headers(&headers);
    let (req, raw): (CreateRequest, Value) = parse_body(body, None)?;
    let kind: Kind = req.kind.parse().map_err(|_| {
        ApiError::bad_request(
            "unknown_kind",
            format!(
                "kind must be \"tcc\", \"saga\" or \"msg\" (got {:?})",
                req.kind
            ),
        )
    })?;
    let gid = match req.gid {
        Some(gid) => {
            check_id("gid", "invalid_gid", &gid)?;
            gid
        }
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let mut request = identity(raw);
    if let Value::Object(map) = &mut request {
        map.insert("gid".into(), Value::String(gid.clone()));
    }
    let defaults = &app.engine.config().defaults;
    let outcome = match kind {
        Kind::Saga => {
            if req.steps.is_empty() {
                return Err(ApiError::bad_request(
                    "empty_steps",
                    "a saga needs at least one step",
                ));
            }
            if !req.branches.is_empty() {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    "a saga takes steps, not branches",
                ));
            }
            if req.query_prepared.is_some() {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    "query_prepared is for msg transactions",
                ));
            }
            check_branch_count("steps", req.steps.len(), app.max_branches)?;
            let mut steps = Vec::new();
            for (i, s) in req.steps.iter().enumerate() {
                check_url(&format!("steps[{i}].action"), &s.action)?;
                let compensate = s.compensate.as_deref().ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_request",
                        format!("steps[{i}].compensate is required for a saga"),
                    )
                })?;
                check_url(&format!("steps[{i}].compensate"), compensate)?;
                let payload = payload_text(&s.payload);
                check_payload(&format!("steps[{i}].payload"), &payload)?;
                steps.push(SagaStep {
                    action: s.action.clone(),
                    compensate: compensate.to_owned(),
                    payload,
                });
            }
            let options = req.options.resolve(defaults, steps.len())?;
            app.engine
                .create_saga(NewSaga {
                    gid: gid.clone(),
                    steps,
                    options,
                    request,
                    trace,
                })
                .await?
        }
        Kind::Tcc | Kind::Msg => {
            if kind == Kind::Tcc && !req.steps.is_empty() {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    "a TCC transaction takes branches, not steps",
                ));
            }
            if kind == Kind::Msg && !req.branches.is_empty() {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    "a msg takes steps, not branches",
                ));
            }
            check_branch_count("branches", req.branches.len(), app.max_branches)?;
            check_branch_count("steps", req.steps.len(), app.max_branches)?;
            let now = app.engine.now();
            let mut branches = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            for spec in &req.branches {
                if !seen.insert(spec.branch_id.as_str()) {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        format!("branch {:?} is listed twice", spec.branch_id),
                    ));
                }
                branches.extend(spec.operations(now)?);
            }
            if kind == Kind::Msg && req.steps.is_empty() {
                return Err(ApiError::bad_request(
                    "empty_steps",
                    "a msg needs at least one step",
                ));
            }
            let mut msg_steps = Vec::new();
            for (i, s) in req.steps.iter().enumerate() {
                check_url(&format!("steps[{i}].action"), &s.action)?;
                if s.compensate.is_some() {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        "msg steps have no compensate",
                    ));
                }
                let payload = payload_text(&s.payload);
                check_payload(&format!("steps[{i}].payload"), &payload)?;
                msg_steps.push((s.action.clone(), payload));
            }
            if let Some(url) = &req.query_prepared {
                check_url("query_prepared", url)?;
            }
            let options = req.options.resolve(defaults, req.steps.len())?;
            app.engine
                .create_prepared(NewPrepared {
                    gid: gid.clone(),
                    kind,
                    options,
                    msg_steps,
                    query_prepared: req.query_prepared,
                    branches,
                    request,
                    trace,
                })
                .await?
        }
    };
    let stored = if req.wait_result && kind == Kind::Saga {
        app.engine.wait_settled(&gid, app.wait_timeout).await?
    } else {
        outcome.stored
    };
    let status = if outcome.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(tx_view(&stored, None))).into_response())
}

pub(super) async fn register(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let (req, _): (RegisterRequest, Value) = parse_body(body, None)?;
    let spec = BranchSpec {
        branch_id: req.branch_id.clone(),
        confirm: req.confirm,
        cancel: req.cancel,
        payload: req.payload,
    };
    let now = app.engine.now();
    let mut branches = spec.operations(now)?.to_vec();
    if let Some(url) = &req.try_url {
        check_url("try", url)?;
        let payload = payload_text(&spec.payload);
        branches.push(Branch::new(
            &req.branch_id,
            Action::Try,
            0,
            url,
            &payload,
            now,
        ));
    }
    app.engine
        .register(&gid, branches)
        .await
        .map_err(registration_error)?;
    let Some(_) = req.try_url else {
        return Ok((
            StatusCode::OK,
            Json(serde_json::json!({"gid": gid, "branch_id": req.branch_id})),
        )
            .into_response());
    };
    let (outcome, _) = app.engine.call_try(&gid, &req.branch_id).await?;
    let (status, code) = match &outcome {
        CallOutcome::Success => (StatusCode::OK, None),
        CallOutcome::Failure(_) => (StatusCode::CONFLICT, Some("try_failed")),
        CallOutcome::InProgress(_) => (StatusCode::TOO_EARLY, Some("try_in_progress")),
        CallOutcome::Unknown(_) => (StatusCode::BAD_GATEWAY, Some("try_unknown")),
    };
    let body = serde_json::json!({
        "gid": gid,
        "branch_id": req.branch_id,
        "try": {"outcome": outcome.label(), "detail": outcome.detail()},
        "error": code.map(|c| serde_json::json!({"code": c, "message": outcome.detail()})),
    });
    Ok((status, Json(body)).into_response())
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
    gid: String,
    body: Result<Bytes, BytesRejection>,
    operation: Operation,
) -> Result<Json<TxView>, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let (req, _): (ActionRequest, Value) = parse_body(body, Some("{}"))?;
    check_reason("reason", req.reason.as_deref())?;
    let reason = |default: &str| req.reason.clone().unwrap_or_else(|| default.into());
    let engine = &app.engine;
    let stored = match operation {
        Operation::Submit => engine.submit(&gid).await?,
        Operation::Abort => engine.abort(&gid, &reason("aborted by the client")).await?,
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

pub(super) async fn submit(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Submit).await
}

pub(super) async fn abort(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Abort).await
}

pub(super) async fn retry(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Retry).await
}

pub(super) async fn force_stop(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::ForceStop).await
}

pub(super) async fn show(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
) -> Result<Json<TxView>, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let stored = app.engine.load(&gid).await?;
    let history = app.engine.history(&gid).await?;
    Ok(Json(tx_view(&stored, Some(history))))
}

pub(super) async fn list(
    State(app): State<Arc<AppState>>,
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
    let after = q.cursor.map(|c| decode_cursor("cursor", &c)).transpose()?;
    let limit = list_limit("limit", q.limit, DEFAULT_LIST_LIMIT)?;
    let filter = ListFilter {
        statuses: status.into_iter().collect(),
        kind,
        created_from: q.created_from,
        created_to: q.created_to,
        after,
        limit,
    };
    let page = app.engine.list(&filter).await?;
    Ok(Json(page_view(&page)))
}

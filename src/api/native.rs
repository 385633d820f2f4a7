//! idem's own HTTP API, under `/api/v1`. Documented in `docs/api.md`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use super::AppState;
use super::error::ApiError;
use super::validate::{
    Given, Overrides, Unit, check_branch_count, check_id, check_payload, check_reason, check_url,
    decode_cursor, parse_body, parse_orders, registration_error,
};
use crate::core::{
    Action, Branch, BranchStatus, CallOutcome, Kind, Millis, SagaStep, Status, Transaction,
    TxOptions,
};
use crate::engine::{NewPrepared, NewSaga};
use crate::store::{AttemptRecord, ListFilter, Page, StoredTx};

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

// ---- requests --------------------------------------------------------------------------

/// Options a request may set; anything unset takes the server default. Numbers are kept
/// as sent so that the shared checks judge them (see `validate`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptionsRequest {
    pub request_timeout_ms: Option<Number>,
    pub retry_interval_ms: Option<Number>,
    pub max_retry_interval_ms: Option<Number>,
    pub max_attempts: Option<Number>,
    pub max_in_progress_ms: Option<Number>,
    pub timeout_ms: Option<Number>,
    #[serde(default)]
    pub branch_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub concurrent: bool,
    #[serde(default)]
    pub orders: BTreeMap<String, Vec<usize>>,
}

impl OptionsRequest {
    /// Resolves against the defaults, checking ranges.
    pub fn resolve(self, defaults: &TxOptions, steps: usize) -> Result<TxOptions, ApiError> {
        let given =
            |field, unit, value: Option<Number>| value.map(|value| Given { field, unit, value });
        let overrides = Overrides {
            request_timeout: given("request_timeout_ms", Unit::Millis, self.request_timeout_ms),
            retry_interval: given("retry_interval_ms", Unit::Millis, self.retry_interval_ms),
            max_retry_interval: given(
                "max_retry_interval_ms",
                Unit::Millis,
                self.max_retry_interval_ms,
            ),
            max_attempts: given("max_attempts", Unit::Count, self.max_attempts),
            max_in_progress: given("max_in_progress_ms", Unit::Millis, self.max_in_progress_ms),
            timeout: given("timeout_ms", Unit::Millis, self.timeout_ms),
            branch_headers: self.branch_headers,
        };
        let mut o = overrides.apply(defaults.clone())?;
        o.concurrent = self.concurrent;
        o.orders = parse_orders(self.orders, steps)
            .map_err(|m| ApiError::bad_request("invalid_options", m))?;
        Ok(o)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepRequest {
    action: String,
    compensate: Option<String>,
    #[serde(default)]
    payload: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    gid: Option<String>,
    kind: String,
    #[serde(default)]
    steps: Vec<StepRequest>,
    #[serde(default)]
    options: OptionsRequest,
    query_prepared: Option<String>,
    /// TCC: branches to register with the transaction, in one request.
    #[serde(default)]
    branches: Vec<BranchSpec>,
    #[serde(default)]
    wait_result: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BranchSpec {
    branch_id: String,
    confirm: String,
    cancel: String,
    #[serde(default)]
    payload: Value,
}

impl BranchSpec {
    /// Checks the fields and builds the Confirm and Cancel operations.
    fn operations(&self, now: Millis) -> Result<[Branch; 2], ApiError> {
        check_id("branch_id", "invalid_branch_id", &self.branch_id)?;
        check_url("confirm", &self.confirm)?;
        check_url("cancel", &self.cancel)?;
        let payload = payload_text(&self.payload);
        check_payload("payload", &payload)?;
        // TCC branches have no order among them: Confirms (or Cancels) all go out together.
        Ok([
            Branch::new(
                &self.branch_id,
                Action::Confirm,
                0,
                &self.confirm,
                &payload,
                now,
            ),
            Branch::new(
                &self.branch_id,
                Action::Cancel,
                0,
                &self.cancel,
                &payload,
                now,
            ),
        ])
    }
}

/// The body sent to a participant: the payload's JSON text; null means an empty body.
fn payload_text(payload: &Value) -> String {
    match payload {
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The part of a request that makes its identity: `wait_result` changes how the answer
/// is given, not what is asked, so it is left out of the hash.
fn identity(mut request: Value) -> Value {
    if let Value::Object(map) = &mut request {
        map.remove("wait_result");
    }
    request
}

async fn create(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
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
    Ok((status, Json(TxView::new(&stored, None))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterRequest {
    branch_id: String,
    confirm: String,
    cancel: String,
    #[serde(rename = "try")]
    try_url: Option<String>,
    #[serde(default)]
    payload: Value,
}

async fn register(
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionRequest {
    #[serde(default)]
    wait_result: bool,
    reason: Option<String>,
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
    Ok(Json(TxView::new(&stored, None)))
}

async fn submit(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Submit).await
}

async fn abort(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Abort).await
}

async fn retry(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::Retry).await
}

async fn force_stop(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TxView>, ApiError> {
    operate(&app, gid, body, Operation::ForceStop).await
}

async fn show(
    State(app): State<Arc<AppState>>,
    Path(gid): Path<String>,
) -> Result<Json<TxView>, ApiError> {
    check_id("gid", "invalid_gid", &gid)?;
    let stored = app.engine.load(&gid).await?;
    let history = app.engine.history(&gid).await?;
    Ok(Json(TxView::new(&stored, Some(history))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    kind: Option<String>,
    created_from: Option<Millis>,
    created_to: Option<Millis>,
    cursor: Option<String>,
    limit: Option<u32>,
}

async fn list(
    State(app): State<Arc<AppState>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
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
    let limit = q.limit.unwrap_or(50);
    if !(1..=1_000).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_query",
            "limit must be 1..=1000",
        ));
    }
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

/// A page of the list as the API answers it; `idem tx list --database-url` prints the same.
pub fn page_view(page: &Page) -> Value {
    let items: Vec<TxView> = page.items.iter().map(|s| TxView::new(s, None)).collect();
    serde_json::json!({
        "transactions": items,
        "next_cursor": page.next.as_ref().map(|(at, gid)| format!("{at}:{gid}")),
    })
}

// ---- views -----------------------------------------------------------------------------

/// A transaction as the API shows it.
#[derive(Debug, Serialize)]
pub struct TxView {
    pub gid: String,
    pub kind: Kind,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_from: Option<Status>,
    pub reason: Option<String>,
    pub last_error: Option<String>,
    /// Failed branch calls so far.
    pub attempts: i32,
    pub timeout_at: Option<Millis>,
    pub next_attempt_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    pub options: TxOptions,
    pub branches: Vec<BranchView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<AttemptRecord>>,
}

#[derive(Debug, Serialize)]
pub struct BranchView {
    pub branch_id: String,
    pub action: Action,
    pub url: String,
    pub payload: String,
    pub status: BranchStatus,
    pub attempts: i32,
    pub next_attempt_at: Option<Millis>,
    pub last_error: Option<String>,
    /// When it first answered "in progress" in its current run of such answers.
    pub in_progress_since: Option<Millis>,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
}

impl TxView {
    pub fn new(stored: &StoredTx, history: Option<Vec<AttemptRecord>>) -> TxView {
        let tx: &Transaction = &stored.tx;
        TxView {
            gid: tx.gid.clone(),
            kind: tx.kind,
            status: tx.status,
            stalled_from: tx.stalled_from,
            reason: tx.reason.clone(),
            last_error: tx.last_error.clone(),
            attempts: tx.attempts,
            timeout_at: tx.timeout_at,
            next_attempt_at: tx.next_attempt_at,
            created_at: tx.created_at,
            updated_at: tx.updated_at,
            finished_at: tx.finished_at,
            options: tx.options.clone(),
            branches: tx
                .branches
                .iter()
                .map(|b| BranchView {
                    branch_id: b.branch_id.clone(),
                    action: b.action,
                    url: b.url.clone(),
                    payload: b.payload.clone(),
                    status: b.status,
                    attempts: b.attempts,
                    next_attempt_at: b.next_attempt_at,
                    last_error: b.last_error.clone(),
                    in_progress_since: b.in_progress_since,
                    updated_at: b.updated_at,
                    finished_at: b.finished_at,
                })
                .collect(),
            history,
        }
    }
}

/// How long `wait_result` waits by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_result_is_not_part_of_the_identity() {
        let a = identity(serde_json::json!({"gid": "g", "wait_result": true}));
        let b = identity(serde_json::json!({"gid": "g"}));
        assert_eq!(a, b);
    }
}

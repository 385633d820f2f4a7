//! DTM's HTTP API (`/api/dtmsvr/...`), served by the same engine, so that DTM's client
//! SDKs drive idem by changing one URL.
//!
//! Shapes follow dtm-labs/dtm (v1.19): request bodies are DTM's `TransGlobal` JSON, answers
//! use its envelope (`{"dtm_result":"SUCCESS"}`, 409 `FAILURE`, 425 `ONGOING`). Where idem
//! deliberately differs it is stricter, never looser: a client mistake is a 4xx with a
//! message (DTM answers 500 or panics), a gid reused with a different body is a 409, and
//! retries are capped and end in `stalled`. The list is in README.md, "Coming from DTM".

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Number, Value, json};

use super::AppState;
use super::error::ApiError;
use super::validate::{
    Given, MAX_CUSTOM_DATA_LEN, Overrides, Unit, check_branch_count, check_id, check_payload,
    check_reason, check_text, check_url, decode_cursor, parse_body, parse_orders,
    registration_error,
};
use crate::core::{
    Action, Branch, BranchStatus, Kind, Millis, Protocol, SagaStep, Status, TxOptions,
};
use crate::engine::{EngineError, NewPrepared, NewSaga};
use crate::store::{ListFilter, StoredTx};
use crate::timestamp::rfc3339;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/api/ping", any(ping))
        .route("/api/dtmsvr/version", get(version))
        .route("/api/dtmsvr/newGid", get(new_gid))
        .route("/api/dtmsvr/prepare", post(prepare))
        .route("/api/dtmsvr/submit", post(submit))
        .route("/api/dtmsvr/abort", post(abort))
        .route("/api/dtmsvr/forceStop", post(force_stop))
        .route("/api/dtmsvr/registerBranch", post(register_branch))
        .route("/api/dtmsvr/registerTccBranch", post(register_branch))
        .route("/api/dtmsvr/registerXaBranch", post(register_xa))
        .route("/api/dtmsvr/query", get(query))
        .route("/api/dtmsvr/all", get(all))
}

// ---- envelope --------------------------------------------------------------------------

/// An answer in DTM's envelope.
pub struct DtmResponse(StatusCode, Value);

impl IntoResponse for DtmResponse {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

fn success() -> DtmResponse {
    DtmResponse(StatusCode::OK, json!({"dtm_result": "SUCCESS"}))
}

fn failure(message: impl Into<String>) -> DtmResponse {
    DtmResponse(
        StatusCode::CONFLICT,
        json!({"dtm_result": "FAILURE", "message": message.into()}),
    )
}

fn ongoing(message: impl Into<String>) -> DtmResponse {
    DtmResponse(
        StatusCode::TOO_EARLY,
        json!({"dtm_result": "ONGOING", "message": message.into()}),
    )
}

/// An error in DTM's envelope. 409 and 425 carry `dtm_result`, since DTM clients read it;
/// other client mistakes must not (a body containing `FAILURE` reads as a business
/// failure to them), and carry idem's error code instead.
pub struct DtmError(ApiError);

impl From<ApiError> for DtmError {
    fn from(e: ApiError) -> Self {
        DtmError(e)
    }
}

impl From<EngineError> for DtmError {
    fn from(e: EngineError) -> Self {
        DtmError(ApiError::from(e))
    }
}

impl IntoResponse for DtmError {
    fn into_response(self) -> Response {
        let e = self.0;
        let error = json!({"code": e.code, "message": e.message});
        let body = match e.status {
            StatusCode::CONFLICT => {
                json!({"dtm_result": "FAILURE", "message": e.message, "error": error})
            }
            StatusCode::TOO_EARLY => {
                json!({"dtm_result": "ONGOING", "message": e.message, "error": error})
            }
            _ => json!({"message": e.message, "error": error}),
        };
        e.attach_detail((e.status, Json(body)).into_response())
    }
}

type DtmResult = Result<DtmResponse, DtmError>;

// ---- requests --------------------------------------------------------------------------

/// DTM's `TransGlobal` as clients send it. Every field may be absent or `null`; unknown
/// keys (such as the obsolete `passthrough_headers`) are ignored.
#[derive(Debug, Default, Deserialize)]
struct TransRequest {
    gid: Option<String>,
    trans_type: Option<String>,
    steps: Option<Vec<BTreeMap<String, Option<String>>>>,
    payloads: Option<Vec<Option<String>>>,
    custom_data: Option<String>,
    wait_result: Option<bool>,
    /// Seconds. Numbers are kept as sent so that the shared checks judge them.
    timeout_to_fail: Option<Number>,
    /// Seconds.
    request_timeout: Option<Number>,
    /// Seconds.
    retry_interval: Option<Number>,
    retry_limit: Option<Number>,
    branch_headers: Option<BTreeMap<String, String>>,
    query_prepared: Option<String>,
    rollback_reason: Option<String>,
}

/// What of a request makes its identity (hashed to recognise a repeat): the fields that
/// change what happens, with DTM's "zero means unset" applied, so `null`, `0` and absence
/// hash alike.
#[derive(Debug, Serialize)]
struct Identity<'a> {
    gid: &'a str,
    trans_type: &'a str,
    steps: Vec<(String, String, String)>,
    custom_data: Option<&'a str>,
    timeout_to_fail: Option<Number>,
    request_timeout: Option<Number>,
    retry_interval: Option<Number>,
    retry_limit: Option<Number>,
    branch_headers: BTreeMap<String, String>,
    query_prepared: Option<&'a str>,
}

/// A parsed and checked request.
struct Trans {
    gid: String,
    kind: Kind,
    /// (action, compensate, payload) per step.
    steps: Vec<(String, String, String)>,
    options: TxOptions,
    query_prepared: Option<String>,
    wait_result: bool,
    reason: Option<String>,
    identity: Value,
}

/// DTM's convention: an integer of 0 or below means "not set". Anything else, fractions
/// included, goes to the shared checks.
fn positive(v: &Option<Number>) -> Option<Number> {
    v.clone().filter(|n| n.as_i64().is_none_or(|v| v > 0))
}

fn parse(body: Result<Bytes, BytesRejection>, app: &AppState) -> Result<Trans, DtmError> {
    let defaults = &app.engine.config().defaults;
    let (req, _): (TransRequest, Value) = parse_body(body, None)?;
    let gid = req
        .gid
        .clone()
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "gid is required"))?;
    check_id("gid", "invalid_gid", &gid)?;
    let trans_type = req.trans_type.clone().unwrap_or_default();
    let kind = match trans_type.as_str() {
        "saga" => Kind::Saga,
        "tcc" => Kind::Tcc,
        "msg" => Kind::Msg,
        "xa" | "workflow" => {
            return Err(ApiError::bad_request(
                "unsupported",
                format!(
                    "trans_type {trans_type:?} is not supported by idem (saga, tcc and msg are)"
                ),
            )
            .into());
        }
        "" => return Err(ApiError::bad_request("unknown_kind", "trans_type is required").into()),
        other => {
            return Err(ApiError::bad_request(
                "unknown_kind",
                format!("trans_type must be saga, tcc or msg (got {other:?})"),
            )
            .into());
        }
    };

    let raw_steps = req.steps.clone().unwrap_or_default();
    check_branch_count("steps", raw_steps.len(), app.max_branches)?;
    let payloads = req.payloads.clone().unwrap_or_default();
    let mut steps = Vec::with_capacity(raw_steps.len());
    for (i, step) in raw_steps.iter().enumerate() {
        let field = |name: &str| step.get(name).cloned().flatten().unwrap_or_default();
        let action = field("action");
        check_url(&format!("steps[{i}].action"), &action)?;
        let compensate = field("compensate");
        if kind == Kind::Saga {
            check_url(&format!("steps[{i}].compensate"), &compensate)?;
        }
        // `payloads[i]` is the body; DTM's legacy `steps[i].data` is accepted too.
        let payload = payloads
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| field("data"));
        check_payload(&format!("payloads[{i}]"), &payload)?;
        steps.push((action, compensate, payload));
    }
    if let Some(url) = &req.query_prepared
        && !url.is_empty()
    {
        check_url("query_prepared", url)?;
    }

    let given = |field, unit, value: &Option<Number>| {
        positive(value).map(|value| Given { field, unit, value })
    };
    let overrides = Overrides {
        timeout: given("timeout_to_fail", Unit::Seconds, &req.timeout_to_fail),
        request_timeout: given("request_timeout", Unit::Seconds, &req.request_timeout),
        retry_interval: given("retry_interval", Unit::Seconds, &req.retry_interval),
        max_attempts: given("retry_limit", Unit::Count, &req.retry_limit),
        branch_headers: req.branch_headers.clone().unwrap_or_default(),
        ..Overrides::default()
    };
    let dtm_defaults = TxOptions {
        protocol: Protocol::Dtm,
        ..defaults.clone()
    };
    let mut options = overrides.apply(dtm_defaults)?;
    if let Some(custom) = req.custom_data.as_deref().filter(|c| !c.is_empty()) {
        check_text("custom_data", custom, MAX_CUSTOM_DATA_LEN)?;
        apply_custom_data(kind, custom, steps.len(), &mut options)?;
    }

    let identity = serde_json::to_value(Identity {
        gid: &gid,
        trans_type: &trans_type,
        steps: steps.clone(),
        custom_data: req.custom_data.as_deref().filter(|c| !c.is_empty()),
        timeout_to_fail: positive(&req.timeout_to_fail),
        request_timeout: positive(&req.request_timeout),
        retry_interval: positive(&req.retry_interval),
        retry_limit: positive(&req.retry_limit),
        branch_headers: req.branch_headers.clone().unwrap_or_default(),
        query_prepared: req.query_prepared.as_deref().filter(|q| !q.is_empty()),
    })
    .expect("serialisable");
    Ok(Trans {
        gid,
        kind,
        steps,
        options,
        query_prepared: req.query_prepared.filter(|q| !q.is_empty()),
        wait_result: req.wait_result.unwrap_or(false),
        reason: req.rollback_reason,
        identity,
    })
}

/// `custom_data` is a JSON string. Saga: `{"orders": {"1": [0]}, "concurrent": true}`
/// (0-based step indexes). Msg: `{"delay": seconds}` is not supported.
fn apply_custom_data(
    kind: Kind,
    custom: &str,
    steps: usize,
    options: &mut TxOptions,
) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    struct Custom {
        #[serde(default)]
        orders: BTreeMap<String, Vec<usize>>,
        #[serde(default)]
        concurrent: bool,
        delay: Option<i64>,
    }
    let bad = |m: String| ApiError::bad_request("invalid_custom_data", m);
    let custom: Custom = serde_json::from_str(custom)
        .map_err(|e| bad(format!("custom_data is not the JSON idem expects: {e}")))?;
    if custom.delay.is_some_and(|d| d > 0) {
        return Err(bad(
            "custom_data.delay (delayed messages) is not supported".into()
        ));
    }
    if kind == Kind::Saga {
        options.concurrent = custom.concurrent;
        options.orders = parse_orders(custom.orders, steps).map_err(bad)?;
    }
    Ok(())
}

// ---- handlers --------------------------------------------------------------------------

async fn ping() -> Json<Value> {
    Json(json!({"msg": "pong"}))
}

async fn version() -> Json<Value> {
    Json(json!({"version": concat!("idem-", env!("CARGO_PKG_VERSION"))}))
}

async fn new_gid() -> Json<Value> {
    Json(json!({"gid": uuid::Uuid::new_v4().simple().to_string(), "dtm_result": "SUCCESS"}))
}

async fn prepare(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> DtmResult {
    let t = parse(body, &app)?;
    if t.kind == Kind::Saga {
        return Err(ApiError::bad_request(
            "invalid_request",
            "prepare is for tcc and msg; submit a saga directly",
        )
        .into());
    }
    let outcome = create_prepared(&app, &t).await?;
    if outcome.tx.status != Status::Prepared {
        return Ok(failure(format!(
            "current status '{}', cannot prepare",
            dtm_status(outcome.tx.status)
        )));
    }
    Ok(success())
}

async fn create_prepared(app: &AppState, t: &Trans) -> Result<StoredTx, DtmError> {
    if t.kind == Kind::Msg && t.steps.is_empty() {
        return Err(ApiError::bad_request("empty_steps", "a msg needs at least one step").into());
    }
    let created = app
        .engine
        .create_prepared(NewPrepared {
            gid: t.gid.clone(),
            kind: t.kind,
            options: t.options.clone(),
            msg_steps: t
                .steps
                .iter()
                .map(|(a, _, p)| (a.clone(), p.clone()))
                .collect(),
            query_prepared: t.query_prepared.clone(),
            branches: Vec::new(),
            request: t.identity.clone(),
        })
        .await?;
    Ok(created.stored)
}

async fn submit(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> DtmResult {
    let t = parse(body, &app)?;
    match t.kind {
        Kind::Saga => {
            if t.steps.is_empty() {
                return Err(
                    ApiError::bad_request("empty_steps", "a saga needs at least one step").into(),
                );
            }
            let steps = t
                .steps
                .iter()
                .map(|(action, compensate, payload)| SagaStep {
                    action: action.clone(),
                    compensate: compensate.clone(),
                    payload: payload.clone(),
                })
                .collect();
            app.engine
                .create_saga(NewSaga {
                    gid: t.gid.clone(),
                    steps,
                    options: t.options.clone(),
                    request: t.identity.clone(),
                })
                .await?;
        }
        Kind::Tcc => {
            app.engine.submit(&t.gid).await?;
        }
        Kind::Msg => {
            // DTM lets a msg be submitted without a prepare; then this creates it.
            create_prepared(&app, &t).await?;
            app.engine.submit(&t.gid).await?;
        }
    }
    finish(&app, &t).await
}

async fn abort(State(app): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> DtmResult {
    let t = parse(body, &app)?;
    check_reason("rollback_reason", t.reason.as_deref())?;
    let reason = t
        .reason
        .clone()
        .unwrap_or_else(|| "aborted by the client".into());
    app.engine.abort(&t.gid, &reason).await?;
    finish(&app, &t).await
}

/// With `wait_result`, answers with the outcome: SUCCESS once succeeded, FAILURE (with
/// the reason) once failed, ONGOING if it is still going or stalled when the wait ends.
async fn finish(app: &AppState, t: &Trans) -> DtmResult {
    if !t.wait_result {
        return Ok(success());
    }
    let stored = app.engine.wait_settled(&t.gid, app.wait_timeout).await?;
    Ok(match stored.tx.status {
        Status::Succeeded => success(),
        Status::Failed => failure(stored.tx.reason.unwrap_or_else(|| "failed".into())),
        other => ongoing(format!(
            "the transaction is {other}{}",
            stored
                .tx
                .last_error
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        )),
    })
}

#[derive(Debug, Deserialize)]
struct GidOnly {
    gid: Option<String>,
    rollback_reason: Option<String>,
}

async fn force_stop(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> DtmResult {
    let (req, _): (GidOnly, Value) = parse_body(body, None)?;
    let gid = req
        .gid
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "gid is required"))?;
    check_id("gid", "invalid_gid", &gid)?;
    check_reason("rollback_reason", req.rollback_reason.as_deref())?;
    let reason = req
        .rollback_reason
        .unwrap_or_else(|| "force-stopped".into());
    app.engine.force_stop(&gid, &reason).await?;
    Ok(success())
}

async fn register_xa() -> DtmError {
    DtmError(ApiError::bad_request(
        "unsupported",
        "XA is not supported by idem; use TCC or saga",
    ))
}

async fn register_branch(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> DtmResult {
    let (fields, _): (BTreeMap<String, Value>, Value) = parse_body(body, None)?;
    // DTM binds this body into map[string]string: every value must be a string.
    let mut data = BTreeMap::new();
    for (key, value) in fields {
        match value {
            Value::String(s) => {
                data.insert(key, s);
            }
            Value::Null => {}
            other => {
                return Err(ApiError::bad_request(
                    "invalid_json",
                    format!("registerBranch takes string values; {key} is {other}"),
                )
                .into());
            }
        }
    }
    let get = |k: &str| data.get(k).cloned().unwrap_or_default();
    let gid = get("gid");
    if gid.is_empty() {
        return Err(ApiError::bad_request("missing_gid", "gid is required").into());
    }
    check_id("gid", "invalid_gid", &gid)?;
    let branch_id = get("branch_id");
    check_id("branch_id", "invalid_branch_id", &branch_id)?;
    match get("trans_type").as_str() {
        "tcc" => {}
        "xa" => return Err(register_xa().await),
        other => {
            return Err(ApiError::bad_request(
                "unknown_kind",
                format!("registerBranch takes trans_type tcc (got {other:?})"),
            )
            .into());
        }
    }
    let (confirm, cancel) = (get("confirm"), get("cancel"));
    check_url("confirm", &confirm)?;
    check_url("cancel", &cancel)?;
    let payload = get("data");
    check_payload("data", &payload)?;
    let now = app.engine.now();
    let branches = vec![
        Branch::new(&branch_id, Action::Confirm, 0, confirm, &payload, now),
        Branch::new(&branch_id, Action::Cancel, 0, cancel, &payload, now),
    ];
    match app.engine.register(&gid, branches).await {
        Ok(()) => Ok(success()),
        Err(EngineError::NotPrepared(status)) => Ok(failure(format!(
            "no trans with gid: {gid} status: prepared found (it is {})",
            dtm_status(status)
        ))),
        Err(e) => Err(registration_error(e).into()),
    }
}

#[derive(Debug, Deserialize)]
struct QueryParams {
    gid: Option<String>,
}

async fn query(
    State(app): State<Arc<AppState>>,
    params: Result<Query<QueryParams>, QueryRejection>,
) -> DtmResult {
    let Query(params) =
        params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let gid = params
        .gid
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "no gid specified"))?;
    check_id("gid", "invalid_gid", &gid)?;
    let Some(stored) = app.engine.find(&gid).await? else {
        return Ok(DtmResponse(
            StatusCode::OK,
            json!({"transaction": null, "branches": []}),
        ));
    };
    let branches: Vec<Value> = stored
        .tx
        .branches
        .iter()
        .filter(|b| b.action != Action::QueryPrepared)
        .map(|b| branch_view(&stored.tx.gid, b))
        .collect();
    Ok(DtmResponse(
        StatusCode::OK,
        json!({"transaction": global_view(&stored), "branches": branches}),
    ))
}

#[derive(Debug, Deserialize)]
struct AllParams {
    position: Option<String>,
    limit: Option<u32>,
    status: Option<String>,
    #[serde(rename = "transType")]
    trans_type: Option<String>,
    #[serde(rename = "createTimeStart")]
    create_time_start: Option<Millis>,
    #[serde(rename = "createTimeEnd")]
    create_time_end: Option<Millis>,
}

async fn all(
    State(app): State<Arc<AppState>>,
    params: Result<Query<AllParams>, QueryRejection>,
) -> DtmResult {
    let Query(p) = params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let statuses = p
        .status
        .filter(|s| !s.is_empty())
        .map(|s| {
            from_dtm_status(&s).ok_or_else(|| {
                ApiError::bad_request("invalid_query", format!("unknown status {s:?}"))
            })
        })
        .transpose()?
        .unwrap_or_default();
    let kind = p
        .trans_type
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<Kind>()
                .map_err(|e| ApiError::bad_request("invalid_query", e.to_string()))
        })
        .transpose()?;
    let after = p
        .position
        .filter(|s| !s.is_empty())
        .map(|position| decode_cursor("position", &position))
        .transpose()?;
    let filter = ListFilter {
        statuses,
        kind,
        created_from: p.create_time_start,
        created_to: p.create_time_end,
        after,
        limit: p.limit.unwrap_or(100).clamp(1, 1_000),
    };
    let page = app.engine.list(&filter).await?;
    let transactions: Vec<Value> = page.items.iter().map(global_view).collect();
    let next = page
        .next
        .map(|(at, gid)| format!("{at}:{gid}"))
        .unwrap_or_default();
    Ok(DtmResponse(
        StatusCode::OK,
        json!({"transactions": transactions, "next_position": next}),
    ))
}

// ---- views -----------------------------------------------------------------------------

/// DTM's name for a status. `stalled` has no DTM equivalent and is shown as such.
pub fn dtm_status(status: Status) -> &'static str {
    match status {
        Status::Prepared => "prepared",
        Status::Running | Status::Committing => "submitted",
        Status::Aborting => "aborting",
        Status::Succeeded => "succeed",
        Status::Failed => "failed",
        Status::Stalled => "stalled",
    }
}

/// The statuses a DTM status name selects (`submitted` is idem's running and committing).
fn from_dtm_status(name: &str) -> Option<Vec<Status>> {
    Some(match name {
        "prepared" => vec![Status::Prepared],
        "submitted" => vec![Status::Running, Status::Committing],
        "aborting" => vec![Status::Aborting],
        "succeed" => vec![Status::Succeeded],
        "failed" => vec![Status::Failed],
        "stalled" => vec![Status::Stalled],
        other => return other.parse().ok().map(|s| vec![s]),
    })
}

fn global_view(stored: &StoredTx) -> Value {
    let tx = &stored.tx;
    let actions: Vec<&Branch> = tx
        .branches
        .iter()
        .filter(|b| b.action == Action::Action)
        .collect();
    let steps: Vec<Value> = actions
        .iter()
        .map(|a| {
            let compensate = tx
                .branches
                .iter()
                .find(|b| b.action == Action::Compensate && b.branch_id == a.branch_id);
            match compensate {
                Some(c) => json!({"action": a.url, "compensate": c.url}),
                None => json!({"action": a.url}),
            }
        })
        .collect();
    let payloads: Vec<&str> = actions.iter().map(|a| a.payload.as_str()).collect();
    let query_prepared = tx
        .branches
        .iter()
        .find(|b| b.action == Action::QueryPrepared)
        .map(|b| b.url.as_str());
    let mut view = json!({
        "gid": tx.gid,
        "trans_type": tx.kind.as_str(),
        "status": dtm_status(tx.status),
        "protocol": "http",
        "create_time": rfc3339(tx.created_at),
        "update_time": rfc3339(tx.updated_at),
        "options": serde_json::to_string(&json!({
            "timeout_to_fail": tx.options.timeout_ms.map(|t| t / 1_000),
            "request_timeout": tx.options.request_timeout_ms / 1_000,
            "retry_interval": tx.options.retry_interval_ms / 1_000,
            "retry_limit": tx.options.max_attempts,
            "branch_headers": tx.options.branch_headers,
        })).expect("serialisable"),
        // idem's additions: retry count, last error, and why it stalled.
        "retry_count": tx.attempts,
        "last_error": tx.last_error,
    });
    let map = view.as_object_mut().expect("object");
    if !steps.is_empty() {
        map.insert("steps".into(), json!(steps));
        map.insert("payloads".into(), json!(payloads));
    }
    if let Some(q) = query_prepared {
        map.insert("query_prepared".into(), json!(q));
    }
    if let Some(at) = tx.finished_at {
        map.insert("finish_time".into(), json!(rfc3339(at)));
    }
    if let (Status::Failed | Status::Aborting, Some(reason)) = (tx.status, &tx.reason) {
        map.insert("rollback_reason".into(), json!(reason));
    }
    if let Some(at) = tx.next_attempt_at {
        map.insert("next_cron_time".into(), json!(rfc3339(at)));
    }
    if let Some(from) = tx.stalled_from {
        map.insert("stalled_from".into(), json!(dtm_status(from)));
    }
    if tx.options.concurrent {
        map.insert(
            "custom_data".into(),
            json!(
                serde_json::to_string(&json!({"orders": tx.options.orders, "concurrent": true}))
                    .expect("serialisable")
            ),
        );
    }
    view
}

fn branch_view(gid: &str, b: &Branch) -> Value {
    let status = match b.status {
        BranchStatus::Succeeded => "succeed",
        BranchStatus::Failed => "failed",
        BranchStatus::Pending | BranchStatus::Skipped | BranchStatus::Stalled => "prepared",
    };
    let mut view = json!({
        "gid": gid,
        "url": b.url,
        "bin_data": base64(b.payload.as_bytes()),
        "branch_id": b.branch_id,
        "op": b.action.op(),
        "status": status,
        "update_time": rfc3339(b.updated_at),
        "attempts": b.attempts,
        "last_error": b.last_error,
    });
    if let Some(at) = b.finished_at {
        view["finish_time"] = json!(rfc3339(at));
    }
    view
}

/// Go marshals `[]byte` as standard base64.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_go() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(br#"{"amount": 30}"#), "eyJhbW91bnQiOiAzMH0=");
    }

    #[test]
    fn statuses_map_both_ways() {
        for s in Status::ALL {
            let back = from_dtm_status(dtm_status(s)).unwrap();
            assert!(back.contains(&s), "{s}");
        }
    }
}

//! The DTM door's handlers: each parses its request, asks the engine, and answers in
//! DTM's envelope.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::requests::{
    AllParams, DtmBody, Field, GidOnly, QueryParams, Trans, msg_steps, parse, saga_steps,
};
use super::views::{branch_view, dtm_status, from_dtm_status, global_view};
use super::{DtmError, DtmResponse, DtmResult, failure, ongoing, success};
use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::validate::{
    DTM_DEFAULT_LIST_LIMIT, branch_urls, check_dtm_url, check_id, check_payload,
    check_payload_size, check_reason, decode_cursor, list_limit, parse_body, registration_error,
};
use crate::auth::Role;
use crate::core::{Access, Action, Branch, Kind, Payload, Status};
use crate::engine::{EngineError, NewPrepared, NewSaga};
use crate::engine::{ListFilter, StoredTx};
use crate::outbound::redact::redacted;
use crate::tenant::client_gid;

pub(super) async fn ping() -> Json<Value> {
    Json(json!({"msg": "pong"}))
}

pub(super) async fn version() -> Json<Value> {
    Json(json!({"version": concat!("idem-", env!("CARGO_PKG_VERSION"))}))
}

pub(super) async fn new_gid() -> Json<Value> {
    Json(json!({"gid": uuid::Uuid::new_v4().simple().to_string(), "dtm_result": "SUCCESS"}))
}

pub(super) async fn prepare(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: DtmBody,
) -> DtmResult {
    let t = parse_for(&caller, body, &app)?;
    check_outbound(&app, caller.tenant(), &t)?;
    if t.kind == Kind::Saga {
        return Err(ApiError::bad_request(
            "invalid_request",
            "prepare is for tcc and msg; submit a saga directly",
        )
        .into());
    }
    let outcome = create_prepared(&app, &caller, &t, &headers).await?;
    if outcome.tx.status != Status::Prepared {
        return Ok(failure(format!(
            "current status '{}', cannot prepare",
            dtm_status(outcome.tx.status)
        )));
    }
    Ok(success())
}

/// Creates a TCC or msg; a repeat returns what is stored. The trace context is the
/// creating request's (see `crate::trace`).
async fn create_prepared(
    app: &AppState,
    caller: &Caller,
    t: &Trans,
    headers: &HeaderMap,
) -> Result<StoredTx, DtmError> {
    if t.kind == Kind::Msg && t.steps.is_empty() {
        return Err(ApiError::bad_request("empty_steps", "a msg needs at least one step").into());
    }
    app.admit_create(caller.tenant(), &t.gid).await?;
    let created = app
        .engine
        .create_prepared(NewPrepared {
            gid: t.gid.clone(),
            kind: t.kind,
            options: t.options.clone(),
            msg_steps: msg_steps(&t.steps),
            query_prepared: t.query_prepared.clone(),
            branches: Vec::new(),
            request: t.identity.clone(),
            trace: crate::trace::from_headers(headers),
            tokenless: caller.access() == Access::Tokenless,
        })
        .await?;
    Ok(created.stored)
}

/// The outbound policy's check of a creating request's URLs (a TCC's submit names none;
/// an abort's are not checked: they are what is stored, and aborting must not depend on
/// today's policy).
fn check_outbound(app: &AppState, tenant: &str, t: &Trans) -> Result<(), ApiError> {
    let steps = t
        .steps
        .iter()
        .enumerate()
        .flat_map(|(i, (action, compensate, _))| {
            let action = (format!("steps[{i}].action"), action.as_str());
            let compensate = (!compensate.is_empty())
                .then(|| (format!("steps[{i}].compensate"), compensate.as_str()));
            std::iter::once(action).chain(compensate)
        });
    let query = t
        .query_prepared
        .iter()
        .filter(|url| !url.is_empty())
        .map(|url| ("query_prepared".to_owned(), url.as_str()));
    app.check_outbound(tenant, steps.chain(query))
}

pub(super) async fn submit(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    headers: HeaderMap,
    body: DtmBody,
) -> DtmResult {
    let t = parse_for(&caller, body, &app)?;
    check_outbound(&app, caller.tenant(), &t)?;
    match t.kind {
        Kind::Saga => {
            if t.steps.is_empty() {
                return Err(
                    ApiError::bad_request("empty_steps", "a saga needs at least one step").into(),
                );
            }
            let steps = saga_steps(&t.steps);
            app.admit_create(caller.tenant(), &t.gid).await?;
            app.engine
                .create_saga(NewSaga {
                    gid: t.gid.clone(),
                    steps,
                    options: t.options.clone(),
                    request: t.identity.clone(),
                    trace: crate::trace::from_headers(&headers),
                    tokenless: caller.access() == Access::Tokenless,
                })
                .await?;
        }
        Kind::Tcc => {
            app.engine.submit(&t.gid, caller.access()).await?;
        }
        Kind::Msg => {
            // DTM lets a msg be submitted without a prepare; then this creates it.
            create_prepared(&app, &caller, &t, &headers).await?;
            app.engine.submit(&t.gid, caller.access()).await?;
        }
    }
    finish(&app, &t).await
}

pub(super) async fn abort(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: DtmBody,
) -> DtmResult {
    let t = parse_for(&caller, body, &app)?;
    check_reason("rollback_reason", t.reason.as_deref())?;
    let reason = t
        .reason
        .clone()
        .unwrap_or_else(|| "aborted by the client".into());
    let (stored, changed) = app.engine.abort(&t.gid, &reason, caller.access()).await?;
    // DTM aborts only what is prepared or aborting: an abort of a transaction that had
    // already failed is its FAILURE (dtmcli's tcc_global_transaction raises on it), not a
    // second success.
    if !changed && stored.tx.status == Status::Failed {
        return Ok(failure(format!(
            "current status '{}', cannot abort",
            dtm_status(stored.tx.status)
        )));
    }
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
        Status::Failed => {
            let reason = redacted(&stored.tx.reason);
            failure(reason.unwrap_or_else(|| "failed".into()))
        }
        other => ongoing(format!(
            "the transaction is {other}{}",
            redacted(&stored.tx.last_error)
                .map(|e| format!(": {e}"))
                .unwrap_or_default()
        )),
    })
}

pub(super) async fn force_stop(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> DtmResult {
    caller.require(Role::Operator, "forceStop")?;
    let req: GidOnly = parse_body(body, None)?;
    let gid = req
        .gid
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "gid is required"))?;
    check_id("gid", "invalid_gid", &gid)?;
    check_reason("rollback_reason", req.rollback_reason.as_deref())?;
    let reason = req
        .rollback_reason
        .unwrap_or_else(|| "force-stopped".into());
    app.engine.force_stop(&caller.key(&gid), &reason).await?;
    Ok(success())
}

/// A DTM request body, its gid scoped to the caller's tenant.
fn parse_for(caller: &Caller, body: DtmBody, app: &AppState) -> Result<Trans, DtmError> {
    let mut t = parse(body, app)?;
    t.gid = caller.key(&t.gid);
    Ok(t)
}

/// Why DTM's topic routes are refused (the gRPC door's topic RPCs say the same).
pub const NO_TOPICS: &str =
    "msg topics are not supported by idem; name each msg step's participant URL";

/// Why DTM's workflow routes are refused.
pub const NO_WORKFLOW: &str =
    "DTM's workflow mode is not supported by idem; use a saga, TCC or msg";

pub(super) async fn unsupported_topics() -> DtmError {
    DtmError(ApiError::bad_request("unsupported", NO_TOPICS))
}

pub(super) async fn unsupported_workflow() -> DtmError {
    DtmError(ApiError::bad_request("unsupported", NO_WORKFLOW))
}

pub(super) async fn register_xa() -> DtmError {
    DtmError(ApiError::bad_request(
        "unsupported",
        "XA is not supported by idem; use TCC or saga",
    ))
}

pub(super) async fn register_branch(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: DtmBody,
) -> DtmResult {
    let fields: BTreeMap<String, Field> = parse_body(body.json, None)?;
    // DTM binds this body into map[string]string: every value must be a string.
    let mut data = BTreeMap::new();
    for (key, value) in fields {
        match value {
            Field::Text(s) => {
                data.insert(key, s);
            }
            Field::Null => {}
            Field::Other(other) => {
                let other = other.as_str();
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
    check_dtm_url("confirm", &confirm)?;
    check_dtm_url("cancel", &cancel)?;
    // Over gRPC the payload is `BusiPayload`, whose bytes need not be text.
    let payload = match body.binary.and_then(|b| b.0.into_iter().next()) {
        Some(bytes) => {
            let name = format!("BusiPayload (branch {branch_id:?})");
            check_payload_size(&name, bytes.len(), &app.limits)?;
            bytes
        }
        None => {
            let text = get("data");
            check_payload(&format!("data (branch {branch_id:?})"), &text, &app.limits)?;
            Payload::from(text)
        }
    };
    let now = app.engine.now();
    let branches = vec![
        Branch::new(
            branch_id.as_str(),
            Action::Confirm,
            0,
            confirm,
            payload.clone(),
            now,
        ),
        Branch::new(branch_id.as_str(), Action::Cancel, 0, cancel, payload, now),
    ];
    app.check_outbound(caller.tenant(), branch_urls(&branches))?;
    match app
        .engine
        .register(&caller.key(&gid), branches, caller.access())
        .await
    {
        Ok(()) => Ok(success()),
        Err(EngineError::NotPrepared(status)) => Ok(failure(format!(
            "no trans with gid: {gid} status: prepared found (it is {})",
            dtm_status(status)
        ))),
        Err(e) => Err(registration_error(e).into()),
    }
}

pub(super) async fn query(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    params: Result<Query<QueryParams>, QueryRejection>,
) -> DtmResult {
    let Query(params) =
        params.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let gid = params
        .gid
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "no gid specified"))?;
    check_id("gid", "invalid_gid", &gid)?;
    let found = app.reads().find(&caller.key(&gid)).await?;
    // What the caller may not see answers as if it did not exist.
    let Some(stored) = found.filter(|s| s.tx.admits(caller.access())) else {
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
        .map(|b| branch_view(&gid, b))
        .collect();
    Ok(DtmResponse(
        StatusCode::OK,
        json!({"transaction": global_view(&stored), "branches": branches}),
    ))
}

pub(super) async fn all(
    State(app): State<Arc<AppState>>,
    caller: Caller,
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
        .transpose()?
        .map(|(at, gid)| (at, caller.key(&gid)));
    // Refused past the bound like the native door's, not cut to it.
    let limit = list_limit("limit", p.limit, DTM_DEFAULT_LIST_LIMIT)?;
    let filter = ListFilter {
        tenant: Some(caller.tenant().to_owned()),
        tokenless_only: caller.access() == Access::Tokenless,
        statuses,
        kind,
        created_from: p.create_time_start,
        created_to: p.create_time_end,
        after,
        limit,
        oldest_first: false,
    };
    let page = app.reads().list(&filter).await?;
    let transactions: Vec<Value> = page.items.iter().map(global_view).collect();
    let next = page
        .next
        .map(|(at, key)| format!("{at}:{}", client_gid(&key)))
        .unwrap_or_default();
    Ok(DtmResponse(
        StatusCode::OK,
        json!({"transactions": transactions, "next_position": next}),
    ))
}

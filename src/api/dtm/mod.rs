//! DTM's HTTP API (`/api/dtmsvr/...`), served by the same engine, so that DTM's client
//! SDKs drive idem by changing one URL.
//!
//! Shapes follow dtm-labs/dtm (v1.19): request bodies are DTM's `TransGlobal` JSON, answers
//! use its envelope (`{"dtm_result":"SUCCESS"}`, 409 `FAILURE`, 425 `ONGOING`). Where idem
//! deliberately differs it is stricter, never looser: a client mistake is a 4xx with a
//! message (DTM answers 500 or panics), a gid reused with a different body is a 409, and
//! retries are capped and end in `stalled`. The list is in docs/dtm.md.
//!
//! `requests` parses and checks what DTM clients send, `handlers` carries it out through the
//! engine, `views` shows transactions as DTM does; the envelope is here.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::engine::EngineError;

mod handlers;
mod requests;
mod views;

pub use handlers::{NO_TOPICS, NO_WORKFLOW};
use handlers::{
    abort, all, force_stop, new_gid, ping, prepare, query, register_branch, register_xa, submit,
    unsupported_topics, unsupported_workflow, version,
};
pub use requests::{BinaryPayloads, Trans, parse_trans};
pub use views::dtm_status;

/// DTM's `/api/dtmsvr` routes, which the rate limit covers.
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
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
        // DTM's topics (and its key-value listing of them) and workflow mode, which idem
        // does not have: a clear refusal rather than a 404 that reads like a wrong URL.
        .route("/api/dtmsvr/subscribe", get(unsupported_topics))
        .route("/api/dtmsvr/unsubscribe", get(unsupported_topics))
        .route("/api/dtmsvr/topic/{topic}", delete(unsupported_topics))
        .route("/api/dtmsvr/scanKV", get(unsupported_topics))
        .route("/api/dtmsvr/queryKV", get(unsupported_topics))
        .route("/api/dtmsvr/prepareWorkflow", post(unsupported_workflow))
}

/// DTM's liveness probe, which it does not: a probe refused with 429 would take a healthy
/// coordinator out of rotation.
pub fn probe_routes() -> Router<Arc<AppState>> {
    Router::new().route("/api/ping", any(ping))
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
pub struct DtmError(pub(super) ApiError);

impl DtmError {
    /// The error under DTM's envelope.
    pub fn api_error(&self) -> &ApiError {
        &self.0
    }
}

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

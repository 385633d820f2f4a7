//! API errors: an HTTP status, a stable machine-readable code and a message.
//!
//! Codes are part of the API contract (see `docs/api.md`); messages are for humans and
//! may change.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::core::CoreError;
use crate::engine::EngineError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        let (status, code) = match &e {
            EngineError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            EngineError::GidConflict(_) => (StatusCode::CONFLICT, "gid_conflict"),
            EngineError::BranchConflict(_) => (StatusCode::CONFLICT, "branch_conflict"),
            EngineError::NotPrepared(_) => (StatusCode::CONFLICT, "not_prepared"),
            EngineError::InvalidState(CoreError::TimedOut) => (StatusCode::CONFLICT, "timed_out"),
            EngineError::InvalidState(CoreError::TryFailed(_)) => {
                (StatusCode::CONFLICT, "try_failed")
            }
            EngineError::InvalidState(CoreError::TryNotSucceeded(_)) => {
                (StatusCode::CONFLICT, "try_not_succeeded")
            }
            EngineError::InvalidState(CoreError::UnknownBranch(_)) => {
                (StatusCode::NOT_FOUND, "unknown_branch")
            }
            EngineError::InvalidState(_) => (StatusCode::CONFLICT, "invalid_state"),
            EngineError::Contention => (StatusCode::SERVICE_UNAVAILABLE, "contention"),
            EngineError::Store(store) => {
                tracing::error!(error = %store, "store error");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        ApiError::new(status, code, message)
    }
}

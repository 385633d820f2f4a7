//! API errors: an HTTP status, a stable machine-readable code and a message.
//!
//! Codes are part of the API contract (see `docs/api.md`); messages are for humans and
//! may change.
//!
//! A database error is never the client's fault and its text is not the client's business
//! (it can name the database, the host, a table or a value): the answer carries a generic
//! message, and the full text rides along in [`ErrorDetail`] for the log (see
//! `api::log_server_errors`, which adds the route). One a retry can cure (the database is
//! down, restarting, partitioned, overloaded) is `503 unavailable`. One that fails the same
//! way every time (the database refuses the statement for its content, stored data does not
//! decode) is `500 internal`: a retry would not help, and an operator must look.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::core::CoreError;
use crate::engine::EngineError;
use crate::store::StoreError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// For the log only, never for the client: what the database said.
    pub detail: Option<String>,
}

/// The message of `503 unavailable`.
pub const UNAVAILABLE: &str = "the database is unavailable; retry later";
/// The message of `500 internal`.
pub const INTERNAL: &str = "internal error; the server's log has the details";

/// What a failed request's answer leaves for the log: the error's full text. Taken out of
/// the response (and logged with the route) before it is sent.
#[derive(Clone, Debug)]
pub struct ErrorDetail(pub String);

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            detail: None,
        }
    }

    /// Puts the detail, if any, on a response built from this error, for the log.
    pub fn attach_detail(&self, mut response: Response) -> Response {
        if let Some(detail) = &self.detail {
            response
                .extensions_mut()
                .insert(ErrorDetail(detail.clone()));
        }
        response
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        self.attach_detail((self.status, Json(body)).into_response())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
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
            EngineError::Store(store) => return ApiError::from_store(store),
        };
        ApiError::new(status, code, e.to_string())
    }
}

/// A failed read or write outside the engine (the token table), answered as the engine's.
impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::from_store(&e)
    }
}

impl ApiError {
    fn from_store(store: &StoreError) -> ApiError {
        let mut e = if store.is_permanent() {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", INTERNAL)
        } else {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", UNAVAILABLE)
        };
        e.detail = Some(store.to_string());
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_errors_answer_generically_and_keep_the_text_for_the_log() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "db.internal:5432 orders_db refused",
        );
        let e = ApiError::from(EngineError::Store(StoreError::Database(sqlx::Error::Io(
            refused,
        ))));
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((e.code, e.message.as_str()), ("unavailable", UNAVAILABLE));
        assert!(e.detail.as_deref().unwrap().contains("orders_db"));

        let cut = ApiError::from(EngineError::Store(StoreError::TimedOut(
            std::time::Duration::from_secs(10),
        )));
        assert_eq!(cut.code, "unavailable");

        let corrupt = ApiError::from(EngineError::Store(StoreError::Corrupt(
            "status 'x' in orders_db".into(),
        )));
        assert_eq!(corrupt.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            (corrupt.code, corrupt.message.as_str()),
            ("internal", INTERNAL)
        );
    }
}

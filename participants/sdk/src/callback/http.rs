//! The axum answer for a payment callback.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{CallbackOutcome, PaymentCallbacks, SIGNATURE_HEADER};
use crate::backend::BarrierDatabase;
use crate::kit::StepConnections;

impl<DB: BarrierDatabase> PaymentCallbacks<DB> {
    /// An axum answer for a callback: reads the signature from [`SIGNATURE_HEADER`],
    /// runs [`PaymentCallbacks::handle`], and answers `{"result": "SUCCESS", "outcome": ..}`
    /// or `{"error": <code>, "outcome": .., "message": ..}` with
    /// [`CallbackOutcome::status_code`] (200 `SUCCESS` for credited and duplicate),
    /// or the error's own status (503 for the database: the provider retries).
    pub async fn respond<S>(&self, pool: &S, headers: &HeaderMap, body: &[u8]) -> Response
    where
        S: StepConnections<Database = DB>,
    {
        let signature = headers
            .get(SIGNATURE_HEADER)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let (status, code, message) = match self.handle(pool, body, signature).await {
            Ok(outcome) => {
                let code = match &outcome {
                    o if o.is_success() => "SUCCESS",
                    CallbackOutcome::Conflict(_) => "payment_conflict",
                    CallbackOutcome::BadSignature => "invalid_signature",
                    CallbackOutcome::Mismatch(_) => "payment_mismatch",
                    CallbackOutcome::UnknownOrder => "unknown_order",
                    _ => "invalid_callback",
                };
                let message = match &outcome {
                    CallbackOutcome::Mismatch(field) => {
                        format!("{field} differs from the order's")
                    }
                    CallbackOutcome::Conflict(why) | CallbackOutcome::Invalid(why) => why.clone(),
                    other => other.kind().to_owned(),
                };
                (outcome.status_code(), code, (outcome.kind(), message))
            }
            Err(e) => (e.status_code(), e.kind(), ("error", e.to_string())),
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        // A success carries `result` (what providers look for); a failure carries the SDK's
        // usual `error` code, as every other answer of this crate does.
        let key = if (200..300).contains(&status.as_u16()) {
            "result"
        } else {
            "error"
        };
        let body = serde_json::json!({key: code, "outcome": message.0, "message": message.1});
        (status, axum::Json(body)).into_response()
    }
}

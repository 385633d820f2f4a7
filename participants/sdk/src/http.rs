//! axum integration: the callback parameters ([`BranchCall`]) as an extractor, the payload
//! as an extractor, and outcomes and errors as responses with the status codes the
//! coordinator acts on.
//!
//! A guarded handler is then a few lines:
//!
//! ```no_run
//! # use axum::extract::State;
//! # use idem_participant::http::Payload;
//! # use idem_participant::{BranchCall, Outcome, ParticipantError};
//! # use sqlx::AnyPool;
//! # #[derive(serde::Deserialize)] struct Req { sku: String }
//! # #[derive(serde::Serialize, serde::Deserialize)] struct Reserved { sku: String }
//! # async fn reserve_stock(_tx: &idem_participant::StepTx<'static, sqlx::Any>, req: &Req) -> Result<Reserved, ParticipantError> {
//! #     Ok(Reserved { sku: req.sku.clone() })
//! # }
//! async fn reserve(State(pool): State<AnyPool>, call: BranchCall, Payload(req): Payload<Req>)
//!     -> Result<Outcome<Reserved>, ParticipantError>
//! {
//!     let req = &req;
//!     call.barrier().run(&pool, |tx| async move { reserve_stock(&tx, req).await }).await
//! }
//! ```
//!
//! # Response bodies and DTM
//!
//! Besides the status code, bodies carry DTM's `dtm_result` (`SUCCESS`, `FAILURE`,
//! `ONGOING`), so DTM clients understand them too. DTM classifies a response by searching
//! its body for the words `FAILURE` and `ONGOING` anywhere, so every other occurrence of
//! those words (in a stored result, in an error message) is written with a JSON escape
//! (`FAIL\u0055RE`): the same string once decoded, but no longer a match.

use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::barrier::Outcome;
use crate::barrier::schema::MsgState;
use crate::error::{InvalidCall, ParticipantError};
use crate::kit::BranchCall;
use crate::signature::{SignedCall, Version};
use crate::tenant::tenant_from_headers;

impl BranchCall {
    /// Parses a raw (percent-encoded) query string ([`BranchCall::from_pairs`]).
    pub fn from_query(query: &str) -> Result<BranchCall, InvalidCall> {
        let Query(pairs) =
            Query::<Vec<(String, String)>>::try_from_uri(&format!("/?{query}").parse().map_err(
                |_| InvalidCall::Invalid {
                    param: "query",
                    reason: "not a valid query string".into(),
                },
            )?)
            .map_err(|e| InvalidCall::Invalid {
                param: "query",
                reason: e.body_text(),
            })?;
        BranchCall::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }
}

/// The call's parameters from the query string, its tenant from the verified signature
/// (v2), else from the `Idem-Tenant` header, else the default; see [`BranchCall`].
impl<S: Send + Sync> FromRequestParts<S> for BranchCall {
    type Rejection = InvalidCall;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let call = BranchCall::from_query(parts.uri.query().unwrap_or_default())?;
        let signed = parts
            .extensions
            .get::<SignedCall>()
            .filter(|s| s.version == Version::V2);
        if let Some(signed) = signed {
            return call.with_tenant(&signed.tenant);
        }
        call.with_tenant(tenant_from_headers(&parts.headers)?)
    }
}

impl IntoResponse for InvalidCall {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("error".into(), json!("invalid_callback"));
        body.insert("message".into(), json!(self.to_string()));
        json_response(StatusCode::BAD_REQUEST, None, body)
    }
}

/// A JSON request body (the branch's registered payload).
///
/// Unlike `axum::Json` it does not insist on a `Content-Type`, and a body that does not
/// parse is answered with 409: the payload is fixed at registration, so retrying cannot fix
/// it, and 409 is how a Try or saga action tells the coordinator to stop and roll back.
///
/// Confirm, Cancel and compensate must eventually succeed, and the coordinator retries
/// them even after a 409; a handler for those is sturdier if it ignores the payload and
/// acts on the ledger row its Try or action wrote (as the example participants do).
#[derive(Clone, Debug)]
pub struct Payload<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Payload<T> {
    type Rejection = ParticipantError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| {
                ParticipantError::transient(format!("cannot read the request body: {e}"))
            })?;
        serde_json::from_slice(&bytes)
            .map(Payload)
            .map_err(|e| ParticipantError::refused(format!("invalid payload: {e}")))
    }
}

impl<T: Serialize> IntoResponse for Outcome<T> {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        body.insert("outcome".into(), json!(self.kind()));
        match self {
            Outcome::Executed(t) | Outcome::Duplicate(t) => {
                match serde_json::to_value(&t) {
                    Ok(v) => body.insert("result".into(), v),
                    Err(e) => {
                        return ParticipantError::internal(format!(
                            "cannot encode the result: {e}"
                        ))
                        .into_response();
                    }
                };
                json_response(StatusCode::OK, Some("SUCCESS"), body)
            }
            Outcome::EmptyRollback => json_response(StatusCode::OK, Some("SUCCESS"), body),
            Outcome::Rejected => {
                body.insert(
                    "message".into(),
                    json!("rejected: this branch was already cancelled or compensated"),
                );
                json_response(StatusCode::CONFLICT, Some("FAILURE"), body)
            }
        }
    }
}

impl IntoResponse for ParticipantError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status_code()).expect("valid status code");
        let dtm = match &self {
            ParticipantError::Refused(_) => Some("FAILURE"),
            ParticipantError::InProgress(_) => Some("ONGOING"),
            _ => None,
        };
        if status.is_server_error() {
            tracing::warn!(error = %self, kind = self.kind(), "branch step failed; the coordinator will retry");
        }
        let mut body = Map::new();
        body.insert("error".into(), json!(self.kind()));
        body.insert("message".into(), json!(self.to_string()));
        json_response(status, dtm, body)
    }
}

impl IntoResponse for MsgState {
    fn into_response(self) -> Response {
        let mut body = Map::new();
        match self {
            MsgState::Committed => {
                body.insert("state".into(), json!("committed"));
                json_response(StatusCode::OK, Some("SUCCESS"), body)
            }
            MsgState::RolledBack => {
                body.insert("state".into(), json!("rolled_back"));
                json_response(StatusCode::CONFLICT, Some("FAILURE"), body)
            }
        }
    }
}

fn json_response(
    status: StatusCode,
    dtm_result: Option<&str>,
    body: Map<String, Value>,
) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        dtm_body(dtm_result, body),
    )
        .into_response()
}

/// Serialises `body`, hides DTM's keywords in it, and puts `dtm_result` first.
pub(crate) fn dtm_body(dtm_result: Option<&str>, body: Map<String, Value>) -> String {
    let text = mask_dtm_keywords(&Value::Object(body).to_string());
    match dtm_result {
        None => text,
        Some(word) => {
            let rest = &text[1..]; // drop the opening brace
            if rest == "}" {
                format!("{{\"dtm_result\":\"{word}\"}}")
            } else {
                format!("{{\"dtm_result\":\"{word}\",{rest}")
            }
        }
    }
}

/// Rewrites `FAILURE` and `ONGOING` in serialised JSON with a `\u` escape. In JSON text
/// letters only occur inside strings, where an escape decodes to the same character.
pub(crate) fn mask_dtm_keywords(json: &str) -> String {
    json.replace("FAILURE", "FAIL\\u0055RE")
        .replace("ONGOING", "ONGO\\u0049NG")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::Op;

    #[test]
    fn parses_percent_encoded_query_strings() {
        let call =
            BranchCall::from_query("gid=a%20b&trans_type=saga&branch_id=02&op=compensate").unwrap();
        assert_eq!(call.gid(), "a b");
        assert_eq!(call.op(), Op::Compensate);
        assert_eq!(BranchCall::from_query(""), Err(InvalidCall::Missing("gid")));
    }

    #[tokio::test]
    async fn the_tenant_is_the_signed_one_else_the_header_else_the_default() {
        let extract = |request: axum::http::Request<()>| async move {
            let (mut parts, ()) = request.into_parts();
            BranchCall::from_request_parts(&mut parts, &()).await
        };
        let uri = "/p?gid=g&trans_type=saga&branch_id=01&op=action";
        let plain = axum::http::Request::get(uri).body(()).unwrap();
        assert_eq!(extract(plain).await.unwrap().tenant(), "default");
        let named = axum::http::Request::get(uri)
            .header("idem-tenant", "acme")
            .body(())
            .unwrap();
        assert_eq!(extract(named).await.unwrap().tenant(), "acme");
        let mut signed = axum::http::Request::get(uri)
            .header("idem-tenant", "beta")
            .body(())
            .unwrap();
        signed.extensions_mut().insert(SignedCall {
            kid: "k".into(),
            version: Version::V2,
            tenant: "acme".into(),
            call_id: None,
        });
        assert_eq!(extract(signed).await.unwrap().tenant(), "acme");
        for bad in ["Acme", "a/b", ""] {
            let request = axum::http::Request::get(uri)
                .header("idem-tenant", bad)
                .body(())
                .unwrap();
            let e = extract(request).await.unwrap_err();
            assert!(e.to_string().contains("Idem-Tenant"), "{bad:?}: {e}");
        }
        let twice = axum::http::Request::get(uri)
            .header("idem-tenant", "acme")
            .header("idem-tenant", "beta")
            .body(())
            .unwrap();
        assert!(extract(twice).await.is_err());
    }

    #[test]
    fn expect_op_limits_an_endpoint() {
        let call = BranchCall::from_query("gid=g&trans_type=msg&branch_id=00&op=msg").unwrap();
        assert_eq!(call.expect_op(&[Op::Msg]), Ok(Op::Msg));
        assert!(call.expect_op(&[Op::Action]).is_err());
    }

    #[test]
    fn dtm_keywords_are_hidden_outside_dtm_result() {
        let mut body = Map::new();
        body.insert("result".into(), json!({"note": "FAILURE and ONGOING"}));
        let text = dtm_body(Some("SUCCESS"), body);
        assert!(text.starts_with("{\"dtm_result\":\"SUCCESS\","));
        assert!(!text.contains("FAILURE"));
        assert!(!text.contains("ONGOING"));
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["result"]["note"], "FAILURE and ONGOING");
        assert_eq!(back["dtm_result"], "SUCCESS");

        let mut body = Map::new();
        body.insert("message".into(), json!("still ONGOING"));
        let text = dtm_body(Some("FAILURE"), body);
        assert_eq!(text.matches("FAILURE").count(), 1);
        assert!(!text.contains("ONGOING"));

        assert_eq!(
            dtm_body(Some("SUCCESS"), Map::new()),
            "{\"dtm_result\":\"SUCCESS\"}"
        );
        assert_eq!(dtm_body(None, Map::new()), "{}");
    }

    #[test]
    fn statuses_of_outcomes_and_errors() {
        assert_eq!(
            Outcome::Executed(1).into_response().status(),
            StatusCode::OK
        );
        assert_eq!(
            Outcome::Duplicate(1).into_response().status(),
            StatusCode::OK
        );
        assert_eq!(
            Outcome::<()>::EmptyRollback.into_response().status(),
            StatusCode::OK
        );
        assert_eq!(
            Outcome::<()>::Rejected.into_response().status(),
            StatusCode::CONFLICT
        );
        assert_eq!(
            ParticipantError::refused("no stock")
                .into_response()
                .status(),
            StatusCode::CONFLICT
        );
        assert_eq!(
            ParticipantError::in_progress("wait")
                .into_response()
                .status(),
            StatusCode::TOO_EARLY
        );
        assert_eq!(
            ParticipantError::transient("db down")
                .into_response()
                .status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            ParticipantError::ConfirmWithoutTry("try not committed".into())
                .into_response()
                .status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            InvalidCall::Missing("gid").into_response().status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            MsgState::RolledBack.into_response().status(),
            StatusCode::CONFLICT
        );
    }
}

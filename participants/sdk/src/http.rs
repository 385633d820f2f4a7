//! axum integration: the callback parameters as an extractor, the payload as an extractor,
//! and outcomes and errors as responses with the status codes the coordinator acts on.
//!
//! A guarded handler is then a few lines:
//!
//! ```no_run
//! # use axum::extract::State;
//! # use idem_participant::http::{BranchCall, Payload};
//! # use idem_participant::{Outcome, ParticipantError};
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

use crate::barrier::{Barrier, InvalidCall, Op, Outcome, TransType, check_id};
use crate::error::ParticipantError;
use crate::schema::MsgState;

/// The coordinator's callback parameters: `gid`, `trans_type`, `branch_id`, `op`.
///
/// As an extractor it answers a call that lacks one, or has one that is unknown or too
/// long, with 400 and a JSON body naming the parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchCall {
    trans_type: TransType,
    gid: String,
    branch_id: String,
    op: Op,
}

impl BranchCall {
    /// Parses the parameters from `(name, value)` pairs (already percent-decoded).
    /// Unknown parameters are ignored (DTM's clients add their own, such as `dtm`).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<BranchCall, InvalidCall> {
        let (mut gid, mut trans_type, mut branch_id, mut op) = (None, None, None, None);
        for (name, value) in pairs {
            match name {
                "gid" => gid = Some(value),
                "trans_type" => trans_type = Some(value),
                "branch_id" => branch_id = Some(value),
                "op" => op = Some(value),
                _ => {}
            }
        }
        let gid = gid
            .filter(|v| !v.is_empty())
            .ok_or(InvalidCall::Missing("gid"))?;
        let trans_type_text = trans_type
            .filter(|v| !v.is_empty())
            .ok_or(InvalidCall::Missing("trans_type"))?;
        let branch_id = branch_id
            .filter(|v| !v.is_empty())
            .ok_or(InvalidCall::Missing("branch_id"))?;
        let op_text = op
            .filter(|v| !v.is_empty())
            .ok_or(InvalidCall::Missing("op"))?;
        check_id("gid", gid)?;
        check_id("branch_id", branch_id)?;
        let trans_type = TransType::parse(trans_type_text).ok_or_else(|| InvalidCall::Invalid {
            param: "trans_type",
            reason: format!("`{trans_type_text}` is not one of tcc, saga, msg"),
        })?;
        let op = Op::parse(op_text).ok_or_else(|| InvalidCall::Invalid {
            param: "op",
            reason: format!(
                "`{op_text}` is not one of try, confirm, cancel, action, compensate, msg"
            ),
        })?;
        if !trans_type.allows(op) {
            return Err(InvalidCall::Invalid {
                param: "op",
                reason: format!("`{op}` is not an operation of a {trans_type} transaction"),
            });
        }
        Ok(BranchCall {
            trans_type,
            gid: gid.to_owned(),
            branch_id: branch_id.to_owned(),
            op,
        })
    }

    /// Parses a raw (percent-encoded) query string.
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

    /// The transaction kind named by the call.
    pub fn trans_type(&self) -> TransType {
        self.trans_type
    }

    /// The global transaction's id.
    pub fn gid(&self) -> &str {
        &self.gid
    }

    /// The branch within it.
    pub fn branch_id(&self) -> &str {
        &self.branch_id
    }

    /// The operation this call performs.
    pub fn op(&self) -> Op {
        self.op
    }

    /// Checks that the op named by the URL path (for a coordinator that registers one URL
    /// per op, like `.../reserve/{op}`) is the op of the call. 400 otherwise.
    pub fn expect_path_op(&self, path_op: &str) -> Result<Op, InvalidCall> {
        if path_op == self.op.as_str() {
            Ok(self.op)
        } else {
            Err(InvalidCall::Invalid {
                param: "op",
                reason: format!("this URL is for `{path_op}`, the call says `{}`", self.op),
            })
        }
    }

    /// The barrier of this call's (first) guarded step.
    pub fn barrier(&self) -> Barrier {
        Barrier::new(
            self.trans_type,
            self.gid.clone(),
            self.branch_id.clone(),
            self.op,
        )
        .expect("a parsed BranchCall names a valid barrier")
    }

    /// Checks that this call's op is one of `ops`, for a handler that serves only some
    /// (an inventory reservation has no saga action). 400 otherwise.
    pub fn expect_op(&self, ops: &[Op]) -> Result<Op, InvalidCall> {
        if ops.contains(&self.op) {
            Ok(self.op)
        } else {
            let names: Vec<&str> = ops.iter().map(|o| o.as_str()).collect();
            Err(InvalidCall::Invalid {
                param: "op",
                reason: format!(
                    "this endpoint serves {}, not `{}`",
                    names.join(", "),
                    self.op
                ),
            })
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for BranchCall {
    type Rejection = InvalidCall;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        BranchCall::from_query(parts.uri.query().unwrap_or_default())
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

    fn pairs(q: &[(&'static str, &'static str)]) -> Result<BranchCall, InvalidCall> {
        BranchCall::from_pairs(q.iter().copied())
    }

    #[test]
    fn parses_a_complete_call() {
        let call = pairs(&[
            ("gid", "g-1"),
            ("trans_type", "tcc"),
            ("branch_id", "01"),
            ("op", "cancel"),
            ("dtm", "ignored"),
        ])
        .unwrap();
        assert_eq!(call.gid(), "g-1");
        assert_eq!(call.trans_type(), TransType::Tcc);
        assert_eq!(call.branch_id(), "01");
        assert_eq!(call.op(), Op::Cancel);
        assert_eq!(call.barrier().barrier_id(), "01");
    }

    #[test]
    fn names_the_missing_or_bad_parameter() {
        assert_eq!(
            pairs(&[("trans_type", "tcc"), ("branch_id", "01"), ("op", "try")]),
            Err(InvalidCall::Missing("gid"))
        );
        assert_eq!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "tcc"),
                ("branch_id", ""),
                ("op", "try")
            ]),
            Err(InvalidCall::Missing("branch_id"))
        );
        assert_eq!(
            pairs(&[("gid", "g"), ("branch_id", "01"), ("op", "try")]),
            Err(InvalidCall::Missing("trans_type"))
        );
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "xa"),
                ("branch_id", "01"),
                ("op", "try")
            ]),
            Err(InvalidCall::Invalid {
                param: "trans_type",
                ..
            })
        ));
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "tcc"),
                ("branch_id", "01"),
                ("op", "rollback")
            ]),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
        assert!(matches!(
            pairs(&[
                ("gid", "g"),
                ("trans_type", "saga"),
                ("branch_id", "01"),
                ("op", "try")
            ]),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
    }

    #[test]
    fn parses_percent_encoded_query_strings() {
        let call =
            BranchCall::from_query("gid=a%20b&trans_type=saga&branch_id=02&op=compensate").unwrap();
        assert_eq!(call.gid(), "a b");
        assert_eq!(call.op(), Op::Compensate);
        assert_eq!(BranchCall::from_query(""), Err(InvalidCall::Missing("gid")));
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

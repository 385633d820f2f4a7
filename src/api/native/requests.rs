//! The native API's requests: what each body and query may hold, and how they become
//! what the engine takes.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use idem_canonical::JsonText;
use serde::{Deserialize, Deserializer};
use serde_json::Number;
use utoipa::{IntoParams, ToSchema};

use crate::api::error::ApiError;
use crate::api::validate::{
    Capped, Given, Limits, MAX_ATTEMPTS, MAX_IN_PROGRESS, MAX_RETRY_INTERVAL, Overrides,
    REQUEST_TIMEOUT, RETRY_INTERVAL, Stated, TIMEOUT, branch_urls, check_branch_count, check_id,
    check_payload, check_url, parse_body_capped, parse_orders,
};
use crate::core::{Action, Branch, Kind, Millis, SagaStep, TxOptions};
use crate::engine::{NewPrepared, NewSaga};

/// Options a request may set; anything unset takes the server default. Numbers are kept
/// as sent so that the shared checks judge them (see `validate`).
/// The ranges in the schema come from `validate::OPTIONS` (see `api::openapi`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OptionsRequest {
    #[schema(value_type = Option<u64>)]
    pub request_timeout_ms: Option<Number>,
    #[schema(value_type = Option<u64>)]
    pub retry_interval_ms: Option<Number>,
    #[schema(value_type = Option<u64>)]
    pub max_retry_interval_ms: Option<Number>,
    #[schema(value_type = Option<u64>)]
    pub max_attempts: Option<Number>,
    #[schema(value_type = Option<u64>)]
    pub max_in_progress_ms: Option<Number>,
    #[schema(value_type = Option<u64>)]
    pub timeout_ms: Option<Number>,
    /// Sent with every branch call (at most 32; see docs/api.md, *Limits*).
    #[serde(default)]
    pub branch_headers: BTreeMap<String, String>,
    #[serde(default)]
    pub concurrent: bool,
    /// Step index -> indexes of the steps it waits for.
    #[serde(default)]
    pub orders: BTreeMap<String, Vec<usize>>,
}

impl OptionsRequest {
    /// What the request states, with its ranges checked; laid over the server's defaults
    /// it is the new transaction's options.
    pub fn check(self, steps: usize, limits: &Limits) -> Result<Stated, ApiError> {
        let numbers = [
            (&REQUEST_TIMEOUT, self.request_timeout_ms),
            (&RETRY_INTERVAL, self.retry_interval_ms),
            (&MAX_RETRY_INTERVAL, self.max_retry_interval_ms),
            (&MAX_ATTEMPTS, self.max_attempts),
            (&MAX_IN_PROGRESS, self.max_in_progress_ms),
            (&TIMEOUT, self.timeout_ms),
        ];
        let overrides = Overrides {
            given: numbers
                .into_iter()
                .filter_map(|(option, value)| value.map(|v| Given::native(option, v)))
                .collect(),
            branch_headers: self.branch_headers,
        };
        let mut stated = overrides.check(&limits.options)?;
        stated.concurrent = self.concurrent;
        stated.orders = parse_orders(self.orders, steps)
            .map_err(|m| ApiError::bad_request("invalid_options", m))?;
        Ok(stated)
    }
}

/// A saga or msg step.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct StepRequest {
    #[schema(format = "uri")]
    pub(super) action: String,
    /// Saga: required. Msg: not allowed.
    #[schema(format = "uri")]
    pub(super) compensate: Option<String>,
    /// Any JSON: its text is the body sent to the participant (null: an empty body).
    #[serde(default)]
    #[schema(value_type = Value)]
    pub(super) payload: Payload,
}

/// A step's or branch's payload: any JSON, kept as the text sent to the participant
/// (compact, keys in order, as `serde_json` prints it), not as a tree; null (or none) is
/// an empty body.
#[derive(Debug, Default)]
pub(super) struct Payload(pub(super) String);

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Payload, D::Error> {
        let text = Option::<JsonText>::deserialize(deserializer)?;
        Ok(Payload(text.map(JsonText::into_string).unwrap_or_default()))
    }
}

/// `POST /api/v1/transactions`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateRequest {
    /// Generated when absent.
    pub(super) gid: Option<String>,
    #[schema(value_type = Kind)]
    pub(super) kind: String,
    #[serde(default)]
    #[schema(value_type = Vec<StepRequest>)]
    pub(super) steps: Capped<StepRequest>,
    #[serde(default)]
    pub(super) options: OptionsRequest,
    /// Msg: where idem asks whether the local transaction committed.
    #[schema(format = "uri")]
    pub(super) query_prepared: Option<String>,
    /// TCC: branches to register with the transaction, in one request.
    #[serde(default)]
    #[schema(value_type = Vec<BranchSpec>)]
    pub(super) branches: Capped<BranchSpec>,
    #[serde(default)]
    pub(super) wait_result: bool,
}

/// A TCC branch listed at creation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BranchSpec {
    pub(super) branch_id: String,
    #[schema(format = "uri")]
    pub(super) confirm: String,
    #[schema(format = "uri")]
    pub(super) cancel: String,
    #[serde(default)]
    #[schema(value_type = Value)]
    pub(super) payload: Payload,
}

impl BranchSpec {
    /// Checks the fields and builds the Confirm and Cancel operations; `field` is where
    /// the request holds it (`branches[2]`, or the register body's top level).
    pub(super) fn operations(
        &self,
        field: &str,
        limits: &Limits,
        now: Millis,
    ) -> Result<[Branch; 2], ApiError> {
        check_id("branch_id", "invalid_branch_id", &self.branch_id)?;
        check_url("confirm", &self.confirm)?;
        check_url("cancel", &self.cancel)?;
        let named = format!("{field}payload (branch {:?})", self.branch_id);
        check_payload(&named, &self.payload.0, limits)?;
        // One copy of the text for both operations.
        let payload = crate::core::Payload::from(self.payload.0.as_str());
        // TCC branches have no order among them: Confirms (or Cancels) all go out together.
        Ok([
            Branch::new(
                self.branch_id.as_str(),
                Action::Confirm,
                0,
                self.confirm.as_str(),
                payload.clone(),
                now,
            ),
            Branch::new(
                self.branch_id.as_str(),
                Action::Cancel,
                0,
                self.cancel.as_str(),
                payload,
                now,
            ),
        ])
    }
}

/// `POST /api/v1/transactions/{gid}/branches`.
/// A create request, parsed and checked: what the engine is asked to store. The trace
/// context comes from the request's headers; the handler sets it.
#[derive(Debug)]
pub enum NewTransaction {
    Saga(NewSaga),
    Prepared(NewPrepared),
}

impl NewTransaction {
    /// Every participant URL of the request, named by its field.
    pub fn urls(&self) -> Vec<(String, &str)> {
        match self {
            NewTransaction::Saga(saga) => saga
                .steps
                .iter()
                .enumerate()
                .flat_map(|(i, s)| {
                    [
                        (format!("steps[{i}].action"), s.action.as_str()),
                        (format!("steps[{i}].compensate"), s.compensate.as_str()),
                    ]
                })
                .collect(),
            NewTransaction::Prepared(prepared) => {
                let steps = prepared
                    .msg_steps
                    .iter()
                    .enumerate()
                    .map(|(i, (url, _))| (format!("steps[{i}].action"), url.as_str()));
                let query = prepared
                    .query_prepared
                    .iter()
                    .map(|url| ("query_prepared".to_owned(), url.as_str()));
                branch_urls(&prepared.branches)
                    .chain(steps)
                    .chain(query)
                    .collect()
            }
        }
    }
}

/// A checked create request and how to answer it.
#[derive(Debug)]
pub struct CheckedCreate {
    pub gid: String,
    pub kind: Kind,
    pub new: NewTransaction,
    pub wait_result: bool,
}

/// Parses and checks a `POST /api/v1/transactions` body without touching the engine: every
/// way it can be wrong is a 4xx [`ApiError`]. Public so the fuzz targets reach it.
pub fn check_create(
    body: Result<Bytes, BytesRejection>,
    idempotency_key: Option<&str>,
    defaults: &TxOptions,
    limits: &Limits,
    now: Millis,
) -> Result<CheckedCreate, ApiError> {
    // A longer list of steps or branches is refused by its count below.
    let req: CreateRequest = parse_body_capped(body, None, limits.max_branches)?;
    let kind: Kind = req.kind.parse().map_err(|_| {
        ApiError::bad_request(
            "unknown_kind",
            format!(
                "kind must be \"tcc\", \"saga\" or \"msg\" (got {:?})",
                req.kind
            ),
        )
    })?;
    let gid = match (req.gid, idempotency_key) {
        (Some(gid), Some(key)) if gid != key => {
            return Err(ApiError::bad_request(
                "idempotency_key_mismatch",
                format!(
                    "the body's gid {} and the Idempotency-Key header {} differ; send one, or both alike",
                    crate::api::validate::shown(&gid),
                    crate::api::validate::shown(key)
                ),
            ));
        }
        (Some(gid), _) => {
            check_id("gid", "invalid_gid", &gid)?;
            gid
        }
        (None, Some(key)) => {
            check_id("the Idempotency-Key header", "invalid_idempotency_key", key)?;
            key.to_owned()
        }
        // Documented as not safe to retry: a resent request makes a second transaction.
        (None, None) => uuid::Uuid::new_v4().simple().to_string(),
    };
    let invalid = |m: &str| Err(ApiError::bad_request("invalid_request", m.to_owned()));
    let new = match kind {
        Kind::Saga => {
            if req.steps.is_empty() {
                return Err(ApiError::bad_request(
                    "empty_steps",
                    "a saga needs at least one step",
                ));
            }
            if !req.branches.is_empty() {
                return invalid("a saga takes steps, not branches");
            }
            if req.query_prepared.is_some() {
                return invalid("query_prepared is for msg transactions");
            }
            check_branch_count("steps", req.steps.len, limits.max_branches)?;
            let mut steps = Vec::new();
            for (i, s) in req.steps.kept.into_iter().enumerate() {
                check_url(&format!("steps[{i}].action"), &s.action)?;
                let compensate = s.compensate.ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_request",
                        format!("steps[{i}].compensate is required for a saga"),
                    )
                })?;
                check_url(&format!("steps[{i}].compensate"), &compensate)?;
                check_payload(&format!("steps[{i}].payload"), &s.payload.0, limits)?;
                steps.push(SagaStep {
                    action: s.action,
                    compensate,
                    payload: s.payload.0.into(),
                });
            }
            let stated = req.options.check(steps.len(), limits)?;
            let options = stated.onto(defaults);
            let request = crate::api::identity::saga(&gid, &steps, &options, stated);
            NewTransaction::Saga(NewSaga {
                gid: gid.clone(),
                steps,
                options,
                request,
                trace: None,
                tokenless: false,
            })
        }
        Kind::Tcc | Kind::Msg => {
            if kind == Kind::Tcc && !req.steps.is_empty() {
                return invalid("a TCC transaction takes branches, not steps");
            }
            if kind == Kind::Msg && !req.branches.is_empty() {
                return invalid("a msg takes steps, not branches");
            }
            check_branch_count("branches", req.branches.len, limits.max_branches)?;
            check_branch_count("steps", req.steps.len, limits.max_branches)?;
            let mut branches = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            for (i, spec) in req.branches.kept.iter().enumerate() {
                if !seen.insert(spec.branch_id.as_str()) {
                    return Err(ApiError::bad_request(
                        "invalid_request",
                        format!("branch {:?} is listed twice", spec.branch_id),
                    ));
                }
                branches.extend(spec.operations(&format!("branches[{i}]."), limits, now)?);
            }
            if kind == Kind::Msg && req.steps.is_empty() {
                return Err(ApiError::bad_request(
                    "empty_steps",
                    "a msg needs at least one step",
                ));
            }
            let mut msg_steps = Vec::new();
            for (i, s) in req.steps.kept.into_iter().enumerate() {
                check_url(&format!("steps[{i}].action"), &s.action)?;
                if s.compensate.is_some() {
                    return invalid("msg steps have no compensate");
                }
                check_payload(&format!("steps[{i}].payload"), &s.payload.0, limits)?;
                msg_steps.push((s.action, s.payload.0.into()));
            }
            if let Some(url) = &req.query_prepared {
                check_url("query_prepared", url)?;
            }
            let stated = req.options.check(msg_steps.len(), limits)?;
            let options = stated.onto(defaults);
            let request = crate::api::identity::prepared(
                &gid,
                kind,
                &msg_steps,
                &branches,
                req.query_prepared.as_deref(),
                &options,
                stated,
            );
            NewTransaction::Prepared(NewPrepared {
                gid: gid.clone(),
                kind,
                options,
                msg_steps,
                query_prepared: req.query_prepared,
                branches,
                request,
                trace: None,
                tokenless: false,
            })
        }
    };
    Ok(CheckedCreate {
        gid,
        kind,
        new,
        wait_result: req.wait_result,
    })
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RegisterRequest {
    pub(super) branch_id: String,
    #[schema(format = "uri")]
    pub(super) confirm: String,
    #[schema(format = "uri")]
    pub(super) cancel: String,
    /// When given, idem calls the Try and answers with its outcome.
    #[serde(rename = "try")]
    #[schema(format = "uri")]
    pub(super) try_url: Option<String>,
    #[serde(default)]
    #[schema(value_type = Value)]
    pub(super) payload: Payload,
}

/// The optional body of submit, abort, retry and force-stop.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ActionRequest {
    #[serde(default)]
    pub(super) wait_result: bool,
    /// Abort and force-stop: why (at most 1,024 bytes).
    #[schema(max_length = 1024)]
    pub(super) reason: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(super) struct ListQuery {
    #[param(value_type = Option<crate::core::Status>)]
    pub(super) status: Option<String>,
    #[param(value_type = Option<Kind>)]
    pub(super) kind: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub(super) created_from: Option<Millis>,
    pub(super) created_to: Option<Millis>,
    /// A `next_cursor` this server gave.
    pub(super) cursor: Option<String>,
    #[param(minimum = 1, maximum = 1000)]
    pub(super) limit: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::OPTIONS;
    use crate::api::validate::body_tests::{
        REQUEST_FIELDS, assert_answers_as_the_tree_did, bodies,
    };
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1_000))]

        /// Read without a tree, a body is answered with the words the tree gave.
        #[test]
        fn bodies_are_answered_as_the_tree_did(text in bodies(REQUEST_FIELDS)) {
            assert_answers_as_the_tree_did::<CreateRequest>(&text);
            assert_answers_as_the_tree_did::<RegisterRequest>(&text);
            assert_answers_as_the_tree_did::<ActionRequest>(&text);
        }
    }

    #[test]
    fn every_numeric_option_is_an_options_field_of_the_same_name() {
        for option in OPTIONS {
            let body = serde_json::json!({ option.name: option.max });
            let request: OptionsRequest = serde_json::from_value(body).unwrap();
            let open = Limits {
                options: crate::api::validate::OptionLimits::OPEN,
                ..Limits::default()
            };
            let resolved = request.check(0, &open).unwrap().onto(&TxOptions::default());
            assert_eq!(option.of(&resolved), Some(option.max), "{}", option.name);
        }
    }
}

//! The native API's requests: what each body and query may hold, and how they become
//! what the engine takes.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Number, Value};

use crate::api::error::ApiError;
use crate::api::validate::{
    Given, MAX_ATTEMPTS, MAX_IN_PROGRESS, MAX_RETRY_INTERVAL, Overrides, REQUEST_TIMEOUT,
    RETRY_INTERVAL, TIMEOUT, check_id, check_payload, check_url, parse_orders,
};
use crate::core::{Action, Branch, Millis, TxOptions};

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
        let mut o = overrides.apply(defaults.clone())?;
        o.concurrent = self.concurrent;
        o.orders = parse_orders(self.orders, steps)
            .map_err(|m| ApiError::bad_request("invalid_options", m))?;
        Ok(o)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StepRequest {
    pub(super) action: String,
    pub(super) compensate: Option<String>,
    #[serde(default)]
    pub(super) payload: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateRequest {
    pub(super) gid: Option<String>,
    pub(super) kind: String,
    #[serde(default)]
    pub(super) steps: Vec<StepRequest>,
    #[serde(default)]
    pub(super) options: OptionsRequest,
    pub(super) query_prepared: Option<String>,
    /// TCC: branches to register with the transaction, in one request.
    #[serde(default)]
    pub(super) branches: Vec<BranchSpec>,
    #[serde(default)]
    pub(super) wait_result: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BranchSpec {
    pub(super) branch_id: String,
    pub(super) confirm: String,
    pub(super) cancel: String,
    #[serde(default)]
    pub(super) payload: Value,
}

impl BranchSpec {
    /// Checks the fields and builds the Confirm and Cancel operations.
    pub(super) fn operations(&self, now: Millis) -> Result<[Branch; 2], ApiError> {
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
pub(super) fn payload_text(payload: &Value) -> String {
    match payload {
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The part of a request that makes its identity: `wait_result` changes how the answer
/// is given, not what is asked, so it is left out of the hash.
pub(super) fn identity(mut request: Value) -> Value {
    if let Value::Object(map) = &mut request {
        map.remove("wait_result");
    }
    request
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RegisterRequest {
    pub(super) branch_id: String,
    pub(super) confirm: String,
    pub(super) cancel: String,
    #[serde(rename = "try")]
    pub(super) try_url: Option<String>,
    #[serde(default)]
    pub(super) payload: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActionRequest {
    #[serde(default)]
    pub(super) wait_result: bool,
    pub(super) reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    pub(super) status: Option<String>,
    pub(super) kind: Option<String>,
    pub(super) created_from: Option<Millis>,
    pub(super) created_to: Option<Millis>,
    pub(super) cursor: Option<String>,
    pub(super) limit: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::validate::OPTIONS;

    #[test]
    fn wait_result_is_not_part_of_the_identity() {
        let a = identity(serde_json::json!({"gid": "g", "wait_result": true}));
        let b = identity(serde_json::json!({"gid": "g"}));
        assert_eq!(a, b);
    }

    #[test]
    fn every_numeric_option_is_an_options_field_of_the_same_name() {
        for option in OPTIONS {
            let body = serde_json::json!({ option.name: option.max });
            let request: OptionsRequest = serde_json::from_value(body).unwrap();
            let resolved = request.resolve(&TxOptions::default(), 0).unwrap();
            assert_eq!(option.of(&resolved), Some(option.max), "{}", option.name);
        }
    }
}

//! The DTM door's requests: DTM's `TransGlobal` and query parameters, parsed and checked
//! into what the engine takes. DTM's option fields are mapped onto idem's table of bounds
//! (`validate::OPTIONS`), so they are judged as the native door's are.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use idem_canonical::JsonText;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Number;

use super::DtmError;
use crate::api::AppState;
use crate::api::error::ApiError;
use crate::api::identity::Identity;
use crate::api::validate::{
    Capped, Given, Limits, MAX_ATTEMPTS, MAX_CUSTOM_DATA_LEN, Overrides, REQUEST_TIMEOUT,
    RETRY_INTERVAL, Stated, TIMEOUT, check_branch_count, check_dtm_url, check_id, check_payload,
    check_payload_size, check_text, parse_body_capped, parse_orders,
};
use crate::core::{Kind, Millis, Payload, Protocol, SagaStep, TxOptions};

/// Payloads a gRPC request carried as bytes: DTM's `BinPayloads` (one per step) or a
/// branch's `BusiPayload`. JSON has no bytes, so the gRPC door hands them to these routes
/// beside the JSON body, as a request extension: set in-process only, never by a client.
#[derive(Clone, Debug, Default)]
pub struct BinaryPayloads(pub Vec<Payload>);

/// A DTM request's body as the routes take it: the JSON, and the payloads a gRPC request
/// carried as bytes.
pub(super) struct DtmBody {
    pub(super) json: Result<Bytes, BytesRejection>,
    pub(super) binary: Option<BinaryPayloads>,
}

impl<S: Send + Sync> FromRequest<S> for DtmBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(request: Request, state: &S) -> Result<DtmBody, Self::Rejection> {
        let binary = request.extensions().get::<BinaryPayloads>().cloned();
        let json = Bytes::from_request(request, state).await;
        Ok(DtmBody { json, binary })
    }
}

/// DTM's `TransGlobal` as clients send it. Every field may be absent or `null`; unknown
/// keys (such as the obsolete `passthrough_headers`) are ignored. Of `steps` and
/// `payloads`, no more entries are kept than a transaction may have steps (a longer
/// `steps` is refused by its count; `payloads` past the steps are not used).
#[derive(Debug, Default, Deserialize)]
pub(super) struct TransRequest {
    pub(super) gid: Option<String>,
    pub(super) trans_type: Option<String>,
    pub(super) steps: Option<Capped<Step>>,
    pub(super) payloads: Option<Capped<Option<String>>>,
    pub(super) custom_data: Option<String>,
    pub(super) wait_result: Option<bool>,
    /// Seconds. Numbers are kept as sent so that the shared checks judge them.
    pub(super) timeout_to_fail: Option<Number>,
    /// Seconds.
    pub(super) request_timeout: Option<Number>,
    /// Seconds.
    pub(super) retry_interval: Option<Number>,
    pub(super) retry_limit: Option<Number>,
    pub(super) branch_headers: Option<BTreeMap<String, String>>,
    pub(super) query_prepared: Option<String>,
    pub(super) rollback_reason: Option<String>,
}

/// A step of a `TransGlobal`, which DTM binds into a `map[string]string`: every value is
/// a string or null, and idem reads `action`, `compensate` and (DTM's legacy payload)
/// `data`. Read as such a map (a key given twice keeps its last value), keeping only
/// those three.
#[derive(Debug, Default)]
pub(super) struct Step {
    action: Option<String>,
    compensate: Option<String>,
    data: Option<String>,
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Step, D::Error> {
        deserializer.deserialize_map(StepVisitor)
    }
}

struct StepVisitor;

impl<'de> Visitor<'de> for StepVisitor {
    type Value = Step;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A map's words, which the answers have always used.
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Step, A::Error> {
        let mut step = Step::default();
        while let Some(key) = map.next_key::<String>()? {
            let value: Option<String> = map.next_value()?;
            match key.as_str() {
                "action" => step.action = value,
                "compensate" => step.compensate = value,
                "data" => step.data = value,
                _ => {}
            }
        }
        Ok(step)
    }
}

/// A value of registerBranch's body, which DTM binds into a `map[string]string`: a string,
/// null (as if absent), or anything else, kept as its text for the refusal.
pub(super) enum Field {
    Text(String),
    Null,
    Other(JsonText),
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Field, D::Error> {
        let text = JsonText::deserialize(deserializer)?;
        Ok(match text.as_str() {
            "null" => Field::Null,
            quoted if quoted.starts_with('"') => {
                Field::Text(serde_json::from_str(quoted).map_err(serde::de::Error::custom)?)
            }
            _ => Field::Other(text),
        })
    }
}

/// A parsed and checked request.
#[derive(Debug)]
pub struct Trans {
    pub(super) gid: String,
    pub(super) kind: Kind,
    /// (action, compensate, payload) per step.
    pub(super) steps: Vec<(String, String, Payload)>,
    pub(super) options: TxOptions,
    pub(super) query_prepared: Option<String>,
    pub(super) wait_result: bool,
    pub(super) reason: Option<String>,
    pub(super) identity: Arc<Identity>,
}

/// DTM's steps (action, compensate, payload) as a saga's.
pub(super) fn saga_steps(steps: &[(String, String, Payload)]) -> Vec<SagaStep> {
    steps
        .iter()
        .map(|(action, compensate, payload)| SagaStep {
            action: action.clone(),
            compensate: compensate.clone(),
            payload: payload.clone(),
        })
        .collect()
}

/// DTM's steps as a msg's (action, payload): a msg step has no compensation.
pub(super) fn msg_steps(steps: &[(String, String, Payload)]) -> Vec<(String, Payload)> {
    steps
        .iter()
        .map(|(action, _, payload)| (action.clone(), payload.clone()))
        .collect()
}

/// DTM's convention: an integer of 0 or below means "not set". Anything else, fractions
/// included, goes to the shared checks.
fn positive(v: &Option<Number>) -> Option<Number> {
    v.clone().filter(|n| n.as_i64().is_none_or(|v| v > 0))
}

pub(super) fn parse(body: DtmBody, app: &AppState) -> Result<Trans, DtmError> {
    parse_trans(
        body.json,
        body.binary.as_ref(),
        &app.engine.config().defaults,
        &app.limits,
    )
}

/// Parses and checks a `TransGlobal` body (and the payloads a gRPC request carried as
/// bytes, which stand for `payloads`) without touching the engine: every way it can be
/// wrong is a 4xx. Public so the fuzz targets reach it.
pub fn parse_trans(
    body: Result<Bytes, BytesRejection>,
    binary: Option<&BinaryPayloads>,
    defaults: &TxOptions,
    limits: &Limits,
) -> Result<Trans, DtmError> {
    // A longer list of steps is refused by its count below.
    let req: TransRequest = parse_body_capped(body, None, limits.max_branches)?;
    let gid = req
        .gid
        .filter(|g| !g.is_empty())
        .ok_or_else(|| ApiError::bad_request("missing_gid", "gid is required"))?;
    check_id("gid", "invalid_gid", &gid)?;
    let trans_type = req.trans_type.unwrap_or_default();
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

    let raw_steps = req.steps.unwrap_or_default();
    check_branch_count("steps", raw_steps.len, limits.max_branches)?;
    let mut payloads = req.payloads.unwrap_or_default().kept.into_iter();
    let mut binary = binary.map(|b| b.0.iter());
    let mut steps = Vec::with_capacity(raw_steps.len);
    for (i, step) in raw_steps.kept.into_iter().enumerate() {
        let action = step.action.unwrap_or_default();
        if action.starts_with("topic://") {
            return Err(ApiError::bad_request(
                "unsupported",
                format!(
                    "steps[{i}].action: msg topics (topic://) are not supported by idem; \
                     name each step's participant URL"
                ),
            )
            .into());
        }
        check_dtm_url(&format!("steps[{i}].action"), &action)?;
        let compensate = step.compensate.unwrap_or_default();
        if kind == Kind::Saga {
            check_dtm_url(&format!("steps[{i}].compensate"), &compensate)?;
        }
        // `payloads[i]` is the body; DTM's legacy `steps[i].data` is accepted too. Over
        // gRPC, `BinPayloads[i]` is, and its bytes need not be text.
        let payload = match binary.as_mut().and_then(Iterator::next) {
            Some(bytes) => {
                let name = format!("BinPayloads[{i}] (step {i})");
                check_payload_size(&name, bytes.len(), limits)?;
                bytes.clone()
            }
            None => {
                let (text, name) = match payloads.next().flatten() {
                    Some(p) => (p, format!("payloads[{i}] (step {i})")),
                    None => (step.data.unwrap_or_default(), format!("steps[{i}].data")),
                };
                check_payload(&name, &text, limits)?;
                Payload::from(text)
            }
        };
        steps.push((action, compensate, payload));
    }
    if let Some(url) = &req.query_prepared
        && !url.is_empty()
    {
        check_dtm_url("query_prepared", url)?;
    }

    // DTM has no field for max_retry_interval_ms or max_in_progress_ms: the server's
    // defaults apply.
    let numbers = [
        (&TIMEOUT, &req.timeout_to_fail),
        (&REQUEST_TIMEOUT, &req.request_timeout),
        (&RETRY_INTERVAL, &req.retry_interval),
        (&MAX_ATTEMPTS, &req.retry_limit),
    ];
    let overrides = Overrides {
        given: numbers
            .into_iter()
            .filter_map(|(option, value)| positive(value).map(|v| Given::dtm(option, v)))
            .collect(),
        branch_headers: req.branch_headers.unwrap_or_default(),
    };
    let mut stated = overrides.check(&limits.options)?;
    stated.protocol = Protocol::Dtm;
    if let Some(custom) = req.custom_data.as_deref().filter(|c| !c.is_empty()) {
        check_text("custom_data", custom, MAX_CUSTOM_DATA_LEN)?;
        apply_custom_data(kind, custom, steps.len(), &mut stated)?;
    }
    let options = stated.onto(defaults);

    // The same identity as the native door's for the same transaction: the steps and the
    // options as stored.
    let query_prepared = req.query_prepared.filter(|q| !q.is_empty());
    let identity = match kind {
        Kind::Saga => crate::api::identity::saga(&gid, &saga_steps(&steps), &options, stated),
        Kind::Tcc | Kind::Msg => crate::api::identity::prepared(
            &gid,
            kind,
            &msg_steps(&steps),
            &[],
            query_prepared.as_deref(),
            &options,
            stated,
        ),
    };
    Ok(Trans {
        gid,
        kind,
        steps,
        options,
        query_prepared,
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
    stated: &mut Stated,
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
        return Err(ApiError::bad_request(
            "unsupported",
            "custom_data.delay: delayed messages are not supported by idem",
        ));
    }
    if kind == Kind::Saga {
        stated.concurrent = custom.concurrent;
        stated.orders = parse_orders(custom.orders, steps).map_err(bad)?;
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
pub(super) struct GidOnly {
    pub(super) gid: Option<String>,
    pub(super) rollback_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct QueryParams {
    pub(super) gid: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct AllParams {
    pub(super) position: Option<String>,
    pub(super) limit: Option<u32>,
    pub(super) status: Option<String>,
    #[serde(rename = "transType")]
    pub(super) trans_type: Option<String>,
    #[serde(rename = "createTimeStart")]
    pub(super) create_time_start: Option<Millis>,
    #[serde(rename = "createTimeEnd")]
    pub(super) create_time_end: Option<Millis>,
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
            assert_answers_as_the_tree_did::<TransRequest>(&text);
            assert_answers_as_the_tree_did::<GidOnly>(&text);
            assert_answers_as_the_tree_did::<BTreeMap<String, Field>>(&text);
        }
    }

    #[test]
    fn every_dtm_field_of_the_table_is_read_from_the_request() {
        for option in OPTIONS {
            let Some((field, _)) = option.dtm else {
                continue;
            };
            let body = serde_json::json!({ field: 7 });
            let req: TransRequest = serde_json::from_value(body).unwrap();
            let given = [
                ("timeout_to_fail", &req.timeout_to_fail),
                ("request_timeout", &req.request_timeout),
                ("retry_interval", &req.retry_interval),
                ("retry_limit", &req.retry_limit),
            ];
            let set: Vec<_> = given.iter().filter(|(_, v)| v.is_some()).collect();
            assert_eq!(set.len(), 1, "{field}");
            assert_eq!(set[0].0, field);
        }
    }

    /// DTM's clients send every field, 0 meaning "unset": those take the stored
    /// transaction's values when a repeat is judged, not today's defaults.
    #[test]
    fn a_repeat_is_judged_as_of_the_stored_options() {
        use crate::canonical::CanonicalRequest;
        use serde_json::{Value, json};
        let parse = |body: &Value, defaults: &TxOptions| {
            let bytes = Ok(Bytes::from(body.to_string()));
            parse_trans(bytes, None, defaults, &Limits::default())
                .unwrap_or_else(|e| panic!("{body}: {}", e.0.message))
        };
        let today = TxOptions {
            request_timeout_ms: 7_000,
            retry_interval_ms: 2_000,
            max_retry_interval_ms: 5_000,
            max_attempts: 3,
            max_in_progress_ms: 9_000,
            ..TxOptions::default()
        };
        let saga = json!({
            "gid": "d1", "trans_type": "saga",
            "steps": [{"action": "http://p/a", "compensate": "http://p/c"}],
            "payloads": ["{\"n\":1}"],
            "timeout_to_fail": 0, "request_timeout": 0, "retry_interval": 0, "retry_limit": 0,
            "custom_data": "{\"concurrent\":true}",
        });
        let msg = json!({
            "gid": "d2", "trans_type": "msg",
            "steps": [{"action": "http://p/a"}], "payloads": ["x"],
            "query_prepared": "http://p/q",
        });
        for body in [saga, msg] {
            let first = parse(&body, &TxOptions::default());
            let mut stored = first.options.clone();
            if first.kind != Kind::Saga {
                // As `Engine::create_prepared` stores it: `--prepared-timeout-ms`.
                stored.timeout_ms.get_or_insert(60_000);
            }
            let hash = first.identity.hash();
            let again = parse(&body, &today);
            assert_ne!(again.identity.hash(), hash, "{body}");
            assert!(again.identity.repeats(&hash, &stored), "{body}");
            let mut same = body.clone();
            same["retry_interval"] = json!(1);
            assert!(
                parse(&same, &today).identity.repeats(&hash, &stored),
                "{same}"
            );
            let mut other = body.clone();
            other["retry_interval"] = json!(2);
            assert!(
                !parse(&other, &today).identity.repeats(&hash, &stored),
                "{other}"
            );
            let mut other = body.clone();
            other["branch_headers"] = json!({"X-A": "1"});
            assert!(
                !parse(&other, &today).identity.repeats(&hash, &stored),
                "{other}"
            );
        }
    }
}

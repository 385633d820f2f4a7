//! The request parsers on random bodies (the stable side of the cargo-fuzz targets in
//! `fuzz/`, which need nightly): the native create body and DTM's `TransGlobal` either
//! pass or answer a 4xx with a code, and never panic. Bodies are drawn from the requests'
//! own field names and plausible values, so most reach the checks past the JSON parse.

use axum::body::Bytes;
use idem::api::validate::{Limits, OptionLimits};
use idem_types::TxOptions;
use proptest::prelude::*;
use serde_json::{Map, Value};

/// Small bounds, so that random bodies reach the limits too.
const LIMITS: Limits = Limits {
    max_branches: 8,
    max_payload_bytes: 64,
    options: OptionLimits {
        max_attempts: 5,
        min_retry_interval_ms: 100,
    },
};

const KEYS: [&str; 27] = [
    "gid",
    "kind",
    "steps",
    "options",
    "query_prepared",
    "branches",
    "wait_result",
    "action",
    "compensate",
    "payload",
    "branch_id",
    "confirm",
    "cancel",
    "request_timeout_ms",
    "max_attempts",
    "retry_interval_ms",
    "timeout_ms",
    "branch_headers",
    "concurrent",
    "orders",
    "trans_type",
    "payloads",
    "custom_data",
    "timeout_to_fail",
    "retry_limit",
    "retry_interval",
    "data",
];

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("saga".to_owned()),
        Just("tcc".to_owned()),
        Just("msg".to_owned()),
        Just("http://127.0.0.1:9/a".to_owned()),
        Just("https://[::1]:9/".to_owned()),
        Just(r#"{"orders":{"1":[0]},"concurrent":true}"#.to_owned()),
        Just("0".to_owned()),
        "[a-z0-9_.:-]{0,10}",
        ".{0,12}",
    ]
}

fn body() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(600_000), any::<i64>()]
            .prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 40, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(&KEYS[..]), inner), 0..6).prop_map(
                |fields| {
                    let map: Map<String, Value> =
                        fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                    Value::Object(map)
                }
            ),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3_000))]

    #[test]
    fn the_native_create_check_passes_or_answers_a_4xx(value in body()) {
        let bytes = Bytes::from(value.to_string());
        if let Err(e) = idem::api::native::check_create(Ok(bytes), None, &TxOptions::default(), &LIMITS, 0) {
            prop_assert!(e.status.is_client_error(), "{} {} for {}", e.status, e.code, value);
        }
    }

    #[test]
    fn the_dtm_trans_global_parse_passes_or_answers_a_4xx(value in body()) {
        let bytes = Bytes::from(value.to_string());
        if let Err(e) = idem::api::dtm::parse_trans(Ok(bytes), None, &TxOptions::default(), &LIMITS) {
            let e = e.api_error();
            prop_assert!(e.status.is_client_error(), "{} {} for {}", e.status, e.code, value);
        }
    }

    #[test]
    fn any_bytes_are_refused_with_a_4xx(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        let body = Ok(Bytes::from(bytes));
        if let Err(e) = idem::api::native::check_create(body, None, &TxOptions::default(), &LIMITS, 0) {
            prop_assert!(e.status.is_client_error());
        }
    }
}

/// What the properties call "passes" exists: a valid body is accepted by both.
#[test]
fn both_parsers_accept_a_valid_saga() {
    let saga = serde_json::json!({"kind": "saga", "steps": [
        {"action": "http://127.0.0.1:9/a", "compensate": "http://127.0.0.1:9/b"}]});
    let checked = idem::api::native::check_create(
        Ok(Bytes::from(saga.to_string())),
        None,
        &TxOptions::default(),
        &LIMITS,
        0,
    );
    assert!(checked.is_ok(), "{checked:?}");
    let dtm = serde_json::json!({"gid": "g", "trans_type": "saga", "steps": [
        {"action": "http://127.0.0.1:9/a", "compensate": "http://127.0.0.1:9/b"}]});
    let parsed = idem::api::dtm::parse_trans(
        Ok(Bytes::from(dtm.to_string())),
        None,
        &TxOptions::default(),
        &LIMITS,
    );
    assert!(parsed.is_ok());
}

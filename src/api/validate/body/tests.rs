//! Bodies read without a tree answer as they did through one: the same code and the same
//! words, for random bodies of each request type (the property each door's request module
//! runs with its own field names) and for the cases where reading in document order could
//! differ.

use std::collections::BTreeMap;

use axum::body::Bytes;
use proptest::prelude::*;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::*;

/// The answer to `text` as a `T`: the code and message of a refusal, or `None`.
fn answer<T: DeserializeOwned>(text: &str) -> Option<(&'static str, String)> {
    parse_body::<T>(Ok(Bytes::from(text.to_owned())), None)
        .err()
        .map(|e| (e.code, e.message))
}

/// The answer the tree gave: the body parsed into a `Value`, then into a `T`.
fn tree_answer<T: DeserializeOwned>(text: &str) -> Option<(&'static str, String)> {
    let value: Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => return Some(("invalid_json", format!("the body is not JSON: {e}"))),
    };
    T::deserialize(&value)
        .err()
        .map(|e| ("invalid_json", format!("invalid request: {e}")))
}

/// Fails unless `text` is answered as the tree answered it, but for the one other
/// message: a request (or a part of one) sent as an array with more entries than it has
/// fields was "invalid length N, expected fewer elements in array", and is now "trailing
/// characters" (the parser finds the extra entries after the request type has read its
/// fields); the code is the same.
pub(crate) fn assert_answers_as_the_tree_did<T: DeserializeOwned>(text: &str) {
    match (answer::<T>(text), tree_answer::<T>(text)) {
        (Some(("invalid_json", now)), Some(("invalid_json", then)))
            if now == "invalid request: trailing characters"
                && then.ends_with("expected fewer elements in array") => {}
        (now, then) => assert_eq!(now, then, "{text}"),
    }
}

/// The field names of both doors' requests, for [`bodies`].
pub(crate) const REQUEST_FIELDS: &[&str] = &[
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
    "try",
    "timeout_ms",
    "branch_headers",
    "concurrent",
    "orders",
    "trans_type",
    "payloads",
    "custom_data",
    "timeout_to_fail",
    "retry_limit",
    "rollback_reason",
    "data",
];

/// Bodies made of `keys` (and one no request has) with values of every JSON type, as a
/// client's serializer writes them: keys in order, each once.
pub(crate) fn bodies(keys: &'static [&'static str]) -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(0i64), Just(1), Just(-1), Just(60_000), any::<i64>()]
            .prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(1.5)),
        prop::sample::select(vec![
            "saga",
            "tcc",
            "msg",
            "http://127.0.0.1:9/a",
            "g-1",
            ""
        ])
        .prop_map(Value::from),
    ];
    let mut keys = keys.to_vec();
    keys.push("no_such_field");
    let key = prop::sample::select(keys);
    leaf.prop_recursive(4, 32, 5, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|fields| {
                let map: Map<String, Value> =
                    fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                Value::Object(map)
            }),
        ]
    })
    .prop_map(|body| body.to_string())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Strict {
    name: String,
    #[serde(default)]
    list: Capped<u8>,
    #[serde(default)]
    map: BTreeMap<String, u8>,
}

const STRICT: &[&str] = &["name", "list", "map"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn random_bodies_are_answered_as_the_tree_did(text in bodies(STRICT)) {
        assert_answers_as_the_tree_did::<Strict>(&text);
    }
}

#[test]
fn what_is_not_json_is_still_not_json_whatever_comes_before() {
    for text in [
        // A wrong type first, then the JSON breaks: the tree never got to the type.
        r#"{"name": 5, "list": [1,"#,
        r#"{"name": "a", "no_such_field": 1e400}"#,
        r#"{"name": "a"} trailing"#,
        r#"{"name": "a", "no_such_field": "\x"}"#,
        &format!(
            r#"{{"name": "a", "no_such_field": {}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
    ] {
        assert_answers_as_the_tree_did::<Strict>(text);
        assert!(
            answer::<Strict>(text)
                .unwrap()
                .1
                .starts_with("the body is not JSON")
        );
    }
    // Empty bodies.
    assert_eq!(
        answer::<Strict>(" \n"),
        Some(("invalid_json", "the request body is empty".to_owned()))
    );
    let parsed: Result<Strict, _> =
        parse_body(Ok(Bytes::from_static(b" ")), Some(r#"{"name":"d"}"#));
    assert_eq!(parsed.unwrap().name, "d");
}

#[test]
fn type_errors_read_as_they_did() {
    for text in [
        r#"{"name": 5}"#,
        r#"{"name": "a", "list": {}}"#,
        r#"{"name": "a", "list": [1, -1]}"#,
        r#"{"name": "a", "map": {"k": 1.5}}"#,
        r#"{"list": []}"#,
        r#"{"name": "a", "other": 1}"#,
        r#"["a", [1, 2]]"#,
        r#"[]"#,
        r#"null"#,
    ] {
        assert_answers_as_the_tree_did::<Strict>(text);
    }
}

/// The one change: a field given twice is refused, where the tree kept the last. Keys
/// given twice inside a map still keep the last, as the tree's map did.
#[test]
fn a_field_given_twice_is_refused_and_a_map_key_given_twice_keeps_the_last() {
    let (code, message) = answer::<Strict>(r#"{"name": "a", "name": "b"}"#).unwrap();
    assert_eq!(
        (code, message.as_str()),
        ("invalid_json", "invalid request: duplicate field `name`")
    );
    let parsed: Strict =
        parse_body(Ok(Bytes::from(r#"{"name":"a","map":{"k":1,"k":2}}"#)), None).unwrap();
    assert_eq!(parsed.map["k"], 2);
}

#[test]
fn a_capped_list_keeps_its_first_entries_counts_all_and_checks_every_one() {
    let text = r#"{"name": "a", "list": [1, 2, 3, 4, 5]}"#;
    let parsed: Strict = parse_body_capped(Ok(Bytes::from(text)), None, 2).unwrap();
    assert_eq!((parsed.list.kept, parsed.list.len), (vec![1, 2], 5));
    // An entry past the bound is still read as an entry.
    let text = r#"{"name": "a", "list": [1, 2, 3, 4, 500]}"#;
    let refused = parse_body_capped::<Strict>(Ok(Bytes::from(text)), None, 2).unwrap_err();
    assert_eq!(
        refused.message,
        "invalid request: invalid value: integer `500`, expected u8"
    );
    // The bound is the parse's own: the next one keeps everything again.
    let parsed: Strict =
        parse_body(Ok(Bytes::from(r#"{"name":"a","list":[1,2,3]}"#)), None).unwrap();
    assert_eq!(parsed.list.kept, vec![1, 2, 3]);
}

//! Repeats judged as of the stored transaction, through the native door's checks (the DTM
//! door's are in `api::dtm::requests`), and the form of the hash that stored transactions
//! carry.

use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::api::native::{NewTransaction, check_create};
use crate::api::validate::{Limits, Stated};
use crate::canonical::{CanonicalRequest, request_hash};
use crate::core::{Action, Branch, Kind, Payload, SagaStep, TxOptions};

/// `--prepared-timeout-ms`'s default, which the engine gives a TCC or msg that states no
/// timeout, after hashing its request.
const PREPARED_TIMEOUT_MS: u64 = 60_000;

/// What a create leaves in the database to judge its repeats by.
struct Stored {
    hash: String,
    options: TxOptions,
}

fn check(body: &Value, defaults: &TxOptions) -> (Arc<dyn CanonicalRequest>, TxOptions) {
    let bytes = Ok(Bytes::from(body.to_string()));
    let checked = check_create(bytes, None, defaults, &Limits::default(), 0)
        .unwrap_or_else(|e| panic!("{body}: {}", e.message));
    match checked.new {
        NewTransaction::Saga(saga) => (saga.request, saga.options),
        NewTransaction::Prepared(prepared) => {
            // As `Engine::create_prepared` stores it.
            let mut options = prepared.options;
            options.timeout_ms.get_or_insert(PREPARED_TIMEOUT_MS);
            (prepared.request, options)
        }
    }
}

/// `body` created on a server with `defaults`.
fn create(body: &Value, defaults: &TxOptions) -> Stored {
    let (request, options) = check(body, defaults);
    Stored {
        hash: request.hash(),
        options,
    }
}

/// How the engine judges `body` arriving at a server with `defaults` under `stored`'s gid.
fn repeats(stored: &Stored, body: &Value, defaults: &TxOptions) -> bool {
    let (request, _) = check(body, defaults);
    request.repeats(&stored.hash, &stored.options)
}

/// Every default an operator can change, changed.
fn other_defaults() -> TxOptions {
    TxOptions {
        request_timeout_ms: 7_000,
        retry_interval_ms: 2_000,
        max_retry_interval_ms: 5_000,
        max_attempts: 3,
        max_in_progress_ms: 9_000,
        ..TxOptions::default()
    }
}

fn saga(options: Value) -> Value {
    json!({
        "gid": "g1",
        "kind": "saga",
        "steps": [{"action": "http://p/a", "compensate": "http://p/c", "payload": {"n": 1}}],
        "options": options,
    })
}

fn tcc(options: Value) -> Value {
    json!({
        "gid": "g1",
        "kind": "tcc",
        "branches": [{"branch_id": "b1", "confirm": "http://p/ok", "cancel": "http://p/no"}],
        "options": options,
    })
}

fn msg(options: Value) -> Value {
    json!({
        "gid": "g1",
        "kind": "msg",
        "steps": [{"action": "http://p/a", "payload": "x"}],
        "query_prepared": "http://p/q",
        "options": options,
    })
}

#[test]
fn the_identical_request_repeats_whatever_the_defaults_are_today() {
    let first = TxOptions::default();
    let today = other_defaults();
    let bodies = [
        saga(json!({})),
        saga(json!({"retry_interval_ms": 500, "branch_headers": {"X-A": "1"}})),
        saga(json!({"concurrent": true, "timeout_ms": 9_000})),
        tcc(json!({})),
        tcc(json!({"timeout_ms": 5_000, "max_attempts": 4})),
        msg(json!({})),
        msg(json!({"request_timeout_ms": 100})),
    ];
    for body in bodies {
        let stored = create(&body, &first);
        let (again, _) = check(&body, &today);
        // What broke: today's defaults give the repeat another hash.
        assert_ne!(again.hash(), stored.hash, "{body}");
        assert!(repeats(&stored, &body, &today), "{body}");
        assert!(repeats(&stored, &body, &first), "{body}");
    }
}

#[test]
fn spellings_of_one_request_stay_one_request_across_a_change_of_defaults() {
    let stored = create(&saga(json!({})), &TxOptions::default());
    let today = other_defaults();
    let mut no_options = saga(json!({}));
    no_options.as_object_mut().unwrap().remove("options");
    let spellings = [
        no_options,
        saga(json!({"branch_headers": {}, "orders": {}, "concurrent": false})),
        json!({
            "kind": "saga", "gid": "g1", "wait_result": true,
            "steps": [{"payload": {"n": 1.0}, "compensate": "http://p/c", "action": "http://p/a"}],
        }),
    ];
    for body in spellings {
        assert!(repeats(&stored, &body, &today), "{body}");
    }
    // A null payload and none are one payload too.
    let null = |payload: Option<Value>| {
        let mut step = json!({"action": "http://p/a", "compensate": "http://p/c"});
        if let Some(p) = payload {
            step["payload"] = p;
        }
        json!({"gid": "g2", "kind": "saga", "steps": [step]})
    };
    let stored = create(&null(Some(Value::Null)), &TxOptions::default());
    assert!(repeats(&stored, &null(None), &today));
}

#[test]
fn a_repeat_that_states_what_the_stored_one_had_repeats_it() {
    // The first left them to the defaults of the day; stating those values is the same.
    let stored = create(&saga(json!({})), &TxOptions::default());
    let stated = saga(json!({"retry_interval_ms": 1_000, "max_attempts": 12}));
    assert!(repeats(&stored, &stated, &other_defaults()));
    // And leaving out what the first stated takes the stored value.
    let stored = create(
        &saga(json!({"retry_interval_ms": 500})),
        &TxOptions::default(),
    );
    assert!(repeats(&stored, &saga(json!({})), &other_defaults()));
    // A prepared transaction's timeout: stated, or filled by the engine, is one value.
    let stored = create(&tcc(json!({})), &TxOptions::default());
    let stated = tcc(json!({"timeout_ms": PREPARED_TIMEOUT_MS}));
    assert!(repeats(&stored, &stated, &other_defaults()));
    let stored = create(
        &tcc(json!({"timeout_ms": PREPARED_TIMEOUT_MS})),
        &TxOptions::default(),
    );
    assert!(repeats(&stored, &tcc(json!({})), &other_defaults()));
}

#[test]
fn a_repeat_that_states_another_value_is_another_request() {
    let today = other_defaults();
    let cases = [
        (saga(json!({})), saga(json!({"retry_interval_ms": 2_001}))),
        // Stating today's default is not what the first one got.
        (saga(json!({})), saga(json!({"retry_interval_ms": 2_000}))),
        (
            saga(json!({"retry_interval_ms": 500})),
            saga(json!({"retry_interval_ms": 501})),
        ),
        (
            saga(json!({})),
            saga(json!({"branch_headers": {"X-A": "1"}})),
        ),
        (
            saga(json!({"branch_headers": {"X-A": "1"}})),
            saga(json!({"branch_headers": {"X-A": "2"}})),
        ),
        (saga(json!({})), saga(json!({"concurrent": true}))),
        (
            saga(json!({"concurrent": true})),
            saga(json!({"concurrent": false})),
        ),
        (saga(json!({})), saga(json!({"timeout_ms": 9_000}))),
        (
            saga(json!({})),
            json!({"gid": "g1", "kind": "saga",
                   "steps": [{"action": "http://p/a", "compensate": "http://p/c", "payload": {"n": 2}}]}),
        ),
        (saga(json!({})), tcc(json!({}))),
        (tcc(json!({})), tcc(json!({"timeout_ms": 5_000}))),
        (
            tcc(json!({"timeout_ms": 5_000})),
            tcc(json!({"timeout_ms": 5_001})),
        ),
        (msg(json!({})), msg(json!({"max_in_progress_ms": 1}))),
    ];
    for (first, then) in cases {
        let stored = create(&first, &TxOptions::default());
        assert!(!repeats(&stored, &then, &today), "{first} then {then}");
        assert!(
            !repeats(&stored, &then, &TxOptions::default()),
            "{first} then {then}"
        );
    }
}

/// Hashes are stored with every transaction: the form a request is hashed in must not
/// change, or the repeats of transactions created before the change would be conflicts.
/// This is the form (and hash) of a saga created with the built-in defaults.
#[test]
fn the_hashed_form_is_the_one_stored_hashes_were_made_of() {
    let (request, _) = check(
        &saga(json!({"branch_headers": {"X-A": "1"}})),
        &TxOptions::default(),
    );
    let form = json!({
        "gid": "g1",
        "kind": "saga",
        "steps": [["http://p/a", "http://p/c", {"n": 1}]],
        "branches": [],
        "query_prepared": null,
        "options": {
            "request_timeout_ms": 5_000,
            "retry_interval_ms": 1_000,
            "max_retry_interval_ms": 60_000,
            "max_attempts": 12,
            "max_in_progress_ms": 3_600_000,
            "timeout_ms": null,
            "protocol": "native",
            "branch_headers": {"X-A": "1"},
            "concurrent": false,
            "orders": {},
        },
    });
    assert_eq!(request.hash(), request_hash(&form));
    // The SHA-256 of that form's canonical text, as stored by every release so far.
    assert_eq!(
        request.hash(),
        "4c342be0a14a12e1736a6eedb558029199facac68538f627a5f9a2f4e137b683"
    );
}

/// The form as every release so far built it: a tree, hashed with `request_hash`. The
/// identity writes its canonical text without one, and must hash exactly as this did.
#[derive(serde::Serialize)]
struct TreeForm<'a> {
    gid: &'a str,
    kind: Kind,
    steps: Vec<(&'a str, &'a str, Value)>,
    branches: Vec<(&'a str, &'a str, &'a str, Value)>,
    query_prepared: Option<&'a str>,
    options: &'a TxOptions,
}

fn tree_payload(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn tree_hash(form: TreeForm<'_>) -> String {
    request_hash(&serde_json::to_value(form).unwrap())
}

/// Payload texts as both doors store them: the native door's compact JSON, DTM's any text
/// (JSON with spaces and keys out of order, numbers in other spellings, keys given twice,
/// text that is not JSON, an empty body).
const PAYLOADS: [&str; 12] = [
    "",
    "x",
    "1 2",
    r#"{"n":1}"#,
    r#" { "b" : [1.0, 2.50, 1e2], "a" : {"z": null, "y": "\u00e9"} } "#,
    r#"{"a":1,"a":2.0}"#,
    "18446744073709551616",
    "-0",
    "[]",
    r#""quoted""#,
    "nul\u{0}l",
    "{\"deep\":[[[[{\"k\":[true,false,null]}]]]]}",
];

#[test]
fn the_text_form_hashes_as_the_tree_form_did() {
    let options = other_defaults();
    let stored = TxOptions {
        timeout_ms: Some(PREPARED_TIMEOUT_MS),
        ..TxOptions::default()
    };
    for (i, text) in PAYLOADS.into_iter().enumerate() {
        let gid = format!("g{i}");
        let steps = [SagaStep {
            action: "http://p/a?x=\"1\"".into(),
            compensate: "http://p/c".into(),
            payload: text.into(),
        }];
        let identity = crate::api::identity::saga(&gid, &steps, &options, Stated::default());
        let tree = |options| TreeForm {
            gid: &gid,
            kind: Kind::Saga,
            steps: vec![("http://p/a?x=\"1\"", "http://p/c", tree_payload(text))],
            branches: Vec::new(),
            query_prepared: None,
            options,
        };
        assert_eq!(identity.hash(), tree_hash(tree(&options)), "{text}");
        assert_eq!(
            identity.hashes_as_of(&stored),
            [tree_hash(tree(&Stated::default().onto(&stored)))],
            "{text}"
        );

        let msg_steps = [("http://p/m".to_owned(), Payload::from(text))];
        let branch = Branch::new("b1", Action::Confirm, 0, "http://p/ok", text, 0);
        for (kind, query) in [(Kind::Msg, Some("http://p/q")), (Kind::Tcc, Some(""))] {
            let (msg, branches) = match kind {
                Kind::Msg => (&msg_steps[..], &[][..]),
                _ => (&[][..], std::slice::from_ref(&branch)),
            };
            let identity = crate::api::identity::prepared(
                &gid,
                kind,
                msg,
                branches,
                query,
                &options,
                Stated::default(),
            );
            let tree = |options| TreeForm {
                gid: &gid,
                kind,
                steps: msg
                    .iter()
                    .map(|(a, t)| (a.as_str(), "", tree_payload(t.as_text().unwrap())))
                    .collect(),
                branches: branches
                    .iter()
                    .map(|b| {
                        (
                            &*b.branch_id,
                            b.action.op(),
                            &*b.url,
                            tree_payload(b.payload.as_text().unwrap()),
                        )
                    })
                    .collect(),
                query_prepared: query.filter(|q| !q.is_empty()),
                options,
            };
            assert_eq!(
                identity.hash(),
                tree_hash(tree(&options)),
                "{kind:?} {text}"
            );
            // With the stored timeout and without it: the first request may have had none.
            let mut without = Stated::default().onto(&stored);
            let with = without.clone();
            without.timeout_ms = None;
            assert_eq!(
                identity.hashes_as_of(&stored),
                [tree_hash(tree(&with)), tree_hash(tree(&without))],
                "{kind:?} {text}"
            );
        }
    }
}

/// A body as sent, keys twice and all: the payload stored is what the tree printed.
#[test]
fn a_payload_is_stored_as_the_tree_printed_it() {
    let body = r#"{"kind": "saga", "gid": "g", "steps": [{"action": "http://p/a",
        "compensate": "http://p/c", "payload": {"b": [1.0, 1e2, -0], "a": "\u00e9", "b": 7}}]}"#;
    let checked = check_create(
        Ok(Bytes::from(body)),
        None,
        &TxOptions::default(),
        &Limits::default(),
        0,
    )
    .unwrap();
    let NewTransaction::Saga(saga) = checked.new else {
        panic!("a saga")
    };
    let value: Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        saga.steps[0].payload,
        value["steps"][0]["payload"].to_string().into()
    );
    assert_eq!(saga.steps[0].payload, r#"{"a":"é","b":7}"#.into());
}

/// A gRPC client's payload that is not text is its bytes in the form: the same bytes are
/// the same request, another byte another one, and no text collides with them. Bytes that
/// are UTF-8 are the text they spell, whichever door they came through.
#[test]
fn bytes_that_are_not_text_are_hashed_as_bytes() {
    let saga = |payload: Payload| {
        let step = SagaStep {
            action: "p:1/s.S/A".into(),
            compensate: "p:1/s.S/C".into(),
            payload,
        };
        let options = TxOptions::default();
        crate::api::identity::saga("g", &[step], &options, Stated::default()).hash()
    };
    let bytes = Payload::from(vec![0x08, 0xff, 0x01]);
    assert_eq!(saga(bytes.clone()), saga(bytes.clone()));
    assert_ne!(saga(bytes), saga(Payload::from(vec![0x08, 0xff, 0x02])));
    for text in ["bytes:ff", "\"bytes:ff\"", "ff", "[\"bytes\",\"ff\"]"] {
        assert_ne!(saga(Payload::from(vec![0xff])), saga(Payload::from(text)));
    }
    assert_eq!(
        saga(Payload::from(b"{\"n\": 1}".to_vec())),
        saga(Payload::from("{\"n\":1}"))
    );
}

//! The identity of a create request: what is hashed to recognise a repeat (the same gid
//! and identity get what is stored; another identity under the gid is `409
//! gid_conflict`). It is taken over the request as parsed and defaulted — the steps or
//! branches and the options the engine will store — never over the body as sent, so the
//! spellings of one request (`"options": {}` or the field left out, `"payload": null` or
//! none, `1` or `1.0`, `wait_result`) are one identity, and both doors build it here.

use serde::Serialize;
use serde_json::Value;

use crate::core::{Branch, Kind, SagaStep, TxOptions};

#[derive(Serialize)]
struct Identity<'a> {
    gid: &'a str,
    kind: Kind,
    /// (action, compensate, payload); a msg's compensate is empty.
    steps: Vec<(&'a str, &'a str, Value)>,
    /// TCC branches given at creation: (branch id, operation, URL, payload).
    branches: Vec<(&'a str, &'a str, &'a str, Value)>,
    query_prepared: Option<&'a str>,
    options: &'a TxOptions,
}

/// A payload as JSON when it is JSON, so that the hash's canonical form orders its keys and
/// compares its numbers by value (`{"n":1}` and `{ "n": 1.0 }` are one request); other text
/// as itself.
fn payload(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn value(identity: Identity<'_>) -> Value {
    serde_json::to_value(identity).expect("an identity serialises")
}

/// A saga's identity.
pub fn saga(gid: &str, steps: &[SagaStep], options: &TxOptions) -> Value {
    value(Identity {
        gid,
        kind: Kind::Saga,
        steps: steps
            .iter()
            .map(|s| {
                (
                    s.action.as_str(),
                    s.compensate.as_str(),
                    payload(&s.payload),
                )
            })
            .collect(),
        branches: Vec::new(),
        query_prepared: None,
        options,
    })
}

/// A TCC's or msg's identity: a msg's steps (action, payload), a TCC's branches given at
/// creation, the back-check URL.
pub fn prepared(
    gid: &str,
    kind: Kind,
    msg_steps: &[(String, String)],
    branches: &[Branch],
    query_prepared: Option<&str>,
    options: &TxOptions,
) -> Value {
    value(Identity {
        gid,
        kind,
        steps: msg_steps
            .iter()
            .map(|(action, text)| (action.as_str(), "", payload(text)))
            .collect(),
        branches: branches
            .iter()
            .map(|b| (&*b.branch_id, b.action.op(), &*b.url, payload(&b.payload)))
            .collect(),
        query_prepared: query_prepared.filter(|q| !q.is_empty()),
        options,
    })
}

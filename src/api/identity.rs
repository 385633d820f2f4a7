//! The identity of a create request: what is hashed to recognise a repeat (the same gid
//! and identity get what is stored; another identity under the gid is `409
//! gid_conflict`). It is taken over the request as parsed and defaulted — the steps or
//! branches and the options the engine will store — never over the body as sent, so the
//! spellings of one request (`"options": {}` or the field left out, `"payload": null` or
//! none, `1` or `1.0`, `wait_result`) are one identity, and both doors build it here.
//!
//! The options a request leaves out take this server's defaults, which an operator may
//! change between a request and its repeat. So a repeat is also judged as of the stored
//! transaction ([`CanonicalRequest::as_of`]): what it states laid over the stored options,
//! in the same form as the hash stored with the transaction. That form has not changed, so
//! transactions created before repeats were judged this way are recognised too.

use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use crate::api::validate::Stated;
use crate::canonical::CanonicalRequest;
use crate::core::{Branch, Kind, SagaStep, TxOptions};

/// A create request's identity, as the engine takes it.
#[derive(Debug)]
pub struct Identity {
    kind: Kind,
    /// With the options the transaction is created with.
    canonical: Value,
    /// The options the request gave.
    stated: Stated,
}

impl Identity {
    fn with_options(&self, options: &TxOptions) -> Value {
        let mut form = self.canonical.clone();
        form["options"] = serde_json::to_value(options).expect("options serialise");
        form
    }
}

impl CanonicalRequest for Identity {
    fn canonical(&self) -> &Value {
        &self.canonical
    }

    fn as_of(&self, stored: &TxOptions) -> Vec<Value> {
        let mut options = self.stated.onto(stored);
        let mut forms = vec![self.with_options(&options)];
        // The engine gives a TCC or msg that states no timeout `--prepared-timeout-ms`
        // after hashing it: the stored timeout may be the first request's own or that
        // default, and the first request's form then had none. A repeat that states
        // another timeout than the stored one is another request either way.
        if self.kind != Kind::Saga
            && options.timeout_ms.is_some()
            && options.timeout_ms == stored.timeout_ms
        {
            options.timeout_ms = None;
            forms.push(self.with_options(&options));
        }
        forms
    }
}

/// The canonical form of an identity, as hashed. Its shape is part of every stored hash:
/// changing it would make the repeats of stored transactions conflicts.
#[derive(Serialize)]
struct Form<'a> {
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

fn value(form: Form<'_>) -> Value {
    serde_json::to_value(form).expect("an identity serialises")
}

/// A saga's identity; `options` are `stated` laid over the server's defaults.
pub fn saga(gid: &str, steps: &[SagaStep], options: &TxOptions, stated: Stated) -> Arc<Identity> {
    let canonical = value(Form {
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
    });
    Arc::new(Identity {
        kind: Kind::Saga,
        canonical,
        stated,
    })
}

/// A TCC's or msg's identity: a msg's steps (action, payload), a TCC's branches given at
/// creation, the back-check URL; `options` are `stated` laid over the server's defaults.
pub fn prepared(
    gid: &str,
    kind: Kind,
    msg_steps: &[(String, String)],
    branches: &[Branch],
    query_prepared: Option<&str>,
    options: &TxOptions,
    stated: Stated,
) -> Arc<Identity> {
    let canonical = value(Form {
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
    });
    Arc::new(Identity {
        kind,
        canonical,
        stated,
    })
}

#[cfg(test)]
mod tests;

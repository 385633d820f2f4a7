//! The identity of a create request: what is hashed to recognise a repeat (the same gid
//! and identity get what is stored; another identity under the gid is `409
//! gid_conflict`). It is taken over the request as parsed and defaulted — the steps or
//! branches and the options the engine will store — never over the body as sent, so the
//! spellings of one request (`"options": {}` or the field left out, `"payload": null` or
//! none, `1` or `1.0`, `wait_result`) are one identity, and both doors build it here.
//!
//! The options a request leaves out take this server's defaults, which an operator may
//! change between a request and its repeat. So a repeat is also judged as of the stored
//! transaction ([`CanonicalRequest::hashes_as_of`]): what it states laid over the stored options,
//! in the same form as the hash stored with the transaction. That form has not changed, so
//! transactions created before repeats were judged this way are recognised too.

use std::sync::Arc;

use idem_canonical::{text_hash, write_canonical_json, write_canonical_text};
use serde_json::Value;

use crate::api::validate::Stated;
use crate::canonical::CanonicalRequest;
use crate::core::{Branch, Kind, Payload, SagaStep, TxOptions};

/// A create request's identity, as the engine takes it.
///
/// Its form is hashed as canonical text, and the text is written here piece by piece
/// rather than taken from a `Value` tree of the form: payloads are up to a megabyte of
/// client JSON, and a tree of them is many times that. The form's keys in canonical order
/// are `branches`, `gid`, `kind`, `options`, `query_prepared`, `steps`: everything before
/// the options' value and everything after it is kept as text, so a form with other
/// options (a repeat judged as of a stored transaction) costs only the options' text.
#[derive(Debug)]
pub struct Identity {
    kind: Kind,
    /// The canonical text up to the options' value: `{"branches":[...],...,"options":`.
    head: Vec<u8>,
    /// The canonical text after the options' value: `,"query_prepared":...}`.
    tail: Vec<u8>,
    /// The hash with the options the transaction is created with.
    hash: String,
    /// The options the request gave.
    stated: Stated,
}

impl Identity {
    fn new(
        kind: Kind,
        (head, tail): (Vec<u8>, Vec<u8>),
        options: &TxOptions,
        stated: Stated,
    ) -> Self {
        let mut identity = Identity {
            kind,
            head,
            tail,
            hash: String::new(),
            stated,
        };
        identity.hash = identity.hash_with(options);
        identity
    }

    /// The hash of the form with `options`.
    fn hash_with(&self, options: &TxOptions) -> String {
        let mut text = Vec::new();
        let options = serde_json::to_value(options).expect("options serialise");
        write_canonical_json(&options, &mut text);
        text_hash([self.head.as_slice(), &text, &self.tail])
    }
}

impl CanonicalRequest for Identity {
    fn hash(&self) -> String {
        self.hash.clone()
    }

    fn hashes_as_of(&self, stored: &TxOptions) -> Vec<String> {
        let mut options = self.stated.onto(stored);
        let mut hashes = vec![self.hash_with(&options)];
        // The engine gives a TCC or msg that states no timeout `--prepared-timeout-ms`
        // after hashing it: the stored timeout may be the first request's own or that
        // default, and the first request's form then had none. A repeat that states
        // another timeout than the stored one is another request either way.
        if self.kind != Kind::Saga
            && options.timeout_ms.is_some()
            && options.timeout_ms == stored.timeout_ms
        {
            options.timeout_ms = None;
            hashes.push(self.hash_with(&options));
        }
        hashes
    }
}

/// The canonical text of the form (gid, kind, steps, branches, back-check URL, options)
/// before and after its options. Its shape is part of every stored hash: changing it
/// would make the repeats of stored transactions conflicts (the test module keeps the
/// form as the tree every release so far has hashed, and holds this text to it).
///
/// Steps are (action, compensate, payload), a msg's compensate empty; branches given at
/// creation (branch id, operation, URL, payload).
fn form<'a>(
    gid: &str,
    kind: Kind,
    steps: impl Iterator<Item = (&'a str, &'a str, &'a Payload)>,
    branches: impl Iterator<Item = (&'a str, &'a str, &'a str, &'a Payload)>,
    query_prepared: Option<&str>,
) -> (Vec<u8>, Vec<u8>) {
    let string = |s: &str, out: &mut Vec<u8>| write_canonical_json(&Value::from(s), out);
    let mut head = b"{\"branches\":[".to_vec();
    for (i, (id, op, url, body)) in branches.enumerate() {
        head.extend_from_slice(if i == 0 { b"[" } else { b",[" });
        for field in [id, op, url] {
            string(field, &mut head);
            head.push(b',');
        }
        payload(body, &mut head);
        head.push(b']');
    }
    head.extend_from_slice(b"],\"gid\":");
    string(gid, &mut head);
    head.extend_from_slice(b",\"kind\":");
    let kind = serde_json::to_value(kind).expect("a kind serialises");
    write_canonical_json(&kind, &mut head);
    head.extend_from_slice(b",\"options\":");

    let mut tail = b",\"query_prepared\":".to_vec();
    match query_prepared.filter(|q| !q.is_empty()) {
        Some(url) => string(url, &mut tail),
        None => tail.extend_from_slice(b"null"),
    }
    tail.extend_from_slice(b",\"steps\":[");
    for (i, (action, compensate, body)) in steps.enumerate() {
        tail.extend_from_slice(if i == 0 { b"[" } else { b",[" });
        for field in [action, compensate] {
            string(field, &mut tail);
            tail.push(b',');
        }
        payload(body, &mut tail);
        tail.push(b']');
    }
    tail.extend_from_slice(b"]}");
    (head, tail)
}

/// A payload as JSON when it is JSON, so that the hash's canonical form orders its keys and
/// compares its numbers by value (`{"n":1}` and `{ "n": 1.0 }` are one request); other text
/// as a string of itself. Bytes that are not text (a gRPC client's protobuf) as `bytes:`
/// and their hex: not JSON, so no text payload has that form.
fn payload(payload: &Payload, out: &mut Vec<u8>) {
    match payload.as_text() {
        Some(text) => {
            if write_canonical_text(text, out).is_err() {
                write_canonical_json(&Value::from(text), out);
            }
        }
        None => {
            out.extend_from_slice(b"bytes:");
            out.extend_from_slice(hex::encode(payload.as_bytes()).as_bytes());
        }
    }
}

/// A saga's identity; `options` are `stated` laid over the server's defaults.
pub fn saga(gid: &str, steps: &[SagaStep], options: &TxOptions, stated: Stated) -> Arc<Identity> {
    let steps = steps
        .iter()
        .map(|s| (&*s.action, &*s.compensate, &s.payload));
    let text = form(gid, Kind::Saga, steps, std::iter::empty(), None);
    Arc::new(Identity::new(Kind::Saga, text, options, stated))
}

/// A TCC's or msg's identity: a msg's steps (action, payload), a TCC's branches given at
/// creation, the back-check URL; `options` are `stated` laid over the server's defaults.
pub fn prepared(
    gid: &str,
    kind: Kind,
    msg_steps: &[(String, Payload)],
    branches: &[Branch],
    query_prepared: Option<&str>,
    options: &TxOptions,
    stated: Stated,
) -> Arc<Identity> {
    let steps = msg_steps
        .iter()
        .map(|(action, payload)| (action.as_str(), "", payload));
    let branches = branches
        .iter()
        .map(|b| (&*b.branch_id, b.action.op(), &*b.url, &b.payload));
    let text = form(gid, kind, steps, branches, query_prepared);
    Arc::new(Identity::new(kind, text, options, stated))
}

#[cfg(test)]
mod tests;

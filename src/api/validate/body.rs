//! Request bodies read straight into their request types, so that what a request holds in
//! memory stays near the size of its body.
//!
//! A body used to become a `serde_json::Value` first and its typed request second: a tree
//! of a megabyte of client JSON is tens of megabytes (every number in an array is a
//! 32-byte `Value`, and the array keeps spare room), held at once with the typed copy.
//! Now a body is read twice, neither time into a tree: once to check that it is JSON
//! (the same checks, in the same order, with the same errors, as the `Value` parse:
//! nesting, number ranges, trailing text), once into the request type, whose payloads
//! are kept as text (`idem_canonical::JsonText`) and whose lists of steps or branches
//! keep no more entries than a transaction may have ([`Capped`]). So the answers stay
//! what they were: `invalid_json` "the body is not JSON" for a body that is not, and
//! "invalid request" for one that does not fit its type, in the same words.
//!
//! Two differences, both for requests no serializer writes: a request that names a field
//! twice is refused (`duplicate field`), where the tree kept the last one; and a request
//! (or a part of one) sent as an array with more entries than it has fields is "trailing
//! characters" where it was "invalid length". Both are `invalid_json` as before. (A body
//! with two mistakes is answered with the first in the body, where the tree named the
//! first in key order; a serializer writes keys in one order or the other.)

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::api::error::ApiError;

/// Parses a JSON body into `T`, turning every way it can be wrong into a 4xx. An empty
/// (or all-whitespace) body is `empty_is` when given, refused otherwise.
pub fn parse_body<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty_is: Option<&str>,
) -> Result<T, ApiError> {
    parse_body_capped(body, empty_is, usize::MAX)
}

/// [`parse_body`], the [`Capped`] lists of `T` keeping at most `kept` entries each.
pub fn parse_body_capped<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty_is: Option<&str>,
    kept: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(e.status(), "payload_too_large", e.body_text())
        } else {
            ApiError::bad_request("invalid_body", e.body_text())
        }
    })?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        match empty_is {
            Some(default) => default.as_bytes(),
            None => {
                return Err(ApiError::bad_request(
                    "invalid_json",
                    "the request body is empty",
                ));
            }
        }
    } else {
        &bytes
    };
    serde_json::from_slice::<Json>(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the body is not JSON: {e}")))?;
    let _kept = KeepAtMost::set(kept);
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("invalid request: {}", without_position(&e)),
        )
    })
}

/// An error's text without the position serde_json adds when it reads text: the tree's
/// errors had none, and the messages stay as they were.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => message.to_owned(),
        None => text,
    }
}

/// Any JSON value, read as `Value` reads it (every value through `deserialize_any`, so
/// numbers are converted and nesting is counted) and kept as nothing.
struct Json;

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_str<E>(self, _: &str) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        while seq.next_element::<Json>()?.is_some() {}
        Ok(Json)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        while map.next_key::<JsonKey>()?.is_some() {
            map.next_value::<Json>()?;
        }
        Ok(Json)
    }
}

/// An object's key, read as `Value` reads one (as a string) and kept as nothing.
struct JsonKey;

impl<'de> Deserialize<'de> for JsonKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JsonKey, D::Error> {
        deserializer.deserialize_str(JsonKeyVisitor)
    }
}

struct JsonKeyVisitor;

impl Visitor<'_> for JsonKeyVisitor {
    type Value = JsonKey;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<JsonKey, E> {
        Ok(JsonKey)
    }
}

thread_local! {
    /// How many entries a [`Capped`] list keeps in the parse running on this thread. A
    /// derived `Deserialize` cannot hand its fields a bound known only at run time (the
    /// server's `--max-branches`); a parse is synchronous, so it is set around one.
    static KEEP_AT_MOST: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Sets [`KEEP_AT_MOST`] until dropped, then puts back what it was.
struct KeepAtMost(usize);

impl KeepAtMost {
    fn set(kept: usize) -> KeepAtMost {
        KeepAtMost(KEEP_AT_MOST.replace(kept))
    }
}

impl Drop for KeepAtMost {
    fn drop(&mut self) {
        KEEP_AT_MOST.set(self.0);
    }
}

/// A list of which a parse keeps the first entries only (as many as a transaction may
/// have: a longer list is refused by its count), and counts the rest. Every entry is
/// still read as a `T`, so one that is not is refused as it was; the ones past the bound
/// are dropped at once. A body of 100,000 tiny steps thus holds no more than the steps a
/// transaction may have, where a `Vec` would hold them all, each many times its text.
#[derive(Debug)]
pub struct Capped<T> {
    /// The first entries, at most the parse's bound.
    pub kept: Vec<T>,
    /// How many the list had.
    pub len: usize,
}

impl<T> Default for Capped<T> {
    fn default() -> Capped<T> {
        Capped {
            kept: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Capped<T> {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Capped<T>, D::Error> {
        deserializer.deserialize_seq(CappedVisitor(PhantomData))
    }
}

struct CappedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for CappedVisitor<T> {
    type Value = Capped<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A `Vec`'s words, which the answers have always used.
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Capped<T>, A::Error> {
        let keep = KEEP_AT_MOST.get();
        let mut list = Capped::default();
        while let Some(entry) = seq.next_element::<T>()? {
            if list.kept.len() < keep {
                list.kept.push(entry);
            }
            list.len += 1;
        }
        Ok(list)
    }
}

#[cfg(test)]
pub(crate) mod tests;

//! Canonical JSON and request hashes.
//!
//! The gid is the idempotency key of a client's intent. To tell a harmless repeat from a
//! different request under the same gid, idem hashes the request in a canonical form:
//! object keys sorted, insignificant whitespace dropped, and numbers normalised so that
//! `1`, `1.0` and `1e0` are the same number.

use std::io::Write;

use serde_json::Value;
use sha2::{Digest, Sha256};

mod text;

pub use text::{JsonText, write_canonical_text};

/// The canonical text of a JSON value.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(value, &mut out);
    // Only serde_json's escaped strings and ASCII punctuation and digits were written.
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// Appends the canonical text of `value` to `out`.
pub fn write_canonical_json(value: &Value, out: &mut Vec<u8>) {
    write_value(value, out);
}

/// SHA-256 of the canonical text, as 64 lowercase hex digits.
pub fn request_hash(value: &Value) -> String {
    let mut text = Vec::new();
    write_value(value, &mut text);
    text_hash([text.as_slice()])
}

/// [`request_hash`] of a canonical text given in pieces, one after the other: a request
/// written as text (see [`write_canonical_text`]) hashes as its tree would.
pub fn text_hash<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> String {
    // Every create hashes its request: one string, not one per byte.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hasher = Sha256::new();
    for piece in pieces {
        hasher.update(piece);
    }
    let digest = hasher.finalize();
    let mut hex = String::with_capacity(2 * digest.len());
    for b in digest {
        hex.push(HEX[usize::from(b >> 4)] as char);
        hex.push(HEX[usize::from(b & 0x0f)] as char);
    }
    hex
}

/// Whether two values are the same request as the hash sees it: equal, with numbers compared
/// by value, so `1`, `1.0` and `1e0` are one number. `x` and `serde_json::from_str(
/// &canonical_json(&x))` always are (the fuzz target and the property test check it).
pub fn same_up_to_numbers(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(m), Value::Number(n)) => match (m.as_i64(), n.as_i64()) {
            (Some(m), Some(n)) => m == n,
            _ => m
                .as_u64()
                .zip(n.as_u64())
                .map_or_else(|| m.as_f64() == n.as_f64(), |(m, n)| m == n),
        },
        (Value::Array(m), Value::Array(n)) => {
            m.len() == n.len() && m.iter().zip(n).all(|(m, n)| same_up_to_numbers(m, n))
        }
        (Value::Object(m), Value::Object(n)) => {
            m.len() == n.len()
                && m.iter()
                    .all(|(k, v)| n.get(k).is_some_and(|w| same_up_to_numbers(v, w)))
        }
        (a, b) => a == b,
    }
}

// Writing to a Vec cannot fail, and neither can serializing a string.
fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_value(&map[key], out);
            }
            out.push(b'}');
        }
    }
}

/// `s` as a JSON string, escaped as serde_json escapes it.
pub(crate) fn write_string(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).expect("a string serializes");
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    let written = if let Some(i) = n.as_i64() {
        write!(out, "{i}")
    } else if let Some(u) = n.as_u64() {
        write!(out, "{u}")
    } else if let Some(f) = n.as_f64() {
        write_float(f, out);
        Ok(())
    } else {
        Ok(())
    };
    written.expect("writing to a Vec cannot fail");
}

/// A finite float of the canonical text.
pub(crate) fn write_float(f: f64, out: &mut Vec<u8>) {
    // Integral floats within the exactly-representable range print as integers, so
    // 1.0 and 1 hash alike; other floats use Rust's shortest round-trip form.
    let written = if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
        write!(out, "{}", f as i64)
    } else {
        write!(out, "{f:?}")
    };
    written.expect("writing to a Vec cannot fail");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b": [1, 2], "a": {"y": 1, "x": "s"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"s","y":1},"b":[1,2]}"#).unwrap();
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"s","y":1},"b":[1,2]}"#);
        assert_eq!(request_hash(&a), request_hash(&b));
    }

    #[test]
    fn numbers_are_normalised() {
        let a: Value = serde_json::from_str(r#"{"n": 1.0, "m": 2.50, "e": 1e2}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"n": 1, "m": 2.5, "e": 100}"#).unwrap();
        assert_eq!(request_hash(&a), request_hash(&b));
    }

    #[test]
    fn different_values_hash_differently() {
        assert_ne!(
            request_hash(&json!({"amount": 100})),
            request_hash(&json!({"amount": 1000}))
        );
        assert_ne!(request_hash(&json!([1, 2])), request_hash(&json!([2, 1])));
        assert_eq!(request_hash(&json!({})).len(), 64);
    }

    /// Any JSON value (`text`'s tests use it too).
    pub(crate) fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                .prop_map(Value::from),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(".{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        // The fuzz target `canonical_json` (fuzz/) checks the same on bytes.
        #[test]
        fn canonical_form_is_idempotent_and_parses_back(x in json()) {
            let canon = canonical_json(&x);
            let y: Value = serde_json::from_str(&canon).unwrap();
            prop_assert_eq!(canonical_json(&y), canon.clone());
            prop_assert!(same_up_to_numbers(&x, &y), "{} became {}", x, y);
            prop_assert_eq!(request_hash(&x), request_hash(&y));
            let spaced = serde_json::to_string_pretty(&x).unwrap();
            let z: Value = serde_json::from_str(&spaced).unwrap();
            prop_assert_eq!(canonical_json(&z), canon);
        }
    }

    #[test]
    fn the_hash_is_the_sha256_of_the_canonical_text_in_lowercase_hex() {
        // Hashes are stored with every transaction: their form must never change.
        assert_eq!(
            request_hash(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        let x = json!({"b": null, "a": [1, 2.50, "x\n"]});
        assert_eq!(canonical_json(&x), r#"{"a":[1,2.5,"x\n"],"b":null}"#);
        assert_eq!(
            request_hash(&x),
            "0718256dfa5777ed7aeb34ff5094fbfaac09972f48f5617e0931b26495144696"
        );
    }

    #[test]
    fn strings_are_escaped() {
        assert_eq!(canonical_json(&json!({"k\"": "a\nb"})), r#"{"k\"":"a\nb"}"#);
    }
}

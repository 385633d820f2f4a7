//! Canonical JSON and request hashes.
//!
//! The gid is the idempotency key of a client's intent. To tell a harmless repeat from a
//! different request under the same gid, idem hashes the request in a canonical form:
//! object keys sorted, insignificant whitespace dropped, and numbers normalised so that
//! `1`, `1.0` and `1e0` are the same number.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical text of a JSON value.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_value(value, &mut out);
    out
}

/// SHA-256 of the canonical text, as 64 lowercase hex digits.
pub fn request_hash(value: &Value) -> String {
    let digest = Sha256::digest(canonical_json(value).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_value(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_value(&map[key], out);
            }
            out.push('}');
        }
    }
}

fn write_number(n: &serde_json::Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        // Integral floats within the exactly-representable range print as integers, so
        // 1.0 and 1 hash alike; other floats use Rust's shortest round-trip form.
        if f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0 {
            out.push_str(&(f as i64).to_string());
        } else {
            out.push_str(&format!("{f:?}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn strings_are_escaped() {
        assert_eq!(canonical_json(&json!({"k\"": "a\nb"})), r#"{"k\"":"a\nb"}"#);
    }
}

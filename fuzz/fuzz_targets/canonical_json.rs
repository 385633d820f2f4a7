//! Canonical JSON of any JSON text: the canonical text is itself canonical (idempotent),
//! parses back to the same value up to number normalisation, and hashes the same.
#![no_main]

use idem::canonical::{canonical_json, request_hash, same_up_to_numbers};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(x) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let canon = canonical_json(&x);
    let y: Value = serde_json::from_str(&canon).expect("canonical text is JSON");
    assert_eq!(canonical_json(&y), canon, "not idempotent");
    assert!(same_up_to_numbers(&x, &y), "{x} became {y}");
    assert_eq!(request_hash(&x), request_hash(&y));
});

//! Canonical JSON and request hashes live in `idem-canonical`, shared with the participant
//! SDK so that a participant's Idempotency-Key layer hashes requests as the coordinator does.

pub use idem_canonical::{canonical_json, request_hash, same_up_to_numbers};

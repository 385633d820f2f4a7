//! Signed idem branch calls, shared by the coordinator (which signs) and the participant
//! SDK (which verifies), so both sides build the same canonical string from one text.
//!
//! # The header
//!
//! ```text
//! Idem-Signature: t=1764600000,kid=2026-12,v1=3f1c…(64 hex digits)
//! ```
//!
//! * `t`: when the call was signed, in Unix seconds (the coordinator's wall clock);
//! * `kid`: which key signed it, so keys can rotate;
//! * `v1`: the lowercase hex HMAC-SHA256 of the canonical string under that key's secret.
//!
//! Fields are separated by `,`; unknown fields are ignored, so a later version can add one
//! (say `v2`) next to `v1`.
//!
//! # The canonical string
//!
//! Six lines joined by `\n` (no trailing newline):
//!
//! ```text
//! idem-signature-v1
//! <t>                      the same decimal digits as in the header
//! <kid>                    the same key id as in the header
//! <METHOD>                 POST, or GET for DTM's msg back-check
//! <path and query>         the request target exactly as sent: /inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try
//! <hex SHA-256 of the body> lowercase; the SHA-256 of nothing for an empty body
//! ```
//!
//! A verifier reads the path and query from the request line as received (before any
//! percent-decoding or routing), so a proxy in front of the participant that rewrites paths
//! breaks the signature: verify where the path is the one the coordinator called.
//!
//! # Keys
//!
//! A key is a key id and a secret (the secret's UTF-8 bytes are the HMAC key), written
//! `kid:secret`; a list of keys is one per line or comma-separated, `#` starting a comment
//! line (see [`Keys::parse`]). The coordinator signs with the first key of its list; a
//! participant accepts any key of its list, which is how keys rotate: add the new key to
//! every participant, then put it first at the coordinator, then remove the old one.

#![warn(missing_docs)]

mod keys;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

pub use keys::{Key, KeyError, Keys, MIN_SECRET_BYTES};

/// The header's name (HTTP header names are case-insensitive).
pub const HEADER: &str = "idem-signature";

/// The first line of the canonical string: names the scheme and its version.
pub const SCHEME: &str = "idem-signature-v1";

/// How far a call's timestamp may be from the verifier's clock, either way, by default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The string that is signed (see the crate's documentation).
pub fn canonical(
    timestamp: u64,
    kid: &str,
    method: &str,
    path_and_query: &str,
    body: &[u8],
) -> String {
    let body_hash = hex::encode(Sha256::digest(body));
    format!("{SCHEME}\n{timestamp}\n{kid}\n{method}\n{path_and_query}\n{body_hash}")
}

fn mac(key: &Key, canonical: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length; the error branch cannot happen.
    let mut mac = Hmac::<Sha256>::new_from_slice(key.secret()).expect("HMAC accepts any key size");
    mac.update(canonical.as_bytes());
    mac
}

/// The `Idem-Signature` header value for one call, signed with `key` at `timestamp`
/// (Unix seconds).
pub fn sign(key: &Key, timestamp: u64, method: &str, path_and_query: &str, body: &[u8]) -> String {
    let text = canonical(timestamp, key.kid(), method, path_and_query, body);
    let digest = hex::encode(mac(key, &text).finalize().into_bytes());
    format!("t={timestamp},kid={},v1={digest}", key.kid())
}

/// Unix seconds of `time` (0 before 1970).
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Why a call's signature was not accepted. Each has a stable [`code`](Self::code).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Idem-Signature` header.
    #[error("the call has no Idem-Signature header")]
    Missing,
    /// The header is not `t=<digits>,kid=<id>,v1=<64 hex digits>`.
    #[error("malformed Idem-Signature header: {0}")]
    Malformed(&'static str),
    /// The header names a key id this side does not hold.
    #[error("unknown signing key id `{0}`")]
    UnknownKey(String),
    /// The signature does not match the call (another secret, or a changed method,
    /// path, query, timestamp or body).
    #[error("the signature does not match the call")]
    Mismatch,
    /// The timestamp is further than the window from this side's clock (a replay, or a
    /// clock off by that much).
    #[error(
        "signed at {timestamp}, {skew_seconds} s away from now; the window is {window_seconds} s"
    )]
    OutsideWindow {
        /// The header's `t`.
        timestamp: u64,
        /// How far it is from now, either way.
        skew_seconds: u64,
        /// The accepted distance.
        window_seconds: u64,
    },
}

impl SignatureError {
    /// The stable code a participant answers with (in a 401's body).
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::Missing => "signature_missing",
            SignatureError::Malformed(_) => "signature_malformed",
            SignatureError::UnknownKey(_) => "signature_unknown_key",
            SignatureError::Mismatch => "signature_mismatch",
            SignatureError::OutsideWindow { .. } => "signature_expired",
        }
    }
}

/// The parsed fields of a header value.
struct Parsed<'a> {
    timestamp: u64,
    kid: &'a str,
    v1: Vec<u8>,
}

fn parse(header: &str) -> Result<Parsed<'_>, SignatureError> {
    let (mut t, mut kid, mut v1) = (None, None, None);
    for field in header.split(',') {
        let Some((name, value)) = field.trim().split_once('=') else {
            return Err(SignatureError::Malformed("a field is not name=value"));
        };
        let slot = match name {
            "t" => &mut t,
            "kid" => &mut kid,
            "v1" => &mut v1,
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return Err(SignatureError::Malformed("a field appears twice"));
        }
    }
    let t = t.ok_or(SignatureError::Malformed("no t"))?;
    let kid = kid.ok_or(SignatureError::Malformed("no kid"))?;
    let v1 = v1.ok_or(SignatureError::Malformed("no v1"))?;
    // Digits only: `+5` or ` 5` would parse but sign a different text.
    if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Malformed("t is not Unix seconds"));
    }
    let timestamp = t
        .parse()
        .map_err(|_| SignatureError::Malformed("t is not Unix seconds"))?;
    if v1.len() != 64 {
        return Err(SignatureError::Malformed("v1 is not 64 hex digits"));
    }
    let v1 = hex::decode(v1).map_err(|_| SignatureError::Malformed("v1 is not 64 hex digits"))?;
    Ok(Parsed { timestamp, kid, v1 })
}

/// Checks a call's signature: `header` is its `Idem-Signature` value (`None` when absent),
/// `method`, `path_and_query` and `body` as received, `now` this side's clock. Accepts a
/// signature by any of `keys` made within `window` of `now` (either way); returns the key
/// id that signed. The comparison runs in constant time.
///
/// A verified call can still be a repeat within the window: idem retries calls anyway,
/// so the participant's barrier, not the signature, makes a repeat harmless.
pub fn verify<'k>(
    header: Option<&str>,
    method: &str,
    path_and_query: &str,
    body: &[u8],
    now: SystemTime,
    keys: &'k Keys,
    window: Duration,
) -> Result<&'k str, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let parsed = parse(header)?;
    let key = keys
        .get(parsed.kid)
        .ok_or_else(|| SignatureError::UnknownKey(parsed.kid.chars().take(64).collect()))?;
    let text = canonical(parsed.timestamp, key.kid(), method, path_and_query, body);
    mac(key, &text)
        .verify_slice(&parsed.v1)
        .map_err(|_| SignatureError::Mismatch)?;
    // Checked after the MAC, so a forged header learns nothing about the window.
    let now = unix_seconds(now);
    let skew = now.abs_diff(parsed.timestamp);
    if skew > window.as_secs() {
        return Err(SignatureError::OutsideWindow {
            timestamp: parsed.timestamp,
            skew_seconds: skew,
            window_seconds: window.as_secs(),
        });
    }
    Ok(key.kid())
}

#[cfg(test)]
mod tests;

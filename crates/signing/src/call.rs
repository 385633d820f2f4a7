//! What a signature covers, signing a call and verifying one.

use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::error::SignatureError;
use crate::header::{Parsed, parse};
use crate::keyring::{Keyring, is_tenant_name};
use crate::keys::{Key, KeyError, Keys};
use crate::{DEFAULT_TENANT, SCHEME_V1, SCHEME_V2, unix_seconds};

/// One call as the coordinator sends it and a participant receives it: everything a v2
/// signature covers besides the time and the key id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call<'a> {
    /// `POST`, or `GET` for DTM's msg back-check.
    pub method: &'a str,
    /// `http` or `https`, lowercase.
    pub scheme: &'a str,
    /// The URL's host, lowercase ASCII (a name as punycode), an IPv6 address in brackets
    /// (`[::1]`), without the port.
    pub host: &'a str,
    /// The port called, the scheme's default (80, 443) when the URL names none.
    pub port: u16,
    /// The request target: the path and query exactly as on the request line
    /// (`/inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try`).
    pub target: &'a str,
    /// The body as sent (empty for a GET).
    pub body: &'a [u8],
    /// The `Idem-Tenant` header; [`DEFAULT_TENANT`] when the call has none.
    pub tenant: &'a str,
    /// The `Idem-Call-Id` header (32 lowercase hex digits); empty when the call has none.
    pub call_id: &'a str,
}

/// Which version of the scheme a verified signature was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// Time, key id, method, target and body only.
    V1,
    /// Also the scheme, host, port, tenant and call id.
    V2,
}

/// A signature that verified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The key that signed.
    pub kid: String,
    /// The version checked.
    pub version: Version,
    /// The header's `t`.
    pub timestamp: u64,
}

/// What a verifier accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// How far a call's timestamp may be from the verifier's clock, either way.
    pub window: Duration,
    /// Whether a call signed with v1 only is accepted (from a coordinator that predates
    /// v2). A call with a v2 signature is always checked on v2 alone.
    pub accept_v1: bool,
}

impl Default for Policy {
    /// The default window, v2 required.
    fn default() -> Policy {
        Policy {
            window: crate::DEFAULT_WINDOW,
            accept_v1: false,
        }
    }
}

fn body_hash(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}

/// The v1 string: six lines (see the crate's documentation).
pub fn canonical_v1(timestamp: u64, kid: &str, method: &str, target: &str, body: &[u8]) -> String {
    let hash = body_hash(body);
    format!("{SCHEME_V1}\n{timestamp}\n{kid}\n{method}\n{target}\n{hash}")
}

/// The v2 string: eleven lines (see the crate's documentation).
pub fn canonical_v2(timestamp: u64, kid: &str, call: &Call<'_>) -> String {
    let Call {
        method,
        scheme,
        host,
        port,
        target,
        body,
        tenant,
        call_id,
    } = call;
    let hash = body_hash(body);
    format!(
        "{SCHEME_V2}\n{timestamp}\n{kid}\n{call_id}\n{tenant}\n{method}\n{scheme}\n{host}\n{port}\n{target}\n{hash}"
    )
}

/// The `Idem-Signature` header value for `call`, signed with `key` at `timestamp` (Unix
/// seconds): `t`, `kid` and `v2`, and `v1` too when `with_v1` and `key` is an HMAC key (a
/// participant that predates v2 checks that one). A public key cannot sign.
pub fn sign_call(
    key: &Key,
    timestamp: u64,
    call: &Call<'_>,
    with_v1: bool,
) -> Result<String, KeyError> {
    let kid = key.kid();
    let public_only = || KeyError::PublicOnly(kid.to_owned());
    let v2 = key
        .sign(canonical_v2(timestamp, kid, call).as_bytes())
        .ok_or_else(public_only)?;
    let mut header = format!("t={timestamp},kid={kid},v2={v2}");
    if with_v1 && key.algorithm() == crate::Algorithm::HmacSha256 {
        let text = canonical_v1(timestamp, kid, call.method, call.target, call.body);
        let v1 = key.sign(text.as_bytes()).ok_or_else(public_only)?;
        header.push_str(&format!(",v1={v1}"));
    }
    Ok(header)
}

/// The v1 header for a call (`t`, `kid`, `v1`): what a coordinator that predates v2 sends.
/// Only an HMAC key signs v1.
pub fn sign_v1(
    key: &Key,
    timestamp: u64,
    method: &str,
    target: &str,
    body: &[u8],
) -> Result<String, KeyError> {
    if key.algorithm() != crate::Algorithm::HmacSha256 {
        return Err(KeyError::PublicOnly(key.kid().to_owned()));
    }
    let text = canonical_v1(timestamp, key.kid(), method, target, body);
    let v1 = key
        .sign(text.as_bytes())
        .ok_or_else(|| KeyError::PublicOnly(key.kid().to_owned()))?;
    Ok(format!("t={timestamp},kid={},v1={v1}", key.kid()))
}

/// A new call id: 128 bits from the operating system's random generator, as 32 lowercase
/// hex digits.
pub fn new_call_id() -> String {
    let mut id = [0u8; 16];
    crate::keys::os_random(&mut id);
    hex::encode(id)
}

/// Whether `id` has the form of a call id: 32 lowercase hex digits.
pub fn is_call_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks a call's signature: `header` is its `Idem-Signature` value (`None` when absent),
/// `call` what was received (its tenant's keys in `keyring` are the ones that may have
/// signed), `now` this side's clock. A header with `v2` is checked on v2 alone; one with
/// only `v1` is refused unless the policy accepts v1. Comparisons of HMACs run in constant
/// time; the window is checked after the signature, so a forged header learns nothing
/// about it.
///
/// A verified v2 call can still be a repeat within the window: refusing a call id seen
/// before is the caller's (the SDK's verifier keeps them; see its replay cache).
pub fn verify_call(
    header: Option<&str>,
    call: &Call<'_>,
    now: SystemTime,
    keyring: &Keyring,
    policy: Policy,
) -> Result<Verified, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let parsed = parse(header)?;
    if !is_tenant_name(call.tenant) {
        return Err(SignatureError::Malformed(
            "Idem-Tenant is not a tenant name (1 to 32 of a-z 0-9 _ -)",
        ));
    }
    let version = match (&parsed.v2, &parsed.v1) {
        (Some(_), _) => Version::V2,
        (None, Some(_)) if policy.accept_v1 => Version::V1,
        (None, Some(_)) => return Err(SignatureError::V2Required),
        (None, None) => return Err(SignatureError::Malformed("no v1 or v2")),
    };
    if version == Version::V2 && !is_call_id(call.call_id) {
        return Err(SignatureError::Malformed(
            "Idem-Call-Id is not 32 lowercase hex digits",
        ));
    }
    let keys = keyring
        .for_tenant(call.tenant)
        .ok_or_else(|| SignatureError::UnknownTenant(call.tenant.to_owned()))?;
    check(keys, &parsed, version, call, now, policy.window)
}

/// Checks a v1 signature alone, as a participant that predates v2 does: `header`, the
/// method, the request target and the body as received, against any of `keys`. Whatever
/// else the header holds (a `v2`) is ignored.
pub fn verify_v1(
    header: Option<&str>,
    method: &str,
    target: &str,
    body: &[u8],
    now: SystemTime,
    keys: &Keys,
    window: Duration,
) -> Result<Verified, SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let parsed = parse(header)?;
    if parsed.v1.is_none() {
        return Err(SignatureError::Malformed("no v1"));
    }
    let call = Call {
        method,
        scheme: "",
        host: "",
        port: 0,
        target,
        body,
        tenant: DEFAULT_TENANT,
        call_id: "",
    };
    check(keys, &parsed, Version::V1, &call, now, window)
}

/// The signature of `version` in `parsed` against the key of `keys` it names, then the
/// window.
fn check(
    keys: &Keys,
    parsed: &Parsed<'_>,
    version: Version,
    call: &Call<'_>,
    now: SystemTime,
    window: Duration,
) -> Result<Verified, SignatureError> {
    let key = keys
        .get(parsed.kid)
        .ok_or_else(|| SignatureError::UnknownKey(parsed.kid.chars().take(64).collect()))?;
    check_signature(key, parsed, version, call)?;
    let skew = unix_seconds(now).abs_diff(parsed.timestamp);
    if skew > window.as_secs() {
        return Err(SignatureError::OutsideWindow {
            timestamp: parsed.timestamp,
            skew_seconds: skew,
            window_seconds: window.as_secs(),
        });
    }
    Ok(Verified {
        kid: key.kid().to_owned(),
        version,
        timestamp: parsed.timestamp,
    })
}

/// The signature of `version` in `parsed` against `key`.
fn check_signature(
    key: &Key,
    parsed: &Parsed<'_>,
    version: Version,
    call: &Call<'_>,
) -> Result<(), SignatureError> {
    let (text, signature) = match version {
        Version::V2 => (
            canonical_v2(parsed.timestamp, key.kid(), call),
            parsed.v2.as_deref(),
        ),
        Version::V1 => {
            // v1 is HMAC only: an Ed25519 key never verifies one.
            if key.algorithm() != crate::Algorithm::HmacSha256 {
                return Err(SignatureError::Mismatch);
            }
            let text = canonical_v1(
                parsed.timestamp,
                key.kid(),
                call.method,
                call.target,
                call.body,
            );
            (text, parsed.v1.as_deref())
        }
    };
    let signature = signature.ok_or(SignatureError::Mismatch)?;
    if key.verifies(text.as_bytes(), signature) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

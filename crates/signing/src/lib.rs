//! Signed idem branch calls, shared by the coordinator (which signs) and the participant
//! SDK (which verifies), so both sides build the same canonical string from one text.
//! Everything a participant in another language needs is on this page.
//!
//! # The headers
//!
//! Every call carries:
//!
//! ```text
//! Idem-Tenant: acme                                   the transaction's tenant (`default` included)
//! Idem-Call-Id: 5f0c3a9e1b2d4c6f8a7e9d0b1c2a3f4e      128 random bits, new for every attempt
//! Idem-Signature: t=1764600000,kid=2026-12,v2=3f1c…   with a signing key only
//! ```
//!
//! The signature header's fields, `,`-separated, unknown ones ignored, none twice:
//!
//! * `t`: when the call was signed, in Unix seconds (the coordinator's wall clock);
//! * `kid`: which key signed it, so keys can rotate;
//! * `v2`: the lowercase hex signature of the v2 canonical string: 64 digits for
//!   HMAC-SHA256, 128 for Ed25519;
//! * `v1`: (only when the coordinator runs with `--signing-legacy-v1`, and only with an
//!   HMAC key) the lowercase hex HMAC-SHA256 of the v1 string, for participants that
//!   predate v2.
//!
//! # The v2 canonical string
//!
//! Eleven lines joined by `\n` (no trailing newline; no line can hold a newline):
//!
//! ```text
//! idem-signature-v2
//! <t>                        the same decimal digits as in the header
//! <kid>                      the same key id as in the header
//! <call id>                  the Idem-Call-Id header: 32 lowercase hex digits
//! <tenant>                   the Idem-Tenant header; `default` when the call has none
//! <METHOD>                   POST, or GET for DTM's msg back-check
//! <scheme>                   http or https, lowercase
//! <host>                     the URL's host, lowercase ASCII (punycode for a name), an IPv6 address in brackets ([::1]), no port
//! <port>                     decimal; 80 or 443 when the URL names none
//! <path and query>           the request target exactly as sent: /inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try
//! <hex SHA-256 of the body>  lowercase; the SHA-256 of nothing for an empty body
//! ```
//!
//! The scheme, host and port are those of the URL idem called. A participant rebuilds them
//! from where it was called: its configured external base URL(s) (behind a proxy that
//! changes `Host`), or else the `Host` header (`host[:port]`) with its configured scheme
//! (`http` by default) and that scheme's default port. Binding the target through `Host`
//! holds only as far as the participant (or its proxy) refuses a `Host` that is not its
//! own: configure the external URL to bind it fully. The path and query are read from the
//! request line as received (before any percent-decoding or routing), so a proxy that
//! rewrites paths breaks the signature.
//!
//! HMAC-SHA256: the key is the secret's UTF-8 bytes, the signature the MAC of the string's
//! bytes. Ed25519: RFC 8032 (pure Ed25519) over the string's bytes.
//!
//! # The v1 canonical string
//!
//! Six lines joined by `\n`: `idem-signature-v1`, `<t>`, `<kid>`, `<METHOD>`, `<path and
//! query>`, `<hex SHA-256 of the body>`, HMAC-SHA256 only. It binds neither the host, the
//! tenant nor the call: a participant should require v2 ([`Policy::accept_v1`] false,
//! the SDK's default) once its coordinator sends it.
//!
//! # Verifying
//!
//! Check, in this order: the header parses; with `v2`, the call id has its form; the key
//! (by `kid`, in the list of the call's tenant, see [`Keyring`]) verifies the signature;
//! `t` is within the window (default [`DEFAULT_WINDOW`], either way) of your clock; the
//! call id was not seen before within the window (the SDK's replay cache). A header with
//! `v2` is checked on `v2` alone, never on its `v1`.
//!
//! # Keys
//!
//! A key file holds one entry per line (or comma-separated), `#` starting a comment line:
//!
//! * `kid:secret`: HMAC-SHA256; the secret is at least 16 bytes, no whitespace or comma;
//! * `kid:ed25519:<64 hex digits>`: an Ed25519 private key (its 32-byte seed), which the
//!   coordinator signs with;
//! * `kid:ed25519-pub:<64 hex digits>`: an Ed25519 public key, which a participant
//!   verifies with (it cannot sign).
//!
//! A key id is 1 to 64 of `A-Z a-z 0-9 . _ -` and appears once in a file. Lines `[tenant
//! NAME]` and `[default]` start sections (see [`Keyring`]): a tenant's calls are signed
//! and verified with its own list when the file has one, else with the default list (the
//! entries before any section). In each list the first key signs and any verifies, which
//! is how keys rotate: add the new key to every participant, then put it first at the
//! coordinator, then remove the old one.

#![warn(missing_docs)]

mod call;
mod error;
mod header;
mod keyring;
mod keys;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use call::{
    Call, Policy, Verified, Version, canonical_v1, canonical_v2, is_call_id, new_call_id,
    sign_call, sign_v1, verify_call, verify_v1,
};
pub use error::SignatureError;
pub use keyring::{Keyring, MAX_TENANT_LEN, SharedKeyring, is_tenant_name};
pub use keys::{Algorithm, Key, KeyError, Keys, MIN_SECRET_BYTES};

/// The signature header's name (HTTP header names are case-insensitive).
pub const HEADER: &str = "idem-signature";

/// The header naming a call's tenant; sent on every call.
pub const TENANT_HEADER: &str = "idem-tenant";

/// The header carrying a call's id; sent on every call, new for every attempt.
pub const CALL_ID_HEADER: &str = "idem-call-id";

/// The tenant of a call without `Idem-Tenant` (the coordinator's default tenant).
pub const DEFAULT_TENANT: &str = "default";

/// The first line of the v1 canonical string.
pub const SCHEME_V1: &str = "idem-signature-v1";

/// The first line of the v2 canonical string.
pub const SCHEME_V2: &str = "idem-signature-v2";

/// How far a call's timestamp may be from the verifier's clock, either way, by default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// Unix seconds of `time` (0 before 1970).
pub fn unix_seconds(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;

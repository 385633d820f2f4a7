//! Verifying that a call comes from your idem coordinator, for your service, for its
//! tenant, once.
//!
//! A coordinator configured with signing keys (`idem serve --signing-secret-file PATH`)
//! signs every branch call:
//!
//! ```text
//! Idem-Tenant: acme
//! Idem-Call-Id: <32 hex digits, new for every attempt>
//! Idem-Signature: t=<unix seconds>,kid=<key id>,v2=<hex HMAC-SHA256 or Ed25519 signature>
//! ```
//!
//! over the v2 canonical string, which covers the time, the key id, the call id, the
//! tenant, the method, the scheme, host and port called, the path and query, and the body's
//! SHA-256 ([`idem_signing`] has the exact form, for participants in other languages).
//!
//! A participant holds a key file (see [`Keyring`]): `kid:secret` (HMAC) or
//! `kid:ed25519-pub:<hex>` (an Ed25519 public key: the participant cannot sign) lines, and
//! `[tenant NAME]` sections when tenants have keys of their own: a call is checked only
//! against its tenant's keys (its section, else the default list), so one tenant's key
//! never passes another tenant's call. Rotation: add the new key to every participant's
//! file, then make it the coordinator's first key, then drop the old one; the keys can be
//! replaced while serving ([`Verifier::keyring`], [`Verifier::reload_every`]).
//!
//! [`Verifier`] accepts a call when its v2 signature verifies for where the call arrived
//! (its configured [`external_url`](Verifier::external_url)s, else the `Host` header and
//! its [`scheme`](Verifier::scheme)), within a window (default [`DEFAULT_WINDOW`], 5
//! minutes, either way) of its own clock, and its call id was not seen before within the
//! window ([`ReplayCache`]). v1-only calls are refused unless [`Verifier::accept_v1`].
//!
//! With axum, put [`require_signature`] in front of the branch routes: a call without a
//! valid signature gets `401` with `{"error": "<code>", "message": …}` and never reaches
//! the handler; codes: `signature_missing`, `signature_malformed`, `signature_unknown_key`,
//! `signature_unknown_tenant`, `signature_mismatch`, `signature_expired`,
//! `signature_v2_required`, `signature_replayed`, and 503 `replay_cache_full`. idem treats
//! a 401 like any unknown answer: it retries (a new call id each time), and the transaction
//! stalls (or a saga compensates) once the attempts are used up, so fixing the keys lets it
//! finish.
//!
//! ```no_run
//! # #[cfg(feature = "axum")] {
//! use axum::{Router, routing::post};
//! use idem_participant::signature::{Keyring, Verifier, require_signature};
//!
//! let keys = Keyring::from_file("/etc/shop/idem-keys".as_ref()).expect("signing keys");
//! let verifier = Verifier::new(keys)
//!     .external_url("https://inventory.shop.example")
//!     .expect("a base URL");
//! let app: Router = Router::new()
//!     .route("/inventory/reserve", post(|| async { "ok" }))
//!     .layer(axum::middleware::from_fn_with_state(verifier, require_signature));
//! # }
//! ```
//!
//! Other frameworks call [`verify_call`] with the header's value and the [`Call`] as
//! received, then [`ReplayCache::check`] with its call id.

mod replay;

pub use idem_signing::{
    Algorithm, CALL_ID_HEADER, Call, DEFAULT_TENANT, DEFAULT_WINDOW, HEADER, Key, KeyError,
    Keyring, Keys, Policy, SharedKeyring, SignatureError, TENANT_HEADER, Verified, Version,
    canonical_v1, canonical_v2, is_tenant_name, new_call_id, sign_call, sign_v1, unix_seconds,
    verify_call, verify_v1,
};
pub use replay::{DEFAULT_REPLAY_CAPACITY, ReplayCache};

#[cfg(feature = "axum")]
pub use self::verifier::{SignatureRejection, SignedBy, SignedCall, Verifier, require_signature};

#[cfg(feature = "axum")]
mod verifier;

#[cfg(all(test, feature = "axum"))]
mod tests;

//! Why a call's signature was not accepted.

/// Why a call's signature was not accepted. Each has a stable [`code`](Self::code).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `Idem-Signature` header.
    #[error("the call has no Idem-Signature header")]
    Missing,
    /// The header (or `Idem-Tenant`, `Idem-Call-Id`, the `Host` a v2 signature covers) is
    /// not as the scheme says.
    #[error("malformed signed call: {0}")]
    Malformed(&'static str),
    /// The header names a key id this side does not hold for the call's tenant.
    #[error("unknown signing key id `{0}`")]
    UnknownKey(String),
    /// This side holds no key for the call's tenant (no list of its own, no default list).
    #[error("no signing key for tenant `{0}`")]
    UnknownTenant(String),
    /// The signature does not match the call (another key, or a changed method, target,
    /// host, port, scheme, tenant, call id, timestamp or body).
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
    /// The call carries only a v1 signature and this side requires v2.
    #[error("the call is signed with v1 only; v2 is required")]
    V2Required,
    /// The call id was seen before within the window: a replay.
    #[error("call id {0} was already received")]
    Replayed(String),
    /// The replay cache is full of call ids still within the window: refused rather than
    /// accepted unchecked (the coordinator retries).
    #[error("too many calls within the window to remember their ids; try again")]
    ReplayCacheFull,
}

impl SignatureError {
    /// The stable code a participant answers with (in a 401's body; 503 for
    /// `replay_cache_full`).
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::Missing => "signature_missing",
            SignatureError::Malformed(_) => "signature_malformed",
            SignatureError::UnknownKey(_) => "signature_unknown_key",
            SignatureError::UnknownTenant(_) => "signature_unknown_tenant",
            SignatureError::Mismatch => "signature_mismatch",
            SignatureError::OutsideWindow { .. } => "signature_expired",
            SignatureError::V2Required => "signature_v2_required",
            SignatureError::Replayed(_) => "signature_replayed",
            SignatureError::ReplayCacheFull => "replay_cache_full",
        }
    }
}

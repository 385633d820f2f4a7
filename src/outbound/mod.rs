//! Where participant calls may go, and keeping URLs' credentials out of sight.
//!
//! `policy`: the outbound policy of `--outbound-policy`, checked when a URL is registered
//! (`api`) and again when it is called (`transport`), where `resolve` checks every
//! address a name resolves to, so a name that resolves elsewhere later (DNS rebinding)
//! is still refused. `special`: the networks (loopback, private, link-local, metadata...)
//! that need an explicit listing. `own`: idem's own listeners, never called.
//! `redact`: userinfo (`user:password@`) replaced by `***` in every view and log line.
//! Semantics: docs/outbound-policy.md.

pub mod grpc_target;
pub mod own;
pub mod policy;
pub mod redact;
pub mod resolve;
pub mod special;
#[cfg(test)]
mod tests;

pub use grpc_target::GrpcTarget;
pub use own::OwnListeners;
pub use policy::{OutboundPolicy, Refusal, Rule};
pub use redact::redact_userinfo;

/// How a call-time refusal's detail starts (an attempt's detail, a branch's last error).
pub const DENIED_PREFIX: &str = "outbound_denied:";

/// The stable code of a registration refused by the policy.
pub const URL_NOT_ALLOWED: &str = "url_not_allowed";

//! W3C trace context (`traceparent`, `tracestate`): read from a client's request, stored
//! with its transaction, and continued on every branch call, after a restart too.
//!
//! A malformed `traceparent` is ignored, as the W3C recommendation says a receiver does:
//! the request is served and idem starts a trace of its own for the transaction, so a
//! bad header from a proxy never refuses a transaction. `tracestate` is kept only beside
//! a valid `traceparent`; one that does not parse is dropped, and one over
//! [`MAX_TRACESTATE_LEN`] loses members from its end until it fits.
//!
//! Each branch call is a span of its own (`branch_call`, child of the drive's
//! `transaction` span): the participant gets the transaction's trace id with that span's
//! id as parent, so its spans nest under the call that caused them.

use axum::http::HeaderMap;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::core::{TraceContext, Transaction};

/// A stored `traceparent`: always the version-00 form.
pub const TRACEPARENT_LEN: usize = 55;
/// The longest `tracestate` stored and forwarded (the W3C recommendation asks vendors to
/// pass on at least 512 characters).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// List members of a `tracestate`, at most (W3C).
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// The parts of a valid `traceparent`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: u128,
    pub span_id: u64,
    pub flags: u8,
}

impl Parent {
    /// The version-00 header value.
    pub fn header(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// Parses a `traceparent` value. Later versions are read by their version-00 prefix, as the
/// recommendation asks; `None` for anything malformed, an all-zero id or version `ff`.
pub fn parse_traceparent(value: &str) -> Option<Parent> {
    let value = value.trim_matches([' ', '\t']);
    let bytes = value.as_bytes();
    if bytes.len() < TRACEPARENT_LEN {
        return None;
    }
    let version = hex_lower(&value[0..2])? as u8;
    if version == 0xff
        || (version == 0 && bytes.len() != TRACEPARENT_LEN)
        || (bytes.len() > TRACEPARENT_LEN && bytes[TRACEPARENT_LEN] != b'-')
        || bytes[2] != b'-'
        || bytes[35] != b'-'
        || bytes[52] != b'-'
    {
        return None;
    }
    let trace_id = hex_lower(&value[3..35])?;
    let span_id = hex_lower(&value[36..52])? as u64;
    let flags = hex_lower(&value[53..55])? as u8;
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    // Version 00 defines only the sampled bit; the others are passed on as zero.
    let flags = if version == 0 { flags } else { flags & 0x01 };
    Some(Parent {
        trace_id,
        span_id,
        flags,
    })
}

/// Lowercase hex digits only: the recommendation refuses uppercase.
fn hex_lower(s: &str) -> Option<u128> {
    if s.is_empty()
        || !s
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u128::from_str_radix(s, 16).ok()
}

/// A `tracestate` as it may be stored: its members checked, at most 32, cut to
/// [`MAX_TRACESTATE_LEN`] by dropping members from the end. `None` if it does not parse
/// or nothing is left.
pub fn normalize_tracestate(value: &str) -> Option<String> {
    let mut members = Vec::new();
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, val) = member.split_once('=')?;
        if !valid_key(key) || !valid_value(val) {
            return None;
        }
        members.push(member);
    }
    if members.len() > MAX_TRACESTATE_MEMBERS {
        return None;
    }
    let mut out = members.join(",");
    while out.len() > MAX_TRACESTATE_LEN {
        members.pop();
        out = members.join(",");
    }
    (!out.is_empty()).then_some(out)
}

fn valid_key(key: &str) -> bool {
    let simple = |k: &str, first_digit: bool, max: usize| {
        let b = k.as_bytes();
        !b.is_empty()
            && b.len() <= max
            && (b[0].is_ascii_lowercase() || (first_digit && b[0].is_ascii_digit()))
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_-*/".contains(c))
    };
    match key.split_once('@') {
        Some((tenant, system)) => simple(tenant, true, 241) && simple(system, false, 14),
        None => simple(key, false, 256),
    }
}

fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    !b.is_empty()
        && b.len() <= 256
        && b.iter()
            .all(|c| (0x20..=0x7e).contains(c) && *c != b',' && *c != b'=')
        && b.last() != Some(&b' ')
}

/// The trace context a request's headers carry, if its `traceparent` is valid (exactly one
/// such header). Several `tracestate` headers are one list, joined in order.
pub fn from_headers(headers: &HeaderMap) -> Option<TraceContext> {
    let mut parents = headers.get_all("traceparent").iter();
    let parent = parents.next()?;
    if parents.next().is_some() {
        return None;
    }
    let parent = parse_traceparent(parent.to_str().ok()?)?;
    let mut states = Vec::new();
    for value in headers.get_all("tracestate") {
        match value.to_str() {
            Ok(v) => states.push(v),
            Err(_) => {
                states.clear();
                break;
            }
        }
    }
    let tracestate = normalize_tracestate(&states.join(","));
    Some(TraceContext {
        traceparent: parent.header(),
        tracestate,
    })
}

/// A new trace for a transaction whose client sent none: sampled, so that participants
/// and an exporter record it.
pub fn start() -> TraceContext {
    let parent = Parent {
        trace_id: nonzero(rand::random::<u128>),
        span_id: nonzero(rand::random::<u64>),
        flags: 0x01,
    };
    TraceContext {
        traceparent: parent.header(),
        tracestate: None,
    }
}

fn nonzero<T: PartialEq + Default>(draw: impl Fn() -> T) -> T {
    loop {
        let v = draw();
        if v != T::default() {
            return v;
        }
    }
}

/// The span of one drive of a transaction (from a create, a client's request or recovery
/// until the driver stops), parented on the stored trace context.
pub fn transaction_span(tx: &Transaction) -> tracing::Span {
    let span = tracing::info_span!("transaction", gid = %tx.gid, kind = tx.kind.as_str());
    continue_trace(&span, tx.trace.as_ref());
    span
}

/// The span of one branch call. Inside a drive it is a child of the drive's span;
/// `detached` (a Try called on a client's behalf) parents it on the stored context.
pub fn call_span(tx: &Transaction, branch_id: &str, op: &str, detached: bool) -> tracing::Span {
    let span = tracing::info_span!("branch_call", gid = %tx.gid, branch_id, op);
    if detached {
        continue_trace(&span, tx.trace.as_ref());
    }
    span
}

/// Makes `context` the remote parent of `span`, for the exporter (a no-op without one).
fn continue_trace(span: &tracing::Span, context: Option<&TraceContext>) {
    let Some(parent) = context.and_then(|c| parse_traceparent(&c.traceparent)) else {
        return;
    };
    let state = context
        .and_then(|c| c.tracestate.as_deref())
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let remote = SpanContext::new(
        TraceId::from(parent.trace_id),
        SpanId::from(parent.span_id),
        TraceFlags::new(parent.flags),
        true,
        state,
    );
    let cx = opentelemetry::Context::new().with_remote_span_context(remote);
    // Fails only when nothing exports this span (no exporter, or the span filtered out);
    // it is set before the span starts, so never because it started already.
    let _ = span.set_parent(cx);
}

/// The `traceparent` a branch call sends: the transaction's trace id, with the id of the
/// call's exported span as parent, or a fresh id when nothing is exported.
pub fn call_traceparent(context: &TraceContext, span: &tracing::Span) -> Option<String> {
    let stored = parse_traceparent(&context.traceparent)?;
    let exported = span.context().span().span_context().clone();
    let span_id = if exported.is_valid()
        && u128::from_be_bytes(exported.trace_id().to_bytes()) == stored.trace_id
    {
        u64::from_be_bytes(exported.span_id().to_bytes())
    } else {
        nonzero(rand::random::<u64>)
    };
    Some(Parent { span_id, ..stored }.header())
}

#[cfg(test)]
mod tests;

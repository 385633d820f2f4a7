//! What the API accepts: the limit on every text it stores, the range of every numeric
//! option (the table in `options`), and the checks that enforce them. Both front doors call these, so a value one
//! refuses the other refuses too, with the same code. Listed in `docs/api.md`, "Limits".
//!
//! The limits are the same on every database, so a request accepted on SQLite is accepted
//! on MariaDB: each is well inside the narrowest column that holds the value (MariaDB's
//! `TEXT` stops at 64 KiB, `VARCHAR(128)` at 128 characters), and none lets through a NUL
//! character, which PostgreSQL cannot store in a text column.

use std::collections::{BTreeMap, BTreeSet};

use super::error::ApiError;
use crate::core::Millis;
use crate::engine::EngineError;
pub use crate::store::DEFAULT_MAX_BRANCHES;
use crate::store::StoreError;

/// Gids and branch ids (`VARCHAR(128)`).
pub use idem_types::MAX_ID_LEN;
/// Participant URLs. Browsers and proxies commonly stop near 8 KiB; half leaves room for
/// the query string idem appends.
pub const MAX_URL_LEN: usize = 4_096;
/// Abort and force-stop reasons: a sentence for an operator, not a document.
pub const MAX_REASON_LEN: usize = 1_024;
/// The largest `--max-branch-payload-bytes`: the body limit already bounds what arrives.
pub const MAX_PAYLOAD_LEN: usize = super::MAX_BODY;
/// A branch payload, as the text sent to the participant, unless the server's
/// `--max-branch-payload-bytes` says otherwise. Every payload is stored twice (a TCC
/// branch's Confirm and Cancel rows, a saga step's action and compensation), sent with every
/// attempt and read with the transaction; a few business fields, not a document.
pub const DEFAULT_MAX_BRANCH_PAYLOAD_BYTES: usize = 65_536;
/// DTM's `custom_data`: saga orders for thousands of steps fit.
pub const MAX_CUSTOM_DATA_LEN: usize = 65_536;
pub const MAX_HEADERS: usize = 32;
pub const MAX_HEADER_NAME_LEN: usize = 128;
pub const MAX_HEADER_VALUE_LEN: usize = 4_096;

/// Headers a participant call gets from idem itself or that describe the connection or
/// the body framing: set by a client they would contradict idem's or break every call.
const RESERVED_HEADERS: [&str; 12] = [
    "connection",
    "content-encoding",
    "content-length",
    "content-type",
    "expect",
    "host",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// A value for an error message: client texts can be a megabyte long.
pub(crate) fn shown(text: &str) -> String {
    const KEEP: usize = 64;
    if text.len() <= KEEP {
        return format!("{text:?}");
    }
    let mut end = KEEP;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &text[..end], text.len())
}

fn too_long(field: &str, len: usize, max: usize) -> ApiError {
    ApiError::bad_request(
        "too_long",
        format!("{field} is {len} bytes; the limit is {max}"),
    )
}

fn check_len(field: &str, text: &str, max: usize) -> Result<(), ApiError> {
    if text.len() > max {
        return Err(too_long(field, text.len(), max));
    }
    Ok(())
}

/// Any stored text: at most `max` bytes and no NUL.
pub fn check_text(field: &str, text: &str, max: usize) -> Result<(), ApiError> {
    check_len(field, text, max)?;
    if text.contains('\0') {
        return Err(ApiError::bad_request(
            "invalid_text",
            format!("{field} contains a NUL character, which cannot be stored"),
        ));
    }
    Ok(())
}

/// [`check_id`]'s rule as a regular expression, for the OpenAPI description.
pub fn id_pattern() -> String {
    format!("^[A-Za-z0-9_.:-]{{1,{MAX_ID_LEN}}}$")
}

/// Gids and branch ids: 1 to 128 of `A-Z a-z 0-9 _ . : -`. They end up in URLs, logs and
/// unique indexes, so anything else is refused rather than escaped.
pub fn check_id(what: &'static str, code: &'static str, id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            code,
            format!(
                "{what} must be 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 _ . : - (got {})",
                shown(id)
            ),
        ))
    }
}

/// Participant URLs: absolute http(s) with a host, at most [`MAX_URL_LEN`] bytes, and no
/// control characters (the URL parser would drop or encode them, so the stored text
/// would not be the URL called).
pub fn check_url(field: &str, url: &str) -> Result<(), ApiError> {
    if url.len() > MAX_URL_LEN {
        return Err(too_long(field, url.len(), MAX_URL_LEN));
    }
    let clean = !url.chars().any(char::is_control);
    match reqwest::Url::parse(url) {
        Ok(u) if clean && matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
        _ => Err(ApiError::bad_request(
            "invalid_url",
            format!(
                "{field} must be an absolute http:// or https:// URL without control characters (got {})",
                shown(&crate::outbound::redact_userinfo(url))
            ),
        )),
    }
}

/// A branch URL of DTM's door: an `http(s)://` URL ([`check_url`]) or, as in DTM, a gRPC
/// target without a scheme (`host:port/package.Service/Method`; see
/// [`crate::outbound::GrpcTarget`]).
pub fn check_dtm_url(field: &str, url: &str) -> Result<(), ApiError> {
    if url.len() <= MAX_URL_LEN && crate::outbound::GrpcTarget::parse(url).is_some() {
        return Ok(());
    }
    check_url(field, url).map_err(|mut e| {
        e.message
            .push_str(", or a gRPC target host:port/package.Service/Method");
        e
    })
}

/// The outbound policy's registration check of URLs that passed [`check_url`]. The
/// message names the field and the rule; the URL itself is not repeated, so no
/// credentials are echoed.
pub fn check_outbound<'a>(
    policy: &crate::outbound::OutboundPolicy,
    tenant: &str,
    urls: impl IntoIterator<Item = (String, &'a str)>,
) -> Result<(), ApiError> {
    for (field, url) in urls {
        policy.check_url(tenant, url).map_err(|refusal| {
            ApiError::bad_request(
                crate::outbound::URL_NOT_ALLOWED,
                format!("{field} is not allowed by the outbound policy: {refusal}"),
            )
        })?;
    }
    Ok(())
}

/// The URLs of branch operations about to be registered, named as in their requests
/// (`branch 01 confirm`).
pub fn branch_urls(branches: &[crate::core::Branch]) -> impl Iterator<Item = (String, &str)> {
    branches.iter().map(|b| {
        let field = format!("branch {} {}", b.branch_id, b.action.op());
        (field, &*b.url)
    })
}

/// The per-transaction bounds an operator sets (`--max-branches`,
/// `--max-branch-payload-bytes`, `--max-attempts-limit`, `--min-retry-interval-ms`), which
/// both doors apply the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Steps of a saga or msg, or branches of a TCC transaction.
    pub max_branches: usize,
    /// Bytes of one branch's payload as stored (and sent).
    pub max_payload_bytes: usize,
    /// What the options a request states may ask for.
    pub options: OptionLimits,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_branches: DEFAULT_MAX_BRANCHES,
            max_payload_bytes: DEFAULT_MAX_BRANCH_PAYLOAD_BYTES,
            options: OptionLimits::default(),
        }
    }
}

/// A branch's payload as stored: at most `limits.max_payload_bytes` (measured on the text
/// stored, which JSON re-encoding can make longer than what was sent) and no NUL. `field`
/// names the step or branch, so a client with many knows which one.
pub fn check_payload(field: &str, payload: &str, limits: &Limits) -> Result<(), ApiError> {
    check_payload_size(field, payload.len(), limits)?;
    check_text(field, payload, MAX_PAYLOAD_LEN)
}

/// A payload given as bytes (over gRPC): at most `limits.max_payload_bytes`, any bytes.
pub fn check_payload_size(field: &str, len: usize, limits: &Limits) -> Result<(), ApiError> {
    let max = limits.max_payload_bytes;
    if len > max {
        return Err(ApiError::bad_request(
            "payload_too_large",
            format!("{field} is {len} bytes; the limit is {max} bytes per branch payload"),
        ));
    }
    Ok(())
}

pub fn check_reason(field: &str, reason: Option<&str>) -> Result<(), ApiError> {
    reason.map_or(Ok(()), |r| check_text(field, r, MAX_REASON_LEN))
}

/// HTTP token characters (RFC 9110, 5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Headers sent with every branch call. Checked here rather than at send time, where a
/// bad one would fail every call of a transaction already stored.
pub fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_header", m);
    if headers.len() > MAX_HEADERS {
        return Err(bad(format!(
            "branch_headers has {} headers; the limit is {MAX_HEADERS}",
            headers.len()
        )));
    }
    let mut seen = BTreeSet::new();
    for (name, value) in headers {
        let field = format!("branch_headers name {}", shown(name));
        // Lengths first; every character problem, NUL included, is `invalid_header`.
        check_len(&field, name, MAX_HEADER_NAME_LEN)?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(bad(format!(
                "{field} is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
            )));
        }
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) {
            return Err(bad(format!(
                "branch_headers cannot set {name}: idem sets it or it governs the connection"
            )));
        }
        if !seen.insert(lower) {
            return Err(bad(format!(
                "branch_headers names {name} twice (names are case-insensitive)"
            )));
        }
        let field = format!("branch_headers[{name}]");
        check_len(&field, value, MAX_HEADER_VALUE_LEN)?;
        let bytes = value.as_bytes();
        let visible = |b: &u8| (0x21..=0x7e).contains(b);
        let inner_ok = bytes
            .iter()
            .all(|b| visible(b) || matches!(b, b' ' | b'\t'));
        let edges_ok = bytes.first().is_none_or(visible) && bytes.last().is_none_or(visible);
        if !inner_ok || !edges_ok {
            return Err(bad(format!(
                "{field} must be visible ASCII, with spaces or tabs only inside (got {})",
                shown(value)
            )));
        }
    }
    Ok(())
}

// ---- branches per transaction -----------------------------------------------------------

/// Steps of a saga or msg, or branches of a TCC transaction, at most `max` (the server's
/// `--max-branches`, default [`DEFAULT_MAX_BRANCHES`]). Each one is rows written, a call
/// per round (all at once in a concurrent saga) and part of every read of the
/// transaction; without a bound one 1 MiB request could create some 12,000 of them.
/// Counted before any other check, so such a request costs nothing more.
pub fn check_branch_count(field: &str, count: usize, max: usize) -> Result<(), ApiError> {
    if count > max {
        return Err(too_many(format!(
            "{field} has {count} entries; the limit is {max} per transaction"
        )));
    }
    Ok(())
}

fn too_many(message: String) -> ApiError {
    ApiError::bad_request("too_many_branches", message)
}

/// A registration's error for the client. The store counts a TCC transaction's branches
/// when it adds one (under the row lock, so branches registered one by one or at the same
/// time cannot pass the limit) and refuses past it.
pub fn registration_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Store(StoreError::TooManyBranches { count, max }) => too_many(format!(
            "branches: the transaction would have {count}; the limit is {max} per transaction"
        )),
        other => other.into(),
    }
}

// ---- bodies, orders, cursors -----------------------------------------------------------

/// Saga step dependencies: `{"2": [0, 1]}` means step 2 waits for steps 0 and 1. Indexes
/// must name steps, and the graph must have no cycle (it would never run).
pub fn parse_orders(
    orders: BTreeMap<String, Vec<usize>>,
    steps: usize,
) -> Result<BTreeMap<usize, Vec<usize>>, String> {
    let mut out = BTreeMap::new();
    for (k, deps) in orders {
        let step: usize = k
            .parse()
            .map_err(|_| format!("orders key {} is not a step index", shown(&k)))?;
        if step >= steps || deps.iter().any(|&d| d >= steps) {
            return Err(format!("orders names a step beyond the {steps} steps"));
        }
        if deps.contains(&step) {
            return Err(format!("step {step} cannot wait for itself"));
        }
        out.insert(step, deps);
    }
    // Kahn's algorithm, not a recursive search: a chain of thousands of steps fits in a
    // 1 MiB body and must not exhaust the stack.
    let mut waiting = vec![0usize; steps];
    let mut dependents = vec![Vec::new(); steps];
    for (&step, deps) in &out {
        for &d in deps {
            waiting[step] += 1;
            dependents[d].push(step);
        }
    }
    let mut ready: Vec<usize> = (0..steps).filter(|&s| waiting[s] == 0).collect();
    let mut runnable = 0;
    while let Some(n) = ready.pop() {
        runnable += 1;
        for &m in &dependents[n] {
            waiting[m] -= 1;
            if waiting[m] == 0 {
                ready.push(m);
            }
        }
    }
    if runnable < steps {
        return Err("orders contain a cycle".into());
    }
    Ok(out)
}

/// A list cursor (`<created_at>:<gid>`), which both doors hand out. The gid is checked
/// like any other, since it reaches the database.
pub fn decode_cursor(field: &str, cursor: &str) -> Result<(Millis, String), ApiError> {
    decode_cursor_with(field, cursor, |gid| check_id("gid", "invalid_query", gid))
}

/// A list cursor whose part after the time `check` accepts: the doors' cursors end in
/// the caller's gid, `idem tx --database-url`'s (which lists every tenant's rows) in a
/// storage key, `tenant/gid`.
pub fn decode_cursor_with(
    field: &str,
    cursor: &str,
    check: impl Fn(&str) -> Result<(), ApiError>,
) -> Result<(Millis, String), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid_query",
            format!("{field} {} is not one this server gave", shown(cursor)),
        )
    };
    let (at, key) = cursor.split_once(':').ok_or_else(bad)?;
    check(key).map_err(|_| bad())?;
    Ok((at.parse().map_err(|_| bad())?, key.to_owned()))
}

mod body;
mod options;
#[cfg(test)]
pub(crate) use body::tests as body_tests;
pub use body::{Capped, parse_body, parse_body_capped};
pub use options::*;

#[cfg(test)]
mod tests;

//! What the API accepts: the limit on every text it stores, the range of every numeric
//! option, and the checks that enforce them. Both front doors call these, so a value one
//! refuses the other refuses too, with the same code. Listed in `docs/api.md`, "Limits".
//!
//! The limits are the same on every database, so a request accepted on SQLite is accepted
//! on MariaDB: each is well inside the narrowest column that holds the value (MariaDB's
//! `TEXT` stops at 64 KiB, `VARCHAR(128)` at 128 characters), and none lets through a NUL
//! character, which PostgreSQL cannot store in a text column.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::{Number, Value};

use super::error::ApiError;
use crate::core::{Millis, TxOptions};

/// Gids and branch ids (`VARCHAR(128)`).
pub const MAX_ID_LEN: usize = 128;
/// Participant URLs. Browsers and proxies commonly stop near 8 KiB; half leaves room for
/// the query string idem appends.
pub const MAX_URL_LEN: usize = 4_096;
/// Abort and force-stop reasons: a sentence for an operator, not a document.
pub const MAX_REASON_LEN: usize = 1_024;
/// A branch payload, as the text sent to the participant. The body limit already bounds
/// what arrives; this bounds what is stored, which may differ (JSON re-encoding).
pub const MAX_PAYLOAD_LEN: usize = super::MAX_BODY;
/// DTM's `custom_data`: saga orders for thousands of steps fit.
pub const MAX_CUSTOM_DATA_LEN: usize = 65_536;
pub const MAX_HEADERS: usize = 32;
pub const MAX_HEADER_NAME_LEN: usize = 128;
pub const MAX_HEADER_VALUE_LEN: usize = 4_096;

const DAY_MS: u64 = 86_400_000;
/// Upper bounds of the numeric options, in idem's units (all start at 1).
pub const MAX_REQUEST_TIMEOUT_MS: u64 = 600_000;
pub const MAX_RETRY_INTERVAL_MS: u64 = 3_600_000;
pub const MAX_MAX_RETRY_INTERVAL_MS: u64 = DAY_MS;
pub const MAX_MAX_ATTEMPTS: u64 = 10_000;
pub const MAX_TIMEOUT_MS: u64 = 30 * DAY_MS;
pub const MAX_MAX_IN_PROGRESS_MS: u64 = 30 * DAY_MS;

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
fn shown(text: &str) -> String {
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
                shown(url)
            ),
        )),
    }
}

pub fn check_payload(field: &str, payload: &str) -> Result<(), ApiError> {
    check_text(field, payload, MAX_PAYLOAD_LEN)
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

// ---- numeric options --------------------------------------------------------------------

/// The unit a front door gives a numeric option in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Millis,
    Seconds,
    Count,
}

/// One numeric option as a request gave it. Kept as any JSON number, so that one beyond
/// what a u64 holds (or a fraction, or a negative) is refused with the same code and
/// message as one beyond idem's range.
#[derive(Clone, Debug)]
pub struct Given {
    pub field: &'static str,
    pub unit: Unit,
    pub value: Number,
}

impl Given {
    /// In idem's unit, if an integer within 1..=`max` (`max` in idem's unit too).
    fn resolve(&self, max: u64) -> Result<u64, ApiError> {
        let (factor, unit) = match self.unit {
            Unit::Millis => (1, " ms"),
            Unit::Seconds => (1_000, " seconds"),
            Unit::Count => (1, ""),
        };
        self.value
            .as_u64()
            .and_then(|v| v.checked_mul(factor))
            .filter(|v| (1..=max).contains(v))
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_options",
                    format!(
                        "{} must be an integer from 1 to {}{unit} (got {})",
                        self.field,
                        max / factor,
                        self.value
                    ),
                )
            })
    }
}

/// What a request changes in the server's default options, in whichever door's units.
/// Only what the request gave is checked: an operator's default is not the client's
/// mistake.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub request_timeout: Option<Given>,
    pub retry_interval: Option<Given>,
    pub max_retry_interval: Option<Given>,
    pub max_attempts: Option<Given>,
    pub max_in_progress: Option<Given>,
    pub timeout: Option<Given>,
    pub branch_headers: BTreeMap<String, String>,
}

impl Overrides {
    pub fn apply(self, mut options: TxOptions) -> Result<TxOptions, ApiError> {
        let take = |given: Option<Given>, max| given.map(|g| g.resolve(max)).transpose();
        if let Some(v) = take(self.request_timeout, MAX_REQUEST_TIMEOUT_MS)? {
            options.request_timeout_ms = v;
        }
        if let Some(v) = take(self.retry_interval, MAX_RETRY_INTERVAL_MS)? {
            options.retry_interval_ms = v;
        }
        if let Some(v) = take(self.max_retry_interval, MAX_MAX_RETRY_INTERVAL_MS)? {
            options.max_retry_interval_ms = v;
        }
        if let Some(v) = take(self.max_attempts, MAX_MAX_ATTEMPTS)? {
            options.max_attempts = u32::try_from(v).expect("bounded by MAX_MAX_ATTEMPTS");
        }
        if let Some(v) = take(self.max_in_progress, MAX_MAX_IN_PROGRESS_MS)? {
            options.max_in_progress_ms = v;
        }
        if let Some(v) = take(self.timeout, MAX_TIMEOUT_MS)? {
            options.timeout_ms = Some(v);
        }
        check_headers(&self.branch_headers)?;
        options.branch_headers.extend(self.branch_headers);
        Ok(options)
    }
}

// ---- bodies, orders, cursors -----------------------------------------------------------

/// Parses a JSON body into `T`, turning every way it can be wrong into a 4xx.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    empty_is: Option<&str>,
) -> Result<(T, Value), ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(e.status(), "payload_too_large", e.body_text())
        } else {
            ApiError::bad_request("invalid_body", e.body_text())
        }
    })?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        match empty_is {
            Some(default) => default.as_bytes(),
            None => {
                return Err(ApiError::bad_request(
                    "invalid_json",
                    "the request body is empty",
                ));
            }
        }
    } else {
        &bytes
    };
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the body is not JSON: {e}")))?;
    let typed = T::deserialize(&value)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("invalid request: {e}")))?;
    Ok((typed, value))
}

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
    let bad = || {
        ApiError::bad_request(
            "invalid_query",
            format!("{field} {} is not one this server gave", shown(cursor)),
        )
    };
    let (at, gid) = cursor.split_once(':').ok_or_else(bad)?;
    check_id("gid", "invalid_query", gid).map_err(|_| bad())?;
    Ok((at.parse().map_err(|_| bad())?, gid.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(r: Result<(), ApiError>) -> Option<&'static str> {
        r.err().map(|e| e.code)
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("gid", "invalid_gid", "order-1001:a.b_c").is_ok());
        assert!(check_id("gid", "invalid_gid", "").is_err());
        assert!(check_id("gid", "invalid_gid", "a b").is_err());
        assert!(check_id("gid", "invalid_gid", "é").is_err());
        assert!(check_id("gid", "invalid_gid", "a\0").is_err());
        assert!(check_id("gid", "invalid_gid", &"a".repeat(129)).is_err());
        assert!(check_id("gid", "invalid_gid", &"a".repeat(128)).is_ok());
    }

    #[test]
    fn urls_are_checked() {
        assert!(check_url("u", "http://127.0.0.1:8080/x?y=1").is_ok());
        assert!(check_url("u", "https://h/x").is_ok());
        assert!(check_url("u", "ftp://h/x").is_err());
        assert!(check_url("u", "/relative").is_err());
        assert!(check_url("u", "http://").is_err());
        assert_eq!(code(check_url("u", "http://h/a\0b")), Some("invalid_url"));
        assert_eq!(code(check_url("u", "http://h/a\nb")), Some("invalid_url"));
        let at_limit = format!("http://h/{}", "a".repeat(MAX_URL_LEN - 9));
        assert_eq!(at_limit.len(), MAX_URL_LEN);
        assert!(check_url("u", &at_limit).is_ok());
        let over = format!("{at_limit}a");
        let e = check_url("steps[0].action", &over).unwrap_err();
        assert_eq!(e.code, "too_long");
        assert!(e.message.contains("steps[0].action") && e.message.contains("4096"));
    }

    #[test]
    fn texts_have_a_limit_and_no_nul() {
        assert!(check_reason("reason", None).is_ok());
        assert!(check_reason("reason", Some(&"r".repeat(MAX_REASON_LEN))).is_ok());
        let long = "r".repeat(MAX_REASON_LEN + 1);
        assert_eq!(code(check_reason("reason", Some(&long))), Some("too_long"));
        // The limit is in bytes: 513 two-byte characters are over 1,024.
        let wide = "é".repeat(513);
        assert_eq!(code(check_reason("reason", Some(&wide))), Some("too_long"));
        assert_eq!(code(check_payload("p", "a\0b")), Some("invalid_text"));
        assert!(check_payload("p", &"x".repeat(MAX_PAYLOAD_LEN)).is_ok());
        assert_eq!(
            code(check_payload("p", &"x".repeat(MAX_PAYLOAD_LEN + 1))),
            Some("too_long")
        );
        // Messages quote at most a short prefix of what was sent.
        let e = check_id("gid", "invalid_gid", &"é".repeat(100_000)).unwrap_err();
        assert!(e.message.len() < 400, "{}", e.message);
    }

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn headers_are_tokens_with_visible_ascii_values() {
        let ok = |pairs: &[(&str, &str)]| check_headers(&headers(pairs)).is_ok();
        let code_of = |pairs: &[(&str, &str)]| code(check_headers(&headers(pairs)));
        assert!(ok(&[
            ("X-Tenant", "t1"),
            ("authorization", "Bearer a b\tc")
        ]));
        assert!(ok(&[("x-empty", "")]));
        assert!(ok(&[("!#$%&'*+-.^_`|~09az", "v")]));
        for bad in ["a\r\nb", "é", "a\0", " lead", "trail ", "\tx", "a\x7f"] {
            assert_eq!(code_of(&[("x", bad)]), Some("invalid_header"), "{bad:?}");
        }
        for bad in ["", "a b", "a:b", "é", "a\r\n", "(x)"] {
            assert_eq!(code_of(&[(bad, "v")]), Some("invalid_header"), "{bad:?}");
        }
        for reserved in [
            "Host",
            "content-length",
            "Content-Type",
            "Transfer-Encoding",
            "TE",
        ] {
            assert_eq!(code_of(&[(reserved, "v")]), Some("invalid_header"));
        }
        assert_eq!(
            code_of(&[("X-A", "1"), ("x-a", "2")]),
            Some("invalid_header")
        );
        let name = "n".repeat(MAX_HEADER_NAME_LEN + 1);
        assert_eq!(code_of(&[(&name, "v")]), Some("too_long"));
        assert!(ok(&[(&name[1..], "v")]));
        let value = "v".repeat(MAX_HEADER_VALUE_LEN + 1);
        assert_eq!(code_of(&[("x", &value)]), Some("too_long"));
        assert!(ok(&[("x", &value[1..])]));
        let many: BTreeMap<String, String> = (0..=MAX_HEADERS)
            .map(|i| (format!("x-{i}"), "v".to_string()))
            .collect();
        assert_eq!(code(check_headers(&many)), Some("invalid_header"));
    }

    #[test]
    fn accepted_headers_are_ones_the_http_client_sends() {
        // Whatever passes here must not fail later at send time, call after call.
        let names = ["x-tenant", "X-Mixed_Case.1", "!#$%&'*+-.^_`|~"];
        let values = ["", "a", "Bearer x y\tz", &"~".repeat(MAX_HEADER_VALUE_LEN)];
        for name in names {
            for value in values {
                assert!(check_headers(&headers(&[(name, value)])).is_ok());
                assert!(reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok());
                assert!(reqwest::header::HeaderValue::from_str(value).is_ok());
            }
        }
    }

    fn given(field: &'static str, unit: Unit, value: serde_json::Value) -> Option<Given> {
        let value = serde_json::from_value(value).unwrap();
        Some(Given { field, unit, value })
    }

    #[test]
    fn numeric_options_are_integers_in_range() {
        let base = TxOptions::default();
        let timeout = |unit, v| {
            Overrides {
                timeout: given("timeout", unit, v),
                ..Overrides::default()
            }
            .apply(base.clone())
        };
        let ms = |v| timeout(Unit::Millis, v).map(|o| o.timeout_ms);
        assert_eq!(ms(serde_json::json!(1)), Ok(Some(1)));
        assert_eq!(
            ms(serde_json::json!(MAX_TIMEOUT_MS)),
            Ok(Some(MAX_TIMEOUT_MS))
        );
        for bad in [
            serde_json::json!(0),
            serde_json::json!(-1),
            serde_json::json!(1.5),
            serde_json::json!(MAX_TIMEOUT_MS + 1),
            serde_json::json!(9_223_372_036_854_775_808u64),
            serde_json::json!(u64::MAX),
            serde_json::json!(1e30),
        ] {
            let e = ms(bad.clone()).unwrap_err();
            assert_eq!(e.code, "invalid_options", "{bad}");
            assert!(e.message.contains("2592000000 ms"), "{}", e.message);
        }
        // Seconds are multiplied with overflow checked, and the bound is the same.
        let s = |v| timeout(Unit::Seconds, v).map(|o| o.timeout_ms);
        assert_eq!(s(serde_json::json!(2_592_000)), Ok(Some(MAX_TIMEOUT_MS)));
        let e = s(serde_json::json!(i64::MAX)).unwrap_err();
        assert!(e.message.contains("2592000 seconds"), "{}", e.message);
        assert!(s(serde_json::json!(2_592_001)).is_err());
    }

    type Slot = fn(&mut Overrides) -> &mut Option<Given>;

    #[test]
    fn every_option_has_its_bound() {
        let cases: [(Slot, u64); 6] = [
            (|o| &mut o.request_timeout, MAX_REQUEST_TIMEOUT_MS),
            (|o| &mut o.retry_interval, MAX_RETRY_INTERVAL_MS),
            (|o| &mut o.max_retry_interval, MAX_MAX_RETRY_INTERVAL_MS),
            (|o| &mut o.max_attempts, MAX_MAX_ATTEMPTS),
            (|o| &mut o.max_in_progress, MAX_MAX_IN_PROGRESS_MS),
            (|o| &mut o.timeout, MAX_TIMEOUT_MS),
        ];
        for (slot, max) in cases {
            for (v, ok) in [(0, false), (1, true), (max, true), (max + 1, false)] {
                let mut o = Overrides::default();
                *slot(&mut o) = given("f", Unit::Millis, serde_json::json!(v));
                assert_eq!(o.apply(TxOptions::default()).is_ok(), ok, "{v} of {max}");
            }
        }
        let o = Overrides {
            max_attempts: given("max_attempts", Unit::Count, serde_json::json!(7)),
            max_in_progress: given("max_in_progress_ms", Unit::Millis, serde_json::json!(9)),
            ..Overrides::default()
        };
        let resolved = o.apply(TxOptions::default()).unwrap();
        assert_eq!((resolved.max_attempts, resolved.max_in_progress_ms), (7, 9));
    }

    #[test]
    fn orders_must_name_steps_and_have_no_cycle() {
        let o = |pairs: &[(&str, Vec<usize>)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        assert!(parse_orders(o(&[("2", vec![0, 1])]), 3).is_ok());
        assert!(parse_orders(o(&[("2", vec![0, 0, 1])]), 3).is_ok());
        assert!(parse_orders(o(&[("3", vec![0])]), 3).is_err());
        assert!(parse_orders(o(&[("x", vec![0])]), 3).is_err());
        assert!(parse_orders(o(&[("1", vec![1])]), 3).is_err());
        assert!(parse_orders(o(&[("0", vec![1]), ("1", vec![0])]), 2).is_err());
        assert!(parse_orders(o(&[("1", vec![2]), ("2", vec![1])]), 3).is_err());
    }

    #[test]
    fn a_long_chain_of_orders_does_not_exhaust_the_stack() {
        let n = 200_000;
        let chain = |cycle: bool| {
            let mut orders: BTreeMap<String, Vec<usize>> =
                (1..n).map(|k| (k.to_string(), vec![k - 1])).collect();
            if cycle {
                orders.insert("0".into(), vec![n - 1]);
            }
            orders
        };
        assert!(parse_orders(chain(false), n).is_ok());
        assert_eq!(
            parse_orders(chain(true), n).unwrap_err(),
            "orders contain a cycle"
        );
    }

    #[test]
    fn cursors_round_trip_and_refuse_what_no_server_gave() {
        assert_eq!(
            decode_cursor("cursor", "17:a:b"),
            Ok((17, "a:b".to_owned()))
        );
        for bad in ["", "17", "x:a", "17:", "17:a\0", "17:a b"] {
            let e = decode_cursor("cursor", bad).unwrap_err();
            assert_eq!(e.code, "invalid_query", "{bad:?}");
        }
    }
}

use axum::http::{HeaderMap, HeaderValue};

use super::*;

const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_valid_traceparent_is_read() {
    let p = parse_traceparent(VALID).unwrap();
    assert_eq!(p.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
    assert_eq!(p.span_id, 0x00f067aa0ba902b7);
    assert_eq!(p.flags, 1);
    assert_eq!(p.header(), VALID);
}

#[test]
fn malformed_traceparents_are_ignored() {
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473x-00f067aa0ba902b7-01",
    ] {
        assert_eq!(parse_traceparent(bad), None, "{bad:?}");
    }
}

#[test]
fn a_later_version_is_read_by_its_prefix_and_stored_as_00() {
    let v = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-more";
    let p = parse_traceparent(v).unwrap();
    assert_eq!(p.header(), VALID);
}

#[test]
fn tracestate_is_checked_and_bounded() {
    assert_eq!(
        normalize_tracestate("rojo=00f067aa0ba902b7, congo=t61rcWkgMzE").as_deref(),
        Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    );
    assert_eq!(
        normalize_tracestate("t@vendor=1").as_deref(),
        Some("t@vendor=1")
    );
    assert_eq!(normalize_tracestate("Bad=1"), None);
    assert_eq!(normalize_tracestate("novalue"), None);
    assert_eq!(normalize_tracestate("a=b,c"), None);
    assert_eq!(normalize_tracestate(""), None);
    let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
    assert_eq!(normalize_tracestate(&many.join(",")), None);
    let long: Vec<String> = (0..5)
        .map(|i| format!("k{i}={}", "x".repeat(200)))
        .collect();
    let cut = normalize_tracestate(&long.join(",")).unwrap();
    assert!(cut.len() <= MAX_TRACESTATE_LEN);
    assert_eq!(cut, long[..2].join(","));
}

#[test]
fn headers_give_the_context_only_with_one_valid_traceparent() {
    let mut h = HeaderMap::new();
    assert_eq!(from_headers(&h), None);
    h.insert("traceparent", HeaderValue::from_static(VALID));
    h.append("tracestate", HeaderValue::from_static("a=1"));
    h.append("tracestate", HeaderValue::from_static("b=2"));
    let c = from_headers(&h).unwrap();
    assert_eq!(c.traceparent, VALID);
    assert_eq!(c.tracestate.as_deref(), Some("a=1,b=2"));
    h.append("traceparent", HeaderValue::from_static(VALID));
    assert_eq!(from_headers(&h), None, "two traceparent headers");
    let mut bad = HeaderMap::new();
    bad.insert("traceparent", HeaderValue::from_static("00-zz"));
    bad.insert("tracestate", HeaderValue::from_static("a=1"));
    assert_eq!(from_headers(&bad), None);
}

#[test]
fn a_started_trace_is_valid_and_new_each_time() {
    let a = start();
    let b = start();
    let pa = parse_traceparent(&a.traceparent).unwrap();
    assert_eq!(pa.flags, 1);
    assert_ne!(
        pa.trace_id,
        parse_traceparent(&b.traceparent).unwrap().trace_id
    );
}

#[test]
fn a_call_keeps_the_trace_id_and_gets_its_own_span_id() {
    let context = TraceContext {
        traceparent: VALID.into(),
        tracestate: None,
    };
    let span = tracing::Span::none();
    let one = parse_traceparent(&call_traceparent(&context, &span).unwrap()).unwrap();
    let two = parse_traceparent(&call_traceparent(&context, &span).unwrap()).unwrap();
    let stored = parse_traceparent(VALID).unwrap();
    assert_eq!(one.trace_id, stored.trace_id);
    assert_eq!(one.flags, stored.flags);
    assert_ne!(one.span_id, stored.span_id);
    assert_ne!(one.span_id, two.span_id);
}

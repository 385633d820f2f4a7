use super::*;
use crate::core::TxOptions;
use axum::http::StatusCode;
use serde_json::Number;

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
    let limits = Limits::default();
    assert_eq!(
        code(check_payload("p", "a\0b", &limits)),
        Some("invalid_text")
    );
    // Messages quote at most a short prefix of what was sent.
    let e = check_id("gid", "invalid_gid", &"é".repeat(100_000)).unwrap_err();
    assert!(e.message.len() < 400, "{}", e.message);
}

#[test]
fn a_payload_over_the_servers_bound_is_too_large_and_the_message_names_it() {
    let limits = Limits {
        max_payload_bytes: 10,
        ..Limits::default()
    };
    assert!(check_payload("steps[3].payload", &"x".repeat(10), &limits).is_ok());
    let e = check_payload("steps[3].payload", &"x".repeat(11), &limits).unwrap_err();
    assert_eq!((e.status.as_u16(), e.code), (400, "payload_too_large"));
    for part in ["steps[3].payload", "11 bytes", "limit is 10"] {
        assert!(e.message.contains(part), "{part}: {}", e.message);
    }
    // Bytes, not characters: six two-byte characters are over 10.
    let wide = "é".repeat(6);
    assert_eq!(
        code(check_payload("p", &wide, &limits)),
        Some("payload_too_large")
    );
    // The size is judged first: an oversized payload with a NUL is too large.
    let both = format!("{}\0", "x".repeat(20));
    assert_eq!(
        code(check_payload("p", &both, &limits)),
        Some("payload_too_large")
    );
    let widest = Limits {
        max_payload_bytes: MAX_PAYLOAD_LEN,
        ..Limits::default()
    };
    assert!(check_payload("p", &"x".repeat(MAX_PAYLOAD_LEN), &widest).is_ok());
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

fn number(value: serde_json::Value) -> Number {
    serde_json::from_value(value).unwrap()
}

#[test]
fn numeric_options_are_integers_in_range() {
    let base = TxOptions::default();
    let timeout = |given: Given| {
        Overrides {
            given: vec![given],
            ..Overrides::default()
        }
        .check(&OptionLimits::OPEN)
        .map(|stated| stated.onto(&base))
    };
    let max_ms = TIMEOUT.max;
    let ms = |v| timeout(Given::native(&TIMEOUT, number(v))).map(|o| o.timeout_ms);
    assert_eq!(ms(serde_json::json!(1)), Ok(Some(1)));
    assert_eq!(ms(serde_json::json!(max_ms)), Ok(Some(max_ms)));
    for bad in [
        serde_json::json!(0),
        serde_json::json!(-1),
        serde_json::json!(1.5),
        serde_json::json!(max_ms + 1),
        serde_json::json!(9_223_372_036_854_775_808u64),
        serde_json::json!(u64::MAX),
        serde_json::json!(1e30),
    ] {
        let e = ms(bad.clone()).unwrap_err();
        assert_eq!(e.code, "invalid_options", "{bad}");
        assert!(e.message.contains("2592000000 ms"), "{}", e.message);
        assert!(e.message.contains("timeout_ms"), "{}", e.message);
    }
    // Seconds are multiplied with overflow checked, and the bound is the same.
    let s = |v| timeout(Given::dtm(&TIMEOUT, number(v))).map(|o| o.timeout_ms);
    assert_eq!(s(serde_json::json!(2_592_000)), Ok(Some(max_ms)));
    let e = s(serde_json::json!(i64::MAX)).unwrap_err();
    assert!(e.message.contains("2592000 seconds"), "{}", e.message);
    assert!(e.message.contains("timeout_to_fail"), "{}", e.message);
    assert!(s(serde_json::json!(2_592_001)).is_err());
}

#[test]
fn every_option_has_its_bound() {
    for option in OPTIONS {
        let max = option.max;
        for (v, ok) in [(0, false), (1, true), (max, true), (max + 1, false)] {
            let o = Overrides {
                given: vec![Given::native(option, number(serde_json::json!(v)))],
                ..Overrides::default()
            };
            let resolved = o
                .check(&OptionLimits::OPEN)
                .map(|s| s.onto(&TxOptions::default()));
            assert_eq!(resolved.is_ok(), ok, "{v} of {max}");
            if let Ok(resolved) = resolved {
                assert_eq!(option.of(&resolved), Some(v), "{}", option.name);
            }
        }
    }
    let o = Overrides {
        given: vec![
            Given::native(&MAX_ATTEMPTS, number(serde_json::json!(7))),
            Given::native(&MAX_IN_PROGRESS, number(serde_json::json!(9))),
        ],
        ..Overrides::default()
    };
    let resolved = o
        .check(&OptionLimits::OPEN)
        .unwrap()
        .onto(&TxOptions::default());
    assert_eq!((resolved.max_attempts, resolved.max_in_progress_ms), (7, 9));
}

#[test]
fn the_servers_limits_refuse_past_them_through_either_door() {
    let limits = OptionLimits {
        max_attempts: 100,
        min_retry_interval_ms: 2_000,
    };
    let check = |given: Given| {
        Overrides {
            given: vec![given],
            ..Overrides::default()
        }
        .check(&limits)
        .map(|s| s.onto(&TxOptions::default()))
    };
    let attempts = |v: u64| check(Given::native(&MAX_ATTEMPTS, number(serde_json::json!(v))));
    assert_eq!(attempts(100).unwrap().max_attempts, 100);
    let e = attempts(10_000).unwrap_err();
    assert_eq!(e.code, "option_limit");
    assert_eq!(
        e.message,
        "max_attempts is 10000; this server allows at most 100 (idem serve --max-attempts-limit)"
    );
    // Past the table too: the table's code, as before.
    assert_eq!(attempts(10_001).unwrap_err().code, "invalid_options");
    let e = check(Given::dtm(&MAX_ATTEMPTS, number(serde_json::json!(101)))).unwrap_err();
    assert_eq!(e.code, "option_limit");
    assert!(
        e.message.starts_with("retry_limit is 101;"),
        "{}",
        e.message
    );

    let interval = |v: u64| {
        check(Given::native(&RETRY_INTERVAL, number(serde_json::json!(v))))
            .map(|o| o.retry_interval_ms)
    };
    assert_eq!(interval(2_000), Ok(2_000));
    let e = interval(1).unwrap_err();
    assert_eq!(e.code, "option_limit");
    assert_eq!(
        e.message,
        "retry_interval_ms is 1 ms; this server allows at least 2000 ms \
         (idem serve --min-retry-interval-ms)"
    );
    // DTM's seconds: 1 s is under 2,000 ms, 2 s is not.
    let dtm = |v: u64| check(Given::dtm(&RETRY_INTERVAL, number(serde_json::json!(v))));
    let e = dtm(1).unwrap_err();
    assert_eq!(e.code, "option_limit");
    assert!(
        e.message
            .starts_with("retry_interval is 1 seconds; this server allows at least 2 seconds"),
        "{}",
        e.message
    );
    assert_eq!(dtm(2).unwrap().retry_interval_ms, 2_000);
    // Only the two options that make idem call more have a server limit.
    let limited: Vec<&str> = OPTIONS
        .iter()
        .filter(|o| o.limit.is_some())
        .map(|o| o.name)
        .collect();
    assert_eq!(limited, ["retry_interval_ms", "max_attempts"]);
    // The defaults are inside the table, and so are the server's own defaults.
    let defaults = OptionLimits::default();
    assert!(defaults.max_attempts as u64 <= MAX_ATTEMPTS.max);
    assert!(TxOptions::default().max_attempts <= defaults.max_attempts);
    assert!(TxOptions::default().retry_interval_ms >= defaults.min_retry_interval_ms);
}

#[test]
fn the_table_matches_the_built_in_defaults_and_the_dtm_fields() {
    let defaults = TxOptions::default();
    for option in OPTIONS {
        assert_eq!(option.of(&defaults), option.default, "{}", option.name);
        assert!(
            option.min >= 1 && option.min <= option.max,
            "{}",
            option.name
        );
        if let Some(d) = option.default {
            assert!((option.min..=option.max).contains(&d), "{}", option.name);
        }
    }
    let dtm: Vec<_> = OPTIONS
        .iter()
        .filter_map(|o| o.dtm.map(|(field, unit)| (o.name, field, unit)))
        .collect();
    assert_eq!(
        dtm,
        [
            ("request_timeout_ms", "request_timeout", Unit::Seconds),
            ("retry_interval_ms", "retry_interval", Unit::Seconds),
            ("max_attempts", "retry_limit", Unit::Count),
            ("timeout_ms", "timeout_to_fail", Unit::Seconds),
        ]
    );
    // A maximum in seconds is a whole number of seconds: both doors accept the same top.
    for option in OPTIONS {
        if let Some((_, Unit::Seconds)) = option.dtm {
            assert_eq!(option.max % 1_000, 0, "{}", option.name);
        }
    }
}

#[test]
fn the_first_bad_option_in_table_order_is_the_one_reported() {
    let o = Overrides {
        given: vec![
            Given::dtm(&TIMEOUT, number(serde_json::json!(u64::MAX))),
            Given::dtm(&REQUEST_TIMEOUT, number(serde_json::json!(601))),
        ],
        ..Overrides::default()
    };
    let e = o.check(&OptionLimits::OPEN).unwrap_err();
    assert!(e.message.starts_with("request_timeout "), "{}", e.message);
}

#[test]
fn list_pages_are_bounded_and_refused_past_the_bound() {
    assert_eq!(list_limit("limit", None, DEFAULT_LIST_LIMIT), Ok(50));
    assert_eq!(list_limit("limit", None, DTM_DEFAULT_LIST_LIMIT), Ok(100));
    assert_eq!(list_limit("limit", Some(1), 50), Ok(1));
    assert_eq!(list_limit("limit", Some(MAX_LIST_LIMIT), 50), Ok(1_000));
    for bad in [0, MAX_LIST_LIMIT + 1, u32::MAX] {
        let e = list_limit("limit", Some(bad), 50).unwrap_err();
        assert_eq!(e.code, "invalid_query", "{bad}");
        assert!(e.message.contains("1..=1000"), "{}", e.message);
    }
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

#[test]
fn branch_counts_have_a_limit() {
    assert!(check_branch_count("steps", 100, 100).is_ok());
    let e = check_branch_count("steps", 101, 100).unwrap_err();
    assert_eq!(
        (e.status, e.code),
        (StatusCode::BAD_REQUEST, "too_many_branches")
    );
    assert!(
        e.message.contains("steps") && e.message.contains("100"),
        "{}",
        e.message
    );
    let e = registration_error(EngineError::Store(StoreError::TooManyBranches {
        count: 101,
        max: 100,
    }));
    assert_eq!(
        (e.status, e.code),
        (StatusCode::BAD_REQUEST, "too_many_branches")
    );
    // Every other error keeps its usual code.
    let e = registration_error(EngineError::NotFound("g".into()));
    assert_eq!(e.code, "not_found");
}

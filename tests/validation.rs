//! The limits on what the API accepts, as a client hits them: over real HTTP, through both
//! front doors, on SQLite, PostgreSQL and MariaDB. A refused request answers 400 with a
//! stable code and leaves nothing behind.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, Uri};
use common::Api;
use common::recorder::Recorder;
use idem::server::ServerConfig;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// The native API, the DTM API, a participant, and the backend's name.
struct Doors {
    native: Api,
    dtm: Api,
    p: Recorder,
    b: &'static str,
}

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    each_backend_with(test, |_| {}, body).await;
}

/// [`each_backend`] with the coordinators' configuration changed by `tweak`.
async fn each_backend_with<F, Fut>(test: &str, tweak: fn(&mut ServerConfig), body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in idem_participant::testing::all(test).await {
        let server = common::coordinator_with(&db.url, tweak).await;
        let doors = Doors {
            native: Api::new(server.url()),
            dtm: Api::new(format!("{}/api/dtmsvr", server.url())),
            p: Recorder::start().await,
            b: db.backend.name(),
        };
        body(doors).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

fn code(answer: &Value) -> Option<&str> {
    answer["error"]["code"].as_str()
}

/// Fails unless the answer is a 400 with `expected`, a message, and (DTM) no
/// `dtm_result`, which DTM clients would read as a business outcome.
fn refused(what: &str, (status, answer): (u16, Value), expected: &str) {
    assert_eq!(
        (status, code(&answer)),
        (400, Some(expected)),
        "{what}: {}",
        short(&answer)
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(!message.is_empty(), "{what}: no message");
    assert!(answer.get("dtm_result").is_none(), "{what}: {answer}");
}

/// An answer for an assertion message: a refused 65 KB URL must not print 65 KB.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.len() > 600 {
        format!("{}... ({} bytes)", &text[..600], text.len())
    } else {
        text
    }
}

async fn assert_absent(d: &Doors, gid: &str) {
    let (status, _) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    assert_eq!(status, 404, "{}: {gid} was stored", d.b);
}

fn saga(p: &Recorder, gid: &str, action: &str) -> Value {
    json!({"gid": gid, "kind": "saga",
           "steps": [{"action": action, "compensate": p.url("/c")}]})
}

fn dtm_saga(p: &Recorder, gid: &str, action: &str) -> Value {
    json!({"gid": gid, "trans_type": "saga",
           "steps": [{"action": action, "compensate": p.url("/c")}], "payloads": ["{}"]})
}

#[tokio::test]
async fn a_url_over_the_limit_is_refused_and_nothing_is_stored() {
    each_backend("validation_long_url", |d| async move {
        // 65 KB: over MariaDB's TEXT, where this used to be a 500 "Data too long".
        let long = d.p.url(&format!("/{}", "a".repeat(65 * 1024)));
        let b = d.b;
        let answer = d.native.post("/api/v1/transactions", saga(&d.p, "long-url", &long)).await;
        refused(b, answer.clone(), "too_long");
        let message = answer.1["error"]["message"].as_str().unwrap();
        assert!(message.contains("steps[0].action") && message.contains("4096"), "{message}");
        assert_absent(&d, "long-url").await;

        let tcc = json!({"gid": "long-confirm", "kind": "tcc",
                         "branches": [{"branch_id": "a", "confirm": long, "cancel": d.p.url("/x")}]});
        refused(b, d.native.post("/api/v1/transactions", tcc).await, "too_long");
        assert_absent(&d, "long-confirm").await;
        let msg = json!({"gid": "long-qp", "kind": "msg", "steps": [{"action": d.p.url("/m")}],
                         "query_prepared": long});
        refused(b, d.native.post("/api/v1/transactions", msg).await, "too_long");
        assert_absent(&d, "long-qp").await;

        // Registered later, to a transaction that exists: it stays without branches.
        let (status, _) = d.native.post("/api/v1/transactions", json!({"gid": "t", "kind": "tcc"})).await;
        assert_eq!(status, 201, "{b}");
        for field in ["confirm", "cancel", "try"] {
            let mut reg = json!({"branch_id": "a", "confirm": d.p.url("/c"), "cancel": d.p.url("/x")});
            reg[field] = json!(long);
            refused(b, d.native.post("/api/v1/transactions/t/branches", reg).await, "too_long");
        }
        let (_, tx) = d.native.get("/api/v1/transactions/t").await;
        assert_eq!(tx["branches"], json!([]), "{b}");

        // Through the DTM door.
        refused(b, d.dtm.post("/submit", dtm_saga(&d.p, "dtm-long", &long)).await, "too_long");
        assert_absent(&d, "dtm-long").await;
        let (status, _) = d.dtm.post("/prepare", json!({"gid": "dtm-t", "trans_type": "tcc"})).await;
        assert_eq!(status, 200, "{b}");
        let reg = json!({"gid": "dtm-t", "branch_id": "01", "trans_type": "tcc", "data": "",
                         "confirm": long, "cancel": d.p.url("/x")});
        refused(b, d.dtm.post("/registerBranch", reg).await, "too_long");
        let (_, q) = d.dtm.get("/query?gid=dtm-t").await;
        assert_eq!(q["branches"], json!([]), "{b}");
    })
    .await;
}

#[tokio::test]
async fn a_url_at_the_limit_is_accepted_and_called() {
    each_backend("validation_url_at_limit", |d| async move {
        let base = d.p.url("/");
        let path = "u".repeat(4_096 - base.len());
        let url = format!("{base}{path}");
        assert_eq!(url.len(), 4_096);
        let mut body = saga(&d.p, "url-4k", &url);
        body["wait_result"] = json!(true);
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{}: {}",
            d.b,
            short(&tx)
        );
        assert_eq!(d.p.paths("url-4k"), [format!("/{path}")], "{}", d.b);
        let mut body = dtm_saga(&d.p, "dtm-url-4k", &url);
        body["wait_result"] = json!(true);
        let (status, answer) = d.dtm.post("/submit", body).await;
        assert_eq!(
            (status, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{}",
            d.b
        );
    })
    .await;
}

#[tokio::test]
async fn a_reason_over_the_limit_leaves_the_transaction_as_it_was() {
    each_backend("validation_reason", |d| async move {
        let b = d.b;
        let tcc = json!({"gid": "r", "kind": "tcc", "branches": [
            {"branch_id": "a", "confirm": d.p.url("/a/confirm"), "cancel": d.p.url("/a/cancel")}]});
        assert_eq!(
            d.native.post("/api/v1/transactions", tcc).await.0,
            201,
            "{b}"
        );
        let (_, before) = d.native.get("/api/v1/transactions/r").await;
        let over = "r".repeat(1_025);
        for op in ["abort", "force-stop"] {
            let path = format!("/api/v1/transactions/r/{op}");
            refused(
                b,
                d.native.post(&path, json!({"reason": over})).await,
                "too_long",
            );
            // PostgreSQL cannot store a NUL; it used to answer 500.
            refused(
                b,
                d.native.post(&path, json!({"reason": "a\u{0}b"})).await,
                "invalid_text",
            );
        }
        let over_dtm = json!({"gid": "r", "trans_type": "tcc", "rollback_reason": over});
        refused(b, d.dtm.post("/abort", over_dtm.clone()).await, "too_long");
        refused(b, d.dtm.post("/forceStop", over_dtm).await, "too_long");
        let (_, after) = d.native.get("/api/v1/transactions/r").await;
        assert_eq!(
            after, before,
            "{b}: a refused request changed the transaction"
        );
        assert!(d.p.calls().is_empty(), "{b}: nothing was cancelled");

        let exact = "é".repeat(512);
        let (status, tx) = d
            .native
            .post(
                "/api/v1/transactions/r/abort",
                json!({"reason": exact, "wait_result": true}),
            )
            .await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (200, Some("failed")),
            "{b}: {tx}"
        );
        assert_eq!(tx["reason"], json!(exact), "{b}");
    })
    .await;
}

/// A participant that records the headers of every call.
#[derive(Clone, Default)]
struct HeaderSink(Arc<Mutex<Vec<HeaderMap>>>);

impl HeaderSink {
    async fn start() -> (HeaderSink, String) {
        let sink = HeaderSink::default();
        let seen = sink.clone();
        let app = Router::new().fallback(move |_: Uri, headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.0.lock().unwrap().push(headers);
                "{}"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/h", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (sink, url)
    }
}

#[tokio::test]
async fn bad_branch_headers_are_refused_before_anything_is_stored() {
    each_backend("validation_headers", |d| async move {
        let b = d.b;
        let many: serde_json::Map<String, Value> =
            (0..33).map(|i| (format!("x-{i}"), json!("v"))).collect();
        let cases: Vec<(Value, &str)> = vec![
            (json!({"x-a": "one\r\nx-injected: two"}), "invalid_header"),
            (json!({"x-a": "line\nbreak"}), "invalid_header"),
            (json!({"x-a": "caf\u{e9}"}), "invalid_header"),
            (json!({"x-a": "nul\u{0}"}), "invalid_header"),
            (json!({"x-a": " padded"}), "invalid_header"),
            (json!({"bad name": "v"}), "invalid_header"),
            (json!({"x-\u{e9}": "v"}), "invalid_header"),
            (json!({"": "v"}), "invalid_header"),
            (json!({"Host": "elsewhere"}), "invalid_header"),
            (json!({"content-length": "0"}), "invalid_header"),
            (json!({"Transfer-Encoding": "chunked"}), "invalid_header"),
            (json!({"Connection": "close"}), "invalid_header"),
            (json!({"X-Tenant": "a", "x-tenant": "b"}), "invalid_header"),
            (json!({"x-a": "v".repeat(4_097)}), "too_long"),
            (json!({"n".repeat(129): "v"}), "too_long"),
            (Value::Object(many), "invalid_header"),
        ];
        for (i, (headers, expected)) in cases.into_iter().enumerate() {
            let gid = format!("h{i}");
            let what = format!("{b} {headers}");
            let native = json!({"gid": gid, "kind": "tcc", "options": {"branch_headers": headers}});
            refused(
                &what,
                d.native.post("/api/v1/transactions", native).await,
                expected,
            );
            let dtm = json!({"gid": gid, "trans_type": "tcc", "branch_headers": headers});
            refused(&what, d.dtm.post("/prepare", dtm).await, expected);
            assert_absent(&d, &gid).await;
        }

        // What is accepted reaches the participant as sent.
        let (sink, url) = HeaderSink::start().await;
        let value = format!("Bearer {}\tend", "t".repeat(4_000));
        let mut ok = saga(&d.p, "h-ok", &url);
        ok["options"] = json!({"branch_headers": {"Authorization": value, "x-empty": ""}});
        ok["wait_result"] = json!(true);
        let (status, tx) = d.native.post("/api/v1/transactions", ok).await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{b}: {}",
            short(&tx)
        );
        let seen = sink.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{b}");
        assert_eq!(seen[0]["authorization"].to_str().unwrap(), value, "{b}");
        assert_eq!(seen[0]["x-empty"].to_str().unwrap(), "", "{b}");
    })
    .await;
}

#[tokio::test]
async fn timeouts_beyond_thirty_days_are_refused_not_wrapped() {
    each_backend("validation_timeouts", |d| async move {
        let b = d.b;
        let native_bad = [
            json!(18_446_744_073_709_551_615u64),
            json!(9_223_372_036_854_775_808u64),
            json!(2_592_000_001u64),
            json!(0),
            json!(-1),
            json!(1.5),
            json!(1e30),
            json!("60000"),
        ];
        for (i, timeout) in native_bad.into_iter().enumerate() {
            let gid = format!("t{i}");
            let body = json!({"gid": gid, "kind": "tcc", "options": {"timeout_ms": timeout}});
            let expected = if timeout.is_string() {
                "invalid_json"
            } else {
                "invalid_options"
            };
            refused(
                &format!("{b} {timeout}"),
                d.native.post("/api/v1/transactions", body).await,
                expected,
            );
            assert_absent(&d, &gid).await;
        }
        let body =
            json!({"gid": "t-max", "kind": "tcc", "options": {"timeout_ms": 2_592_000_000u64}});
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(status, 201, "{b}: {tx}");
        let deadline = tx["timeout_at"].as_i64().unwrap() - tx["created_at"].as_i64().unwrap();
        assert_eq!(deadline, 2_592_000_000, "{b}: {tx}");

        for (gid, seconds) in [
            ("d1", json!(9_223_372_036_854_775_807i64)),
            ("d2", json!(2_592_001)),
            ("d3", json!(18_446_744_073_709_551_615u64)),
        ] {
            let body = json!({"gid": gid, "trans_type": "tcc", "timeout_to_fail": seconds});
            refused(
                &format!("{b} {seconds}"),
                d.dtm.post("/prepare", body).await,
                "invalid_options",
            );
            assert_absent(&d, gid).await;
        }
        let mut saga = dtm_saga(&d.p, "d4", &d.p.url("/a"));
        saga["timeout_to_fail"] = json!(i64::MAX);
        refused(b, d.dtm.post("/submit", saga).await, "invalid_options");
        assert_absent(&d, "d4").await;
        let body = json!({"gid": "d-max", "trans_type": "tcc", "timeout_to_fail": 2_592_000});
        assert_eq!(d.dtm.post("/prepare", body).await.0, 200, "{b}");
        let (_, tx) = d.native.get("/api/v1/transactions/d-max").await;
        assert_eq!(tx["options"]["timeout_ms"], 2_592_000_000u64, "{b}");
    })
    .await;
}

#[tokio::test]
async fn dtm_retry_limit_above_the_cap_is_refused_not_clamped() {
    each_backend("validation_retry_limit", |d| async move {
        let mut body = dtm_saga(&d.p, "rl", &d.p.url("/a"));
        body["retry_limit"] = json!(20_000);
        let answer = d.dtm.post("/submit", body.clone()).await;
        refused(d.b, answer.clone(), "invalid_options");
        assert!(
            answer.1["message"]
                .as_str()
                .unwrap()
                .contains("retry_limit"),
            "{}",
            answer.1
        );
        assert_absent(&d, "rl").await;
        body["retry_limit"] = json!(10_000);
        body["wait_result"] = json!(true);
        assert_eq!(d.dtm.post("/submit", body).await.0, 200, "{}", d.b);
        let (_, tx) = d.native.get("/api/v1/transactions/rl").await;
        assert_eq!(tx["options"]["max_attempts"], 10_000, "{}", d.b);
    })
    .await;
}

/// One option through both doors: native field, DTM field (if any), how many of idem's
/// units one DTM unit is, and idem's upper bound.
const BOUNDS: [(&str, Option<&str>, u64, u64); 6] = [
    (
        "request_timeout_ms",
        Some("request_timeout"),
        1_000,
        600_000,
    ),
    (
        "retry_interval_ms",
        Some("retry_interval"),
        1_000,
        3_600_000,
    ),
    ("max_attempts", Some("retry_limit"), 1, 10_000),
    ("timeout_ms", Some("timeout_to_fail"), 1_000, 2_592_000_000),
    ("max_retry_interval_ms", None, 1, 86_400_000),
    ("max_in_progress_ms", None, 1, 2_592_000_000),
];

#[tokio::test]
async fn both_doors_agree_on_every_bound() {
    each_backend("validation_doors_agree", |d| async move {
        let b = d.b;
        let mut n = 0;
        for (native_field, dtm_field, factor, max) in BOUNDS {
            // In the DTM door's unit; the native door gets the same amount in idem's.
            let dtm_max = max / factor;
            let cases = [
                (1, true),
                (dtm_max, true),
                (dtm_max + 1, false),
                (i64::MAX as u64, false),
                (u64::MAX, false),
            ];
            for (value, accepted) in cases {
                n += 1;
                let ms = value.saturating_mul(factor);
                let gid = format!("n{n}");
                let native = json!({"gid": gid, "kind": "tcc", "options": {native_field: ms}});
                let (status, answer) = d.native.post("/api/v1/transactions", native).await;
                let what = format!("{b}: {native_field}={ms}");
                if accepted {
                    assert_eq!(status, 201, "{what}: {answer}");
                    assert_eq!(answer["options"][native_field], ms, "{what}");
                } else {
                    refused(&what, (status, answer), "invalid_options");
                    assert_absent(&d, &gid).await;
                }
                let Some(dtm_field) = dtm_field else { continue };
                let gid = format!("d{n}");
                let dtm = json!({"gid": gid, "trans_type": "tcc", dtm_field: value});
                let (status, answer) = d.dtm.post("/prepare", dtm).await;
                let what = format!("{b}: {dtm_field}={value}");
                if accepted {
                    assert_eq!(status, 200, "{what}: {answer}");
                    let (_, tx) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
                    assert_eq!(
                        tx["options"][native_field], ms,
                        "{what}: the same option as native"
                    );
                } else {
                    refused(&what, (status, answer), "invalid_options");
                    assert_absent(&d, &gid).await;
                }
            }
            // Where the doors differ by design: DTM reads 0 and below as "not set".
            if let Some(dtm_field) = dtm_field {
                for (i, unset) in [json!(0), json!(-5), Value::Null].into_iter().enumerate() {
                    let gid = format!("z{n}-{i}");
                    let dtm = json!({"gid": gid, "trans_type": "tcc", dtm_field: unset});
                    assert_eq!(
                        d.dtm.post("/prepare", dtm).await.0,
                        200,
                        "{b}: {dtm_field}={unset}"
                    );
                }
                let fraction = json!({"gid": format!("f{n}"), "trans_type": "tcc", dtm_field: 1.5});
                refused(b, d.dtm.post("/prepare", fraction).await, "invalid_options");
            }
            let native =
                json!({"gid": format!("zero{n}"), "kind": "tcc", "options": {native_field: 0}});
            refused(
                b,
                d.native.post("/api/v1/transactions", native).await,
                "invalid_options",
            );
        }
    })
    .await;
}

#[tokio::test]
async fn texts_postgresql_cannot_store_are_refused_on_every_backend() {
    each_backend("validation_nul", |d| async move {
        let b = d.b;
        let nul_url = d.p.url("/a\u{0}b");
        refused(
            b,
            d.native
                .post("/api/v1/transactions", saga(&d.p, "nul-url", &nul_url))
                .await,
            "invalid_url",
        );
        assert_absent(&d, "nul-url").await;
        let mut body = dtm_saga(&d.p, "nul-payload", &d.p.url("/a"));
        body["payloads"] = json!(["x\u{0}y"]);
        refused(b, d.dtm.post("/submit", body).await, "invalid_text");
        assert_absent(&d, "nul-payload").await;
        assert_eq!(
            d.dtm
                .post("/prepare", json!({"gid": "tn", "trans_type": "tcc"}))
                .await
                .0,
            200
        );
        let reg = json!({"gid": "tn", "branch_id": "01", "trans_type": "tcc", "data": "\u{0}",
                         "confirm": d.p.url("/c"), "cancel": d.p.url("/x")});
        refused(b, d.dtm.post("/registerBranch", reg).await, "invalid_text");
        // Reads too: a gid or cursor reaches the database.
        refused(b, d.dtm.get("/query?gid=%00").await, "invalid_gid");
        refused(b, d.dtm.get("/all?position=1:%00").await, "invalid_query");
        refused(
            b,
            d.native.get("/api/v1/transactions?cursor=1:%00").await,
            "invalid_query",
        );
        assert_eq!(
            d.native.get("/api/v1/transactions?cursor=1:a").await.0,
            200,
            "{b}"
        );
    })
    .await;
}

#[tokio::test]
async fn payloads_and_custom_data_have_limits() {
    each_backend("validation_payloads", |d| async move {
        let b = d.b;
        // Under the 1 MiB body limit, but its text as stored is longer ("1e2" is 100.0).
        let numbers = vec![json!(1e2); 200_000];
        let mut body = saga(&d.p, "big", &d.p.url("/a"));
        body["steps"][0]["payload"] = json!(numbers);
        let raw = body.to_string().replace("100.0", "1e2");
        assert!(raw.len() < 1 << 20);
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/transactions", d.native.base))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        refused(b, (status, r.json().await.unwrap()), "too_long");
        assert_absent(&d, "big").await;

        let mut body = dtm_saga(&d.p, "cd", &d.p.url("/a"));
        body["custom_data"] = json!(format!(
            "{{\"concurrent\": true, \"pad\": \"{}\"}}",
            "x".repeat(65_536)
        ));
        refused(b, d.dtm.post("/submit", body).await, "too_long");
        assert_absent(&d, "cd").await;
        let mut body = dtm_saga(&d.p, "cd-ok", &d.p.url("/a"));
        body["custom_data"] = json!(json!({"concurrent": true, "orders": {}}).to_string());
        body["wait_result"] = json!(true);
        assert_eq!(d.dtm.post("/submit", body).await.0, 200, "{b}");

        // Over the body limit: 413 from both doors.
        let huge = "x".repeat(1 << 20);
        let (status, answer) = d
            .dtm
            .post(
                "/submit",
                json!({"gid": "huge", "trans_type": "saga", "payloads": [huge]}),
            )
            .await;
        assert_eq!(
            (status, code(&answer)),
            (413, Some("payload_too_large")),
            "{b}"
        );
        assert_absent(&d, "huge").await;
    })
    .await;
}

#[tokio::test]
async fn a_long_chain_of_orders_is_refused_without_crashing_the_server() {
    // Past the default cap on steps, which would refuse it before the orders are read.
    let no_cap = |c: &mut ServerConfig| c.connect.max_branches = 20_000;
    each_backend_with("validation_orders_chain", no_cap, |d| async move {
        // 15,000 steps, each waiting for the one before, and the first for the last: the
        // recursive cycle check this replaced overflowed the stack and aborted the process.
        let n = 15_000;
        let steps: Vec<Value> = (0..n)
            .map(|_| json!({"action": "http://a/x", "compensate": "http://a/y"}))
            .collect();
        let mut orders: serde_json::Map<String, Value> =
            (1..n).map(|k| (k.to_string(), json!([k - 1]))).collect();
        orders.insert("0".into(), json!([n - 1]));
        let body = json!({"gid": "chain", "kind": "saga", "steps": steps,
                          "options": {"concurrent": true, "orders": orders}});
        assert!(body.to_string().len() < 1 << 20);
        let answer = d.native.post("/api/v1/transactions", body).await;
        refused(d.b, answer.clone(), "invalid_options");
        assert!(
            answer.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cycle")
        );
        assert_absent(&d, "chain").await;
        assert_eq!(d.native.get("/health").await.0, 200);
    })
    .await;
}

#[tokio::test]
async fn max_in_progress_ms_is_a_native_option_that_bounds_an_ongoing_step() {
    each_backend("validation_max_in_progress", |d| async move {
        // A step that keeps answering 425 is given up once max_in_progress_ms has passed
        // since its first such answer: the saga compensates.
        d.p.answer("/slow", None, 1_000, 425);
        let mut body = saga(&d.p, "ongoing", &d.p.url("/slow"));
        body["options"] = json!({"max_in_progress_ms": 300});
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(status, 201, "{}: {tx}", d.b);
        assert_eq!(tx["options"]["max_in_progress_ms"], 300);
        d.native.wait_status("ongoing", &["failed"], WAIT).await;
        assert!(d.p.paths("ongoing").contains(&"/c".to_string()), "{}", d.b);
    })
    .await;
}

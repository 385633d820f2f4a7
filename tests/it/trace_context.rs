//! W3C trace context through real `idem serve` processes: the client's `traceparent`
//! reaches every branch call, before and after a SIGKILL and restart (so it is stored),
//! through both doors, on every database; and spans reach a local OTLP/HTTP receiver with
//! the transaction's trace id.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Child;
use common::recorder::{Call, Recorder};
use common::typed::{self, wait_status};
use idem_client::Status;
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn client_traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

/// The (trace id, span id, flags) of a valid version-00 `traceparent`; panics otherwise.
fn parts(traceparent: &str) -> (String, String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "{traceparent}");
    assert_eq!(p[0], "00", "{traceparent}");
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    assert!(
        hex(p[1], 32) && p[1].bytes().any(|b| b != b'0'),
        "{traceparent}"
    );
    assert!(
        hex(p[2], 16) && p[2].bytes().any(|b| b != b'0'),
        "{traceparent}"
    );
    assert!(hex(p[3], 2), "{traceparent}");
    (p[1].to_owned(), p[2].to_owned(), p[3].to_owned())
}

/// Creates a one- or two-step saga through the native door with `headers`.
async fn create_native(
    base: &str,
    p: &Recorder,
    gid: &str,
    steps: &[&str],
    headers: &[(&str, &str)],
) {
    let steps: Vec<Value> = steps
        .iter()
        .map(|s| {
            json!({"action": p.url(&format!("/{s}/action")), "compensate": p.url(&format!("/{s}/compensate"))})
        })
        .collect();
    let body =
        json!({"kind": "saga", "gid": gid, "steps": steps, "options": {"max_attempts": 1000}});
    post(&format!("{base}/api/v1/transactions"), body, headers, 201).await;
}

async fn post(url: &str, body: Value, headers: &[(&str, &str)], expect: u16) {
    idem::transport::install_crypto_provider();
    let mut request = reqwest::Client::new().post(url).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let answer = request.send().await.expect("idem answers");
    let status = answer.status().as_u16();
    let text = answer.text().await.unwrap();
    assert_eq!(status, expect, "{url}: {text}");
}

fn calls_of(p: &Recorder, gid: &str) -> Vec<Call> {
    p.calls().into_iter().filter(|c| c.gid == gid).collect()
}

/// Every call carries `trace_id` with a span id of its own (never the client's), and
/// `tracestate` as given.
fn assert_one_trace(calls: &[Call], trace_id: &str, tracestate: Option<&str>, what: &str) {
    assert!(!calls.is_empty(), "{what}: no calls");
    let mut spans = HashSet::new();
    for c in calls {
        let header = c
            .traceparent
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: {c:?}"));
        let (trace, span, flags) = parts(header);
        assert_eq!(trace, trace_id, "{what}: {c:?}");
        assert_eq!(flags, "01", "{what}: {c:?}");
        assert_ne!(span, CLIENT_SPAN, "{what}: a call has its own span");
        assert!(spans.insert(span), "{what}: span ids repeat: {calls:#?}");
        assert_eq!(c.tracestate.as_deref(), tracestate, "{what}: {c:?}");
    }
}

async fn survives_restart(db: TestDatabase) {
    let backend = db.backend;
    let p = Recorder::start().await;
    // Step 2 fails until after the restart: its calls come from both processes.
    p.answer("/s2/action", None, 100_000, 503);
    let extra = ["--max-attempts", "1000", "--max-attempts-limit", "1000"];
    let first = Child::serve(&db.url, "trace-node", &extra).await;
    let traced = "traced";
    let parent = client_traceparent();
    let headers = [
        ("traceparent", parent.as_str()),
        ("tracestate", "vendor=abc,other=1"),
    ];
    create_native(&first.url, &p, traced, &["s1", "s2"], &headers).await;
    // No traceparent, and a malformed one: idem starts a trace for each.
    create_native(&first.url, &p, "untraced", &["s3"], &[]).await;
    let malformed = [
        ("traceparent", "00-not-a-trace-01"),
        ("tracestate", "vendor=abc"),
    ];
    create_native(&first.url, &p, "malformed", &["s4"], &malformed).await;
    // A tracestate of 513 characters loses its last member; the 512 left fit every database.
    let members: Vec<String> = (0..4)
        .map(|i| format!("k{i}={}", "v".repeat(124)))
        .collect();
    let longest = members.join(",");
    assert_eq!(longest.len(), 511);
    let over = format!("{longest},z=1");
    let long = [
        ("traceparent", parent.as_str()),
        ("tracestate", over.as_str()),
    ];
    create_native(&first.url, &p, "long-state", &["s6"], &long).await;
    // The DTM door, with its own client context.
    let dtm_parent = format!("00-{}-{CLIENT_SPAN}-01", "a".repeat(32));
    let dtm = json!({
        "gid": "dtm-traced",
        "trans_type": "saga",
        "steps": [{"action": p.url("/s5/action"), "compensate": p.url("/s5/compensate")}],
        "payloads": ["{}"],
    });
    let dtm_headers = [("traceparent", dtm_parent.as_str())];
    post(
        &format!("{}/api/dtmsvr/submit", first.url),
        dtm,
        &dtm_headers,
        200,
    )
    .await;

    p.wait_until(WAIT, |calls| {
        calls.iter().filter(|c| c.path == "/s2/action").count() >= 3
    })
    .await;
    first.kill();
    let before = calls_of(&p, traced).len();
    let second = Child::serve(&db.url, "trace-node", &extra).await;
    p.wait_until(WAIT, |calls| {
        calls.iter().filter(|c| c.gid == traced).count() >= before + 2
    })
    .await;
    p.heal();
    let idem = typed::client(&second.url);
    for gid in [traced, "untraced", "malformed", "dtm-traced", "long-state"] {
        wait_status(&idem, gid, &[Status::Succeeded], WAIT).await;
    }

    let calls = calls_of(&p, traced);
    assert!(calls.len() > before, "{backend}: calls after the restart");
    let state = Some("vendor=abc,other=1");
    assert_one_trace(
        &calls[..before],
        TRACE_ID,
        state,
        &format!("{backend} before"),
    );
    assert_one_trace(&calls, TRACE_ID, state, &format!("{backend} all"));
    assert!(
        calls.iter().any(|c| c.path == "/s1/action")
            && calls.iter().any(|c| c.path == "/s2/action")
    );

    let mut started = HashSet::new();
    for gid in ["untraced", "malformed"] {
        let calls = calls_of(&p, gid);
        let header = calls[0].traceparent.clone().unwrap_or_default();
        let (trace, _, _) = parts(&header);
        assert_ne!(trace, TRACE_ID, "{backend}: {gid}");
        assert_one_trace(&calls, &trace, None, &format!("{backend} {gid}"));
        assert!(started.insert(trace), "{backend}: a trace per transaction");
    }
    assert_one_trace(
        &calls_of(&p, "dtm-traced"),
        &"a".repeat(32),
        None,
        &format!("{backend} dtm"),
    );
    let state = Some(longest.as_str());
    assert_one_trace(
        &calls_of(&p, "long-state"),
        TRACE_ID,
        state,
        &format!("{backend} long"),
    );
    // As stored: the client's context, in its version-00 form.
    let store = common::open(&db.url).await;
    for (gid, state) in [
        (traced, "vendor=abc,other=1"),
        ("long-state", longest.as_str()),
    ] {
        let trace = store.load(gid).await.unwrap().unwrap().tx.trace.unwrap();
        assert_eq!(trace.traceparent, parent, "{backend}: {gid}");
        assert_eq!(trace.tracestate.as_deref(), Some(state), "{backend}: {gid}");
    }
    drop(store);
    drop(second);
    db.drop_database().await;
}

#[tokio::test]
async fn traceparent_reaches_calls_before_and_after_a_restart_sqlite() {
    survives_restart(TestDatabase::create(Backend::Sqlite, "trace_sqlite").await).await;
}

#[tokio::test]
async fn traceparent_reaches_calls_before_and_after_a_restart_postgres() {
    let db = TestDatabase::create(Backend::Postgres, "trace_postgres").await;
    survives_restart(db).await;
}

#[tokio::test]
async fn traceparent_reaches_calls_before_and_after_a_restart_mysql() {
    let db = TestDatabase::create(Backend::Mysql, "trace_mysql").await;
    survives_restart(db).await;
}

// ---- OTLP -------------------------------------------------------------------------------

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

/// A local OTLP/HTTP receiver: every span of every `POST /v1/traces`.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let receiver = Receiver::default();
        let spans = Arc::clone(&receiver.spans);
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                let Ok(request) = ExportTraceServiceRequest::decode(body) else {
                    return axum::http::StatusCode::BAD_REQUEST;
                };
                let mut spans = spans.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        spans.extend(scope.spans);
                    }
                }
                axum::http::StatusCode::OK
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (receiver, url)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            any_value::Value::StringValue(s) => Some(s.clone()),
            other => Some(format!("{other:?}")),
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn spans_reach_a_local_otlp_receiver_in_the_clients_trace() {
    let db = TestDatabase::create(Backend::Sqlite, "trace_otlp").await;
    let (receiver, endpoint) = Receiver::start().await;
    let p = Recorder::start().await;
    // A short batch delay, so the spans leave while the process runs.
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    // The sagas ask for 1,000 attempts (see `create_native`): allowed here.
    let flags = ["--otlp-endpoint", &endpoint, "--max-attempts-limit", "1000"];
    let idem = Child::serve_env(&db.url, "otlp-node", &flags, &env).await;
    let parent = client_traceparent();
    create_native(
        &idem.url,
        &p,
        "exported",
        &["s1"],
        &[("traceparent", parent.as_str())],
    )
    .await;
    wait_status(
        &typed::client(&idem.url),
        "exported",
        &[Status::Succeeded],
        WAIT,
    )
    .await;

    let deadline = tokio::time::Instant::now() + WAIT;
    let (transaction, call) = loop {
        let spans = receiver.spans();
        let ours = |name: &str| {
            spans.iter().find(|s| {
                s.name == name
                    && hex(&s.trace_id) == TRACE_ID
                    && attribute(s, "gid").as_deref() == Some("exported")
            })
        };
        if let (Some(t), Some(c)) = (ours("transaction"), ours("branch_call")) {
            break (t.clone(), c.clone());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no transaction and branch_call spans of the client's trace: {spans:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The drive continues the client's span; the call is the drive's child.
    assert_eq!(hex(&transaction.parent_span_id), CLIENT_SPAN);
    assert_eq!(call.parent_span_id, transaction.span_id);
    assert_eq!(attribute(&call, "branch_id").as_deref(), Some("01"));
    assert_eq!(attribute(&call, "op").as_deref(), Some("action"));
    // The participant was called with the exported call span as its parent.
    let calls = calls_of(&p, "exported");
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let (trace, span, _) = parts(calls[0].traceparent.as_deref().unwrap());
    assert_eq!((trace.as_str(), span), (TRACE_ID, hex(&call.span_id)));
    drop(idem);
    db.drop_database().await;
}

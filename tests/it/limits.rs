//! The server's limits on what one request may carry and how often a tenant may ask, as a
//! client hits them over real HTTP:
//!
//! - the payload of each branch (`--max-branch-payload-bytes`): every payload a request can
//!   carry, through both doors, on SQLite, PostgreSQL and MariaDB (`400 payload_too_large`,
//!   nothing stored);
//! - the tenant's request rate (`--rate-limit-per-second`, `--rate-limit-burst`): on SQLite
//!   only, since the limit is decided before a request reaches the engine or the database
//!   (`429 rate_limited`, `Retry-After`, nothing stored). The refill is tested on a fake
//!   clock in `src/api/rate_limit.rs`; here the rate is one per second, so the last of a
//!   handful of back-to-back requests is refused unless they took a second;
//! - both set through a real `idem serve`'s environment.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem::api::rate_limit::RateLimitConfig;
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
/// The payload cap of the in-process coordinators of the payload tests.
const MAX: usize = 100;

struct Doors {
    native: Api,
    dtm: Api,
    p: Recorder,
    b: &'static str,
}

/// Fails unless the answer is `400 payload_too_large`, its message names `field` and gives
/// the payload's size and the limit, and (DTM) it carries no `dtm_result`.
fn too_large(what: &str, (status, answer): (u16, Value), field: &str, size: usize) {
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("payload_too_large")),
        "{what}: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    for part in [
        field,
        &format!("{size} bytes"),
        &format!("limit is {MAX} bytes"),
    ] {
        assert!(
            message.contains(part),
            "{what}: {part:?} not in {message:?}"
        );
    }
    assert!(answer.get("dtm_result").is_none(), "{what}: {answer}");
}

/// Neither door knows `gid`.
async fn assert_absent(d: &Doors, gid: &str) {
    let (status, _) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    assert_eq!(status, 404, "{}: {gid} was stored", d.b);
    let (status, answer) = d.dtm.get(&format!("/query?gid={gid}")).await;
    assert_eq!(status, 200, "{}: {answer}", d.b);
    assert!(answer["transaction"].is_null(), "{}: {answer}", d.b);
}

/// The branch ids stored for `gid`, once each.
async fn branch_ids(d: &Doors, gid: &str) -> Vec<String> {
    let (_, tx) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    let ids: BTreeSet<String> = tx["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["branch_id"].as_str().unwrap().to_owned())
        .collect();
    ids.into_iter().collect()
}

/// A JSON payload whose stored text (its JSON) is `bytes` long.
fn payload(bytes: usize) -> Value {
    json!("x".repeat(bytes - 2))
}

fn step(p: &Recorder, payload: Value) -> Value {
    json!({"action": p.url("/a"), "compensate": p.url("/c"), "payload": payload})
}

fn tcc_branch(p: &Recorder, id: &str, payload: Value) -> Value {
    json!({"branch_id": id, "confirm": p.url("/confirm"), "cancel": p.url("/cancel"),
           "payload": payload})
}

fn dtm_saga(p: &Recorder, gid: &str, payloads: &[String]) -> Value {
    let steps: Vec<Value> = payloads
        .iter()
        .map(|_| json!({"action": p.url("/a"), "compensate": p.url("/c")}))
        .collect();
    json!({"gid": gid, "trans_type": "saga", "steps": steps, "payloads": payloads})
}

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in testing::all(test).await {
        let server = common::coordinator_with(&db.url, |c| c.max_branch_payload_bytes = MAX).await;
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

#[tokio::test]
async fn native_payloads_over_the_cap_are_refused_and_store_nothing() {
    each_backend("limits_native_payload", |d| async move {
        let b = d.b;
        let over = MAX + 1;
        let saga = json!({"gid": "n-saga", "kind": "saga",
                          "steps": [step(&d.p, json!({"a": 1})), step(&d.p, payload(over))]});
        let msg = json!({"gid": "n-msg", "kind": "msg", "query_prepared": d.p.url("/q"),
                         "steps": [{"action": d.p.url("/m"), "payload": payload(over)}]});
        let tcc = json!({"gid": "n-tcc", "kind": "tcc", "branches": [
            tcc_branch(&d.p, "b0", json!(null)), tcc_branch(&d.p, "b1", payload(over))]});
        for (body, field) in [
            (saga, "steps[1].payload"),
            (msg, "steps[0].payload"),
            (tcc, "branches[1].payload (branch \"b1\")"),
        ] {
            let gid = body["gid"].as_str().unwrap().to_owned();
            let answer = d.native.post("/api/v1/transactions", body).await;
            too_large(&format!("{b} {gid}"), answer, field, over);
            assert_absent(&d, &gid).await;
        }

        // Measured as stored: sent as `1e2`, each number is stored as `100.0`, so a body
        // whose payload was 81 bytes on the wire is 121 as stored.
        let numbers = vec!["1e2"; 20].join(",");
        let raw = format!(
            r#"{{"gid": "n-wide", "kind": "saga", "steps": [{{"action": "{}",
                "compensate": "{}", "payload": [{numbers}]}}]}}"#,
            d.p.url("/a"),
            d.p.url("/c")
        );
        assert!(numbers.len() + 2 <= MAX);
        let r = reqwest::Client::new()
            .post(format!("{}/api/v1/transactions", d.native.base))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let answer = (r.status().as_u16(), r.json().await.unwrap());
        too_large(&format!("{b} re-encoded"), answer, "steps[0].payload", 121);
        assert_absent(&d, "n-wide").await;

        // A TCC branch registered later, with or without the Try idem calls: refused,
        // the transaction keeps the branches it had, and the Try is never called.
        let tcc = json!({"gid": "t", "kind": "tcc",
                         "branches": [tcc_branch(&d.p, "b0", payload(MAX))]});
        let (status, answer) = d.native.post("/api/v1/transactions", tcc).await;
        assert_eq!(status, 201, "{b}: at the cap: {answer}");
        let path = "/api/v1/transactions/t/branches";
        let mut reg = tcc_branch(&d.p, "b1", payload(over));
        too_large(
            b,
            d.native.post(path, reg.clone()).await,
            "payload (branch \"b1\")",
            over,
        );
        reg["try"] = json!(d.p.url("/try"));
        too_large(
            b,
            d.native.post(path, reg).await,
            "payload (branch \"b1\")",
            over,
        );
        assert_eq!(branch_ids(&d, "t").await, ["b0"], "{b}");
        assert_eq!(d.p.count("t", "/try"), 0, "{b}: a refused Try was called");

        // At the cap, a saga runs and its participant gets the payload whole.
        let saga = json!({"gid": "n-ok", "kind": "saga", "steps": [step(&d.p, payload(MAX))]});
        let (status, answer) = d.native.post("/api/v1/transactions", saga).await;
        assert_eq!(status, 201, "{b}: {answer}");
        d.native.wait_status("n-ok", &["succeeded"], WAIT).await;
        let calls = d.p.calls();
        let call = calls
            .iter()
            .find(|c| c.gid == "n-ok")
            .expect("the step was called");
        assert_eq!(call.body.len(), MAX, "{b}");
    })
    .await;
}

#[tokio::test]
async fn dtm_payloads_over_the_cap_are_refused_and_store_nothing() {
    each_backend("limits_dtm_payload", |d| async move {
        let b = d.b;
        let over = MAX + 1;
        let (ok, big) = ("{}".to_owned(), "x".repeat(over));

        let saga = dtm_saga(&d.p, "d-saga", &[ok.clone(), big.clone()]);
        too_large(
            b,
            d.dtm.post("/submit", saga).await,
            "payloads[1] (step 1)",
            over,
        );
        assert_absent(&d, "d-saga").await;

        // DTM's legacy `steps[i].data`, when `payloads` does not give the step's.
        let legacy = json!({"gid": "d-legacy", "trans_type": "saga", "steps": [
            {"action": d.p.url("/a"), "compensate": d.p.url("/c"), "data": big}]});
        too_large(
            b,
            d.dtm.post("/submit", legacy).await,
            "steps[0].data",
            over,
        );
        assert_absent(&d, "d-legacy").await;

        let msg = json!({"gid": "d-msg", "trans_type": "msg", "query_prepared": d.p.url("/q"),
                         "steps": [{"action": d.p.url("/m")}], "payloads": [big]});
        too_large(
            b,
            d.dtm.post("/prepare", msg.clone()).await,
            "payloads[0]",
            over,
        );
        assert_absent(&d, "d-msg").await;
        // A msg submitted without a prepare, which DTM creates.
        too_large(b, d.dtm.post("/submit", msg).await, "payloads[0]", over);
        assert_absent(&d, "d-msg").await;

        // registerBranch's `data`: refused, and the transaction keeps no such branch.
        let tcc = json!({"gid": "d-tcc", "trans_type": "tcc"});
        assert_eq!(d.dtm.post("/prepare", tcc).await.0, 200, "{b}");
        let reg = |id: &str, data: &str| {
            json!({"gid": "d-tcc", "branch_id": id, "trans_type": "tcc", "data": data,
                   "confirm": d.p.url("/confirm"), "cancel": d.p.url("/cancel")})
        };
        let answer = d.dtm.post("/registerBranch", reg("b1", &big)).await;
        too_large(b, answer, "data (branch \"b1\")", over);
        let (_, query) = d.dtm.get("/query?gid=d-tcc").await;
        assert_eq!(query["branches"], json!([]), "{b}");
        let at_cap = "x".repeat(MAX);
        assert_eq!(
            d.dtm.post("/registerBranch", reg("b2", &at_cap)).await.0,
            200,
            "{b}"
        );
        assert_eq!(branch_ids(&d, "d-tcc").await, ["b2"], "{b}");

        // At the cap, a saga is taken and runs.
        let saga = dtm_saga(&d.p, "d-ok", &[at_cap]);
        let (status, answer) = d.dtm.post("/submit", saga).await;
        assert_eq!(status, 200, "{b}: {answer}");
        d.native.wait_status("d-ok", &["succeeded"], WAIT).await;
    })
    .await;
}

/// `name`'s value in a Prometheus exposition (a series without labels).
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics"))
}

async fn scrape(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tenant_over_its_rate_is_refused_with_429_and_nothing_is_stored() {
    let db = TestDatabase::create(Backend::Sqlite, "limits_rate").await;
    let server = common::coordinator_with(&db.url, |c| {
        c.rate_limit = RateLimitConfig {
            per_second: 1,
            burst: 3,
        }
    })
    .await;
    let base = server.url();
    let p = Recorder::start().await;
    let client = reqwest::Client::new();
    let before = sample(&scrape(&base).await, "idem_rate_limited_total");

    // Three requests of the burst pass, through either door (one tenant, one quota); the
    // cheapest ones, so the burst is spent well within the second that refills one.
    for path in [
        "/api/dtmsvr/newGid",
        "/api/v1/transactions",
        "/api/dtmsvr/version",
    ] {
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let saga = json!({"gid": "r4", "kind": "saga", "steps": [step(&p, json!(null))]});
    let r = client
        .post(format!("{base}/api/v1/transactions"))
        .json(&saga)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let retry_after = r.headers()["retry-after"].to_str().unwrap().to_owned();
    assert_eq!(retry_after, "1", "one second at one per second, rounded up");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"default\""),
        "without authentication, the default tenant: {body}"
    );

    // The DTM door answers in its envelope, without `dtm_result`.
    let r = client
        .post(format!("{base}/api/dtmsvr/submit"))
        .json(&dtm_saga(&p, "r5", &["{}".to_owned()]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(body.get("dtm_result").is_none(), "{body}");

    // Probes, metrics and the spec are not limited.
    for path in [
        "/health",
        "/health/live",
        "/health/ready",
        "/api/ping",
        "/api/v1/openapi.json",
    ] {
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let metrics = scrape(&base).await;
    assert_eq!(sample(&metrics, "idem_rate_limited_total") - before, 2.0);
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("idem_rate_limited_total{")),
        "no labels (a tenant must not be one)"
    );

    // Nothing was stored and no participant was called (read from the engine: the API
    // would refuse the reads too).
    for gid in ["r4", "r5"] {
        assert!(
            server.engine.reads().find(gid).await.unwrap().is_none(),
            "{gid}"
        );
    }
    assert!(p.calls().is_empty());
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn without_a_rate_limit_nothing_is_refused() {
    let db = TestDatabase::create(Backend::Sqlite, "limits_no_rate").await;
    let server = common::coordinator(&db.url).await;
    let client = reqwest::Client::new();
    for _ in 0..50 {
        let r = client
            .get(format!("{}/api/dtmsvr/newGid", server.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// The flags reach the coordinator: a real `idem serve` with both limits set through its
/// environment, as an operator would.
#[tokio::test]
async fn idem_serve_takes_both_limits_from_its_flags() {
    let db = TestDatabase::create(Backend::Sqlite, "limits_flags").await;
    let env = [
        ("IDEM_MAX_BRANCH_PAYLOAD_BYTES", "10"),
        ("IDEM_RATE_LIMIT_PER_SECOND", "1"),
        ("IDEM_RATE_LIMIT_BURST", "2"),
    ];
    let child = common::Child::serve_env(&db.url, "", &[], &env).await;
    let api = Api::new(child.url.clone());
    let body = json!({"gid": "f", "kind": "saga", "steps": [{"action": "http://127.0.0.1:9/a",
                      "compensate": "http://127.0.0.1:9/c", "payload": "x".repeat(9)}]});
    let (status, answer) = api.post("/api/v1/transactions", body).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("payload_too_large")),
        "11 bytes over 10: {answer}"
    );
    assert_eq!(api.get("/api/dtmsvr/newGid").await.0, 200);
    let (status, answer) = api.get("/api/dtmsvr/newGid").await;
    assert_eq!(status, 429, "the third of a burst of two: {answer}");
    assert_eq!(answer["error"]["code"], "rate_limited", "{answer}");
    child.kill();
    db.drop_database().await;
}

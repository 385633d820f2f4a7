//! The caps on requests in flight (`--max-requests-in-flight`) and on the body bytes they
//! hold (`--max-body-bytes-in-flight`), over real HTTP on every backend. Requests are held
//! in flight by sending their heads and only part of their bodies: past a cap, a request
//! through either door is `503 overloaded` with `Retry-After` in that door's error body and
//! stores nothing, while the probes, `/metrics`, DTM's ping and the OpenAPI document still
//! answer; once the held ones end, requests pass again. The 200-bodies load is
//! `lab/tests/it/bodies.rs`.

use crate::common;

use std::time::Duration;

use idem::api::in_flight::InFlightConfig;
use idem_participant::testing;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const WAIT: Duration = Duration::from_secs(20);

/// A request whose head and the first half of its body are sent: in flight until
/// [`Held::finish`] sends the rest.
struct Held {
    stream: TcpStream,
    rest: Vec<u8>,
}

impl Held {
    async fn start(addr: &str, path: &str, body: &[u8]) -> Held {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n\r\n",
            body.len()
        );
        let (first, rest) = body.split_at(body.len() / 2);
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(first).await.unwrap();
        Held {
            stream,
            rest: rest.to_vec(),
        }
    }

    /// Sends the rest of the body; the answer's status line and body.
    async fn finish(mut self) -> (String, Value) {
        let answer = common::exchange(&mut self.stream, &self.rest).await;
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        let status = head.lines().next().unwrap().to_owned();
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}

fn tcc(gid: &str) -> Vec<u8> {
    json!({"gid": gid, "kind": "tcc"}).to_string().into_bytes()
}

fn dtm_tcc(gid: &str) -> Vec<u8> {
    json!({"gid": gid, "trans_type": "tcc"})
        .to_string()
        .into_bytes()
}

/// Fails unless `answer` is `503 overloaded` with `Retry-After: 1` and a message
/// containing `says`; returns its body.
async fn overloaded(answer: reqwest::Response, says: &str) -> Value {
    assert_eq!(answer.status(), 503);
    assert_eq!(answer.headers()["retry-after"], "1");
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(says), "{message}");
    body
}

fn refused_count(metrics: &str, limit: &str) -> f64 {
    let name = format!("idem_overloaded_total{{limit=\"{limit}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} is not in /metrics"))
}

/// Polls with a request that counts against both caps (a request with a body) and
/// changes nothing if it passes (a submit of a transaction that does not exist) until it
/// is refused: then the held requests have been counted.
async fn until_full(http: &reqwest::Client, base: &str) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = http
            .post(format!("{base}/api/v1/transactions/none/submit"))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        if answer.status() == 503 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held requests were never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn probes_answer(http: &reqwest::Client, base: &str) {
    for path in [
        "/health",
        "/health/live",
        "/health/ready",
        "/metrics",
        "/api/ping",
        "/api/v1/openapi.json",
    ] {
        let answer = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn requests_past_either_cap_are_refused_with_503_while_probes_answer() {
    for db in testing::all("in_flight_caps").await {
        let b = db.backend;
        let server = common::coordinator_with(&db.url, |c| {
            c.in_flight = InFlightConfig {
                max_requests: 2,
                max_body_bytes: 1 << 20,
            }
        })
        .await;
        let base = server.url();
        let addr = base.trim_start_matches("http://").to_owned();
        let http = reqwest::Client::new();
        let before = reqwest::get(format!("{base}/metrics")).await.unwrap();
        let before = before.text().await.unwrap();

        // Two requests held in flight, one through each door: the cap of 2 is reached.
        let native = Held::start(&addr, "/api/v1/transactions", &tcc("held-1")).await;
        let dtm = Held::start(&addr, "/api/dtmsvr/prepare", &dtm_tcc("held-2")).await;
        until_full(&http, &base).await;
        let answer = http
            .post(format!("{base}/api/v1/transactions"))
            .header("content-type", "application/json")
            .body(tcc("refused-1"))
            .send()
            .await
            .unwrap();
        overloaded(answer, "2 requests").await;
        let answer = http
            .post(format!("{base}/api/dtmsvr/prepare"))
            .header("content-type", "application/json")
            .body(dtm_tcc("refused-2"))
            .send()
            .await
            .unwrap();
        let body = overloaded(answer, "2 requests").await;
        assert!(body.get("dtm_result").is_none(), "{b}: {body}");
        probes_answer(&http, &base).await;

        // The held ones end as if nothing had happened; then requests pass again.
        let (status, tx) = native.finish().await;
        assert!(status.contains(" 201 "), "{b}: {status} {tx}");
        let (status, answer) = dtm.finish().await;
        assert!(status.contains(" 200 "), "{b}: {status} {answer}");
        let answer = http
            .post(format!("{base}/api/v1/transactions"))
            .header("content-type", "application/json")
            .body(tcc("passes-1"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 201, "{b}");

        // A body of the whole byte cap held: a request with any body is refused, one
        // without passes.
        let mut big = tcc("held-3");
        big.resize(1 << 20, b' ');
        let held = Held::start(&addr, "/api/v1/transactions", &big).await;
        until_full(&http, &base).await;
        let answer = http
            .post(format!("{base}/api/v1/transactions"))
            .header("content-type", "application/json")
            .body(tcc("refused-3"))
            .send()
            .await
            .unwrap();
        overloaded(answer, "bytes of bodies").await;
        let answer = http
            .get(format!("{base}/api/v1/transactions/held-1"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200, "{b}: a request without a body passes");
        let (status, tx) = held.finish().await;
        assert!(status.contains(" 201 "), "{b}: {status} {tx}");

        // Nothing of the refused ones was stored.
        for gid in ["refused-1", "refused-2", "refused-3"] {
            assert!(
                server.engine.reads().find(gid).await.unwrap().is_none(),
                "{b}: {gid}"
            );
        }
        let after = reqwest::get(format!("{base}/metrics")).await.unwrap();
        let after = after.text().await.unwrap();
        let requests = refused_count(&after, "requests") - refused_count(&before, "requests");
        assert!(requests >= 3.0, "{b}: {requests}");
        let bytes = refused_count(&after, "body_bytes") - refused_count(&before, "body_bytes");
        assert!(bytes >= 2.0, "{b}: {bytes}");
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

//! The bodies workload: `--clients` requests of about 1 MiB each, sent at once, and the
//! coordinator's peak resident memory while it takes them. Every answer is accounted for
//! (a 2xx, the 4xx the body earns, or `503 overloaded`; never another 5xx or a dropped
//! connection) and every transaction is checked whole or absent.
//!
//! The bodies are what costs a parser most: payloads of small numbers (`[0,0,0,...]`),
//! which as a `serde_json::Value` tree take 16 to 32 times their text. A quarter each:
//! - a TCC with 100 branches of 10 kB payloads (stored: `201`);
//! - the same with one payload over the default `--max-branch-payload-bytes` at the end
//!   (`400 payload_too_large` after the whole body is read; nothing stored);
//! - a saga with one 1 MB payload (`400 payload_too_large`);
//! - DTM's `prepare` of a msg with 100 steps of 10 kB payloads (stored: `200`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{BenchConfig, BenchResult, Coordinator, Databases, Error};

/// Branches or steps of the stored kinds (the default `--max-branches`).
const ENTRIES: usize = 100;
/// Bytes of each of their payloads.
const PAYLOAD: usize = 10_000;
/// Bytes of the payload over the default `--max-branch-payload-bytes` (65,536).
const TOO_LARGE: usize = 70_000;
/// Bytes of the saga's one payload: the body just under the 1 MiB limit.
const ONE_PAYLOAD: usize = 1_040_000;

/// What the run measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BodyFigures {
    /// Requests sent at once, and their bodies' total bytes.
    pub requests: usize,
    pub body_bytes: u64,
    /// The coordinator's resident memory (VmRSS) before the requests, and its peak
    /// (VmHWM) once all were answered, in MB.
    pub rss_before_mb: f64,
    pub peak_rss_mb: f64,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    /// `503 unavailable` answers: the database did not answer in time (the write may
    /// have reached it).
    pub unavailable: usize,
    /// Answers that were not the one the body earns, `503 overloaded` or `503
    /// unavailable`: another status, or no answer (a dropped connection); the first few,
    /// described.
    pub unexpected: usize,
    pub unexpected_samples: Vec<String>,
    /// Transactions found stored in part, or stored for a refused request, or missing
    /// for an accepted one; the first few, described.
    pub half_stored: usize,
    pub half_stored_samples: Vec<String>,
    /// Transactions stored, checked whole.
    pub stored: usize,
}

impl BodyFigures {
    pub(super) fn table(&self, result: &BenchResult) -> String {
        let statuses: Vec<String> = self
            .statuses
            .iter()
            .map(|(status, n)| format!("{status}: {n}"))
            .collect();
        format!(
            "workload bodies on {}: {} requests of about 1 MiB at once ({:.0} MB), {:.1} s\n  \
             answers: {} ({} of the 503s: the database unavailable); unexpected: {} {:?}\n  \
             stored whole: {}; half stored or wrongly stored: {} {:?}\n  \
             coordinator RSS MB: before {:.1}, peak {:.1} (growth {:.1})\n",
            result.backend,
            self.requests,
            self.body_bytes as f64 / 1e6,
            result.seconds,
            statuses.join(", "),
            self.unavailable,
            self.unexpected,
            self.unexpected_samples,
            self.stored,
            self.half_stored,
            self.half_stored_samples,
            self.rss_before_mb,
            self.peak_rss_mb,
            self.peak_rss_mb - self.rss_before_mb,
        )
    }
}

/// The four kinds of body.
#[derive(Clone, Copy, Debug)]
enum Body {
    Tcc,
    TccTooLarge,
    SagaTooLarge,
    DtmMsg,
}

impl Body {
    fn of(i: usize) -> Body {
        [
            Body::Tcc,
            Body::TccTooLarge,
            Body::SagaTooLarge,
            Body::DtmMsg,
        ][i % 4]
    }

    /// The path, the body, and the status it earns when it is taken.
    fn request(self, gid: &str) -> (&'static str, String, u16) {
        let url = "http://127.0.0.1:9/p";
        let branch = |i: usize, bytes: usize| {
            json!({"branch_id": format!("b{i}"), "confirm": url, "cancel": url,
                   "payload": numbers(bytes)})
        };
        match self {
            Body::Tcc => {
                let branches: Vec<Value> = (0..ENTRIES).map(|i| branch(i, PAYLOAD)).collect();
                let body = json!({"gid": gid, "kind": "tcc", "branches": branches});
                ("/api/v1/transactions", body.to_string(), 201)
            }
            Body::TccTooLarge => {
                let mut branches: Vec<Value> =
                    (0..ENTRIES - 5).map(|i| branch(i, PAYLOAD)).collect();
                branches.push(branch(ENTRIES, TOO_LARGE));
                let body = json!({"gid": gid, "kind": "tcc", "branches": branches});
                ("/api/v1/transactions", body.to_string(), 400)
            }
            Body::SagaTooLarge => {
                let step = json!({"action": url, "compensate": url,
                                  "payload": numbers(ONE_PAYLOAD)});
                let body = json!({"gid": gid, "kind": "saga", "steps": [step]});
                ("/api/v1/transactions", body.to_string(), 400)
            }
            Body::DtmMsg => {
                let steps: Vec<Value> = (0..ENTRIES).map(|_| json!({"action": url})).collect();
                let payloads: Vec<String> =
                    (0..ENTRIES).map(|_| numbers(PAYLOAD).to_string()).collect();
                let body = json!({"gid": gid, "trans_type": "msg", "steps": steps,
                                  "payloads": payloads, "query_prepared": url});
                ("/api/dtmsvr/prepare", body.to_string(), 200)
            }
        }
    }

    /// Branch operations (TCC: Confirms; msg: actions) a stored one has, and their
    /// payloads' total bytes.
    fn stored(self) -> (&'static str, usize, usize) {
        match self {
            Body::Tcc => ("confirm", ENTRIES, ENTRIES * payload_len(PAYLOAD)),
            Body::DtmMsg => ("action", ENTRIES, ENTRIES * payload_len(PAYLOAD)),
            Body::TccTooLarge | Body::SagaTooLarge => ("", 0, 0),
        }
    }
}

/// A JSON array of zeros, about `bytes` long ([`payload_len`] exactly).
fn numbers(bytes: usize) -> Value {
    Value::Array(vec![Value::from(0); (bytes - 1) / 2])
}

/// The length of `numbers(bytes)`'s text: `[`, the zeros and the commas between them, `]`.
fn payload_len(bytes: usize) -> usize {
    2 * ((bytes - 1) / 2) + 1
}

pub(super) async fn run(config: &BenchConfig) -> Result<BenchResult, Error> {
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let coordinator = Coordinator::start(
        &config.idem_bin,
        &dbs.coordinator,
        false,
        &config.serve_args,
    )
    .await?;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    // One transaction first, so that the pools and caches exist before the baseline.
    let (path, body, _) = Body::Tcc.request(&format!("warm-{run}"));
    send(&http, &coordinator.url, path, body).await?;
    let rss_before_mb = coordinator.rss_mb();

    let requests: Vec<(String, Body, &'static str, String, u16)> = (0..config.clients)
        .map(|i| {
            let gid = format!("body-{run}-{i}");
            let kind = Body::of(i);
            let (path, body, earns) = kind.request(&gid);
            (gid, kind, path, body, earns)
        })
        .collect();
    let body_bytes = requests.iter().map(|r| r.3.len() as u64).sum();
    let start = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (gid, kind, path, body, earns) in requests {
        let (http, url, start) = (http.clone(), coordinator.url.clone(), Arc::clone(&start));
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let answer = send(&http, &url, path, body).await;
            (gid, kind, earns, answer)
        }));
    }
    let mut figures = BodyFigures {
        requests: tasks.len(),
        body_bytes,
        rss_before_mb,
        ..BodyFigures::default()
    };
    let mut answered = Vec::new();
    for task in tasks {
        let (gid, kind, earns, answer) = task.await?;
        let code = answer
            .as_ref()
            .ok()
            .and_then(|(_, text)| serde_json::from_str::<Value>(text).ok())
            .and_then(|body| body["error"]["code"].as_str().map(str::to_owned));
        let expect = match (&answer, code.as_deref()) {
            (Ok((status, _)), _) if *status == earns && earns < 300 => Expect::Whole,
            (Ok((status, _)), _) if *status == earns => Expect::Absent,
            (Ok((503, _)), Some("overloaded")) => Expect::Absent,
            // The database did not answer in time: the write may have reached it.
            (Ok((503, _)), Some("unavailable")) => {
                figures.unavailable += 1;
                Expect::Either
            }
            _ => {
                figures.unexpected += 1;
                if figures.unexpected_samples.len() < 5 {
                    let sample = format!("{kind:?}: {answer:?}");
                    figures.unexpected_samples.push(sample);
                }
                Expect::Either
            }
        };
        if let Ok((status, _)) = &answer {
            *figures.statuses.entry(*status).or_default() += 1;
        }
        answered.push((gid, kind, expect));
    }
    let seconds = started.elapsed().as_secs_f64();
    figures.peak_rss_mb = coordinator.peak_rss_mb();
    for (gid, kind, expect) in answered {
        let stored = check_stored(&http, &coordinator.url, &gid, kind).await?;
        match (expect, stored) {
            (Expect::Whole | Expect::Either, Stored::Whole) => figures.stored += 1,
            (Expect::Absent | Expect::Either, Stored::Absent) => {}
            (expect, stored) => {
                figures.half_stored += 1;
                if figures.half_stored_samples.len() < 5 {
                    let sample = format!("{gid} {kind:?}: {expect:?}, found {stored:?}");
                    figures.half_stored_samples.push(sample);
                }
            }
        }
    }
    coordinator.stop().await;
    dbs.drop().await;
    Ok(BenchResult {
        workload: "bodies".into(),
        backend: config.backend.clone(),
        clients: config.clients,
        coordinators: 1,
        seconds,
        coordinator_peak_rss_mb: figures.peak_rss_mb,
        bodies: Some(figures),
        ..BenchResult::default()
    })
}

/// The status and body of one POST, or why there was no answer.
async fn send(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    body: String,
) -> Result<(u16, String), String> {
    let answer = http
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e:?}"))?;
    let status = answer.status().as_u16();
    let text = answer
        .text()
        .await
        .map_err(|e| format!("answer cut: {e}"))?;
    Ok((status, text))
}

/// What an answer says of the transaction.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Whole,
    Absent,
    /// No answer, or one that cannot tell: whole or absent, never in part.
    Either,
}

#[derive(Debug)]
enum Stored {
    Whole,
    Absent,
    Partial,
}

/// Whether `gid` is stored whole (every branch operation with its payload), or not at all.
async fn check_stored(
    http: &reqwest::Client,
    base: &str,
    gid: &str,
    kind: Body,
) -> Result<Stored, Error> {
    let answer = http
        .get(format!("{base}/api/v1/transactions/{gid}"))
        .send()
        .await?;
    if answer.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Stored::Absent);
    }
    let tx: Value = answer.error_for_status()?.json().await?;
    let (action, count, bytes) = kind.stored();
    let ops: Vec<&Value> = tx["branches"]
        .as_array()
        .map(|b| b.iter().filter(|b| b["action"] == action).collect())
        .unwrap_or_default();
    let payload_bytes: usize = ops
        .iter()
        .map(|b| b["payload"].as_str().map_or(0, str::len))
        .sum();
    Ok(if ops.len() == count && payload_bytes == bytes {
        Stored::Whole
    } else {
        Stored::Partial
    })
}

//! `/metrics` scraped over HTTP from a coordinator in this process, on every backend:
//! each metric moves when its event happens, every metric has its HELP line, latencies are
//! histograms with buckets, and no label value is a gid.
//!
//! The same steps check the log lines of the events an operator must see (failed, stalled,
//! force-stopped, taken over), with their fields.
//!
//! The recorder and the log subscriber are process-global, so the test runs alone in a
//! child process of its own: its steps run one after the other and each asserts the change
//! its own event made.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem::core::{Kind, SagaStep, Transaction, TxOptions};
use idem::store::Lease;
use idem_participant::testing;
use serde_json::{Value, json};

/// One scrape: every sample, as (name, labels) → value.
struct Scrape {
    text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Scrape {
    async fn of(base: &str) -> Scrape {
        let r = reqwest::get(format!("{base}/metrics")).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let text = r.text().await.unwrap();
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("a sample line");
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                    None => (series, BTreeMap::new()),
                };
                (name.to_owned(), labels, value.parse::<f64>().unwrap())
            })
            .collect();
        Scrape { text, samples }
    }

    /// The sum over the series of `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, _, v)| v)
            .sum()
    }

    /// How much `name` (with `labels`) grew since `before`.
    fn since(&self, before: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels) - before.value(name, labels)
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|(n, _, _)| n == name)
    }
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let end = after.find('"').expect("a closed label value");
        out.insert(
            key.trim_start_matches(',').to_owned(),
            after[..end].to_owned(),
        );
        rest = &after[end + 1..];
    }
    out
}

/// Scrapes until `check` holds, for up to ten seconds.
async fn until(base: &str, what: &str, check: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = Scrape::of(base).await;
        if check(&s) {
            return s;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("{what} did not happen; last scrape:\n{}", s.text);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// What the process logged at the default level, as the operator's terminal shows it.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn install() -> Logs {
        let logs = Logs::default();
        tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .init();
        logs
    }

    /// The line that says `message` about `gid`, with every one of `fields`.
    fn line(&self, message: &str, gid: &str, fields: &[&str]) -> String {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        let gid_field = format!("gid=\"{gid}\"");
        text.lines()
            .find(|l| l.contains(message) && l.contains(&gid_field))
            .filter(|l| fields.iter().all(|f| l.contains(f)))
            .unwrap_or_else(|| panic!("no line {message:?} for {gid} with {fields:?}:\n{text}"))
            .to_owned()
    }
}

fn steps(p: &Recorder, tag: &str) -> Value {
    json!([
        {"action": p.url(&format!("/{tag}/1/action")), "compensate": p.url(&format!("/{tag}/1/compensate")), "payload": {"n": 1}},
        {"action": p.url(&format!("/{tag}/2/action")), "compensate": p.url(&format!("/{tag}/2/compensate")), "payload": {"n": 2}},
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_metric_moves_when_its_event_happens() {
    if !testing::in_own_process("metrics::each_metric_moves_when_its_event_happens") {
        return;
    }
    let logs = Logs::install();
    for db in testing::all("metrics_move").await {
        let b = db.backend;
        let server = common::coordinator_with(&db.url, |c| {
            c.metrics_sample_interval = Duration::from_millis(50);
        })
        .await;
        let base = server.url();
        let api = Api::new(&base);
        let p = Recorder::start().await;
        let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let gid = |name: &str| format!("{name}-{b}-{run}");
        let mut gids = Vec::new();
        let before = Scrape::of(&base).await;

        // Created, then repeated with the same body, then the same gid with another.
        let g = gid("created");
        gids.push(g.clone());
        let body = json!({"gid": g, "kind": "saga", "steps": steps(&p, "ok"), "wait_result": true});
        let (code, tx) = api.post("/api/v1/transactions", body.clone()).await;
        assert_eq!(
            (code, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{b}: {tx}"
        );
        assert_eq!(
            api.post("/api/v1/transactions", body.clone()).await.0,
            200,
            "{b}"
        );
        let mut other = body.clone();
        other["steps"][0]["payload"] = json!({"n": 99});
        assert_eq!(api.post("/api/v1/transactions", other).await.0, 409, "{b}");
        let s = Scrape::of(&base).await;
        let delta = |name: &str, labels: &[(&str, &str)]| s.since(&before, name, labels);
        let saga = [("kind", "saga")];
        assert_eq!(delta("idem_transactions_created_total", &saga), 1.0, "{b}");
        assert_eq!(delta("idem_create_repeats_total", &saga), 1.0, "{b}");
        assert_eq!(delta("idem_gid_conflicts_total", &saga), 1.0, "{b}");
        assert_eq!(
            delta(
                "idem_branch_calls_total",
                &[("op", "action"), ("outcome", "success")]
            ),
            2.0,
            "{b}"
        );
        // Every round renews the lease to cover its calls.
        assert!(delta("idem_lease_renewals_total", &[]) >= 1.0, "{b}");
        let route = [("route", "/api/v1/transactions"), ("method", "POST")];
        let created = [route[0], route[1], ("status", "201")];
        let conflict = [route[0], route[1], ("status", "409")];
        assert_eq!(delta("idem_http_requests_total", &created), 1.0, "{b}");
        assert_eq!(delta("idem_http_requests_total", &conflict), 1.0, "{b}");

        // A route with the gid in its path is counted under its template; an unknown path
        // as `unmatched`.
        let before = s;
        let unknown = gid("unknown");
        gids.push(unknown.clone());
        assert_eq!(
            api.get(&format!("/api/v1/transactions/{unknown}")).await.0,
            404
        );
        assert_eq!(api.get(&format!("/no/such/{unknown}")).await.0, 404);
        let s = Scrape::of(&base).await;
        let show = [("route", "/api/v1/transactions/{gid}"), ("status", "404")];
        let unmatched = [("route", "unmatched"), ("status", "404")];
        for labels in [&show, &unmatched] {
            let moved = s.since(&before, "idem_http_requests_total", labels);
            assert_eq!(moved, 1.0, "{b}: {labels:?}");
        }

        // A call answered 500 once is retried.
        let before = s;
        let g = gid("retried");
        gids.push(g.clone());
        p.answer("/retry/1/action", Some(&g), 1, 500);
        let body =
            json!({"gid": g, "kind": "saga", "steps": steps(&p, "retry"), "wait_result": true});
        let (code, tx) = api.post("/api/v1/transactions", body).await;
        assert_eq!(
            (code, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{b}: {tx}"
        );
        let s = Scrape::of(&base).await;
        let retries = s.since(&before, "idem_branch_retries_total", &[("op", "action")]);
        assert_eq!(retries, 1.0, "{b}");

        // A compensation that keeps failing stalls its saga: counted, sampled, retried by
        // an operator (and stalling again), then force-stopped.
        let before = s;
        let g = gid("stalled");
        gids.push(g.clone());
        p.answer("/stall/2/action", Some(&g), 1, 409);
        p.answer("/stall/1/compensate", Some(&g), 10_000, 500);
        let body = json!({"gid": g, "kind": "saga", "steps": steps(&p, "stall")});
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);
        api.wait_status(&g, &["stalled"], Duration::from_secs(20))
            .await;
        let s = until(&base, "the stalled gauge", |s| {
            s.value("idem_transactions_stalled", &[]) >= 1.0
                && s.value("idem_transactions_active", &[("status", "stalled")]) >= 1.0
        })
        .await;
        assert_eq!(s.since(&before, "idem_stalls_total", &saga), 1.0, "{b}");
        assert!(s.value("idem_oldest_active_age_seconds", &[]) > 0.0, "{b}");
        let (code, _) = api
            .post(&format!("/api/v1/transactions/{g}/retry"), json!({}))
            .await;
        assert_eq!(code, 200, "{b}");
        api.wait_status(&g, &["stalled"], Duration::from_secs(20))
            .await;
        let (code, _) = api
            .post(
                &format!("/api/v1/transactions/{g}/force-stop"),
                json!({"reason": "metrics test"}),
            )
            .await;
        assert_eq!(code, 200, "{b}");
        let s = until(&base, "the stall leaving the gauge", |s| {
            s.value("idem_transactions_active", &[("status", "stalled")]) == 0.0
        })
        .await;
        for action in ["retry", "force_stop"] {
            let labels = [("action", action)];
            let moved = s.since(&before, "idem_operator_actions_total", &labels);
            assert_eq!(moved, 1.0, "{b}: {action}");
        }
        let stalled = &g;
        let line = logs.line(
            "transaction stalled",
            stalled,
            &["kind=\"saga\"", "status=\"stalled\""],
        );
        assert!(
            line.contains("WARN") && line.contains("reason="),
            "{b}: {line}"
        );
        logs.line(
            "force-stopped",
            stalled,
            &["kind=\"saga\"", "status=\"failed\"", "metrics test"],
        );
        logs.line(
            "transaction failed",
            stalled,
            &["kind=\"saga\"", "from=\"stalled\""],
        );
        assert_eq!(
            s.since(&before, "idem_stalls_total", &saga),
            2.0,
            "{b}: the retried saga stalled again"
        );

        // A saga in flight is driven here; a force-stop in the middle of its call makes
        // the driver's next write stale.
        let before = s;
        let g = gid("fenced");
        gids.push(g.clone());
        p.delay("/slow/1/action", Some(&g), 1, Duration::from_millis(800));
        let body = json!({"gid": g, "kind": "saga", "steps": steps(&p, "slow")});
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);
        until(&base, "the driving gauge", |s| {
            s.value("idem_transactions_driving", &[]) >= 1.0
        })
        .await;
        let (code, _) = api
            .post(&format!("/api/v1/transactions/{g}/force-stop"), json!({}))
            .await;
        assert_eq!(code, 200, "{b}");
        let s = until(&base, "the stale write", |s| {
            s.value("idem_stale_writes_refused_total", &[])
                > before.value("idem_stale_writes_refused_total", &[])
        })
        .await;
        assert!(s.has("idem_recovery_lag_seconds"), "{b}");
        assert_eq!(s.value("idem_ready", &[]), 1.0, "{b}");

        // Another coordinator takes the row while its driver sleeps through a backoff: the
        // driver's renewal before its next round (which must cover a 5 s call) fails.
        let before = s;
        let g = gid("stolen");
        gids.push(g.clone());
        p.answer("/stolen/1/action", Some(&g), 1, 500);
        let options = json!({"retry_interval_ms": 1500, "max_retry_interval_ms": 3000, "request_timeout_ms": 5000});
        let body =
            json!({"gid": g, "kind": "saga", "steps": steps(&p, "stolen"), "options": options});
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);
        let store = common::open(&db.url).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let stored = loop {
            let stored = store.load(&g).await.unwrap().unwrap();
            if stored.tx.attempts == 1 {
                break stored;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{b}: the failed call is not stored"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let thief = Lease {
            token: "thief:0000beef:000000000000000000000000".into(),
            until: server.engine.now() + 300,
        };
        let stolen = store
            .save(idem::store::Save {
                before: &stored.tx,
                after: &stored.tx,
                guard: idem::store::Guard::Version(stored.version),
                lease: Some(&thief),
                attempts: &[],
            })
            .await
            .unwrap();
        assert_eq!(stolen, idem::store::Saved::Saved, "{b}");
        api.wait_status(&g, &["succeeded"], Duration::from_secs(20))
            .await;
        let s = Scrape::of(&base).await;
        assert_eq!(s.since(&before, "idem_leases_lost_total", &[]), 1.0, "{b}");
        // The thief's lease lapses and this coordinator takes the saga back from it.
        assert!(s.since(&before, "idem_takeovers_total", &[]) >= 1.0, "{b}");
        logs.line("taking over", &g, &["previous_owner=\"thief:"]);

        // A row whose lease another process held and let lapse is claimed: a takeover.
        let before = s;
        let g = gid("orphan");
        gids.push(g.clone());
        let now = server.engine.now();
        let saga_steps: Vec<SagaStep> = (1..=2)
            .map(|i| SagaStep {
                action: p.url(&format!("/orphan/{i}/action")),
                compensate: p.url(&format!("/orphan/{i}/compensate")),
                payload: "{}".into(),
            })
            .collect();
        let tx = Transaction::saga(&g, saga_steps, TxOptions::default(), now);
        assert_eq!(tx.kind, Kind::Saga);
        let gone = Lease {
            token: "elsewhere:0000dead:000000000000000000000000".into(),
            until: now - 1,
        };
        store.create(&tx, "h", Some(&gone)).await.unwrap();
        api.wait_status(&g, &["succeeded"], Duration::from_secs(10))
            .await;
        let s = Scrape::of(&base).await;
        assert!(s.since(&before, "idem_claims_total", &[]) >= 1.0, "{b}");
        logs.line(
            "taking over",
            &g,
            &["kind=\"saga\"", "previous_owner=\"elsewhere:", "reason="],
        );
        assert_eq!(s.since(&before, "idem_takeovers_total", &[]), 1.0, "{b}");

        // The exposition: HELP for every metric, buckets for the latencies, no summary,
        // and no gid anywhere in a label.
        for (name, kind, _, _) in idem::metrics::DESCRIPTIONS {
            assert!(
                s.text.contains(&format!("# HELP {name} ")),
                "{b}: no HELP for {name}"
            );
            let type_name = match kind {
                idem::metrics::Type::Counter => "counter",
                idem::metrics::Type::Gauge => "gauge",
                idem::metrics::Type::Histogram => "histogram",
            };
            assert!(
                s.text.contains(&format!("# TYPE {name} {type_name}")),
                "{b}: {name} is not a {type_name}"
            );
        }
        for le in ["0.005", "0.25", "60", "+Inf"] {
            let bucket = [("op", "action"), ("le", le)];
            assert!(
                s.value("idem_branch_call_seconds_bucket", &bucket) >= 1.0,
                "{b}: le={le}"
            );
        }
        assert!(s.has("idem_http_request_seconds_bucket"), "{b}");
        assert!(!s.text.contains("quantile="), "{b}: a summary is rendered");
        let gids: HashSet<&str> = gids.iter().map(String::as_str).collect();
        for (name, labels, _) in &s.samples {
            for value in labels.values() {
                assert!(
                    !gids.iter().any(|g| value.contains(g)),
                    "{b}: {name} has a gid in a label: {labels:?}"
                );
            }
        }

        // Readiness as a gauge: an SQLite file taken away is not ready (as /health/ready),
        // and each failed check is a store error.
        if b == idem_participant::Backend::Sqlite {
            let before = s;
            let path = db.url.trim_start_matches("sqlite://");
            std::fs::remove_file(path.split('?').next().unwrap()).unwrap();
            let s = until(&base, "idem_ready 0", |s| s.value("idem_ready", &[]) == 0.0).await;
            let errors = s.since(&before, "idem_store_errors_total", &[]);
            assert!(errors >= 1.0, "{b}: {errors}");
        }

        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

//! What one request can make idem do is bounded by the server, not by the request (issue
//! 28, point 5), over real HTTP on SQLite, PostgreSQL and MariaDB: options past the
//! server's limits are refused through both doors with `400 option_limit`; a transaction
//! whose participant always fails stops at the call budget, stalled and visible; its
//! history is kept to the newest records, the rest counted, and read page by page.

use crate::common;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem::api::validate::OptionLimits;
use idem_participant::testing;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn saga(p: &Recorder, gid: &str, steps: usize, action: &str, options: Value) -> Value {
    let steps: Vec<Value> = (0..steps)
        .map(|_| json!({"action": p.url(action), "compensate": p.url("/c")}))
        .collect();
    json!({"gid": gid, "kind": "saga", "steps": steps, "options": options})
}

fn refused_with_limit(what: &str, (status, body): (u16, Value), names: &[&str]) {
    assert_eq!(status, 400, "{what}: {body}");
    let error = if body["error"].is_object() {
        &body["error"]
    } else {
        &body
    };
    assert_eq!(error["code"], "option_limit", "{what}: {body}");
    let message = error["message"].as_str().unwrap_or_default();
    for name in names {
        assert!(message.contains(name), "{what}: {message} lacks {name}");
    }
    assert!(body.get("dtm_result").is_none(), "{what}: {body}");
}

/// The probe: 20 steps, 10,000 attempts each, 1 ms apart. Refused, nothing stored,
/// nothing called; the same through DTM's door, whose retry interval is in seconds.
#[tokio::test]
async fn the_amplification_probe_is_refused_with_a_stable_code_through_both_doors() {
    for db in testing::all("caps_probe").await {
        let b = db.backend.name();
        let server = common::coordinator_with(&db.url, |c| {
            c.option_limits = OptionLimits {
                max_attempts: 100,
                min_retry_interval_ms: 2_000,
            };
            c.engine.defaults.retry_interval_ms = 2_000;
        })
        .await;
        let native = Api::new(server.url());
        let dtm = Api::new(format!("{}/api/dtmsvr", server.url()));
        let p = Recorder::start().await;

        let probe = saga(
            &p,
            "probe",
            20,
            "/a",
            json!({"max_attempts": 10_000, "retry_interval_ms": 1}),
        );
        let answer = native.post("/api/v1/transactions", probe).await;
        // The first option past its limit in the table's order is the one named.
        refused_with_limit(
            b,
            answer,
            &[
                "retry_interval_ms",
                "1 ms",
                "2000 ms",
                "--min-retry-interval-ms",
            ],
        );
        let attempts = saga(
            &p,
            "probe",
            20,
            "/a",
            json!({"max_attempts": 10_000, "retry_interval_ms": 2_000}),
        );
        let answer = native.post("/api/v1/transactions", attempts).await;
        refused_with_limit(
            b,
            answer,
            &["max_attempts", "10000", "100", "--max-attempts-limit"],
        );
        assert_eq!(native.get("/api/v1/transactions/probe").await.0, 404, "{b}");

        let mut dtm_probe = json!({"gid": "dtm-probe", "trans_type": "saga",
            "steps": [{"action": p.url("/a"), "compensate": p.url("/c")}], "payloads": ["{}"],
            "retry_limit": 10_000});
        refused_with_limit(
            b,
            dtm.post("/submit", dtm_probe.clone()).await,
            &["retry_limit", "10000", "100"],
        );
        dtm_probe["retry_limit"] = json!(5);
        dtm_probe["retry_interval"] = json!(1);
        refused_with_limit(
            b,
            dtm.post("/submit", dtm_probe.clone()).await,
            &["retry_interval", "1 seconds", "2 seconds"],
        );
        assert_eq!(native.get("/api/v1/transactions/dtm-probe").await.0, 404);
        assert!(p.calls().is_empty(), "{b}: a refused request called nobody");

        // At the limits, both doors accept.
        let (status, tx) = native
            .post(
                "/api/v1/transactions",
                saga(&p, "at-limit", 1, "/a", json!({"max_attempts": 100})),
            )
            .await;
        assert_eq!(status, 201, "{b}: {tx}");
        dtm_probe["retry_interval"] = json!(2);
        assert_eq!(dtm.post("/submit", dtm_probe).await.0, 200, "{b}");
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// Records of the history as the API shows them: their numbers.
fn numbers(records: &Value) -> Vec<i64> {
    records
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {records}"))
        .iter()
        .map(|r| r["number"].as_i64().unwrap())
        .collect()
}

/// Every kept record of `gid`'s history, page by page.
async fn all_pages(api: &Api, gid: &str, limit: u32) -> (Vec<Value>, Vec<Value>) {
    let mut records = Vec::new();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("?limit={limit}&cursor={c}"),
            None => format!("?limit={limit}"),
        };
        let (status, page) = api
            .get(&format!("/api/v1/transactions/{gid}/attempts{query}"))
            .await;
        assert_eq!(status, 200, "{page}");
        records.extend(page["attempts"].as_array().unwrap().iter().cloned());
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        pages.push(page);
        if cursor.is_none() {
            return (records, pages);
        }
    }
}

#[tokio::test]
async fn a_participant_that_always_fails_stops_at_the_call_budget_with_a_bounded_history() {
    const BUDGET: i64 = 30;
    const KEPT: i64 = 10;
    for db in testing::all("caps_budget").await {
        let b = db.backend.name();
        let server = common::coordinator_with(&db.url, |c| {
            c.engine.max_calls_per_transaction = BUDGET as u64;
            c.engine.max_history_per_transaction = KEPT as u32;
        })
        .await;
        let store = common::open(&db.url).await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        p.answer("/fail", None, 1_000_000, 500);
        // Attempts enough to go on for ever but for the budget, as fast as allowed.
        let options = json!({"max_attempts": 100, "retry_interval_ms": 10,
                             "max_retry_interval_ms": 10});
        let (status, tx) = api
            .post(
                "/api/v1/transactions",
                saga(&p, "always-fails", 1, "/fail", options.clone()),
            )
            .await;
        assert_eq!(status, 201, "{b}: {tx}");
        let tx = api.wait_status("always-fails", &["stalled"], WAIT).await;
        assert_eq!(tx["stalled_from"], "running", "{b}: {tx}");
        assert_eq!(tx["calls"], BUDGET, "{b}: {tx}");
        let error = tx["last_error"].as_str().unwrap();
        assert!(error.contains("budget of 30 calls"), "{b}: {error}");
        // Exactly the budget reached the participant: the round past it was never sent.
        assert_eq!(p.count("always-fails", "/fail"), BUDGET as usize, "{b}");

        // Thirty recorded, the newest ten kept (as rows, not only in the view).
        assert_eq!(
            (tx["history_total"].as_i64(), tx["history_dropped"].as_i64()),
            (Some(BUDGET), Some(BUDGET - KEPT)),
            "{b}: {tx}"
        );
        let newest: Vec<i64> = (BUDGET - KEPT + 1..=BUDGET).collect();
        assert_eq!(numbers(&tx["history"]), newest, "{b}");
        assert_eq!(tx["history"][KEPT as usize - 1]["attempt"], BUDGET, "{b}");
        let rows = store.attempts("always-fails", 0, 1_000).await.unwrap();
        assert_eq!(
            rows.iter().map(|r| r.number).collect::<Vec<_>>(),
            newest,
            "{b}: the rows kept"
        );

        // Pages of four: every kept record once, in order, with the counts.
        let (paged, pages) = all_pages(&api, "always-fails", 4).await;
        assert_eq!(pages.len(), 3, "{b}: {pages:?}");
        assert_eq!(
            numbers(&Value::Array(paged.clone())),
            newest,
            "{b}: {pages:?}"
        );
        assert_eq!(Value::Array(paged), tx["history"], "{b}");
        for page in &pages {
            assert_eq!(
                (page["total"].as_i64(), page["dropped"].as_i64()),
                (Some(30), Some(20))
            );
        }
        // A cursor below what is kept starts at the oldest kept.
        let (_, page) = api
            .get("/api/v1/transactions/always-fails/attempts?cursor=3&limit=2")
            .await;
        assert_eq!(numbers(&page["attempts"]), [21, 22], "{b}: {page}");
        for bad in ["cursor=x", "cursor=-1", "limit=0", "limit=1001", "other=1"] {
            let (status, body) = api
                .get(&format!("/api/v1/transactions/always-fails/attempts?{bad}"))
                .await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (400, Some("invalid_query")),
                "{b}: {bad}: {body}"
            );
        }
        let (status, body) = api.get("/api/v1/transactions/nobody/attempts").await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("not_found"))
        );

        // An operator's retry gives a new budget; the history stays bounded.
        let (status, body) = api
            .post("/api/v1/transactions/always-fails/retry", json!({}))
            .await;
        assert_eq!(status, 200, "{b}: {body}");
        p.wait_until(WAIT, |calls| {
            calls.iter().filter(|c| c.gid == "always-fails").count() >= 2 * BUDGET as usize
        })
        .await;
        let tx = api.wait_status("always-fails", &["stalled"], WAIT).await;
        assert_eq!(tx["calls"], BUDGET, "{b}: {tx}");
        assert_eq!(p.count("always-fails", "/fail"), 2 * BUDGET as usize, "{b}");
        assert_eq!(
            (tx["history_total"].as_i64(), tx["history_dropped"].as_i64()),
            (Some(2 * BUDGET), Some(2 * BUDGET - KEPT)),
            "{b}: {tx}"
        );
        let rows = store.attempts("always-fails", 0, 1_000).await.unwrap();
        assert_eq!(rows.len(), KEPT as usize, "{b}");
        assert_eq!(rows[0].number, 2 * BUDGET - KEPT + 1, "{b}");

        // Concurrent steps: a round is sent whole or not at all, so three failing steps
        // stop at or under the budget, and the participant saw exactly what was counted.
        let mut concurrent = options.clone();
        concurrent["concurrent"] = json!(true);
        let (status, tx) = api
            .post(
                "/api/v1/transactions",
                saga(&p, "three-fail", 3, "/fail", concurrent),
            )
            .await;
        assert_eq!(status, 201, "{b}: {tx}");
        let tx = api.wait_status("three-fail", &["stalled"], WAIT).await;
        let calls = tx["calls"].as_i64().unwrap();
        assert!(calls <= BUDGET && calls > BUDGET - 3, "{b}: {tx}");
        assert_eq!(p.count("three-fail", "/fail") as i64, calls, "{b}");
        assert_eq!(tx["history_total"], calls, "{b}");
        assert_eq!(numbers(&tx["history"]).len(), KEPT as usize, "{b}");

        drop(store);
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// `idem serve` holds its own defaults to the limits it sets its clients, and its budget to
/// the widest round: a setting past them is refused at start (exit status 2, both
/// settings named), and raising the limit with it is accepted.
#[test]
fn the_servers_defaults_are_held_to_its_own_limits() {
    let base = [
        "--database-url",
        "sqlite::memory:",
        "--listen",
        "127.0.0.1:0",
    ];
    let refused: [(&[&str], [&str; 2]); 3] = [
        (
            &["--max-attempts", "200"],
            ["--max-attempts", "--max-attempts-limit"],
        ),
        (
            &["--max-calls-per-transaction", "99"],
            ["--max-calls-per-transaction", "--max-branches"],
        ),
        (
            &["--retry-interval-ms", "5"],
            ["--retry-interval-ms", "--min-retry-interval-ms"],
        ),
    ];
    for (flags, named) in refused {
        for command in ["serve", "config"] {
            let mut args = vec![command];
            args.extend(base);
            args.extend(flags);
            let out = common::idem_run(&args, &[]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            for name in named {
                assert!(stderr.contains(name), "{args:?}: {name} in {stderr}");
            }
        }
    }
    let mut args = vec!["config"];
    args.extend(base);
    args.extend([
        "--max-attempts",
        "200",
        "--max-attempts-limit",
        "200",
        "--retry-interval-ms",
        "5",
        "--min-retry-interval-ms",
        "5",
        "--max-calls-per-transaction",
        "100",
        "--max-history-per-transaction",
        "7",
        "--tenant-share-percent",
        "25",
    ]);
    let out = common::idem_run(&args, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "max_attempts_limit = 200",
        "min_retry_interval_ms = 5",
        "max_calls_per_transaction = 100",
        "max_history_per_transaction = 7",
        "tenant_share_percent = 25",
    ] {
        assert!(stdout.contains(line), "{line} in {stdout}");
    }
}

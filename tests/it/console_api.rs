//! The console's API, on SQLite, PostgreSQL and MariaDB: `whoami`, the overview of the
//! caller's tenant (counts, lists, throughput, the coordinators seen), the trace id of a
//! view; and the console's files, served without a token.

use crate::common;

use std::time::Duration;

use common::auth::{Setup, WAIT, code, get, post, wait_status};
use idem::auth::Role;
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

/// A saga whose second step fails and whose first step's compensation keeps failing: it
/// stalls once the compensation's attempts are spent.
fn stalling_saga(s: &Setup, gid: &str) -> Value {
    s.recorder.answer("/stall/2/action", Some(gid), 1, 409);
    s.recorder
        .answer("/stall/1/compensate", Some(gid), 10_000, 500);
    let step = |i: u32| {
        json!({"action": s.recorder.url(&format!("/stall/{i}/action")),
               "compensate": s.recorder.url(&format!("/stall/{i}/compensate"))})
    };
    json!({"gid": gid, "kind": "saga", "steps": [step(1), step(2)]})
}

fn tcc(gid: &str) -> Value {
    json!({"gid": gid, "kind": "tcc"})
}

fn gids(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|t| t["gid"].as_str().unwrap())
        .collect()
}

fn total(overview: &Value, field: &str) -> u64 {
    overview["throughput"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[field].as_u64().unwrap())
        .sum()
}

#[tokio::test]
async fn the_overview_shows_the_callers_tenant_only() {
    for db in testing::all("console_overview").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let acme = s.token("acme", Role::Client).await;
        let globex = s.token("globex", Role::Client).await;

        for (token, body) in [
            (&acme, s.saga("ok-1", "a")),
            (&acme, s.saga("ok-2", "a")),
            (&acme, stalling_saga(&s, "stuck-1")),
            (&acme, tcc("open-1")),
            (&globex, s.saga("ok-1", "g")),
            (&globex, tcc("open-g")),
        ] {
            let (status, answer) = post(&s, "/api/v1/transactions", Some(token), body).await;
            assert_eq!(status, 201, "{name}: {answer}");
        }
        wait_status(&s, &acme, "ok-1", "succeeded").await;
        wait_status(&s, &acme, "ok-2", "succeeded").await;
        wait_status(&s, &acme, "stuck-1", "stalled").await;
        wait_status(&s, &globex, "ok-1", "succeeded").await;

        let (status, a) = get(&s, "/api/v1/overview", Some(&acme)).await;
        assert_eq!(status, 200, "{name}: {a}");
        assert_eq!(
            a["counts"],
            json!({"prepared": 1, "running": 0, "committing": 0, "aborting": 0,
                   "stalled": 1, "succeeded": 2, "failed": 0}),
            "{name}"
        );
        assert_eq!(gids(&a["stalled"]), ["stuck-1"], "{name}: {a}");
        assert_eq!(a["stalled"][0]["tenant"], "acme", "{name}");
        assert_eq!(gids(&a["oldest_in_progress"]), ["open-1"], "{name}: {a}");
        let minutes = a["throughput"].as_array().unwrap();
        assert_eq!(minutes.len(), 15, "{name}: the default");
        let now = a["now"].as_i64().unwrap();
        assert_eq!(minutes[14]["minute"], json!(now - now % 60_000), "{name}");
        assert!(
            minutes.windows(2).all(|w| w[1]["minute"].as_i64().unwrap()
                - w[0]["minute"].as_i64().unwrap()
                == 60_000),
            "{name}: one entry per minute, oldest first: {minutes:?}"
        );
        assert_eq!(total(&a, "created"), 4, "{name}: {a}");
        assert_eq!(total(&a, "finished"), 2, "{name}: {a}");
        assert_eq!(
            a["coordinators"],
            json!([]),
            "{name}: a client sees no nodes"
        );

        let (status, g) = get(&s, "/api/v1/overview?minutes=3", Some(&globex)).await;
        assert_eq!(status, 200, "{name}: {g}");
        assert_eq!(g["counts"]["succeeded"], 1, "{name}: {g}");
        assert_eq!(g["counts"]["prepared"], 1, "{name}: {g}");
        assert_eq!(g["counts"]["stalled"], 0, "{name}: {g}");
        assert_eq!(g["stalled"], json!([]), "{name}");
        assert_eq!(gids(&g["oldest_in_progress"]), ["open-g"], "{name}");
        assert_eq!(g["throughput"].as_array().unwrap().len(), 3, "{name}");
        assert_eq!(total(&g, "created"), 2, "{name}: {g}");
        assert_eq!(total(&g, "finished"), 1, "{name}: {g}");

        for bad in ["0", "121", "x", "-1"] {
            let path = format!("/api/v1/overview?minutes={bad}");
            let (status, body) = get(&s, &path, Some(&acme)).await;
            assert_eq!(
                (status, code(&body)),
                (400, "invalid_query"),
                "{name}: {bad}"
            );
        }
        let (status, body) = get(&s, "/api/v1/overview", None).await;
        assert_eq!((status, code(&body)), (401, "token_missing"), "{name}");
        s.finish().await;
    }
}

#[tokio::test]
async fn the_coordinators_seen_are_the_operators_to_see() {
    for db in testing::all("console_coordinators").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let operator = s.token("acme", Role::Operator).await;
        let client = s.token("acme", Role::Client).await;

        // The recovery loop records its node on its first pass.
        let deadline = tokio::time::Instant::now() + WAIT;
        let seen = loop {
            let (status, body) = get(&s, "/api/v1/overview", Some(&operator)).await;
            assert_eq!(status, 200, "{name}: {body}");
            if !body["coordinators"].as_array().unwrap().is_empty() {
                break body;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name}: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let node = &seen["coordinators"][0];
        assert_eq!(
            node["node"], "idem",
            "{name}: the engine's default node: {seen}"
        );
        assert!(
            node["last_seen_at"].as_i64().unwrap() <= seen["now"].as_i64().unwrap(),
            "{name}: {seen}"
        );
        let (_, body) = get(&s, "/api/v1/overview", Some(&client)).await;
        assert_eq!(body["coordinators"], json!([]), "{name}");

        // A pass that claimed nothing keeps the last claim; a node unseen for a day is
        // left out, one unseen for a week deleted; a name past 64 characters is cut.
        let now = s.store.db_now().await.unwrap();
        let store = &s.store;
        store
            .coordinator_seen("other", now - 10, Some(now - 10))
            .await
            .unwrap();
        store.coordinator_seen("other", now, None).await.unwrap();
        store
            .coordinator_seen("gone", now - 2 * 86_400_000, None)
            .await
            .unwrap();
        store
            .coordinator_seen("ancient", now - 8 * 86_400_000, None)
            .await
            .unwrap();
        store.coordinator_seen("other", now, None).await.unwrap();
        let stored = store.coordinators(0).await.unwrap();
        assert!(
            stored.iter().all(|c| c.node != "ancient"),
            "{name}: {stored:?}"
        );
        assert!(
            stored.iter().any(|c| c.node == "gone"),
            "{name}: kept a week"
        );
        let long = "n".repeat(80);
        store.coordinator_seen(&long, now, None).await.unwrap();
        let (_, body) = get(&s, "/api/v1/overview", Some(&operator)).await;
        let nodes = body["coordinators"].as_array().unwrap();
        let other = nodes.iter().find(|n| n["node"] == "other").unwrap();
        assert_eq!(
            (
                other["last_seen_at"].as_i64(),
                other["last_claim_at"].as_i64()
            ),
            (Some(now), Some(now - 10)),
            "{name}: {body}"
        );
        assert!(nodes.iter().all(|n| n["node"] != "gone"), "{name}: {body}");
        assert!(
            nodes.iter().any(|n| n["node"] == "n".repeat(64)),
            "{name}: {body}"
        );
        s.finish().await;
    }
}

#[tokio::test]
async fn the_recovery_loop_records_when_it_last_claimed() {
    for db in testing::all("console_last_claim").await {
        let name = db.name().to_owned();
        // No hold: a driver hands every retry back to the recovery loop, which claims it.
        let s = Setup::with(db, |c| c.engine.hold_ms = 0).await;
        let operator = s.token("default", Role::Operator).await;
        s.recorder.answer("/step/action", Some("claimed"), 1, 500);
        let (status, created) = post(
            &s,
            "/api/v1/transactions",
            Some(&operator),
            s.saga("claimed", "c"),
        )
        .await;
        assert_eq!(status, 201, "{name}: {created}");
        wait_status(&s, &operator, "claimed", "succeeded").await;
        let deadline = tokio::time::Instant::now() + WAIT;
        let claim = loop {
            let (_, body) = get(&s, "/api/v1/overview", Some(&operator)).await;
            if let Some(at) = body["coordinators"][0]["last_claim_at"].as_i64() {
                break at;
            }
            assert!(tokio::time::Instant::now() < deadline, "{name}: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            claim >= created["created_at"].as_i64().unwrap(),
            "{name}: {claim} {created}"
        );
        s.finish().await;
    }
}

#[tokio::test]
async fn whoami_names_the_tenant_the_role_and_the_mode() {
    for db in testing::all("console_whoami").await {
        let name = db.name().to_owned();
        let url = db.url.clone();
        let s = Setup::new(db, |_| {}).await;
        for role in [Role::Client, Role::Operator, Role::Admin] {
            let token = s.token("acme", role).await;
            let (status, body) = get(&s, "/api/v1/whoami", Some(&token)).await;
            assert_eq!(status, 200, "{name}: {body}");
            assert_eq!(
                body,
                json!({"tenant": "acme", "role": role.to_string(), "auth": "tokens"}),
                "{name}"
            );
        }
        let (status, body) = get(&s, "/api/v1/whoami", None).await;
        assert_eq!((status, code(&body)), (401, "token_missing"), "{name}");

        let open = common::coordinator(&url).await;
        let (status, body) = common::Api::new(open.url()).get("/api/v1/whoami").await;
        assert_eq!(status, 200, "{name}: {body}");
        assert_eq!(
            body,
            json!({"tenant": "default", "role": "admin", "auth": "none"}),
            "{name}"
        );
        open.stop().await.unwrap();
        s.finish().await;
    }
}

#[tokio::test]
async fn a_view_shows_the_trace_id_of_its_traceparent() {
    for db in testing::all("console_trace_id").await {
        let name = db.name().to_owned();
        let s = Setup::new(db, |_| {}).await;
        let token = s.token("acme", Role::Client).await;
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let response = reqwest::Client::new()
            .post(format!("{}/api/v1/transactions", s.server.url()))
            .bearer_auth(&token)
            .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
            .json(&s.saga("traced", "t"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{name}");
        let created: Value = response.json().await.unwrap();
        assert_eq!(created["trace_id"], trace, "{name}: {created}");
        let shown = wait_status(&s, &token, "traced", "succeeded").await;
        assert_eq!(shown["trace_id"], trace, "{name}: {shown}");
        let (_, page) = get(&s, "/api/v1/transactions", Some(&token)).await;
        assert_eq!(page["transactions"][0]["trace_id"], trace, "{name}: {page}");
        s.finish().await;
    }
}

/// The console's files need no database of their own: SQLite only.
async fn sqlite(test: &str) -> TestDatabase {
    TestDatabase::create(Backend::Sqlite, test).await
}

#[tokio::test]
async fn the_console_is_open_while_the_api_needs_a_token() {
    let pattern = "https://jaeger.example/trace/{trace_id}";
    let s = Setup::with(sqlite("console_files").await, |c| {
        c.console.trace_url = Some(pattern.to_owned())
    })
    .await;
    let client = reqwest::Client::new();
    let index = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/console/index.html")).unwrap();
    for path in ["/ui", "/ui/", "/ui/index.html"] {
        let response = client
            .get(format!("{}{path}", s.server.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(
            headers["content-type"], "text/html; charset=utf-8",
            "{path}"
        );
        assert_eq!(headers["cache-control"], "no-cache", "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline"), "{path}: {csp}");
        assert_eq!(response.bytes().await.unwrap(), index, "{path}");
    }
    for (path, kind) in [
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ] {
        let response = client
            .get(format!("{}{path}", s.server.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["content-type"], kind, "{path}");
    }
    let (status, body) = get(&s, "/ui/config.json", None).await;
    assert_eq!((status, body), (200, json!({"trace_url": pattern})));
    let (status, body) = get(&s, "/ui/missing.js", None).await;
    assert_eq!((status, code(&body)), (404, "not_found"));
    let (status, body) = get(&s, "/api/v1/overview", None).await;
    assert_eq!((status, code(&body)), (401, "token_missing"));
    s.finish().await;
}

#[tokio::test]
async fn without_a_pattern_the_console_links_no_trace() {
    let s = Setup::with(sqlite("console_no_pattern").await, |_| {}).await;
    let (status, body) = get(&s, "/ui/config.json", None).await;
    assert_eq!((status, body), (200, json!({"trace_url": null})));
    s.finish().await;
}

#[test]
fn the_trace_url_pattern_comes_from_the_flag_or_the_environment_and_needs_the_id() {
    let bad = common::idem_run(
        &["config", "--console-trace-url", "https://jaeger.example/"],
        &[],
    );
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("{trace_id}"), "{stderr}");
    let pattern = "https://jaeger.example/trace/{trace_id}";
    let good = common::idem_run(&["config"], &[("IDEM_CONSOLE_TRACE_URL", pattern)]);
    assert!(good.status.success(), "{good:?}");
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(
        stdout.contains(&format!("console_trace_url = \"{pattern}\"")),
        "{stdout}"
    );
}

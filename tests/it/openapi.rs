//! The native API's OpenAPI description as a client gets it (`GET /api/v1/openapi.json`),
//! on SQLite, PostgreSQL and MariaDB: it parses, lists every native route the router
//! serves (each answers at its path and method), and real answers of the operations
//! validate against the schemas the spec gives for their status.

use crate::common;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

/// Every native route, as `routes()` registers it. A route added without a
/// `#[utoipa::path]` is not in the spec, and this list (and the spec) must both name it.
const ROUTES: [(&str, &str); 16] = [
    ("post", "/api/v1/transactions"),
    ("get", "/api/v1/transactions"),
    ("get", "/api/v1/transactions/{gid}"),
    ("get", "/api/v1/transactions/{gid}/attempts"),
    ("post", "/api/v1/transactions/{gid}/branches"),
    ("post", "/api/v1/transactions/{gid}/submit"),
    ("post", "/api/v1/transactions/{gid}/abort"),
    ("post", "/api/v1/transactions/{gid}/retry"),
    ("post", "/api/v1/transactions/{gid}/force-stop"),
    ("post", "/api/v1/bulk"),
    ("post", "/api/v1/tokens"),
    ("get", "/api/v1/tokens"),
    ("post", "/api/v1/tokens/{id}/revoke"),
    ("get", "/api/v1/openapi.json"),
    ("get", "/api/v1/whoami"),
    ("get", "/api/v1/overview"),
];

/// Checks `answer` against the schema the spec gives `operation` for `status`; the
/// spec's components are put beside it so its `$ref`s resolve.
fn check(spec: &Value, method: &str, path: &str, answer: &(u16, Value)) {
    let errors = mismatches(spec, method, path, answer);
    assert!(
        errors.is_empty(),
        "{method} {path} {}: {errors:#?}\nanswer: {}",
        answer.0,
        answer.1
    );
}

fn mismatches(
    spec: &Value,
    method: &str,
    path: &str,
    (status, answer): &(u16, Value),
) -> Vec<String> {
    let responses = &spec["paths"][path][method]["responses"];
    let schema = &responses[status.to_string()]["content"]["application/json"]["schema"];
    assert!(
        schema.is_object(),
        "{method} {path}: the spec has no schema for {status} (answer {answer})"
    );
    let mut root = schema.clone();
    root["components"] = spec["components"].clone();
    let validator = jsonschema::validator_for(&root)
        .unwrap_or_else(|e| panic!("{method} {path} {status}: the schema does not compile: {e}"));
    validator
        .iter_errors(answer)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

#[tokio::test]
async fn the_served_spec_lists_every_route_and_real_answers_match_it() {
    for db in idem_participant::testing::all("openapi_spec").await {
        let server = common::coordinator(&db.url).await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        let b = db.backend.name();

        let (status, spec) = api.get("/api/v1/openapi.json").await;
        assert_eq!(status, 200, "{b}");
        assert!(spec["openapi"].as_str().unwrap().starts_with("3."), "{b}");

        let mut listed = Vec::new();
        for (path, item) in spec["paths"].as_object().unwrap() {
            for method in item.as_object().unwrap().keys() {
                listed.push((method.clone(), path.clone()));
            }
        }
        listed.sort();
        let mut expected: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        expected.sort();
        assert_eq!(listed, expected, "{b}: the spec's operations");

        // A saga whose first step fails once: its view then has a history.
        p.answer("/reserve", None, 1, 503);
        let create = json!({
            "gid": "spec-saga", "kind": "saga",
            "steps": [{"action": p.url("/reserve"), "compensate": p.url("/release"),
                       "payload": {"sku": "apple", "n": 1.5}}],
            "options": {"concurrent": true, "orders": {}, "branch_headers": {"x-t": "1"}},
        });
        let created = api.post("/api/v1/transactions", create.clone()).await;
        assert_eq!(created.0, 201, "{b}: {}", created.1);
        check(&spec, "post", "/api/v1/transactions", &created);
        // The check can fail: a view without its status, or with an unknown one, does not pass.
        let mut mangled = created.clone();
        mangled.1.as_object_mut().unwrap().remove("status");
        assert!(!mismatches(&spec, "post", "/api/v1/transactions", &mangled).is_empty());
        mangled.1["status"] = json!("sleeping");
        assert!(!mismatches(&spec, "post", "/api/v1/transactions", &mangled).is_empty());
        // A repeat while the saga runs is 202, after its outcome 200: both as specified.
        let repeat = api.post("/api/v1/transactions", create.clone()).await;
        assert!(matches!(repeat.0, 200 | 202), "{b}: {}", repeat.0);
        check(&spec, "post", "/api/v1/transactions", &repeat);
        api.wait_status("spec-saga", &["succeeded"], WAIT).await;
        let settled = api.post("/api/v1/transactions", create).await;
        assert_eq!(settled.0, 200, "{b}");
        check(&spec, "post", "/api/v1/transactions", &settled);
        let shown = api.get("/api/v1/transactions/spec-saga").await;
        assert!(
            !shown.1["history"].as_array().unwrap().is_empty(),
            "{b}: {}",
            shown.1
        );
        check(&spec, "get", "/api/v1/transactions/{gid}", &shown);
        let history = api.get("/api/v1/transactions/spec-saga/attempts").await;
        assert_eq!(history.0, 200, "{b}: {}", history.1);
        check(
            &spec,
            "get",
            "/api/v1/transactions/{gid}/attempts",
            &history,
        );
        let page = api.get("/api/v1/transactions?limit=1&kind=saga").await;
        check(&spec, "get", "/api/v1/transactions", &page);
        let overview = api.get("/api/v1/overview?minutes=2").await;
        assert_eq!(overview.0, 200, "{b}: {}", overview.1);
        check(&spec, "get", "/api/v1/overview", &overview);
        let refused = api.get("/api/v1/overview?minutes=0").await;
        check(&spec, "get", "/api/v1/overview", &refused);
        check(
            &spec,
            "get",
            "/api/v1/whoami",
            &api.get("/api/v1/whoami").await,
        );

        // A TCC transaction: a branch registered with a Try that refuses, one without.
        let tcc = json!({"gid": "spec-tcc", "kind": "tcc", "options": {"timeout_ms": 60000}});
        let created = api.post("/api/v1/transactions", tcc).await;
        check(&spec, "post", "/api/v1/transactions", &created);
        let branches = "/api/v1/transactions/{gid}/branches";
        let plain = json!({"branch_id": "a", "confirm": p.url("/c"), "cancel": p.url("/x")});
        let registered = api
            .post("/api/v1/transactions/spec-tcc/branches", plain)
            .await;
        assert_eq!(registered.0, 200, "{b}: {}", registered.1);
        check(&spec, "post", branches, &registered);
        p.answer("/try", None, 1, 409);
        let with_try = json!({"branch_id": "b", "confirm": p.url("/c"), "cancel": p.url("/x"),
                              "try": p.url("/try")});
        let refused = api
            .post("/api/v1/transactions/spec-tcc/branches", with_try)
            .await;
        assert_eq!(refused.0, 409, "{b}: {}", refused.1);
        check(&spec, "post", branches, &refused);
        let conflict = json!({"branch_id": "a", "confirm": p.url("/other"), "cancel": p.url("/x")});
        let conflict = api
            .post("/api/v1/transactions/spec-tcc/branches", conflict)
            .await;
        assert_eq!(conflict.1["error"]["code"], "branch_conflict", "{b}");
        check(&spec, "post", branches, &conflict);
        let aborted = api
            .post(
                "/api/v1/transactions/spec-tcc/abort",
                json!({"reason": "spec"}),
            )
            .await;
        assert_eq!(aborted.0, 200, "{b}: {}", aborted.1);
        check(&spec, "post", "/api/v1/transactions/{gid}/abort", &aborted);

        // Errors: their bodies and codes are in the spec too.
        let missing = api.get("/api/v1/transactions/nope").await;
        assert_eq!(missing.0, 404, "{b}");
        check(&spec, "get", "/api/v1/transactions/{gid}", &missing);
        let bad = api.post_raw("/api/v1/transactions", "{").await;
        assert_eq!(bad.0, 400, "{b}");
        check(&spec, "post", "/api/v1/transactions", &bad);
        let late = api
            .post("/api/v1/transactions/spec-tcc/submit", json!({}))
            .await;
        assert_eq!(late.0, 409, "{b}: {}", late.1);
        check(&spec, "post", "/api/v1/transactions/{gid}/submit", &late);
        let bad_query = api.get("/api/v1/transactions?limit=0").await;
        check(&spec, "get", "/api/v1/transactions", &bad_query);
        for op in ["retry", "force-stop"] {
            let answer = api
                .post(&format!("/api/v1/transactions/nope/{op}"), json!({}))
                .await;
            check(
                &spec,
                "post",
                &format!("/api/v1/transactions/{{gid}}/{op}"),
                &answer,
            );
        }

        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

//! The coordinator's own idempotency keys, on SQLite, PostgreSQL and MariaDB: the
//! `Idempotency-Key` header names a create's gid, a body gid that differs is refused, the
//! spellings of one request are one request, a repeat while the first is still driven
//! answers 202 with what is stored, and concurrent duplicates make one transaction and one
//! run.

use crate::common;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem_participant::testing;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

async fn post_keyed(api: &Api, key: Option<&str>, body: &Value) -> (u16, Value) {
    idem::transport::install_crypto_provider();
    let mut request = reqwest::Client::new()
        .post(format!("{}/api/v1/transactions", api.base))
        .json(body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn saga(p: &Recorder, path: &str) -> Value {
    json!({"kind": "saga", "steps": [{
        "action": p.url(&format!("/{path}/action")),
        "compensate": p.url(&format!("/{path}/compensate")),
        "payload": {"n": 1},
    }]})
}

#[tokio::test]
async fn the_idempotency_key_header_names_the_gid() {
    for db in testing::all("create_keys_header").await {
        let name = db.name().to_owned();
        let server = common::coordinator(&db.url).await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        let body = saga(&p, "h");

        let (status, first) = post_keyed(&api, Some("order-7"), &body).await;
        assert_eq!(
            (status, first["gid"].as_str()),
            (201, Some("order-7")),
            "{name}: {first}"
        );
        api.wait_status("order-7", &["succeeded"], WAIT).await;
        let (status, again) = post_keyed(&api, Some("order-7"), &body).await;
        assert_eq!(
            (status, again["status"].as_str()),
            (200, Some("succeeded")),
            "{name}: {again}"
        );
        // The same key in the body and the header is one request too.
        let mut with_gid = body.clone();
        with_gid["gid"] = json!("order-7");
        assert_eq!(
            post_keyed(&api, Some("order-7"), &with_gid).await.0,
            200,
            "{name}"
        );
        assert_eq!(
            p.calls().iter().filter(|c| c.path == "/h/action").count(),
            1,
            "{name}"
        );

        // A body gid and another header: refused, nothing stored.
        let mut other = body.clone();
        other["gid"] = json!("order-8");
        let (status, answer) = post_keyed(&api, Some("order-9"), &other).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("idempotency_key_mismatch")),
            "{name}"
        );
        for gid in ["order-8", "order-9"] {
            assert_eq!(
                api.get(&format!("/api/v1/transactions/{gid}")).await.0,
                404,
                "{name}: {gid}"
            );
        }
        let (status, answer) = post_keyed(&api, Some("bad key/1"), &body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (400, Some("invalid_idempotency_key")),
            "{name}"
        );
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

#[tokio::test]
async fn spellings_of_one_request_are_one_request() {
    for db in testing::all("create_keys_spellings").await {
        let name = db.name().to_owned();
        let server = common::coordinator(&db.url).await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        let bare = json!({"gid": "tcc-1", "kind": "tcc", "branches": [{
            "branch_id": "b1", "confirm": p.url("/b1/confirm"), "cancel": p.url("/b1/cancel"),
        }]});
        let spelled = json!({"gid": "tcc-1", "kind": "tcc", "options": {}, "wait_result": false,
            "branches": [{"branch_id": "b1", "confirm": p.url("/b1/confirm"),
                          "cancel": p.url("/b1/cancel"), "payload": null}]});
        assert_eq!(
            api.post("/api/v1/transactions", bare.clone()).await.0,
            201,
            "{name}"
        );
        let (status, answer) = api.post("/api/v1/transactions", spelled).await;
        assert_eq!(status, 200, "{name}: a false conflict: {answer}");
        // Numbers by value and keys in any order inside a payload.
        let a = json!({"gid": "s-1", "kind": "saga", "steps": [{"action": p.url("/s/a"), "compensate": p.url("/s/c"),
                       "payload": {"n": 1, "m": "x"}}]});
        let b = json!({"gid": "s-1", "kind": "saga", "steps": [{"action": p.url("/s/a"), "compensate": p.url("/s/c"),
                       "payload": {"m": "x", "n": 1.0}}]});
        assert_eq!(api.post("/api/v1/transactions", a).await.0, 201, "{name}");
        let (status, _) = api.post("/api/v1/transactions", b).await;
        assert!(matches!(status, 200 | 202), "{name}: {status}");
        // What does change the request is still a conflict.
        let changed = json!({"gid": "tcc-1", "kind": "tcc", "options": {"max_attempts": 3}, "branches": [{
            "branch_id": "b1", "confirm": p.url("/b1/confirm"), "cancel": p.url("/b1/cancel"),
        }]});
        let (status, answer) = api.post("/api/v1/transactions", changed).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("gid_conflict")),
            "{name}"
        );
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

#[tokio::test]
async fn duplicates_while_the_first_runs_get_202_and_one_run() {
    for db in testing::all("create_keys_duplicates").await {
        let name = db.name().to_owned();
        let server = common::coordinator(&db.url).await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        // The action answers late: the saga stays running while the duplicates arrive.
        p.delay("/d/action", None, 1, Duration::from_secs(3));
        let body = saga(&p, "d");
        let sends = (0..20).map(|_| {
            let (api, body) = (api.clone(), body.clone());
            tokio::spawn(async move { post_keyed(&api, Some("dup-1"), &body).await })
        });
        let mut statuses = Vec::new();
        for send in sends {
            let (status, view) = send.await.unwrap();
            assert_eq!(view["gid"], "dup-1", "{name}: {view}");
            statuses.push(status);
        }
        statuses.sort();
        assert_eq!(
            statuses.iter().filter(|s| **s == 201).count(),
            1,
            "{name}: {statuses:?}"
        );
        assert!(
            statuses.iter().all(|s| matches!(s, 201 | 202)),
            "{name}: {statuses:?}"
        );
        api.wait_status("dup-1", &["succeeded"], WAIT).await;
        assert_eq!(
            post_keyed(&api, Some("dup-1"), &body).await.0,
            200,
            "{name}: after the outcome"
        );
        assert_eq!(
            p.calls().iter().filter(|c| c.path == "/d/action").count(),
            1,
            "{name}: one run"
        );
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

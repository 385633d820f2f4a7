//! The DTM-compatible API: the fields DTM's Python client does not send (concurrent saga
//! orders, msg, retry_limit), DTM's answer rules, and where idem is stricter.

use crate::common;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn setup(test: &str) -> (TestDatabase, idem::server::RunningServer, Api, Recorder) {
    let db = TestDatabase::create(Backend::Sqlite, test).await;
    let server = common::coordinator(&db.url).await;
    let api = Api::new(format!("{}/api/dtmsvr", server.url()));
    (db, server, api, Recorder::start().await)
}

async fn query(api: &Api, gid: &str) -> Value {
    let (code, body) = api.get(&format!("/query?gid={gid}")).await;
    assert_eq!(code, 200, "{body}");
    body
}

async fn wait_dtm_status(api: &Api, gid: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let q = query(api, gid).await;
        if q["transaction"]["status"] == status {
            return q;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{gid} never {status}: {q:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn saga_body(p: &Recorder, gid: &str, steps: &[&str]) -> Value {
    json!({
        "gid": gid,
        "trans_type": "saga",
        "steps": steps.iter().map(|s| json!({"action": p.url(&format!("/{s}/action")), "compensate": p.url(&format!("/{s}/compensate"))})).collect::<Vec<_>>(),
        "payloads": steps.iter().map(|s| format!("{{\"step\":\"{s}\"}}")).collect::<Vec<_>>(),
        "custom_data": null,
        "query_prepared": null,
        "passthrough_headers": [],
        "timeout_to_fail": 0,
        "request_timeout": 8,
    })
}

#[tokio::test]
async fn concurrent_saga_orders_from_custom_data() {
    let (db, server, api, p) = setup("dtm_concurrent_saga").await;
    // Steps 0 and 1 run together; step 2 waits for both. Step 1 is slow, so step 2 must
    // wait for it even though step 0 is done.
    p.delay("/b/action", None, 1, Duration::from_millis(300));
    let mut body = saga_body(&p, "conc", &["a", "b", "c"]);
    body["custom_data"] = json!(json!({"concurrent": true, "orders": {"2": [0, 1]}}).to_string());
    body["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", body).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (200, Some("SUCCESS")),
        "{answer}"
    );
    let paths = p.paths("conc");
    assert_eq!(paths.len(), 3);
    assert_eq!(paths[2], "/c/action", "c runs last: {paths:?}");
    assert_eq!(
        paths[0], "/a/action",
        "a does not wait for the slow b: {paths:?}"
    );
    let q = query(&api, "conc").await;
    assert!(
        q["transaction"]["custom_data"]
            .as_str()
            .unwrap()
            .contains("\"concurrent\":true"),
        "{q:#}"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn concurrent_saga_compensates_in_reverse_orders() {
    let (db, server, api, p) = setup("dtm_concurrent_compensation").await;
    p.answer("/c/action", None, 1, 409);
    let mut body = saga_body(&p, "conc-fail", &["a", "b", "c"]);
    body["custom_data"] = json!(json!({"concurrent": true, "orders": {"2": [0, 1]}}).to_string());
    body["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", body).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (409, Some("FAILURE")),
        "{answer}"
    );
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("03/action failed"),
        "{answer}"
    );
    let paths = p.paths("conc-fail");
    let c = paths.iter().position(|x| x == "/c/compensate").unwrap();
    let a = paths.iter().position(|x| x == "/a/compensate").unwrap();
    let b = paths.iter().position(|x| x == "/b/compensate").unwrap();
    assert!(
        c < a && c < b,
        "the dependent step is compensated first: {paths:?}"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn msg_prepare_then_submit_delivers_every_step() {
    let (db, server, api, p) = setup("dtm_msg_submit").await;
    let body = json!({
        "gid": "msg-1", "trans_type": "msg",
        "steps": [{"action": p.url("/m1")}, {"action": p.url("/m2")}],
        "payloads": ["{\"n\":1}", "{\"n\":2}"],
        "query_prepared": p.url("/qp"),
    });
    let (code, answer) = api.post("/prepare", body.clone()).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (200, Some("SUCCESS"))
    );
    // Prepare is idempotent while prepared.
    let (code, _) = api.post("/prepare", body.clone()).await;
    assert_eq!(code, 200);
    assert_eq!(
        query(&api, "msg-1").await["transaction"]["status"],
        "prepared"
    );
    // The application commits its local transaction, then submits.
    p.answer("/m2", None, 2, 500);
    let mut submit = body.clone();
    submit["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", submit).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (200, Some("SUCCESS")),
        "{answer}"
    );
    let calls = p.calls();
    assert!(
        calls
            .iter()
            .all(|c| c.trans_type == "msg" && c.op == "action"),
        "{calls:?}"
    );
    assert_eq!(
        p.paths("msg-1").iter().filter(|x| *x == "/m2").count(),
        3,
        "retried until it succeeded"
    );
    assert!(
        !p.paths("msg-1").contains(&"/qp".to_string()),
        "no back-check needed"
    );
    // Prepare after submit is refused.
    let (code, answer) = api.post("/prepare", body).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (409, Some("FAILURE")),
        "{answer}"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn msg_whose_application_died_is_checked_back() {
    let (db, server, api, p) = setup("dtm_msg_query_prepared").await;
    // The application prepared and died. After timeout_to_fail idem asks query_prepared.
    p.answer("/qp-rolled-back", None, 10, 409);
    for (gid, qp) in [
        ("committed", "/qp-committed"),
        ("rolled-back", "/qp-rolled-back"),
    ] {
        let body = json!({
            "gid": gid, "trans_type": "msg", "timeout_to_fail": 1,
            "steps": [{"action": p.url("/deliver")}], "payloads": ["{}"],
            "query_prepared": p.url(qp),
        });
        let (code, _) = api.post("/prepare", body).await;
        assert_eq!(code, 200);
    }
    wait_dtm_status(&api, "committed", "succeed").await;
    wait_dtm_status(&api, "rolled-back", "failed").await;
    let qp = p
        .calls()
        .into_iter()
        .find(|c| c.path == "/qp-committed")
        .unwrap();
    assert_eq!(
        (
            qp.branch_id.as_str(),
            qp.op.as_str(),
            qp.trans_type.as_str()
        ),
        ("00", "msg", "msg")
    );
    assert_eq!(p.paths("committed"), ["/qp-committed", "/deliver"]);
    assert_eq!(
        p.paths("rolled-back"),
        ["/qp-rolled-back"],
        "a rolled-back message is never delivered"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn retry_limit_caps_attempts_of_a_saga_step() {
    let (db, server, api, p) = setup("dtm_retry_limit").await;
    p.answer("/a/action", None, 100, 500);
    let mut body = saga_body(&p, "capped", &["a"]);
    body["retry_limit"] = json!(2);
    body["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", body).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (409, Some("FAILURE")),
        "{answer}"
    );
    assert_eq!(
        p.paths("capped"),
        ["/a/action", "/a/action", "/a/compensate"]
    );
    let q = query(&api, "capped").await;
    assert_eq!(q["transaction"]["retry_count"], 2, "{q:#}");
    let action = q["branches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["op"] == "action")
        .unwrap();
    assert_eq!(action["attempts"], 2);
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn answers_follow_dtm_body_rules() {
    let (db, server, api, p) = setup("dtm_body_rules").await;
    // 200 with FAILURE in the body is a failure; 200 with ONGOING is asked again.
    p.answer_body("/b/action", 1, 200, r#"{"dtm_result":"FAILURE"}"#);
    p.answer_body("/a/compensate", 2, 200, r#"{"dtm_result":"ONGOING"}"#);
    let mut body = saga_body(&p, "rules", &["a", "b"]);
    body["wait_result"] = json!(true);
    let (code, _) = api.post("/submit", body).await;
    assert_eq!(code, 409);
    assert_eq!(
        p.paths("rules"),
        [
            "/a/action",
            "/b/action",
            "/b/compensate",
            "/a/compensate",
            "/a/compensate",
            "/a/compensate"
        ]
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn client_mistakes_are_4xx_with_a_message() {
    let (db, server, api, p) = setup("dtm_client_mistakes").await;
    let cases: Vec<(&str, Value, u16)> = vec![
        ("/submit", json!({"trans_type": "saga"}), 400),
        ("/submit", json!({"gid": "x", "trans_type": "sagaa"}), 400),
        (
            "/submit",
            json!({"gid": "x", "trans_type": "saga", "steps": []}),
            400,
        ),
        (
            "/submit",
            json!({"gid": "x", "trans_type": "saga", "custom_data": {"orders": {}}}),
            400,
        ),
        ("/submit", json!({"gid": "x", "trans_type": "xa"}), 400),
        ("/prepare", json!({"gid": "x", "trans_type": "saga"}), 400),
        (
            "/registerBranch",
            json!({"gid": "x", "branch_id": "01", "trans_type": "tcc", "data": 5}),
            400,
        ),
        (
            "/registerBranch",
            json!({"gid": "x", "branch_id": "01", "trans_type": "tcc", "confirm": "nope", "cancel": "nope"}),
            400,
        ),
        (
            "/registerXaBranch",
            json!({"gid": "x", "branch_id": "01", "trans_type": "xa", "url": p.url("/xa")}),
            400,
        ),
        ("/abort", json!({"gid": "never", "trans_type": "tcc"}), 404),
    ];
    for (path, body, code) in cases {
        let (got, answer) = api.post(path, body.clone()).await;
        assert_eq!(got, code, "{path} {body} -> {answer}");
        assert!(
            answer["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
        assert!(
            !answer.to_string().contains("FAILURE"),
            "a client mistake must not read as a business failure: {answer}"
        );
    }
    let (code, answer) = api.get("/query").await;
    assert_eq!(code, 400, "{answer}");
    let (_, answer) = api.post("/registerXaBranch", json!({})).await;
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("XA is not supported")
    );
    assert_eq!(
        query(&api, "x").await,
        json!({"transaction": null, "branches": []}),
        "nothing was stored"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn tcc_prepare_register_submit_with_nulls_and_unknown_keys() {
    let (db, server, api, p) = setup("dtm_tcc").await;
    let (code, gid) = api.get("/newGid").await;
    assert_eq!(code, 200);
    let gid = gid["gid"].as_str().unwrap().to_owned();
    let tcc = json!({"gid": gid, "trans_type": "tcc", "custom_data": null, "passthrough_headers": null, "branch_headers": null});
    assert_eq!(api.post("/prepare", tcc.clone()).await.0, 200);
    for id in ["01", "02"] {
        let reg = json!({"gid": gid, "branch_id": id, "trans_type": "tcc", "status": "prepared", "data": "{\"amount\":30}",
                         "confirm": p.url(&format!("/{id}/confirm")), "cancel": p.url(&format!("/{id}/cancel"))});
        let (code, answer) = api.post("/registerBranch", reg.clone()).await;
        assert_eq!(
            (code, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{answer}"
        );
        // idem makes a repeated registration harmless (DTM answers 500).
        assert_eq!(api.post("/registerTccBranch", reg).await.0, 200);
    }
    let mut submit = tcc.clone();
    submit["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", submit).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (200, Some("SUCCESS")),
        "{answer}"
    );
    let mut confirmed = p.paths(&gid);
    confirmed.sort();
    assert_eq!(confirmed, ["/01/confirm", "/02/confirm"]);
    assert_eq!(p.calls()[0].body, "{\"amount\":30}");
    // Registering after submit: DTM's 409.
    let late = json!({"gid": gid, "branch_id": "03", "trans_type": "tcc", "data": "", "confirm": p.url("/c"), "cancel": p.url("/c")});
    let (code, answer) = api.post("/registerBranch", late).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (409, Some("FAILURE")),
        "{answer}"
    );
    // A repeated prepare of a submitted transaction: 409 as in DTM.
    assert_eq!(api.post("/prepare", tcc).await.0, 409);
    // The same gid with a different body: 409 conflict (DTM silently ignores it).
    let (code, answer) = api
        .post(
            "/prepare",
            json!({"gid": gid, "trans_type": "tcc", "timeout_to_fail": 99}),
        )
        .await;
    assert_eq!(
        (code, answer["error"]["code"].as_str()),
        (409, Some("gid_conflict")),
        "{answer}"
    );
    let q = query(&api, &gid).await;
    assert_eq!(q["transaction"]["status"], "succeed");
    assert_eq!(q["branches"].as_array().unwrap().len(), 4);
    let branch = &q["branches"][0];
    assert_eq!(branch["bin_data"], "eyJhbW91bnQiOjMwfQ==", "{q:#}");
    assert!(branch["update_time"].as_str().unwrap().ends_with('Z'));
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// DTM aborts only a transaction that is prepared or aborting: the abort that fails a TCC
/// is a SUCCESS, and an abort of one that has failed already is a FAILURE (409), as DTM
/// answers it (dtmcli's `tcc_global_transaction` raises on it).
#[tokio::test]
async fn an_abort_of_a_failed_tcc_is_a_failure_as_in_dtm() {
    let (db, server, api, p) = setup("dtm_abort_failed").await;
    let tcc = json!({"gid": "ab", "trans_type": "tcc"});
    assert_eq!(api.post("/prepare", tcc.clone()).await.0, 200);
    let reg = json!({"gid": "ab", "branch_id": "01", "trans_type": "tcc", "data": "{}",
                     "confirm": p.url("/confirm"), "cancel": p.url("/cancel")});
    assert_eq!(api.post("/registerBranch", reg).await.0, 200);
    let (code, answer) = api.post("/abort", tcc.clone()).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (200, Some("SUCCESS")),
        "{answer}"
    );
    wait_dtm_status(&api, "ab", "failed").await;
    let (code, answer) = api.post("/abort", tcc.clone()).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (409, Some("FAILURE")),
        "{answer}"
    );
    assert!(
        answer["message"].as_str().unwrap().contains("cannot abort"),
        "{answer}"
    );
    assert_eq!(p.paths("ab"), ["/cancel"], "cancelled once");
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// What idem does not serve of DTM's transaction surface is refused with `400
/// unsupported` and a message saying what instead, and nothing is stored: XA, msg topics
/// (the routes, and `topic://` steps), delayed messages and workflow.
#[tokio::test]
async fn what_idem_does_not_serve_is_refused_as_unsupported() {
    let (db, server, api, p) = setup("dtm_unsupported").await;
    let msg = |gid: &str, action: String, custom: Option<&str>| {
        json!({"gid": gid, "trans_type": "msg", "steps": [{"action": action}],
               "payloads": ["{}"], "custom_data": custom})
    };
    let posts = [
        ("/prepare", msg("topic", "topic://orders".into(), None)),
        ("/submit", msg("topic2", "topic://orders".into(), None)),
        (
            "/submit",
            msg("delayed", p.url("/in"), Some(r#"{"delay": 10}"#)),
        ),
        (
            "/prepareWorkflow",
            json!({"gid": "wf", "trans_type": "workflow"}),
        ),
        (
            "/registerXaBranch",
            json!({"gid": "xa", "branch_id": "01", "trans_type": "xa", "url": p.url("/xa")}),
        ),
        (
            "/registerBranch",
            json!({"gid": "xa", "branch_id": "01", "trans_type": "xa", "url": p.url("/xa")}),
        ),
    ];
    for (path, body) in posts {
        let (code, answer) = api.post(path, body.clone()).await;
        assert_eq!(
            (code, answer["error"]["code"].as_str()),
            (400, Some("unsupported")),
            "{path} {body}: {answer}"
        );
        assert!(answer.get("dtm_result").is_none(), "{answer}");
    }
    for path in [
        "/subscribe?topic=t&url=http://x/y",
        "/unsubscribe?topic=t&url=http://x/y",
        "/scanKV?cat=topics",
        "/queryKV?cat=topics&key=t",
    ] {
        let (code, answer) = api.get(path).await;
        assert_eq!(
            (code, answer["error"]["code"].as_str()),
            (400, Some("unsupported")),
            "{path}: {answer}"
        );
        assert!(
            answer["message"].as_str().unwrap().contains("topics"),
            "{answer}"
        );
    }
    let deleted = reqwest::Client::new()
        .delete(format!("{}/topic/orders", api.base))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 400);
    for gid in ["topic", "topic2", "delayed", "wf", "xa"] {
        // DTM's query answers an unknown gid with no transaction.
        let q = query(&api, gid).await;
        assert!(q["transaction"].is_null(), "{gid} was stored: {q}");
    }
    assert!(p.calls().is_empty());
    server.stop().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn stalled_is_visible_in_query_and_force_stop_ends_it() {
    let (db, server, api, p) = setup("dtm_stalled").await;
    p.answer("/a/compensate", None, 100, 500);
    p.answer("/a/action", None, 1, 409);
    let mut body = saga_body(&p, "stuck", &["a"]);
    body["retry_limit"] = json!(3);
    body["wait_result"] = json!(true);
    let (code, answer) = api.post("/submit", body).await;
    assert_eq!(
        (code, answer["dtm_result"].as_str()),
        (425, Some("ONGOING")),
        "{answer}"
    );
    let q = query(&api, "stuck").await;
    assert_eq!(q["transaction"]["status"], "stalled", "{q:#}");
    assert_eq!(q["transaction"]["stalled_from"], "aborting");
    assert!(
        q["transaction"]["last_error"]
            .as_str()
            .unwrap()
            .contains("exhausted 3 attempts")
    );
    let (code, _) = api.post("/forceStop", json!({"gid": "stuck"})).await;
    assert_eq!(code, 200);
    assert_eq!(
        query(&api, "stuck").await["transaction"]["status"],
        "failed"
    );
    let (code, all) = api.get("/all?status=failed&limit=1").await;
    assert_eq!(code, 200);
    assert_eq!(all["transactions"][0]["gid"], "stuck", "{all}");
    let (code, ping) = Api::new(api.base.replace("/api/dtmsvr", ""))
        .get("/api/ping")
        .await;
    assert_eq!((code, ping["msg"].as_str()), (200, Some("pong")));
    server.stop().await.unwrap();
    db.drop_database().await;
}

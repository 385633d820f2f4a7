//! DTM's gRPC door (`--grpc-listen`, the `dtmgimp.Dtm` service) driven by a client that
//! PyPI's grpcio-tools generates from our proto at test time (`dtm_grpc/client.py`): a saga
//! (and the same saga submitted again), a failing saga (`ABORTED`), a TCC whose Try fails
//! (Abort, so both branches are cancelled), a TCC that commits, a msg completed through its
//! QueryPrepared, bad input (`INVALID_ARGUMENT`, never `INTERNAL`, nothing stored), an
//! unknown gid (`NOT_FOUND`) and a topic RPC (`UNIMPLEMENTED`); with a token in the
//! `authorization` metadata. The participant is a real HTTP server that records every
//! call: what it received is checked here. On SQLite, PostgreSQL and MariaDB.
//!
//! Needs a Python with grpcio-tools: `scripts/test` makes a virtualenv and points
//! `IDEM_GRPC_PYTHON` at it.

use crate::common;

use common::auth::{Setup, get, wait_status};
use common::recorder::{Call, Recorder};
use idem::auth::Role;
use idem_dtm_proto::{DtmClient, DtmRequest};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::Value;

fn python() -> String {
    // A test that cannot run fails with the reason: it is never counted as passed.
    std::env::var("IDEM_GRPC_PYTHON").unwrap_or_else(|_| {
        panic!(
            "not run: set IDEM_GRPC_PYTHON to a python with grpcio-tools \
             (scripts/test makes one in .venv-grpc)"
        )
    })
}

async fn grpc_door(backend: Backend, test: &str) {
    let python = python();
    let db = TestDatabase::create(backend, test).await;
    let s = Setup::with(db, |c| c.grpc_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let grpc = s.server.grpc_addr.expect("a gRPC listener");
    let token = s.token("grpc", Role::Client).await;
    let p = &s.recorder;
    p.answer("/saga/inFail", None, usize::MAX, 409);
    p.answer("/tcc/tryFail", None, usize::MAX, 409);
    let gp = GrpcParticipant::start(&python).await;

    let run = "g";
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/dtm_grpc/client.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .env("IDEM_GRPC", grpc.to_string())
        .env("PARTICIPANT", p.url(""))
        .env("GRPC_PARTICIPANT", format!("127.0.0.1:{}", gp.port))
        .env("RUN", run)
        .env("IDEM_TOKEN", &token)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("all checks passed"),
        "the gRPC client failed:\n{stdout}\n{stderr}"
    );
    let results: Value = serde_json::from_str(stdout.trim_end_matches("all checks passed\n"))
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    // The message names the client's gid, never the tenant-scoped key it is stored under.
    let changed = results["gsaga_changed"]["message"].as_str().unwrap();
    assert!(
        changed.contains(&format!(
            "gid \"{run}-gsaga\" is already used by a different request"
        )),
        "{changed}"
    );
    let too_large = results["bad_payload_size"]["message"].as_str().unwrap();
    assert!(too_large.starts_with("payload_too_large: "), "{too_large}");
    for (name, result) in results.as_object().unwrap() {
        if name.starts_with("bad_") {
            let message = result["message"].as_str().unwrap();
            assert!(
                message.contains(':') && !message.to_lowercase().contains("internal"),
                "{name}: a bad request's message names idem's code: {result}"
            );
        }
    }

    // The saga ran once, submitted twice: each step once, with its payload's bytes and
    // DTM's query parameters.
    let saga = wait_status(&s, &token, &format!("{run}-saga"), "succeeded").await;
    assert_eq!(saga["kind"], "saga");
    let calls = calls_of(p, &format!("{run}-saga"));
    assert_eq!(paths(&calls), ["/saga/out", "/saga/in"], "{calls:#?}");
    assert_eq!(calls[0].body, r#"{"amount":30,"step":"out"}"#);
    assert_eq!(calls[1].body, r#"{"amount":30,"step":"in"}"#);
    assert!(
        calls
            .iter()
            .all(|c| c.trans_type == "saga" && c.op == "action")
    );

    // The failing saga was compensated and its second action never retried past FAILURE.
    wait_status(&s, &token, &format!("{run}-saga-fail"), "failed").await;
    let fail = paths(&calls_of(p, &format!("{run}-saga-fail")));
    assert_eq!(fail[..2], ["/saga/out", "/saga/inFail"], "{fail:?}");
    assert!(fail.contains(&"/saga/outRevert".to_owned()), "{fail:?}");

    // The TCC whose second Try failed: both branches cancelled with their payloads, none
    // confirmed.
    wait_status(&s, &token, &format!("{run}-tcc"), "failed").await;
    let tcc = calls_of(p, &format!("{run}-tcc"));
    let mut cancels: Vec<(String, String)> = tcc
        .iter()
        .filter(|c| c.path == "/tcc/cancel")
        .map(|c| (c.branch_id.clone(), c.body.clone()))
        .collect();
    cancels.sort();
    assert_eq!(
        cancels,
        [
            ("01".to_owned(), r#"{"branch": "01"}"#.to_owned()),
            ("02".to_owned(), r#"{"branch": "02"}"#.to_owned())
        ],
        "{tcc:#?}"
    );
    assert!(tcc.iter().all(|c| c.path != "/tcc/confirm"), "{tcc:#?}");
    assert!(
        tcc.iter()
            .filter(|c| c.path == "/tcc/cancel")
            .all(|c| c.op == "cancel" && c.trans_type == "tcc")
    );

    // The committed TCC: one Confirm.
    wait_status(&s, &token, &format!("{run}-tcc-ok"), "succeeded").await;
    let ok = calls_of(p, &format!("{run}-tcc-ok"));
    assert_eq!(paths(&ok), ["/tcc/confirm"], "{ok:#?}");
    assert_eq!(ok[0].body, r#"{"branch":"ok"}"#);

    // The msg: asked after its timeout, then sent once.
    let msg = format!("{run}-msg");
    wait_status(&s, &token, &msg, "succeeded").await;
    let msg_calls = paths(&calls_of(p, &msg));
    assert_eq!(
        msg_calls,
        ["/msg/queryPrepared", "/msg/in"],
        "{msg_calls:?}"
    );
    assert_eq!(
        calls_of(p, &msg)[1].body,
        r#"{"amount":7}"#,
        "the msg step's payload"
    );

    // The msg prepared and submitted: sent once, never asked about.
    let msg2 = format!("{run}-msg-submitted");
    wait_status(&s, &token, &msg2, "succeeded").await;
    let msg2_calls = calls_of(p, &msg2);
    assert_eq!(paths(&msg2_calls), ["/msg/in"], "{msg2_calls:#?}");
    assert_eq!(msg2_calls[0].body, r#"{"amount":8}"#);

    // The gRPC participant's side: each method once, with DTM's metadata and the
    // payload's bytes (the failing saga's second step is compensated too, as DTM does; its
    // repeat submit called nothing again).
    wait_status(&s, &token, &format!("{run}-gsaga"), "failed").await;
    wait_status(&s, &token, &format!("{run}-gtcc"), "failed").await;
    wait_status(&s, &token, &format!("{run}-gmsg"), "succeeded").await;
    let grpc_seen = gp.calls().await;
    // BusiReq{Account: "alice", Amount: 300}: not UTF-8, sent as the bytes it is.
    let proto = "0a05616c69636510ac02";
    let m = |name: &str, op: &str, id: &str, body: &str| {
        (
            name.to_owned(),
            op.to_owned(),
            id.to_owned(),
            body.to_owned(),
        )
    };
    let gsaga = grpc_calls(&grpc_seen, &format!("{run}-gsaga"));
    // Views show bytes that are not text as base64, and say so; DTM's query as DTM does.
    let (_, view) = get(
        &s,
        &format!("/api/v1/transactions/{run}-gsaga"),
        Some(&token),
    )
    .await;
    let proto_base64 = "CgVhbGljZRCsAg==";
    for branch in view["branches"].as_array().unwrap() {
        assert_eq!(branch["payload"], proto_base64, "{branch}");
        assert_eq!(branch["payload_encoding"], "base64", "{branch}");
    }
    let (_, dtm) = get(
        &s,
        &format!("/api/dtmsvr/query?gid={run}-gsaga"),
        Some(&token),
    )
    .await;
    assert_eq!(dtm["transaction"]["payloads"][0], proto_base64, "{dtm}");
    assert_eq!(dtm["branches"][0]["bin_data"], proto_base64, "{dtm}");
    // Text payloads are shown as they were.
    let (_, view) = get(
        &s,
        &format!("/api/v1/transactions/{run}-saga"),
        Some(&token),
    )
    .await;
    assert!(
        view["branches"][0].get("payload_encoding").is_none(),
        "{view}"
    );
    assert_eq!(
        gsaga[..2],
        [
            m("TransOut", "action", "01", proto),
            m("TransInFail", "action", "02", proto)
        ],
        "{gsaga:?}"
    );
    let mut compensations = gsaga[2..].to_vec();
    compensations.sort();
    assert_eq!(
        compensations,
        [
            m("TransInRevert", "compensate", "02", proto),
            m("TransOutRevert", "compensate", "01", proto)
        ]
    );
    assert_eq!(
        grpc_calls(&grpc_seen, &format!("{run}-gtcc")),
        [
            m("TransOutTryFail", "try", "01", proto),
            m("TransOutCancel", "cancel", "01", proto)
        ]
    );
    assert_eq!(
        grpc_calls(&grpc_seen, &format!("{run}-gmsg")),
        [
            m("QueryPrepared", "msg", "00", ""),
            m("TransIn", "action", "01", proto)
        ]
    );

    // Nothing was stored for the refused requests.
    for gid in ["bad-kind", "bad-json", "bad-timeout", "bad-url", "bad-size"] {
        let path = format!("/api/v1/transactions/{run}-{gid}");
        let (status, body) = get(&s, &path, Some(&token)).await;
        assert_eq!(status, 404, "{gid}: {body}");
    }

    // Without a token (and no token-less door), the gRPC door refuses like the HTTP one.
    let mut client = DtmClient::connect(format!("http://{grpc}")).await.unwrap();
    let refused = client.new_gid(()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let submit = DtmRequest {
        gid: format!("{run}-no-token"),
        trans_type: "saga".into(),
        steps: format!(r#"[{{"action":"{}"}}]"#, p.url("/x")),
        ..DtmRequest::default()
    };
    let refused = client.submit(submit).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    s.finish().await;
}

fn calls_of(p: &Recorder, gid: &str) -> Vec<Call> {
    p.calls().into_iter().filter(|c| c.gid == gid).collect()
}

fn paths(calls: &[Call]) -> Vec<String> {
    calls.iter().map(|c| c.path.clone()).collect()
}

#[tokio::test]
async fn grpc_clients_drive_the_dtm_door_on_sqlite() {
    grpc_door(Backend::Sqlite, "grpc_door_sqlite").await;
}

#[tokio::test]
async fn grpc_clients_drive_the_dtm_door_on_postgres() {
    grpc_door(Backend::Postgres, "grpc_door_pg").await;
}

#[tokio::test]
async fn grpc_clients_drive_the_dtm_door_on_mariadb() {
    grpc_door(Backend::Mysql, "grpc_door_mysql").await;
}

/// DTM's token-less door over gRPC: from loopback, listed in `--dtm-tokenless-from`, a
/// client without a token acts as `--dtm-tenant`'s client, as over HTTP.
#[tokio::test]
async fn the_tokenless_door_takes_grpc_clients_from_the_listed_networks() {
    let db = TestDatabase::create(Backend::Sqlite, "grpc_tokenless").await;
    let s = Setup::with(db, |c| {
        c.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        c.auth.dtm_tenant = Some("legacy".into());
        c.auth.dtm_tokenless_from = vec!["127.0.0.0/8".parse().unwrap()];
    })
    .await;
    let grpc = s.server.grpc_addr.unwrap();
    let mut client = DtmClient::connect(format!("http://{grpc}")).await.unwrap();
    let gid = client.new_gid(()).await.unwrap().into_inner().gid;
    assert!(!gid.is_empty());
    let submit = DtmRequest {
        gid: "tokenless-grpc".into(),
        trans_type: "saga".into(),
        steps: format!(
            r#"[{{"action":"{}","compensate":"{}"}}]"#,
            s.recorder.url("/step/action"),
            s.recorder.url("/step/compensate")
        ),
        bin_payloads: vec![b"{}".to_vec()],
        ..DtmRequest::default()
    };
    client.submit(submit).await.unwrap();
    let admin = s.token("legacy", Role::Admin).await;
    let done = wait_status(&s, &admin, "tokenless-grpc", "succeeded").await;
    assert_eq!(done["kind"], "saga");
    let other = s.token("other", Role::Admin).await;
    let (status, _) = get(&s, "/api/v1/transactions/tokenless-grpc", Some(&other)).await;
    assert_eq!(status, 404, "another tenant does not see it");
    s.finish().await;
}

/// The rate limit and the metrics hold over gRPC as over HTTP: past the burst, a request is
/// `RESOURCE_EXHAUSTED` with `retry-after` metadata and stores nothing, and every RPC is
/// counted by method and code.
#[tokio::test]
async fn the_rate_limit_refuses_grpc_calls_and_they_are_counted() {
    let db = TestDatabase::create(Backend::Sqlite, "grpc_rate").await;
    let server = common::coordinator_with(&db.url, |c| {
        c.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        c.rate_limit = idem::api::rate_limit::RateLimitConfig {
            per_second: 1,
            burst: 3,
        };
    })
    .await;
    let grpc = server.grpc_addr.unwrap();
    let mut client = DtmClient::connect(format!("http://{grpc}")).await.unwrap();
    for _ in 0..3 {
        client.new_gid(()).await.unwrap();
    }
    let submit = DtmRequest {
        gid: "over-the-rate".into(),
        trans_type: "saga".into(),
        steps: r#"[{"action":"http://127.0.0.1:9/a","compensate":"http://127.0.0.1:9/c"}]"#.into(),
        ..DtmRequest::default()
    };
    let refused = client.submit(submit).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused.metadata().get("idem-error-code").unwrap(),
        "rate_limited"
    );
    assert!(
        refused.metadata().get("retry-after").is_some(),
        "{refused:?}"
    );
    let metrics = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"idem_grpc_requests_total{method="Submit",code="RESOURCE_EXHAUSTED"}"#,
        r#"idem_grpc_requests_total{method="NewGid",code="OK"}"#,
    ] {
        assert!(metrics.contains(series), "{series} not in /metrics");
    }
    let store = common::open(&db.url).await;
    assert!(
        store.load("over-the-rate").await.unwrap().is_none(),
        "stored"
    );
    drop(store);
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// A gRPC participant on Python's grpcio (`dtm_grpc/participant.py`), for one test.
struct GrpcParticipant {
    child: tokio::process::Child,
    port: u16,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl GrpcParticipant {
    async fn start(python: &str) -> GrpcParticipant {
        GrpcParticipant::start_on(python, 0).await
    }

    /// On `port` (0: any).
    async fn start_on(python: &str, port: u16) -> GrpcParticipant {
        use tokio::io::AsyncBufReadExt;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/it/dtm_grpc/participant.py"
        );
        let mut child = tokio::process::Command::new(python)
            .arg(script)
            .arg(port.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let first = lines
            .next_line()
            .await
            .unwrap()
            .expect("the participant's port");
        let port = serde_json::from_str::<Value>(&first).unwrap()["port"]
            .as_u64()
            .unwrap() as u16;
        GrpcParticipant { child, port, lines }
    }

    fn target(&self, method: &str) -> String {
        format!("127.0.0.1:{}/busi.Busi/{method}", self.port)
    }

    /// Stops it and returns every call it recorded.
    async fn calls(mut self) -> Vec<Value> {
        drop(self.child.stdin.take());
        let mut calls = Vec::new();
        while let Ok(Some(line)) = self.lines.next_line().await {
            calls.push(serde_json::from_str(&line).unwrap());
        }
        let _ = self.child.wait().await;
        calls
    }
}

fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

fn steps(p: &GrpcParticipant, pairs: &[(&str, &str)]) -> String {
    let steps: Vec<Value> = pairs
        .iter()
        .map(|(action, compensate)| {
            serde_json::json!({"action": p.target(action), "compensate": p.target(compensate)})
        })
        .collect();
    Value::Array(steps).to_string()
}

/// The calls of `gid`, as (method's name, op, branch id, body in hex).
fn grpc_calls(calls: &[Value], gid: &str) -> Vec<(String, String, String, String)> {
    calls
        .iter()
        .filter(|c| c["metadata"]["dtm-gid"] == gid)
        .map(|c| {
            let m = &c["metadata"];
            let method = c["method"]
                .as_str()
                .unwrap()
                .trim_start_matches("/busi.Busi/");
            let text = |k: &str| m[k].as_str().unwrap_or_default().to_owned();
            (
                method.to_owned(),
                text("dtm-op"),
                text("dtm-branch_id"),
                c["body"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Branches called over gRPC, as DTM calls them: a saga whose steps succeed (one after an
/// in-progress answer), a saga whose step fails and is compensated, a TCC confirmed, all
/// created through the gRPC door; each call's method, DTM metadata and payload bytes are
/// checked on the participant's side. A target the outbound policy refuses, or idem's own
/// gRPC port, is refused at creation.
async fn grpc_branches(backend: Backend, test: &str) {
    let python = python();
    let db = TestDatabase::create(backend, test).await;
    let s = Setup::with(db, |c| c.grpc_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let grpc = s.server.grpc_addr.unwrap();
    let token = s.token("grpc", Role::Client).await;
    let p = GrpcParticipant::start(&python).await;
    let mut client = DtmClient::connect(format!("http://{grpc}")).await.unwrap();
    // A protobuf message (field 1, the string "hello"): bytes that are also UTF-8.
    let message = b"\x0a\x05hello".to_vec();
    let hex_message = "0a0568656c6c6f";

    let ok = DtmRequest {
        gid: "gs-ok".into(),
        trans_type: "saga".into(),
        steps: steps(
            &p,
            &[
                ("TransOut", "TransOutRevert"),
                ("TransOngoing", "TransInRevert"),
            ],
        ),
        bin_payloads: vec![message.clone(), message.clone()],
        trans_options: Some(idem_dtm_proto::DtmTransOptions {
            wait_result: true,
            ..Default::default()
        }),
        ..DtmRequest::default()
    };
    client.submit(authed(ok, &token)).await.unwrap();

    let mut fail = DtmRequest {
        gid: "gs-fail".into(),
        trans_type: "saga".into(),
        steps: steps(
            &p,
            &[
                ("TransOut", "TransOutRevert"),
                ("TransInFail", "TransInRevert"),
            ],
        ),
        bin_payloads: vec![message.clone(), message.clone()],
        ..DtmRequest::default()
    };
    fail.trans_options = Some(idem_dtm_proto::DtmTransOptions {
        wait_result: true,
        ..Default::default()
    });
    let failed = client.submit(authed(fail, &token)).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Aborted, "{failed:?}");

    let tcc = DtmRequest {
        gid: "gt".into(),
        trans_type: "tcc".into(),
        ..DtmRequest::default()
    };
    client.prepare(authed(tcc.clone(), &token)).await.unwrap();
    let branch = idem_dtm_proto::DtmBranchRequest {
        gid: "gt".into(),
        trans_type: "tcc".into(),
        branch_id: "01".into(),
        op: "try".into(),
        data: [
            ("confirm".to_owned(), p.target("TransOutConfirm")),
            ("cancel".to_owned(), p.target("TransOutCancel")),
        ]
        .into(),
        busi_payload: message.clone(),
    };
    client
        .register_branch(authed(branch, &token))
        .await
        .unwrap();
    let mut submit = tcc;
    submit.trans_options = Some(idem_dtm_proto::DtmTransOptions {
        wait_result: true,
        ..Default::default()
    });
    client.submit(authed(submit, &token)).await.unwrap();

    // Where calls may not go: a private address the policy does not list, idem's own port.
    for (gid, action) in [
        ("gs-private", "10.1.2.3:50051/busi.Busi/TransOut".to_owned()),
        ("gs-own", format!("{grpc}/dtmgimp.Dtm/Submit")),
    ] {
        let refused = DtmRequest {
            gid: gid.into(),
            trans_type: "saga".into(),
            steps: serde_json::json!([{"action": action, "compensate": action}]).to_string(),
            bin_payloads: vec![message.clone()],
            ..DtmRequest::default()
        };
        let refused = client.submit(authed(refused, &token)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert_eq!(
            refused.metadata().get("idem-error-code").unwrap(),
            idem::outbound::URL_NOT_ALLOWED,
            "{gid}"
        );
    }

    wait_status(&s, &token, "gs-fail", "failed").await;
    let calls = p.calls().await;
    let ok_calls = grpc_calls(&calls, "gs-ok");
    let m = |name: &str, op: &str, id: &str| {
        (
            name.to_owned(),
            op.to_owned(),
            id.to_owned(),
            hex_message.to_owned(),
        )
    };
    assert_eq!(
        ok_calls,
        [
            m("TransOut", "action", "01"),
            m("TransOngoing", "action", "02"),
            m("TransOngoing", "action", "02"),
        ],
        "{calls:#?}"
    );
    let fail_calls = grpc_calls(&calls, "gs-fail");
    assert_eq!(
        fail_calls[..2],
        [
            m("TransOut", "action", "01"),
            m("TransInFail", "action", "02")
        ]
    );
    assert!(
        fail_calls.contains(&m("TransOutRevert", "compensate", "01")),
        "{fail_calls:?}"
    );
    assert!(
        fail_calls
            .iter()
            .all(|c| c.0 != "TransInFail" || c.1 == "action")
    );
    assert_eq!(
        grpc_calls(&calls, "gt"),
        [m("TransOutConfirm", "confirm", "01")]
    );
    let first = calls
        .iter()
        .find(|c| c["metadata"]["dtm-gid"] == "gs-ok")
        .unwrap();
    assert_eq!(first["metadata"]["dtm-trans_type"], "saga", "{first}");
    assert_eq!(first["metadata"]["idem-tenant"], "grpc", "{first}");
    assert!(first["metadata"]["idem-call-id"].is_string(), "{first}");
    // Every call came over one connection: idem keeps it (one per participant address).
    let peers: std::collections::BTreeSet<&str> =
        calls.iter().map(|c| c["peer"].as_str().unwrap()).collect();
    assert_eq!(peers.len(), 1, "{peers:?}");
    // The transaction's trace continues into the call (W3C trace context, version 00).
    let traceparent = first["metadata"]["traceparent"]
        .as_str()
        .unwrap_or_default();
    assert!(
        traceparent.starts_with("00-") && traceparent.len() == 55,
        "{first}"
    );
    s.finish().await;
}

/// A kept connection to a participant that restarted is replaced: the participant is
/// stopped after a saga and started again on its port, and the next saga reaches it.
#[tokio::test]
async fn a_restarted_grpc_participant_is_reached_again() {
    let python = python();
    let db = TestDatabase::create(Backend::Sqlite, "grpc_participant_restarted").await;
    let s = Setup::with(db, |c| c.grpc_listen = Some("127.0.0.1:0".parse().unwrap())).await;
    let grpc = s.server.grpc_addr.unwrap();
    let token = s.token("grpc", Role::Client).await;
    let mut client = DtmClient::connect(format!("http://{grpc}")).await.unwrap();
    let saga = |gid: &str, p: &GrpcParticipant| DtmRequest {
        gid: gid.into(),
        trans_type: "saga".into(),
        steps: steps(p, &[("TransOut", "TransOutRevert")]),
        bin_payloads: vec![b"\x0a\x01a".to_vec()],
        trans_options: Some(idem_dtm_proto::DtmTransOptions {
            wait_result: true,
            retry_interval: 1,
            ..Default::default()
        }),
        ..DtmRequest::default()
    };
    let first = GrpcParticipant::start(&python).await;
    let port = first.port;
    client
        .submit(authed(saga("before", &first), &token))
        .await
        .unwrap();
    let before = first.calls().await;
    assert_eq!(grpc_calls(&before, "before").len(), 1, "{before:?}");

    let second = GrpcParticipant::start_on(&python, port).await;
    client
        .submit(authed(saga("after", &second), &token))
        .await
        .unwrap();
    wait_status(&s, &token, "after", "succeeded").await;
    let after = second.calls().await;
    let calls = grpc_calls(&after, "after");
    assert_eq!(calls.len(), 1, "{after:?}");
    assert_eq!(calls[0].0, "TransOut");
    assert_ne!(before[0]["peer"], after[0]["peer"], "a new connection");
    s.finish().await;
}

#[tokio::test]
async fn branches_are_called_over_grpc_on_sqlite() {
    grpc_branches(Backend::Sqlite, "grpc_branches_sqlite").await;
}

#[tokio::test]
async fn branches_are_called_over_grpc_on_postgres() {
    grpc_branches(Backend::Postgres, "grpc_branches_pg").await;
}

#[tokio::test]
async fn branches_are_called_over_grpc_on_mariadb() {
    grpc_branches(Backend::Mysql, "grpc_branches_mysql").await;
}

/// The key tenant `grpc` signs its calls with, in the coordinator's and the participant's
/// key files.
const GRPC_KEYS: &str = "[tenant grpc]\nk-grpc:0123456789abcdef-grpc-secret\n";

/// The tonic example participant (`idem_demo::grpc_busi`, the barrier over gRPC, behind
/// the SDK's signature layer) driven by idem, which signs its gRPC calls, through the gRPC
/// door: a transfer saga moves money once; a saga whose first action is refused (not
/// enough money) ends failed with its compensation an empty rollback; a saga whose second
/// action is refused (unknown account) gives the money back. Calls made here directly show
/// that the participant takes only rightly signed ones: none unsigned, none signed for
/// another method, no replay.
async fn tonic_example(backend: Backend, test: &str) {
    use idem_demo::grpc_busi::{self, proto::BusiReq, proto::busi_client::BusiClient};
    use idem_participant::signature::{self as sig, Keyring, Verifier};
    use prost::Message;

    let db = TestDatabase::create(backend, test).await;
    let busi_db = TestDatabase::create(backend, &format!("{test}_busi")).await;
    let pool = grpc_busi::open(&busi_db.url).await.unwrap();
    grpc_busi::seed(&pool, "alice", 100).await.unwrap();
    grpc_busi::seed(&pool, "bob", 0).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let busi = listener.local_addr().unwrap();
    let verifier = Verifier::new(Keyring::parse(GRPC_KEYS).unwrap());
    let serving = tokio::spawn(grpc_busi::serve_signed(listener, pool.clone(), verifier));

    let s = Setup::with(db, |c| {
        c.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
        c.signing = Some(idem::signing::Signer::new(Keyring::parse(GRPC_KEYS).unwrap()).unwrap());
    })
    .await;
    let token = s.token("grpc", Role::Client).await;
    let mut client = DtmClient::connect(format!("http://{}", s.server.grpc_addr.unwrap()))
        .await
        .unwrap();
    let target = |method: &str| format!("{busi}/busi.Busi/{method}");
    let transfer = |gid: &str, from: (&str, i64), to: (&str, i64)| {
        let req = |(account, amount): (&str, i64)| {
            BusiReq {
                account: account.into(),
                amount,
            }
            .encode_to_vec()
        };
        DtmRequest {
            gid: gid.into(),
            trans_type: "saga".into(),
            steps: serde_json::json!([
                {"action": target("TransOut"), "compensate": target("TransOutRevert")},
                {"action": target("TransIn"), "compensate": target("TransInRevert")},
            ])
            .to_string(),
            bin_payloads: vec![req(from), req(to)],
            trans_options: Some(idem_dtm_proto::DtmTransOptions {
                wait_result: true,
                ..Default::default()
            }),
            ..DtmRequest::default()
        }
    };
    let balances = || async {
        (
            grpc_busi::balance(&pool, "alice").await.unwrap(),
            grpc_busi::balance(&pool, "bob").await.unwrap(),
        )
    };

    client
        .submit(authed(transfer("t-ok", ("alice", 30), ("bob", 30)), &token))
        .await
        .unwrap();
    assert_eq!(balances().await, (70, 30));

    let refused = client
        .submit(authed(
            transfer("t-poor", ("alice", 100), ("bob", 100)),
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Aborted, "{refused:?}");
    assert_eq!(balances().await, (70, 30), "nothing moved");

    let unknown = client
        .submit(authed(
            transfer("t-nobody", ("alice", 20), ("nobody", 20)),
            &token,
        ))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Aborted, "{unknown:?}");
    wait_status(&s, &token, "t-nobody", "failed").await;
    assert_eq!(balances().await, (70, 30), "alice got her 20 back");

    // Direct calls, signed here as idem signs: only the right one reaches the barrier.
    let key = sig::Key::new("k-grpc", "0123456789abcdef-grpc-secret").unwrap();
    let message = BusiReq {
        account: "alice".into(),
        amount: 5,
    };
    let body = message.encode_to_vec();
    let call_id = sig::new_call_id();
    let signed_for = |method: &str| {
        let target =
            format!("/busi.Busi/{method}?gid=direct&trans_type=saga&branch_id=01&op=action");
        let call = sig::Call {
            method: "POST",
            scheme: "http",
            host: "127.0.0.1",
            port: busi.port(),
            target: &target,
            body: &body,
            tenant: "grpc",
            call_id: &call_id,
        };
        let now = sig::unix_seconds(std::time::SystemTime::now());
        sig::sign_call(&key, now, &call, false).unwrap()
    };
    let request = |signature: Option<String>| {
        let mut request = tonic::Request::new(message.clone());
        let metadata = request.metadata_mut();
        for (name, value) in [
            ("dtm-gid", "direct"),
            ("dtm-trans_type", "saga"),
            ("dtm-branch_id", "01"),
            ("dtm-op", "action"),
            ("idem-tenant", "grpc"),
            ("idem-call-id", call_id.as_str()),
        ] {
            metadata.insert(name, value.parse().unwrap());
        }
        if let Some(signature) = signature {
            metadata.insert("idem-signature", signature.parse().unwrap());
        }
        request
    };
    let refusal = |answer: Result<tonic::Response<()>, tonic::Status>| {
        let status = answer.expect_err("refused");
        let code = status.message().split(':').next().unwrap().to_owned();
        (status.code(), code)
    };
    let mut direct = BusiClient::connect(format!("http://{busi}")).await.unwrap();
    let unauthenticated = |code: &str| (tonic::Code::Unauthenticated, code.to_owned());
    assert_eq!(
        refusal(direct.trans_out(request(None)).await),
        unauthenticated("signature_missing")
    );
    assert_eq!(
        refusal(direct.trans_out(request(Some(signed_for("TransIn")))).await),
        unauthenticated("signature_mismatch")
    );
    assert_eq!(balances().await, (70, 30), "nothing moved");
    let signed = signed_for("TransOut");
    direct
        .trans_out(request(Some(signed.clone())))
        .await
        .unwrap();
    assert_eq!(balances().await, (65, 30), "the signed call moved 5");
    assert_eq!(
        refusal(direct.trans_out(request(Some(signed))).await),
        unauthenticated("signature_replayed")
    );
    assert_eq!(balances().await, (65, 30), "the replay moved nothing");

    serving.abort();
    s.finish().await;
    pool.close().await;
    busi_db.drop_database().await;
}

#[tokio::test]
async fn the_tonic_example_participant_is_driven_over_grpc_on_sqlite() {
    tonic_example(Backend::Sqlite, "grpc_tonic_sqlite").await;
}

#[tokio::test]
async fn the_tonic_example_participant_is_driven_over_grpc_on_postgres() {
    tonic_example(Backend::Postgres, "grpc_tonic_pg").await;
}

#[tokio::test]
async fn the_tonic_example_participant_is_driven_over_grpc_on_mariadb() {
    tonic_example(Backend::Mysql, "grpc_tonic_mysql").await;
}

//! The coordinator end to end: real HTTP between idem and participants, on SQLite,
//! PostgreSQL and MariaDB. The tests act as an application through the typed client;
//! where they check the wire contract itself (status codes, malformed bodies, the shape
//! of an answer, what only the raw API offers) they use the raw helper.

use crate::common;

use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use common::typed::{self, created, created_tcc, operate_waiting, refusal, register, wait_status};
use idem_client::{
    Action, BranchStatus, Client, Kind, ListQuery, Options, SagaBuilder, Status, TryOutcome,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Client, Api, Recorder, &'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in idem_participant::testing::all(test).await {
        let server = common::coordinator(&db.url).await;
        let participant = Recorder::start().await;
        let backend: &'static str = db.backend.name();
        let idem = typed::client(&server.url());
        body(idem, Api::new(server.url()), participant, backend).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

fn tcc_branch(p: &Recorder, id: &str) -> Value {
    json!({
        "branch_id": id,
        "confirm": p.url(&format!("/{id}/confirm")),
        "cancel": p.url(&format!("/{id}/cancel")),
        "payload": {"branch": id},
    })
}

fn saga_steps(p: &Recorder, n: usize) -> Value {
    Value::Array(
        (1..=n)
            .map(|i| {
                json!({
                    "action": p.url(&format!("/s{i}/action")),
                    "compensate": p.url(&format!("/s{i}/compensate")),
                    "payload": {"step": i},
                })
            })
            .collect(),
    )
}

/// The saga [`saga_steps`] describes, ready to create.
fn saga(idem: &Client, p: &Recorder, gid: &str, n: usize) -> SagaBuilder {
    (1..=n).fold(idem.saga(gid), |saga, i| {
        saga.step(
            p.url(&format!("/s{i}/action")),
            p.url(&format!("/s{i}/compensate")),
            json!({"step": i}),
        )
    })
}

#[tokio::test]
async fn tcc_commit_confirms_every_branch() {
    each_backend(
        "tcc_commit_confirms_every_branch",
        |idem, _, p, b| async move {
            let tcc = idem.tcc("tcc-ok").create().await.map(created_tcc).unwrap();
            let tx = idem.get(tcc.gid()).await.unwrap();
            assert_eq!(
                (tx.gid.as_str(), tx.kind),
                ("tcc-ok", Kind::Tcc),
                "{b}: {tx:?}"
            );
            assert_eq!(tx.status, Status::Prepared);
            for id in ["inventory", "payment"] {
                let registered = register(&tcc, &p, id).await;
                assert!(registered.is_ok(), "{b}: {registered:?}");
            }
            let tx = tcc.submit(true).await;
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
            let mut paths = p.paths("tcc-ok");
            paths.sort();
            assert_eq!(paths, ["/inventory/confirm", "/payment/confirm"], "{b}");
            let call = &p.calls()[0];
            assert_eq!(call.trans_type, "tcc");
            assert_eq!(call.op, "confirm");
            assert_eq!(
                serde_json::from_str::<Value>(&call.body).unwrap()["branch"],
                call.branch_id.as_str()
            );
            // A repeated submit returns the outcome of the first.
            let again = tcc.submit(false).await;
            assert_eq!(again.map(|t| t.status), Ok(Status::Succeeded));
            assert_eq!(p.paths("tcc-ok").len(), 2, "{b}: nothing called twice");
        },
    )
    .await;
}

#[tokio::test]
async fn tcc_abort_cancels_every_branch() {
    each_backend(
        "tcc_abort_cancels_every_branch",
        |idem, _, p, b| async move {
            let tcc = idem
                .tcc("tcc-abort")
                .create()
                .await
                .map(created_tcc)
                .unwrap();
            for id in ["a", "b", "c"] {
                register(&tcc, &p, id).await.unwrap();
            }
            let tx = operate_waiting(&idem, "tcc-abort", "abort", Some("Try of b failed")).await;
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Failed);
            assert_eq!(tx.reason.as_deref(), Some("Try of b failed"));
            let mut paths = p.paths("tcc-abort");
            paths.sort();
            assert_eq!(paths, ["/a/cancel", "/b/cancel", "/c/cancel"], "{b}");
            // Submit after abort is refused and changes nothing.
            let refused = tcc.submit(false).await;
            assert_eq!(refusal(&refused), Some((409, "invalid_state")), "{b}");
            // Registration after the decision is refused.
            let refused = register(&tcc, &p, "d").await;
            assert_eq!(refusal(&refused), Some((409, "not_prepared")), "{b}");
        },
    )
    .await;
}

#[tokio::test]
async fn tcc_global_timeout_cancels_everywhere() {
    each_backend(
        "tcc_global_timeout_cancels_everywhere",
        |idem, _, p, b| async move {
            let options = Options {
                timeout_ms: Some(200),
                ..Options::default()
            };
            let tcc = idem
                .tcc("tcc-timeout")
                .options(options)
                .create()
                .await
                .map(created_tcc);
            assert!(tcc.is_ok(), "{b}: {tcc:?}");
            let tcc = tcc.unwrap();
            for id in ["a", "b"] {
                register(&tcc, &p, id).await.unwrap();
            }
            // Nobody submits: the recovery loop aborts it when the deadline passes.
            p.wait_until(WAIT, |calls| {
                calls.iter().filter(|c| c.gid == "tcc-timeout").count() == 2
            })
            .await;
            let tx = wait_status(&idem, "tcc-timeout", &[Status::Failed], WAIT).await;
            assert!(
                tx.reason.as_deref().unwrap().contains("timeout"),
                "{b}: {tx:?}"
            );
            let mut paths = p.paths("tcc-timeout");
            paths.sort();
            assert_eq!(paths, ["/a/cancel", "/b/cancel"], "{b}");
            let refused = tcc.submit(false).await;
            assert_eq!(
                refusal(&refused).map(|r| r.0),
                Some(409),
                "{b}: {refused:?}"
            );
        },
    )
    .await;
}

#[tokio::test]
async fn tcc_try_can_be_called_by_idem() {
    each_backend(
        "tcc_try_can_be_called_by_idem",
        |idem, api, p, b| async move {
            let tcc = idem.tcc("tcc-try").create().await.map(created_tcc).unwrap();
            // The Try's outcome in the registration's answer is the wire contract: raw.
            let mut ok = tcc_branch(&p, "a");
            ok["try"] = json!(p.url("/a/try"));
            let (code, body) = api.post("/api/v1/transactions/tcc-try/branches", ok).await;
            assert_eq!(code, 200, "{b}: {body}");
            assert_eq!(body["try"]["outcome"], "success");
            p.answer("/b/try", None, 1, 409);
            let (confirm, cancel) = (p.url("/b/confirm"), p.url("/b/cancel"));
            let refused = tcc
                .register_with_try(
                    "b",
                    &p.url("/b/try"),
                    &confirm,
                    &cancel,
                    json!({"branch": "b"}),
                )
                .await;
            // The client reads `409 try_failed` as the Try's refusal, not as an error.
            assert!(
                matches!(&refused, Ok(TryOutcome::Failed(_))),
                "{b}: {refused:?}"
            );
            assert_eq!(refused.as_ref().map(|o| o.label()), Ok("failure"));
            let tx = idem.get("tcc-try").await.unwrap();
            let try_b = tx
                .branches
                .iter()
                .find(|x| x.branch_id == "b" && x.action == Action::Try)
                .unwrap();
            assert_eq!(try_b.status, BranchStatus::Failed, "{b}: {tx:#?}");
            let tx = operate_waiting(&idem, "tcc-try", "abort", None)
                .await
                .unwrap();
            assert_eq!(tx.status, Status::Failed);
            assert_eq!(
                p.paths("tcc-try")
                    .iter()
                    .filter(|x| x.ends_with("/cancel"))
                    .count(),
                2,
                "{b}"
            );
        },
    )
    .await;
}

#[tokio::test]
async fn saga_success_runs_steps_in_order() {
    each_backend(
        "saga_success_runs_steps_in_order",
        |idem, _, p, b| async move {
            let tx = saga(&idem, &p, "saga-ok", 3)
                .wait_result(true)
                .send()
                .await
                .map(created);
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
            assert_eq!(
                p.paths("saga-ok"),
                ["/s1/action", "/s2/action", "/s3/action"],
                "{b}"
            );
            let calls = p.calls();
            assert_eq!(calls[0].branch_id, "01");
            assert_eq!(calls[2].branch_id, "03");
            assert_eq!(calls[0].trans_type, "saga");
            assert_eq!(calls[0].op, "action");
            assert_eq!(calls[1].body, r#"{"step":2}"#);
        },
    )
    .await;
}

#[tokio::test]
async fn saga_failure_compensates_in_reverse_including_the_failed_step() {
    each_backend(
        "saga_failure_compensates_in_reverse",
        |idem, _, p, b| async move {
            p.answer("/s3/action", None, 1, 409);
            let tx = saga(&idem, &p, "saga-fail", 4)
                .wait_result(true)
                .send()
                .await
                .map(created);
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Failed, "{b}: {tx:#?}");
            assert!(
                tx.reason.as_deref().unwrap().contains("03/action failed"),
                "{b}: {tx:?}"
            );
            assert_eq!(
                p.paths("saga-fail"),
                [
                    "/s1/action",
                    "/s2/action",
                    "/s3/action",
                    "/s3/compensate",
                    "/s2/compensate",
                    "/s1/compensate"
                ],
                "{b}"
            );
            let compensate4 = tx
                .branches
                .iter()
                .find(|x| x.branch_id == "04" && x.action == Action::Compensate)
                .unwrap();
            assert_eq!(compensate4.status, BranchStatus::Skipped);
        },
    )
    .await;
}

#[tokio::test]
async fn failed_calls_are_retried_until_success_and_counted() {
    each_backend(
        "failed_calls_are_retried_until_success",
        |idem, _, p, b| async move {
            // Two 500s, then a call that takes longer than its timeout, then success.
            p.answer("/s1/action", None, 2, 500);
            p.delay("/s1/action", None, 1, Duration::from_millis(600));
            let options = Options {
                request_timeout_ms: Some(300),
                ..Options::default()
            };
            let tx = saga(&idem, &p, "retry", 1)
                .options(options)
                .wait_result(true)
                .send()
                .await
                .map(created);
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
            let action = tx
                .branches
                .iter()
                .find(|x| x.action == Action::Action)
                .unwrap();
            assert_eq!(action.attempts, 4, "{b}: {tx:#?}");
            assert_eq!(tx.attempts, 3, "{b}: three failed attempts");
            let shown = idem.get("retry").await.unwrap();
            let history = shown.history.unwrap();
            let outcomes: Vec<(&str, i32)> = history
                .iter()
                .map(|h| (h.outcome.as_str(), h.attempt))
                .collect();
            assert_eq!(
                outcomes,
                [("unknown", 1), ("unknown", 2), ("unknown", 3)],
                "{b}: {history:#?}"
            );
            assert!(history[0].detail.as_deref().unwrap().contains("HTTP 500"));
            assert!(
                history[2].detail.as_deref().unwrap().contains("timed out"),
                "{b}: {history:#?}"
            );
        },
    )
    .await;
}

#[tokio::test]
async fn exhausted_confirm_stalls_then_retry_completes() {
    each_backend(
        "exhausted_confirm_stalls_then_retry_completes",
        |idem, _, p, b| async move {
            let options = Options {
                max_attempts: Some(3),
                ..Options::default()
            };
            let tcc = idem
                .tcc("stall")
                .options(options)
                .create()
                .await
                .map(created_tcc)
                .unwrap();
            register(&tcc, &p, "a").await.unwrap();
            p.answer("/a/confirm", None, 3, 503);
            let tx = tcc.submit(true).await.unwrap();
            assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
            assert_eq!(tx.stalled_from, Some(Status::Committing));
            assert!(
                tx.last_error
                    .as_deref()
                    .unwrap()
                    .contains("exhausted 3 attempts"),
                "{b}: {tx:?}"
            );
            assert_eq!(p.paths("stall").len(), 3);
            // Stalled: no more calls go out by themselves.
            let stalled = ListQuery {
                status: Some(Status::Stalled),
                ..ListQuery::default()
            };
            let list = idem.list(&stalled).await.unwrap();
            let first = list.transactions.first().map(|t| t.gid.as_str());
            assert_eq!(first, Some("stall"), "{b}: {list:?}");
            let tx = operate_waiting(&idem, "stall", "retry", None).await;
            assert!(tx.is_ok(), "{b}: {tx:?}");
            let tx = tx.unwrap();
            assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
            assert_eq!(p.paths("stall").len(), 4);
        },
    )
    .await;
}

/// Idempotency on the wire: the first create answers 201, a repeat 200, whatever the
/// order of the body's keys.
#[tokio::test]
async fn same_gid_same_body_returns_the_first_result_and_a_different_body_conflicts() {
    each_backend("same_gid_same_body", |idem, api, p, b| async move {
        let body = json!({"gid": "order-7", "kind": "saga", "steps": saga_steps(&p, 2), "wait_result": true});
        let (code, first) = api.post("/api/v1/transactions", body.clone()).await;
        assert_eq!((code, first["status"].as_str()), (201, Some("succeeded")), "{b}: {first}");
        // The same intent again, keys in another order and without wait_result.
        let reordered: Value = serde_json::from_str(&format!(
            r#"{{"steps": {}, "kind": "saga", "gid": "order-7"}}"#,
            saga_steps(&p, 2)
        ))
        .unwrap();
        let (code, again) = api.post("/api/v1/transactions", reordered).await;
        assert_eq!(code, 200, "{b}: {again}");
        assert_eq!(again["status"], "succeeded");
        assert_eq!(again["created_at"], first["created_at"]);
        assert_eq!(p.paths("order-7").len(), 2, "{b}: the steps ran once");
        // The same gid with another body.
        let mut other = body.clone();
        other["steps"][0]["payload"] = json!({"step": 99});
        let (code, err) = api.post("/api/v1/transactions", other).await;
        assert_eq!((code, err["error"]["code"].as_str()), (409, Some("gid_conflict")), "{b}: {err}");
        let still = idem.get("order-7").await.unwrap();
        assert_eq!(still.branches[0].payload, r#"{"step":1}"#, "{b}: nothing changed");
    })
    .await;
}

/// Counts the 201s and the repeats' 200s and 202s of racing creates: raw.
#[tokio::test]
async fn concurrent_duplicate_creates_run_the_saga_once() {
    each_backend(
        "concurrent_duplicate_creates",
        |idem, api, p, b| async move {
            let body = json!({"gid": "dup", "kind": "saga", "steps": saga_steps(&p, 2)});
            let results = futures::future::join_all(
                (0..20).map(|_| api.post("/api/v1/transactions", body.clone())),
            )
            .await;
            let created = results.iter().filter(|(c, _)| *c == 201).count();
            // A repeat answers 202 while the saga runs, 200 once it has its outcome.
            let repeats = results
                .iter()
                .filter(|(c, _)| matches!(c, 200 | 202))
                .count();
            assert_eq!((created, repeats), (1, 19), "{b}: {results:?}");
            wait_status(&idem, "dup", &[Status::Succeeded], WAIT).await;
            assert_eq!(p.paths("dup"), ["/s1/action", "/s2/action"], "{b}");
        },
    )
    .await;
}

/// Malformed and invalid requests with their exact codes: raw.
#[tokio::test]
async fn bad_input_gets_a_4xx_and_changes_nothing() {
    each_backend("bad_input_gets_a_4xx", |idem, api, p, b| async move {
        let cases: Vec<(Value, u16, &str)> = vec![
            (json!({"kind": "xa"}), 400, "unknown_kind"),
            (json!({"kind": "saga", "steps": []}), 400, "empty_steps"),
            (json!({"gid": "has space", "kind": "tcc"}), 400, "invalid_gid"),
            (json!({"gid": "x".repeat(129), "kind": "tcc"}), 400, "invalid_gid"),
            (json!({"gid": "g", "kind": "saga", "steps": [{"action": "not a url", "compensate": p.url("/c")}]}), 400, "invalid_url"),
            (json!({"gid": "g", "kind": "saga", "steps": [{"action": p.url("/a")}]}), 400, "invalid_request"),
            (json!({"gid": 5, "kind": "tcc"}), 400, "invalid_json"),
            (json!({"gid": "g", "kind": "tcc", "surprise": 1}), 400, "invalid_json"),
            (json!({"gid": "g", "kind": "tcc", "options": {"max_attempts": 0}}), 400, "invalid_options"),
        ];
        for (body, code, error) in cases {
            let (got, resp) = api.post("/api/v1/transactions", body.clone()).await;
            assert_eq!((got, resp["error"]["code"].as_str()), (code, Some(error)), "{b}: {body} -> {resp}");
        }
        let (got, resp) = api.post_raw("/api/v1/transactions", "{not json").await;
        assert_eq!((got, resp["error"]["code"].as_str()), (400, Some("invalid_json")));
        let (got, _) = api.get("/api/v1/transactions/nope").await;
        assert_eq!(got, 404);
        let (got, resp) = api.post("/api/v1/transactions/nope/submit", json!({})).await;
        assert_eq!((got, resp["error"]["code"].as_str()), (404, Some("not_found")));
        let (got, resp) = api.post("/api/v1/transactions/nope/branches", json!({"branch_id": "a"})).await;
        assert_eq!((got, resp["error"]["code"].as_str()), (400, Some("invalid_json")), "{resp}");
        let (got, resp) = api.get("/api/v1/transactions?status=bogus").await;
        assert_eq!((got, resp["error"]["code"].as_str()), (400, Some("invalid_query")));
        // Nothing was stored by any of them.
        let list = idem.list(&ListQuery::default()).await.unwrap();
        assert_eq!(list.transactions.len(), 0, "{b}: {list:?}");
    })
    .await;
}

/// Branches registered in the create request itself (idem-client registers them one by
/// one): raw, but for the application's submit and read.
#[tokio::test]
async fn tcc_branches_can_be_registered_with_the_transaction() {
    each_backend("tcc_branches_with_create", |idem, api, p, b| async move {
        let body = json!({"gid": "tcc-one-shot", "kind": "tcc",
                          "branches": [tcc_branch(&p, "inventory"), tcc_branch(&p, "payment")]});
        let (code, tx) = api.post("/api/v1/transactions", body.clone()).await;
        assert_eq!(code, 201, "{b}: {tx}");
        assert_eq!(tx["branches"].as_array().unwrap().len(), 4, "{b}: {tx:#}");
        // A repeat is harmless; registering one of them again separately too.
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 200);
        let (code, _) = api.post("/api/v1/transactions/tcc-one-shot/branches", tcc_branch(&p, "payment")).await;
        assert_eq!(code, 200, "{b}");
        let tx = idem.submit("tcc-one-shot", true).await.unwrap();
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        assert_eq!(p.paths("tcc-one-shot").len(), 2);

        let twice = json!({"gid": "dup-branch", "kind": "tcc", "branches": [tcc_branch(&p, "a"), tcc_branch(&p, "a")]});
        let (code, err) = api.post("/api/v1/transactions", twice).await;
        assert_eq!((code, err["error"]["code"].as_str()), (400, Some("invalid_request")), "{b}: {err}");
        let saga = json!({"gid": "saga-branches", "kind": "saga", "steps": saga_steps(&p, 1), "branches": [tcc_branch(&p, "a")]});
        assert_eq!(api.post("/api/v1/transactions", saga).await.0, 400);
        let mut bad = tcc_branch(&p, "a");
        bad["confirm"] = json!("nope");
        let (code, err) = api.post("/api/v1/transactions", json!({"gid": "bad-url", "kind": "tcc", "branches": [bad]})).await;
        assert_eq!((code, err["error"]["code"].as_str()), (400, Some("invalid_url")), "{b}");
        let stored = idem.get("bad-url").await;
        assert_eq!(refusal(&stored).map(|r| r.0), Some(404), "{b}: nothing stored");
    })
    .await;
}

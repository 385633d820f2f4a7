//! The typed client (`idem-client`) against a real coordinator and participants over
//! HTTP, on SQLite, PostgreSQL and MariaDB: every kind of transaction, its views parsed,
//! the API's codes in its errors, and its retries with the same gid absorbed.

use crate::common;

use std::time::Duration;

use common::recorder::Recorder;
use idem_client::{Action, BranchStatus, Client, Error, Kind, ListQuery, Status, TryOutcome};
use serde_json::json;

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Client, Recorder) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in idem_participant::testing::all(test).await {
        let server = common::coordinator(&db.url).await;
        let participant = Recorder::start().await;
        body(Client::new(&server.url()).unwrap(), participant).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

#[tokio::test]
async fn sagas_tccs_and_messages_through_the_typed_client() {
    each_backend("client_kinds", |idem, p| async move {
        let saga = idem
            .saga("c-saga")
            .step(p.url("/a1"), p.url("/c1"), json!({"n": 1}))
            .step(p.url("/a2"), p.url("/c2"), json!({"n": 2}))
            .wait_result(true)
            .create()
            .await
            .unwrap();
        assert_eq!((saga.kind, saga.status), (Kind::Saga, Status::Succeeded));
        assert_eq!(saga.branches.len(), 4);
        let action = saga
            .branches
            .iter()
            .find(|b| b.action == Action::Action && b.branch_id == "02")
            .unwrap();
        assert_eq!(action.status, BranchStatus::Succeeded);
        assert_eq!(action.payload, r#"{"n":2}"#);

        let tcc = idem.tcc("c-tcc").create().await.unwrap();
        let tried = tcc
            .register_with_try(
                "01",
                &p.url("/try"),
                &p.url("/confirm"),
                &p.url("/cancel"),
                json!({"sku": "apple"}),
            )
            .await
            .unwrap();
        assert_eq!(tried, TryOutcome::Succeeded);
        let done = tcc.submit(true).await.unwrap();
        assert_eq!(done.status, Status::Succeeded);
        assert_eq!(p.count("c-tcc", "/confirm"), 1);

        let msg = idem
            .msg("c-msg")
            .step(p.url("/deliver"), json!({"to": "x"}))
            .query_prepared(p.url("/check"))
            .prepare()
            .await
            .unwrap();
        assert_eq!((msg.kind, msg.status), (Kind::Msg, Status::Prepared));
        let sent = idem.submit("c-msg", true).await.unwrap();
        assert_eq!(sent.status, Status::Succeeded);

        let page = idem
            .list(&ListQuery {
                kind: Some(Kind::Tcc),
                ..ListQuery::default()
            })
            .await
            .unwrap();
        let gids: Vec<&str> = page.transactions.iter().map(|t| t.gid.as_str()).collect();
        assert_eq!(gids, ["c-tcc"]);
    })
    .await;
}

#[tokio::test]
async fn errors_carry_the_apis_codes_and_operator_actions_return_views() {
    each_backend("client_errors", |idem, p| async move {
        idem.saga("c-one")
            .step(p.url("/a"), p.url("/c"), json!({}))
            .wait_result(true)
            .create()
            .await
            .unwrap();
        // The same gid with another request.
        let err = idem
            .saga("c-one")
            .step(p.url("/other"), p.url("/c"), json!({}))
            .create()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Api { status: 409, code, .. } if code == "gid_conflict"),
            "{err:?}"
        );
        assert!(!err.may_succeed_on_retry());
        let err = idem.get("c-none").await.unwrap_err();
        assert_eq!(err.code(), Some("not_found"));

        // A compensation that keeps failing stalls the saga; the operator's retry after
        // the participant healed ends it.
        p.answer("/fail", None, 1_000, 409);
        p.answer("/undo", None, 1_000, 500);
        let stalled = idem
            .saga("c-stall")
            .step(p.url("/ok"), p.url("/undo"), json!({}))
            .step(p.url("/fail"), p.url("/undo2"), json!({}))
            .wait_result(true)
            .create()
            .await
            .unwrap();
        assert_eq!(stalled.status, Status::Stalled, "{stalled:?}");
        let shown = idem.get("c-stall").await.unwrap();
        assert!(
            shown.history.as_ref().is_some_and(|h| h.len() >= 5),
            "every failed call is in the history: {shown:?}"
        );
        p.heal();
        idem.retry("c-stall").await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = idem.get("c-stall").await.unwrap();
            if now.status == Status::Failed {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{now:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// Clients that all time out and resend the same saga at once: the coordinator runs it
/// once and every client gets the same transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_repeats_of_one_create_run_it_once() {
    each_backend("client_repeats", |idem, p| async move {
        let sends = (0..8).map(|_| {
            idem.saga("c-race")
                .step(p.url("/a"), p.url("/c"), json!({"n": 1}))
                .wait_result(true)
                .send()
        });
        let answers = futures::future::join_all(sends).await;
        for answer in &answers {
            let view = &answer.as_ref().unwrap().view;
            assert_eq!(
                (view.gid.as_str(), view.status),
                ("c-race", Status::Succeeded)
            );
        }
        // One of them created it (201); the others were told it existed (200).
        let new = answers.iter().filter(|a| a.as_ref().unwrap().new).count();
        assert_eq!(new, 1, "{answers:?}");
        assert_eq!(
            p.count("c-race", "/a"),
            1,
            "one action call: {:?}",
            p.paths("c-race")
        );
    })
    .await;
}

/// A Try the coordinator called comes back as its outcome, not as an error; branches
/// listed at creation are registered with it; an abort can wait for its Cancels; the raw
/// answers are the views' JSON.
#[tokio::test]
async fn try_outcomes_branches_at_creation_and_raw_answers() {
    each_backend("client_tries", |idem, p| async move {
        let tcc = idem
            .tcc("c-refused")
            .branch("01", p.url("/confirm"), p.url("/cancel"), json!({"n": 1}))
            .create()
            .await
            .unwrap();
        p.answer("/try2", None, 1, 409);
        let tried = tcc
            .register_with_try(
                "02",
                &p.url("/try2"),
                &p.url("/confirm2"),
                &p.url("/cancel2"),
                json!({}),
            )
            .await
            .unwrap();
        assert_eq!(tried.label(), "failure", "{tried:?}");
        assert!(
            matches!(&tried, TryOutcome::Failed(d) if d.contains("409")),
            "{tried:?}"
        );
        // A registration refused is an error, not a Try's outcome.
        let err = tcc
            .register_with_try(
                "02",
                &p.url("/other"),
                &p.url("/c"),
                &p.url("/c"),
                json!({}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some("branch_conflict"), "{err:?}");
        let done = tcc.abort(Some("a Try refused"), true).await.unwrap();
        assert_eq!(done.status, Status::Failed, "{done:?}");
        assert_eq!(done.reason.as_deref(), Some("a Try refused"));
        assert_eq!(
            p.count("c-refused", "/cancel"),
            1,
            "{:?}",
            p.paths("c-refused")
        );
        assert_eq!(
            p.count("c-refused", "/cancel2"),
            1,
            "{:?}",
            p.paths("c-refused")
        );

        let typed = idem.get("c-refused").await.unwrap();
        let raw = idem.raw().get("c-refused").await.unwrap();
        assert_eq!(raw, serde_json::to_value(&typed).unwrap());
        let page = idem.raw().list(&ListQuery::default()).await.unwrap();
        assert_eq!(page["transactions"][0]["gid"], "c-refused", "{page}");
        let err = idem.raw().retry("c-refused").await.unwrap_err();
        assert!(
            err.is_from_api() && err.code() == Some("invalid_state"),
            "{err:?}"
        );
        assert!(
            idem.metrics()
                .await
                .unwrap()
                .contains("idem_transactions_total")
        );
    })
    .await;
}

/// The client comes back no sooner than a `429`'s `Retry-After` asks (here the tenant's rate
/// is one request a second), and gets through then; a client whose `max_delay` is shorter
/// than what it was asked to wait gets the refusal instead of waiting.
#[tokio::test]
async fn a_refusal_with_retry_after_is_repeated_no_sooner_than_asked() {
    let db = idem_participant::testing::TestDatabase::create(
        idem_participant::testing::Backend::Sqlite,
        "client_retry_after",
    )
    .await;
    let server = common::coordinator_with(&db.url, |c| {
        c.rate_limit = idem::api::rate_limit::RateLimitConfig {
            per_second: 1,
            burst: 1,
        };
    })
    .await;
    let p = Recorder::start().await;
    let patient = Client::new(&server.url()).unwrap();
    let impatient = Client::new(&server.url())
        .unwrap()
        .retry_policy(idem_client::RetryPolicy {
            max_delay: Duration::from_millis(500),
            ..idem_client::RetryPolicy::default()
        });
    let saga = |idem: &Client, gid: &str| {
        idem.saga(gid)
            .step(p.url("/a"), p.url("/c"), json!({}))
            .send()
    };
    saga(&patient, "first").await.unwrap();
    // The bucket is empty: the next request is refused with `Retry-After: 1`.
    let refused = saga(&impatient, "impatient").await;
    assert!(
        matches!(&refused, Err(Error::Api { status: 429, code, .. }) if code == "rate_limited"),
        "{refused:?}"
    );
    let started = std::time::Instant::now();
    let created = saga(&patient, "second").await.unwrap();
    assert!(created.new);
    // Both the impatient request and the patient one's first try were refused.
    let metrics = reqwest::get(format!("{}/metrics", server.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refusals = metrics
        .lines()
        .find_map(|l| l.strip_prefix("idem_rate_limited_total"))
        .and_then(|rest| rest.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(refusals, Some(2.0), "{metrics}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "came back after {:?}, sooner than the second it was asked to wait",
        started.elapsed()
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

//! Every transaction ends terminal or visibly stalled within its policy, as a user meets
//! it: real `idem serve` processes on SQLite, PostgreSQL and MariaDB, real HTTP
//! participants that keep failing, several branches at once. The application and the
//! operator use the typed client; DTM's front door is reached with the raw helper.

use crate::common;

use std::time::Duration;

use common::recorder::Recorder;
use common::typed::{
    self, created, created_tcc, refusal, register, register_with_try, wait_status,
};
use common::{Api, Child, idem_cli};
use idem_client::{Action, BranchStatus, Client, ListQuery, Options, Status};
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(40);

/// Runs `body` once per backend against a fresh database and a fresh `idem serve`.
async fn each_backend<F, Fut>(test: &str, extra: &[&str], body: F)
where
    F: Fn(Client, Api, Recorder, TestDatabase) -> Fut,
    Fut: std::future::Future<Output = TestDatabase>,
{
    for db in testing::all(test).await {
        let server = Child::serve(&db.url, test, extra).await;
        let participant = Recorder::start().await;
        let idem = typed::client(&server.url);
        let db = body(idem, Api::new(server.url.clone()), participant, db).await;
        drop(server);
        db.drop_database().await;
    }
}

const FOREVER: usize = 1_000_000;

/// Seen: a TCC with two branches whose Confirms always answer 500 stayed `committing`
/// forever, calling the Confirms on every recovery cycle.
#[tokio::test]
async fn two_confirms_that_always_fail_stall_and_the_operator_resumes_them() {
    each_backend("two_confirms_stall", &[], |idem, _, p, db| async move {
        let b = db.backend;
        for id in ["a", "b"] {
            p.answer(&format!("/{id}/confirm"), None, FOREVER, 500);
        }
        let options = Options {
            max_attempts: Some(3),
            retry_interval_ms: Some(100),
            ..Options::default()
        };
        let tcc = idem
            .tcc("two-confirms")
            .options(options)
            .create()
            .await
            .map(created_tcc);
        assert!(tcc.is_ok(), "{b}: {tcc:?}");
        let tcc = tcc.unwrap();
        for id in ["a", "b"] {
            register(&tcc, &p, id).await.unwrap();
        }
        tcc.submit(false).await.unwrap();
        let tx = wait_status(&idem, "two-confirms", &[Status::Stalled], WAIT).await;
        assert_eq!(tx.stalled_from, Some(Status::Committing), "{b}: {tx:#?}");
        assert_eq!(tx.next_attempt_at, None, "{b}: nothing scheduled");
        assert_eq!(tx.attempts, 6, "{b}: {tx:#?}");
        for branch in &tx.branches {
            if branch.action == Action::Confirm {
                assert_eq!(
                    (branch.status, branch.attempts),
                    (BranchStatus::Stalled, 3),
                    "{b}"
                );
            }
        }
        // The stall is stored after the round that used up the attempts: exactly 3 each.
        assert_eq!(
            (
                p.count("two-confirms", "/a/confirm"),
                p.count("two-confirms", "/b/confirm")
            ),
            (3, 3),
            "{b}"
        );
        // Visible where the operator looks.
        let list = idem_cli(&[
            "tx",
            "list",
            "--database-url",
            &db.url,
            "--status",
            "stalled",
        ]);
        assert!(list.contains("two-confirms"), "{b}: {list}");
        let stalled = ListQuery {
            status: Some(Status::Stalled),
            ..ListQuery::default()
        };
        let page = idem.list(&stalled).await;
        assert!(page.is_ok(), "{b}: {page:?}");
        let first = page.unwrap().transactions.into_iter().next().map(|t| t.gid);
        assert_eq!(first.as_deref(), Some("two-confirms"), "{b}");

        // The participant comes back; the operator's retry finishes it.
        p.heal();
        let retried = idem.retry("two-confirms").await;
        assert!(retried.is_ok(), "{b}: {retried:?}");
        wait_status(&idem, "two-confirms", &[Status::Succeeded], WAIT).await;
        assert_eq!(
            (
                p.count("two-confirms", "/a/confirm"),
                p.count("two-confirms", "/b/confirm")
            ),
            (4, 4),
            "{b}"
        );
        db
    })
    .await;
}

/// Seen: three branches whose Cancels always fail after an abort, through DTM's API
/// (`retry_limit: 3, retry_interval: 1`), stayed `aborting` forever.
#[tokio::test]
async fn three_cancels_that_always_fail_stall_through_the_dtm_api() {
    each_backend("three_cancels_stall_dtm", &[], |idem, api, p, db| async move {
        let b = db.backend;
        let gid = "dtm-cancels";
        let (code, body) = api
            .post("/api/dtmsvr/prepare", json!({"gid": gid, "trans_type": "tcc", "retry_limit": 3, "retry_interval": 1}))
            .await;
        assert_eq!(code, 200, "{b}: {body}");
        for id in ["a", "b", "c"] {
            p.answer(&format!("/{id}/cancel"), None, FOREVER, 503);
            let reg = json!({
                "gid": gid, "trans_type": "tcc", "branch_id": id, "data": "{}",
                "confirm": p.url(&format!("/{id}/confirm")), "cancel": p.url(&format!("/{id}/cancel")),
            });
            assert_eq!(api.post("/api/dtmsvr/registerBranch", reg).await.0, 200, "{b}");
        }
        let abort = json!({"gid": gid, "trans_type": "tcc", "retry_limit": 3, "retry_interval": 1});
        assert_eq!(api.post("/api/dtmsvr/abort", abort).await.0, 200, "{b}");
        let tx = wait_status(&idem, gid, &[Status::Stalled], WAIT).await;
        assert_eq!(tx.stalled_from, Some(Status::Aborting), "{b}");
        for id in ["a", "b", "c"] {
            assert_eq!(p.count(gid, &format!("/{id}/cancel")), 3, "{b}: {id}");
        }
        assert_eq!(p.count(gid, "/confirm"), 0, "{b}: nothing confirmed");
        let (_, q) = api.get(&format!("/api/dtmsvr/query?gid={gid}")).await;
        assert_eq!(q["transaction"]["status"], "stalled", "{b}: {q:#}");
        db
    })
    .await;
}

/// Seen: a concurrent saga whose two compensations always fail stayed `aborting`.
#[tokio::test]
async fn a_concurrent_saga_whose_compensations_always_fail_stalls() {
    each_backend(
        "saga_compensations_stall",
        &[],
        |idem, _, p, db| async move {
            let b = db.backend;
            let gid = "saga-comp";
            p.answer("/s3/action", None, FOREVER, 409);
            p.answer("/s1/compensate", None, FOREVER, 500);
            p.answer("/s2/compensate", None, FOREVER, 500);
            let options = Options {
                max_attempts: Some(3),
                retry_interval_ms: Some(50),
                concurrent: true,
                orders: [("2".to_owned(), vec![0, 1])].into(),
                ..Options::default()
            };
            let saga = (1..=3).fold(idem.saga(gid).options(options), |saga, i| {
                saga.step(
                    p.url(&format!("/s{i}/action")),
                    p.url(&format!("/s{i}/compensate")),
                    Value::Null,
                )
            });
            let created = saga.send().await.map(created);
            assert!(created.is_ok(), "{b}: {created:?}");
            let tx = wait_status(&idem, gid, &[Status::Stalled], WAIT).await;
            assert_eq!(tx.stalled_from, Some(Status::Aborting), "{b}: {tx:#?}");
            assert_eq!(
                (
                    p.count(gid, "/s1/compensate"),
                    p.count(gid, "/s2/compensate")
                ),
                (3, 3),
                "{b}"
            );
            assert_eq!(
                p.count(gid, "/s3/compensate"),
                1,
                "{b}: the refused step is compensated once"
            );
            p.heal();
            idem.retry(gid).await.unwrap();
            let tx = wait_status(&idem, gid, &[Status::Failed], WAIT).await;
            assert!(
                tx.reason.as_deref().unwrap().contains("03/action failed"),
                "{b}: {tx:#?}"
            );
            db
        },
    )
    .await;
}

/// Seen: a step answering 425 (or, through DTM's API, any answer containing `ONGOING`,
/// even a 500) was asked again forever when no global timeout was set.
#[tokio::test]
async fn in_progress_answers_are_bounded_by_max_in_progress() {
    each_backend(
        "in_progress_bounded",
        &["--max-in-progress-ms", "1500"],
        |idem, api, p, db| async move {
            let b = db.backend;
            let capped = || Options {
                max_in_progress_ms: Some(800),
                ..Options::default()
            };
            // A saga step that is "in progress" forever is compensated.
            p.answer("/slow/action", None, FOREVER, 425);
            idem.saga("slow-saga")
                .step(
                    p.url("/slow/action"),
                    p.url("/slow/compensate"),
                    Value::Null,
                )
                .options(capped())
                .send()
                .await
                .map(created)
                .unwrap();
            let tx = wait_status(&idem, "slow-saga", &[Status::Failed], WAIT).await;
            assert!(
                tx.reason.as_deref().unwrap().contains("still in progress"),
                "{b}: {tx:#?}"
            );
            assert_eq!(p.count("slow-saga", "/slow/compensate"), 1, "{b}");

            // A Confirm in progress forever stalls, visibly.
            p.answer("/a/confirm", Some("slow-tcc"), FOREVER, 425);
            let tcc = idem
                .tcc("slow-tcc")
                .options(capped())
                .create()
                .await
                .map(created_tcc)
                .unwrap();
            register(&tcc, &p, "a").await.unwrap();
            tcc.submit(false).await.unwrap();
            let tx = wait_status(&idem, "slow-tcc", &[Status::Stalled], WAIT).await;
            assert!(
                tx.last_error
                    .as_deref()
                    .unwrap()
                    .contains("still in progress"),
                "{b}: {tx:#?}"
            );

            // DTM: a 500 whose body says ONGOING, under the server's default cap.
            p.answer_body("/dtm/action", FOREVER, 500, r#"{"dtm_result":"ONGOING"}"#);
            let submit = json!({
                "gid": "dtm-ongoing", "trans_type": "saga",
                "steps": [{"action": p.url("/dtm/action"), "compensate": p.url("/dtm/compensate")}],
                "payloads": ["{}"],
            });
            assert_eq!(api.post("/api/dtmsvr/submit", submit).await.0, 200, "{b}");
            let tx = wait_status(&idem, "dtm-ongoing", &[Status::Failed], WAIT).await;
            assert_eq!(
                tx.options.max_in_progress_ms, 1500,
                "{b}: the server default"
            );
            db
        },
    )
    .await;
}

/// Seen: a msg created without `query_prepared` and never submitted stayed `prepared`
/// past its timeout, its row rewritten every second.
#[tokio::test]
async fn a_msg_without_back_check_fails_at_its_timeout_and_rests() {
    each_backend("msg_without_back_check", &[], |idem, _, p, db| async move {
        let b = db.backend;
        let options = Options {
            timeout_ms: Some(1000),
            ..Options::default()
        };
        let prepared = idem
            .msg("lonely-msg")
            .step(p.url("/m/action"), Value::Null)
            .options(options)
            .send()
            .await
            .map(created);
        assert!(prepared.is_ok(), "{b}: {prepared:?}");
        let tx = wait_status(&idem, "lonely-msg", &[Status::Failed], WAIT).await;
        assert!(
            tx.reason.as_deref().unwrap().contains("no query_prepared"),
            "{b}: {tx:#?}"
        );
        assert_eq!(tx.next_attempt_at, None, "{b}");
        assert_eq!(
            Some(tx.updated_at),
            tx.finished_at,
            "{b}: not written after it failed"
        );
        assert!(p.calls().is_empty(), "{b}: the message was not delivered");
        db
    })
    .await;
}

/// Seen: a branch whose Try idem called answered 409, and a later submit answered 200
/// and confirmed both branches.
#[tokio::test]
async fn submit_is_refused_when_a_try_failed_or_is_unsettled() {
    each_backend(
        "submit_refused_after_try",
        &[],
        |idem, _, p, db| async move {
            let b = db.backend;
            for (gid, try_status, code) in [
                ("try-refused", 409, "try_failed"),
                ("try-unknown", 500, "try_not_succeeded"),
            ] {
                let tcc = idem.tcc(gid).create().await.map(created_tcc).unwrap();
                let good = register_with_try(&tcc, &p, "good").await;
                assert!(good.is_ok(), "{b}: {good:?}");
                p.answer("/bad/try", Some(gid), 1, try_status);
                let bad = register_with_try(&tcc, &p, "bad").await;
                assert!(bad.is_err(), "{b}: the Try's refusal reaches the client");
                let refused = tcc.submit(false).await;
                assert_eq!(refusal(&refused), Some((409, code)), "{b}: {refused:?}");
                let tx = idem.get(gid).await.unwrap();
                assert_eq!(tx.status, Status::Prepared, "{b}: nothing changed");
                assert_eq!(p.count(gid, "/confirm"), 0, "{b}: nothing confirmed");
                // What the client does instead: abort; every branch is cancelled.
                let tx = typed::operate_waiting(&idem, gid, "abort", None).await;
                assert_eq!(
                    tx.as_ref().map(|t| t.status),
                    Ok(Status::Failed),
                    "{b}: {tx:?}"
                );
                assert_eq!(p.count(gid, "/cancel"), 2, "{b}");
            }
            // An unknown Try called again successfully (registering again calls it) lets the
            // commit through.
            let gid = "try-again";
            let tcc = idem.tcc(gid).create().await.map(created_tcc).unwrap();
            p.answer("/flaky/try", Some(gid), 1, 503);
            let unknown = register_with_try(&tcc, &p, "flaky").await;
            assert_eq!(
                refusal(&unknown).map(|r| r.0),
                Some(502),
                "{b}: {unknown:?}"
            );
            let again = register_with_try(&tcc, &p, "flaky").await;
            assert!(again.is_ok(), "{b}: {again:?}");
            let tx = tcc.submit(true).await;
            assert_eq!(
                tx.as_ref().map(|t| t.status),
                Ok(Status::Succeeded),
                "{b}: {tx:?}"
            );
            db
        },
    )
    .await;
}

/// A trigger that refuses any branch row whose error is a 418 answer (a status nothing
/// else in the test answers; an answer's body never reaches the error): a write the
/// database refuses for its content, every time.
async fn poison_branch_writes(db: &TestDatabase) {
    use sqlx::Connection;
    match db.backend {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql(
                "CREATE TRIGGER poison BEFORE UPDATE ON idem_branch WHEN NEW.last_error LIKE '%HTTP 418%' \
                 BEGIN SELECT RAISE(ABORT, 'poisoned row'); END",
            )
            .execute(&mut c)
            .await
            .unwrap();
        }
        Backend::Postgres => {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql(
                "CREATE FUNCTION poison() RETURNS trigger AS $$ BEGIN \
                   IF NEW.last_error LIKE '%HTTP 418%' THEN RAISE EXCEPTION 'poisoned row' USING ERRCODE = '22001'; END IF; \
                   RETURN NEW; END $$ LANGUAGE plpgsql; \
                 CREATE TRIGGER poison BEFORE UPDATE ON idem_branch FOR EACH ROW EXECUTE FUNCTION poison();",
            )
            .execute(&mut c)
            .await
            .unwrap();
        }
        Backend::Mysql => {
            let mut c = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql(
                "CREATE TRIGGER poison BEFORE UPDATE ON idem_branch FOR EACH ROW BEGIN \
                   IF NEW.last_error LIKE '%HTTP 418%' THEN SIGNAL SQLSTATE '22001' SET MESSAGE_TEXT = 'poisoned row'; END IF; \
                 END",
            )
            .execute(&mut c)
            .await
            .unwrap();
        }
    }
}

/// Seen: a saga whose failure could not be stored (MariaDB refused the error text) stayed
/// `running` and was re-sent on every recovery cycle past `max_attempts`. Any write the
/// database refuses for good must end in `stalled` with the reason.
#[tokio::test]
async fn a_write_the_database_refuses_for_good_stalls_with_the_reason() {
    each_backend("refused_write_stalls", &[], |idem, _, p, db| async move {
        let b = db.backend;
        poison_branch_writes(&db).await;
        p.answer("/s1/action", None, 1, 418);
        let options = Options {
            max_attempts: Some(3),
            ..Options::default()
        };
        let created = idem
            .saga("poisoned")
            .step(p.url("/s1/action"), p.url("/s1/compensate"), Value::Null)
            .options(options)
            .send()
            .await
            .map(created);
        assert!(created.is_ok(), "{b}: {created:?}");
        let tx = wait_status(&idem, "poisoned", &[Status::Stalled], WAIT).await;
        let error = tx.last_error.as_deref().unwrap();
        assert!(
            error.contains("cannot store progress") && error.contains("poisoned row"),
            "{b}: {error}"
        );
        assert_eq!(tx.stalled_from, Some(Status::Running), "{b}");
        assert_eq!(p.count("poisoned", "/s1/action"), 1, "{b}: not re-sent");
        // The operator fixes the cause and resumes: the step runs again and succeeds.
        let retried = idem.retry("poisoned").await;
        assert!(retried.is_ok(), "{b}: {retried:?}");
        wait_status(&idem, "poisoned", &[Status::Succeeded], WAIT).await;
        db
    })
    .await;
}

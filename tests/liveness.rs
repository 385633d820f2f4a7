//! Every transaction ends terminal or visibly stalled within its policy, as a user meets
//! it: real `idem serve` processes on SQLite, PostgreSQL and MariaDB, real HTTP
//! participants that keep failing, several branches at once.

mod common;

use std::time::Duration;

use common::recorder::Recorder;
use common::{Api, Child, idem_cli};
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(40);

/// Runs `body` once per backend against a fresh database and a fresh `idem serve`.
async fn each_backend<F, Fut>(test: &str, extra: &[&str], body: F)
where
    F: Fn(Api, Recorder, TestDatabase) -> Fut,
    Fut: std::future::Future<Output = TestDatabase>,
{
    for db in testing::all(test).await {
        let server = Child::serve(&db.url, test, extra);
        let participant = Recorder::start().await;
        let db = body(Api::new(server.url.clone()), participant, db).await;
        drop(server);
        db.drop_database().await;
    }
}

fn branch(p: &Recorder, id: &str) -> Value {
    json!({
        "branch_id": id,
        "confirm": p.url(&format!("/{id}/confirm")),
        "cancel": p.url(&format!("/{id}/cancel")),
        "payload": {"branch": id},
    })
}

const FOREVER: usize = 1_000_000;

/// Seen: a TCC with two branches whose Confirms always answer 500 stayed `committing`
/// forever, calling the Confirms on every recovery cycle.
#[tokio::test]
async fn two_confirms_that_always_fail_stall_and_the_operator_resumes_them() {
    each_backend("two_confirms_stall", &[], |api, p, db| async move {
        let b = db.backend;
        for id in ["a", "b"] {
            p.answer(&format!("/{id}/confirm"), None, FOREVER, 500);
        }
        let body = json!({
            "gid": "two-confirms", "kind": "tcc",
            "branches": [branch(&p, "a"), branch(&p, "b")],
            "options": {"max_attempts": 3, "retry_interval_ms": 100},
        });
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201, "{b}");
        api.post("/api/v1/transactions/two-confirms/submit", json!({}))
            .await;
        let tx = api.wait_status("two-confirms", &["stalled"], WAIT).await;
        assert_eq!(tx["stalled_from"], "committing", "{b}: {tx:#}");
        assert_eq!(tx["next_attempt_at"], Value::Null, "{b}: nothing scheduled");
        assert_eq!(tx["attempts"], 6, "{b}: {tx:#}");
        for branch in tx["branches"].as_array().unwrap() {
            if branch["action"] == "confirm" {
                assert_eq!(
                    (branch["status"].as_str(), branch["attempts"].as_i64()),
                    (Some("stalled"), Some(3)),
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
        let (code, page) = api.get("/api/v1/transactions?status=stalled").await;
        assert_eq!(code, 200);
        assert_eq!(page["transactions"][0]["gid"], "two-confirms", "{b}");

        // The participant comes back; the operator's retry finishes it.
        p.heal();
        let (code, _) = api
            .post("/api/v1/transactions/two-confirms/retry", json!({}))
            .await;
        assert_eq!(code, 200, "{b}");
        api.wait_status("two-confirms", &["succeeded"], WAIT).await;
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
    each_backend("three_cancels_stall_dtm", &[], |api, p, db| async move {
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
        let tx = api.wait_status(gid, &["stalled"], WAIT).await;
        assert_eq!(tx["stalled_from"], "aborting", "{b}");
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
    each_backend("saga_compensations_stall", &[], |api, p, db| async move {
        let b = db.backend;
        let gid = "saga-comp";
        p.answer("/s3/action", None, FOREVER, 409);
        p.answer("/s1/compensate", None, FOREVER, 500);
        p.answer("/s2/compensate", None, FOREVER, 500);
        let steps: Vec<Value> = (1..=3)
            .map(|i| json!({"action": p.url(&format!("/s{i}/action")), "compensate": p.url(&format!("/s{i}/compensate"))}))
            .collect();
        let body = json!({
            "gid": gid, "kind": "saga", "steps": steps,
            "options": {"max_attempts": 3, "retry_interval_ms": 50, "concurrent": true, "orders": {"2": [0, 1]}},
        });
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201, "{b}");
        let tx = api.wait_status(gid, &["stalled"], WAIT).await;
        assert_eq!(tx["stalled_from"], "aborting", "{b}: {tx:#}");
        assert_eq!((p.count(gid, "/s1/compensate"), p.count(gid, "/s2/compensate")), (3, 3), "{b}");
        assert_eq!(p.count(gid, "/s3/compensate"), 1, "{b}: the refused step is compensated once");
        p.heal();
        api.post(&format!("/api/v1/transactions/{gid}/retry"), json!({})).await;
        let tx = api.wait_status(gid, &["failed"], WAIT).await;
        assert!(tx["reason"].as_str().unwrap().contains("03/action failed"), "{b}: {tx:#}");
        db
    })
    .await;
}

/// Seen: a step answering 425 (or, through DTM's API, any answer containing `ONGOING`,
/// even a 500) was asked again forever when no global timeout was set.
#[tokio::test]
async fn in_progress_answers_are_bounded_by_max_in_progress() {
    each_backend("in_progress_bounded", &["--max-in-progress-ms", "1500"], |api, p, db| async move {
        let b = db.backend;
        // A saga step that is "in progress" forever is compensated.
        p.answer("/slow/action", None, FOREVER, 425);
        let steps = json!([{"action": p.url("/slow/action"), "compensate": p.url("/slow/compensate")}]);
        let body = json!({"gid": "slow-saga", "kind": "saga", "steps": steps, "options": {"max_in_progress_ms": 800}});
        api.post("/api/v1/transactions", body).await;
        let tx = api.wait_status("slow-saga", &["failed"], WAIT).await;
        assert!(tx["reason"].as_str().unwrap().contains("still in progress"), "{b}: {tx:#}");
        assert_eq!(p.count("slow-saga", "/slow/compensate"), 1, "{b}");

        // A Confirm in progress forever stalls, visibly.
        p.answer("/a/confirm", Some("slow-tcc"), FOREVER, 425);
        let body = json!({"gid": "slow-tcc", "kind": "tcc", "branches": [branch(&p, "a")], "options": {"max_in_progress_ms": 800}});
        api.post("/api/v1/transactions", body).await;
        api.post("/api/v1/transactions/slow-tcc/submit", json!({})).await;
        let tx = api.wait_status("slow-tcc", &["stalled"], WAIT).await;
        assert!(tx["last_error"].as_str().unwrap().contains("still in progress"), "{b}: {tx:#}");

        // DTM: a 500 whose body says ONGOING, under the server's default cap.
        p.answer_body("/dtm/action", FOREVER, 500, r#"{"dtm_result":"ONGOING"}"#);
        let submit = json!({
            "gid": "dtm-ongoing", "trans_type": "saga",
            "steps": [{"action": p.url("/dtm/action"), "compensate": p.url("/dtm/compensate")}],
            "payloads": ["{}"],
        });
        assert_eq!(api.post("/api/dtmsvr/submit", submit).await.0, 200, "{b}");
        let tx = api.wait_status("dtm-ongoing", &["failed"], WAIT).await;
        assert_eq!(tx["options"]["max_in_progress_ms"], 1500, "{b}: the server default");
        db
    })
    .await;
}

/// Seen: a msg created without `query_prepared` and never submitted stayed `prepared`
/// past its timeout, its row rewritten every second.
#[tokio::test]
async fn a_msg_without_back_check_fails_at_its_timeout_and_rests() {
    each_backend("msg_without_back_check", &[], |api, p, db| async move {
        let b = db.backend;
        let body = json!({
            "gid": "lonely-msg", "kind": "msg",
            "steps": [{"action": p.url("/m/action")}],
            "options": {"timeout_ms": 1000},
        });
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201, "{b}");
        let tx = api.wait_status("lonely-msg", &["failed"], WAIT).await;
        assert!(
            tx["reason"].as_str().unwrap().contains("no query_prepared"),
            "{b}: {tx:#}"
        );
        assert_eq!(tx["next_attempt_at"], Value::Null, "{b}");
        assert_eq!(
            tx["updated_at"], tx["finished_at"],
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
    each_backend("submit_refused_after_try", &[], |api, p, db| async move {
        let b = db.backend;
        for (gid, try_status, code) in [
            ("try-refused", 409, "try_failed"),
            ("try-unknown", 500, "try_not_succeeded"),
        ] {
            api.post("/api/v1/transactions", json!({"gid": gid, "kind": "tcc"}))
                .await;
            let mut good = branch(&p, "good");
            good["try"] = json!(p.url("/good/try"));
            let (c, _) = api
                .post(&format!("/api/v1/transactions/{gid}/branches"), good)
                .await;
            assert_eq!(c, 200, "{b}");
            p.answer("/bad/try", Some(gid), 1, try_status);
            let mut bad = branch(&p, "bad");
            bad["try"] = json!(p.url("/bad/try"));
            let (c, _) = api
                .post(&format!("/api/v1/transactions/{gid}/branches"), bad)
                .await;
            assert_ne!(c, 200, "{b}: the Try's refusal reaches the client");
            let (c, err) = api
                .post(&format!("/api/v1/transactions/{gid}/submit"), json!({}))
                .await;
            assert_eq!(
                (c, err["error"]["code"].as_str()),
                (409, Some(code)),
                "{b}: {err}"
            );
            let (_, tx) = api.get(&format!("/api/v1/transactions/{gid}")).await;
            assert_eq!(tx["status"], "prepared", "{b}: nothing changed");
            assert_eq!(p.count(gid, "/confirm"), 0, "{b}: nothing confirmed");
            // What the client does instead: abort; every branch is cancelled.
            let (c, tx) = api
                .post(
                    &format!("/api/v1/transactions/{gid}/abort"),
                    json!({"wait_result": true}),
                )
                .await;
            assert_eq!(
                (c, tx["status"].as_str()),
                (200, Some("failed")),
                "{b}: {tx}"
            );
            assert_eq!(p.count(gid, "/cancel"), 2, "{b}");
        }
        // An unknown Try called again successfully (registering again calls it) lets the
        // commit through.
        let gid = "try-again";
        api.post("/api/v1/transactions", json!({"gid": gid, "kind": "tcc"}))
            .await;
        let mut flaky = branch(&p, "flaky");
        flaky["try"] = json!(p.url("/flaky/try"));
        p.answer("/flaky/try", Some(gid), 1, 503);
        let path = format!("/api/v1/transactions/{gid}/branches");
        assert_eq!(api.post(&path, flaky.clone()).await.0, 502, "{b}");
        assert_eq!(api.post(&path, flaky).await.0, 200, "{b}");
        let (c, tx) = api
            .post(
                &format!("/api/v1/transactions/{gid}/submit"),
                json!({"wait_result": true}),
            )
            .await;
        assert_eq!(
            (c, tx["status"].as_str()),
            (200, Some("succeeded")),
            "{b}: {tx}"
        );
        db
    })
    .await;
}

/// A trigger that refuses any branch row whose error mentions POISON: a write the
/// database refuses for its content, every time.
async fn poison_branch_writes(db: &TestDatabase) {
    use sqlx::Connection;
    match db.backend {
        Backend::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::raw_sql(
                "CREATE TRIGGER poison BEFORE UPDATE ON idem_branch WHEN NEW.last_error LIKE '%POISON%' \
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
                   IF NEW.last_error LIKE '%POISON%' THEN RAISE EXCEPTION 'poisoned row' USING ERRCODE = '22001'; END IF; \
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
                   IF NEW.last_error LIKE '%POISON%' THEN SIGNAL SQLSTATE '22001' SET MESSAGE_TEXT = 'poisoned row'; END IF; \
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
    each_backend("refused_write_stalls", &[], |api, p, db| async move {
        let b = db.backend;
        poison_branch_writes(&db).await;
        p.answer_body("/s1/action", 1, 500, "POISON");
        let steps = json!([{"action": p.url("/s1/action"), "compensate": p.url("/s1/compensate")}]);
        let body = json!({"gid": "poisoned", "kind": "saga", "steps": steps, "options": {"max_attempts": 3}});
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201, "{b}");
        let tx = api.wait_status("poisoned", &["stalled"], WAIT).await;
        let error = tx["last_error"].as_str().unwrap();
        assert!(error.contains("cannot store progress") && error.contains("poisoned row"), "{b}: {error}");
        assert_eq!(tx["stalled_from"], "running", "{b}");
        assert_eq!(p.count("poisoned", "/s1/action"), 1, "{b}: not re-sent");
        // The operator fixes the cause and resumes: the step runs again and succeeds.
        let (code, _) = api.post("/api/v1/transactions/poisoned/retry", json!({})).await;
        assert_eq!(code, 200, "{b}");
        api.wait_status("poisoned", &["succeeded"], WAIT).await;
        db
    })
    .await;
}

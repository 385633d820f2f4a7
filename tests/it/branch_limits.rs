//! The cap on steps and branches per transaction, as a client hits it: over real HTTP,
//! through both front doors, on SQLite, PostgreSQL and MariaDB, for TCC branches
//! registered with the transaction, one by one, and at the same time. A refused request
//! answers `400 too_many_branches` and stores nothing.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::recorder::Recorder;
use common::{Api, Child};
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(20);
/// The cap of the in-process coordinators here.
const MAX: usize = 5;

struct Doors {
    native: Api,
    dtm: Api,
    p: Recorder,
    b: &'static str,
}

async fn each_backend<F, Fut>(test: &str, body: F)
where
    F: Fn(Doors) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for db in testing::all(test).await {
        let server = common::coordinator_with(&db.url, |c| c.connect.max_branches = MAX).await;
        let doors = Doors {
            native: Api::new(server.url()),
            dtm: Api::new(format!("{}/api/dtmsvr", server.url())),
            p: Recorder::start().await,
            b: db.backend.name(),
        };
        body(doors).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// Fails unless the answer is `400 too_many_branches` with a message, and no
/// `dtm_result` (DTM clients would read it as a business outcome).
fn refused(what: &str, (status, answer): (u16, Value)) {
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("too_many_branches")),
        "{what}: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(&MAX.to_string()), "{what}: {message}");
    assert!(answer.get("dtm_result").is_none(), "{what}: {answer}");
}

async fn assert_absent(d: &Doors, gid: &str) {
    let (status, _) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    assert_eq!(status, 404, "{}: {gid} was stored", d.b);
}

/// Distinct branch ids stored for `gid`.
async fn branch_ids(d: &Doors, gid: &str) -> BTreeSet<String> {
    let (_, tx) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    tx["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["branch_id"].as_str().unwrap().to_owned())
        .collect()
}

fn saga(p: &Recorder, gid: &str, n: usize) -> Value {
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"action": p.url(&format!("/a{i}")), "compensate": p.url("/c")}))
        .collect();
    json!({"gid": gid, "kind": "saga", "steps": steps})
}

fn msg(p: &Recorder, gid: &str, n: usize) -> Value {
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"action": p.url(&format!("/m{i}"))}))
        .collect();
    json!({"gid": gid, "kind": "msg", "steps": steps, "query_prepared": p.url("/q")})
}

fn tcc_branch(p: &Recorder, id: &str) -> Value {
    json!({"branch_id": id, "confirm": p.url("/confirm"), "cancel": p.url("/cancel")})
}

fn tcc(p: &Recorder, gid: &str, n: usize) -> Value {
    let branches: Vec<Value> = (0..n).map(|i| tcc_branch(p, &format!("b{i}"))).collect();
    json!({"gid": gid, "kind": "tcc", "branches": branches})
}

fn dtm(p: &Recorder, gid: &str, kind: &str, n: usize) -> Value {
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"action": p.url(&format!("/a{i}")), "compensate": p.url("/c")}))
        .collect();
    let payloads: Vec<&str> = vec!["{}"; n];
    json!({"gid": gid, "trans_type": kind, "steps": steps, "payloads": payloads,
           "query_prepared": p.url("/q")})
}

fn dtm_register(p: &Recorder, gid: &str, id: &str) -> Value {
    json!({"gid": gid, "branch_id": id, "trans_type": "tcc", "data": "{}",
           "confirm": p.url("/confirm"), "cancel": p.url("/cancel")})
}

#[tokio::test]
async fn transactions_created_past_the_limit_are_refused_through_both_doors() {
    each_backend("branch_limit_create", |d| async move {
        let b = d.b;
        let over = MAX + 1;
        let native = [
            ("saga", saga(&d.p, "n-saga", over)),
            ("msg", msg(&d.p, "n-msg", over)),
            ("tcc", tcc(&d.p, "n-tcc", over)),
        ];
        for (what, body) in native {
            let gid = body["gid"].as_str().unwrap().to_owned();
            refused(
                &format!("{b} native {what}"),
                d.native.post("/api/v1/transactions", body).await,
            );
            assert_absent(&d, &gid).await;
        }
        let doors = [
            ("/submit", dtm(&d.p, "d-saga", "saga", over)),
            ("/prepare", dtm(&d.p, "d-msg", "msg", over)),
            // DTM creates a msg submitted without a prepare.
            ("/submit", dtm(&d.p, "d-msg-submit", "msg", over)),
        ];
        for (path, body) in doors {
            let gid = body["gid"].as_str().unwrap().to_owned();
            refused(
                &format!("{b} DTM {path} {gid}"),
                d.dtm.post(path, body).await,
            );
            assert_absent(&d, &gid).await;
        }

        // At the limit, all of them are taken.
        for body in [
            saga(&d.p, "n-saga", MAX),
            msg(&d.p, "n-msg", MAX),
            tcc(&d.p, "n-tcc", MAX),
        ] {
            let (status, answer) = d.native.post("/api/v1/transactions", body).await;
            assert_eq!(status, 201, "{b}: {answer}");
        }
        assert_eq!(branch_ids(&d, "n-tcc").await.len(), MAX, "{b}");
        let (status, answer) = d
            .dtm
            .post("/submit", dtm(&d.p, "d-saga", "saga", MAX))
            .await;
        assert_eq!(status, 200, "{b}: {answer}");
        let (status, answer) = d.dtm.post("/prepare", dtm(&d.p, "d-msg", "msg", MAX)).await;
        assert_eq!(status, 200, "{b}: {answer}");
        d.native.wait_status("n-saga", &["succeeded"], WAIT).await;
        d.native.wait_status("d-saga", &["succeeded"], WAIT).await;
    })
    .await;
}

#[tokio::test]
async fn tcc_branches_registered_one_by_one_stop_at_the_limit() {
    each_backend("branch_limit_one_by_one", |d| async move {
        let b = d.b;
        // Created with two, then registered through either door.
        let (status, _) = d
            .native
            .post("/api/v1/transactions", tcc(&d.p, "t", 2))
            .await;
        assert_eq!(status, 201, "{b}");
        let path = "/api/v1/transactions/t/branches";
        assert_eq!(
            d.native.post(path, tcc_branch(&d.p, "n2")).await.0,
            200,
            "{b}"
        );
        assert_eq!(
            d.dtm
                .post("/registerBranch", dtm_register(&d.p, "t", "d3"))
                .await
                .0,
            200,
            "{b}"
        );
        assert_eq!(
            d.native.post(path, tcc_branch(&d.p, "n4")).await.0,
            200,
            "{b}"
        );
        assert_eq!(branch_ids(&d, "t").await.len(), MAX, "{b}");

        refused(
            &format!("{b} native"),
            d.native.post(path, tcc_branch(&d.p, "n5")).await,
        );
        let with_try = json!({"branch_id": "n6", "confirm": d.p.url("/confirm"),
                              "cancel": d.p.url("/cancel"), "try": d.p.url("/try")});
        refused(
            &format!("{b} native with try"),
            d.native.post(path, with_try).await,
        );
        refused(
            &format!("{b} DTM"),
            d.dtm
                .post("/registerBranch", dtm_register(&d.p, "t", "d5"))
                .await,
        );
        assert_eq!(d.p.count("t", "/try"), 0, "{b}: a refused Try was called");
        let ids = branch_ids(&d, "t").await;
        let expected: BTreeSet<String> = ["b0", "b1", "n2", "d3", "n4"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(ids, expected, "{b}");

        // A repeat of a registered branch adds nothing, so it is still harmless.
        assert_eq!(
            d.native.post(path, tcc_branch(&d.p, "n2")).await.0,
            200,
            "{b}"
        );
        let (status, answer) = d
            .native
            .post(
                "/api/v1/transactions/t/submit",
                json!({"wait_result": true}),
            )
            .await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some("succeeded")),
            "{b}: {answer}"
        );
        assert_eq!(d.p.count("t", "/confirm"), MAX, "{b}");

        // DTM's own prepare, then its registrations.
        let prepare = json!({"gid": "dt", "trans_type": "tcc"});
        assert_eq!(d.dtm.post("/prepare", prepare).await.0, 200, "{b}");
        for i in 0..MAX {
            let (status, answer) = d
                .dtm
                .post("/registerBranch", dtm_register(&d.p, "dt", &format!("{i}")))
                .await;
            assert_eq!(status, 200, "{b}: {answer}");
        }
        refused(
            &format!("{b} DTM prepared"),
            d.dtm
                .post("/registerBranch", dtm_register(&d.p, "dt", "x"))
                .await,
        );
        assert_eq!(branch_ids(&d, "dt").await.len(), MAX, "{b}");
    })
    .await;
}

#[tokio::test]
async fn concurrent_registrations_cannot_pass_the_limit_together() {
    each_backend("branch_limit_concurrent", |d| async move {
        let b = d.b;
        for round in 0..3 {
            let gid = format!("race-{round}");
            let (status, _) = d
                .native
                .post("/api/v1/transactions", tcc(&d.p, &gid, MAX - 1))
                .await;
            assert_eq!(status, 201, "{b}");
            // Sixteen new branches for the one place left, half through each door.
            let answers = futures::future::join_all((0..16).map(|i| {
                let (d, gid) = (&d, gid.clone());
                async move {
                    let id = format!("r{i}");
                    if i % 2 == 0 {
                        let path = format!("/api/v1/transactions/{gid}/branches");
                        d.native.post(&path, tcc_branch(&d.p, &id)).await
                    } else {
                        d.dtm
                            .post("/registerBranch", dtm_register(&d.p, &gid, &id))
                            .await
                    }
                }
            }))
            .await;
            let taken = answers.iter().filter(|(status, _)| *status == 200).count();
            assert_eq!(taken, 1, "{b} {gid}: {answers:?}");
            for answer in answers.into_iter().filter(|(status, _)| *status != 200) {
                refused(&format!("{b} {gid}"), answer);
            }
            assert_eq!(branch_ids(&d, &gid).await.len(), MAX, "{b} {gid}");
        }
    })
    .await;
}

#[tokio::test]
async fn the_limit_defaults_to_100_and_the_flag_changes_it() {
    let db = TestDatabase::create(Backend::Sqlite, "branch_limit_flag").await;
    let p = Recorder::start().await;
    let idem = Child::serve(&db.url, "default-limit", &[]).await;
    let api = Api::new(idem.url.clone());
    let (status, answer) = api
        .post("/api/v1/transactions", saga(&p, "s101", 101))
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("too_many_branches")),
        "{answer}"
    );
    let (status, answer) = api
        .post("/api/v1/transactions", saga(&p, "s100", 100))
        .await;
    assert_eq!(status, 201, "{answer}");
    api.wait_status("s100", &["succeeded"], WAIT).await;
    drop(idem);

    let idem = Child::serve(&db.url, "small-limit", &["--max-branches", "2"]).await;
    let api = Api::new(idem.url.clone());
    let (status, answer) = api.post("/api/v1/transactions", saga(&p, "s3", 3)).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("too_many_branches")),
        "{answer}"
    );
    let (status, _) = api.post("/api/v1/transactions", tcc(&p, "t", 2)).await;
    assert_eq!(status, 201);
    let (status, answer) = api
        .post("/api/v1/transactions/t/branches", tcc_branch(&p, "late"))
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("too_many_branches")),
        "{answer}"
    );
    drop(idem);
    db.drop_database().await;
}

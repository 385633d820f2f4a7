//! A client's identical retry across restarts of `idem serve` that change its defaults (a
//! flag, then the configuration file), on SQLite, PostgreSQL and MariaDB, through both
//! doors: the retry gets the first request's transaction, never `409 gid_conflict`, and
//! nothing runs twice; a retry that states another value than the stored one is still 409.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::recorder::Recorder;
use common::{Api, Child};
use idem_participant::testing;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// The defaults the first process runs with (besides `Child::serve`'s short retries) ...
const FIRST: &str = "request_timeout_ms = 2000\nmax_attempts = 5\nprepared_timeout_ms = 120000\n";
/// ... and the configuration file the last one is given instead.
const CHANGED: &str = "request_timeout_ms = 7000\nmax_attempts = 3\nmax_in_progress_ms = 9000\n\
                       max_retry_interval_ms = 5000\nprepared_timeout_ms = 30000\n";

fn config_file(test: &str, name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-repeats-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The requests of one run: each created once, then sent again after every restart.
struct Requests {
    saga: Value,
    tcc: Value,
    dtm_saga: Value,
    dtm_msg: Value,
}

impl Requests {
    fn new(p: &Recorder) -> Requests {
        Requests {
            // No options: every one is the server's default of the day.
            saga: json!({"gid": "saga-1", "kind": "saga", "steps": [
                {"action": p.url("/s1/action"), "compensate": p.url("/s1/compensate"), "payload": {"n": 1}},
                {"action": p.url("/s2/action"), "compensate": p.url("/s2/compensate")},
            ]}),
            tcc: json!({"gid": "tcc-1", "kind": "tcc", "branches": [
                {"branch_id": "b1", "confirm": p.url("/b1/confirm"), "cancel": p.url("/b1/cancel")},
            ]}),
            // DTM's clients send every field; 0 means "the server's default".
            dtm_saga: json!({
                "gid": "dtm-saga-1", "trans_type": "saga",
                "steps": [{"action": p.url("/d1/action"), "compensate": p.url("/d1/compensate")}],
                "payloads": ["{\"n\":1}"],
                "timeout_to_fail": 0, "request_timeout": 0, "retry_interval": 0, "retry_limit": 0,
            }),
            dtm_msg: json!({
                "gid": "dtm-msg-1", "trans_type": "msg",
                "steps": [{"action": p.url("/m1/action")}], "payloads": ["x"],
                "query_prepared": p.url("/m1/query"),
            }),
        }
    }
}

fn dtm(base: &str) -> Api {
    Api::new(format!("{base}/api/dtmsvr"))
}

/// The parts of a transaction that a repeat must give back as the first request got them.
fn first_answer(tx: &Value) -> Value {
    json!({"gid": tx["gid"], "kind": tx["kind"], "created_at": tx["created_at"],
           "options": tx["options"], "timeout_at": tx["timeout_at"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_retry_after_a_restart_with_other_defaults_gets_the_first_transaction() {
    for db in testing::all("repeat_after_restart").await {
        let b = db.backend;
        let p = Recorder::start().await;
        let r = Requests::new(&p);
        let first_config = config_file(db.name(), "first.toml", FIRST);
        let first_config = first_config.to_str().unwrap();
        let server = Child::serve(&db.url, "first", &["--config", first_config]).await;
        let api = Api::new(&server.url);

        let (code, saga) = api.post("/api/v1/transactions", r.saga.clone()).await;
        assert_eq!(code, 201, "{b}: {saga}");
        let (code, tcc) = api.post("/api/v1/transactions", r.tcc.clone()).await;
        assert_eq!(code, 201, "{b}: {tcc}");
        let (code, answer) = dtm(&server.url).post("/submit", r.dtm_saga.clone()).await;
        assert_eq!(
            (code, &answer["dtm_result"]),
            (200, &json!("SUCCESS")),
            "{b}: {answer}"
        );
        let (code, answer) = dtm(&server.url).post("/prepare", r.dtm_msg.clone()).await;
        assert_eq!(
            (code, &answer["dtm_result"]),
            (200, &json!("SUCCESS")),
            "{b}: {answer}"
        );
        let saga = api.wait_status("saga-1", &["succeeded"], WAIT).await;
        let dtm_saga = api.wait_status("dtm-saga-1", &["succeeded"], WAIT).await;
        let dtm_msg = api.wait_status("dtm-msg-1", &["prepared"], WAIT).await;
        assert_eq!(saga["options"]["retry_interval_ms"], 50, "{b}: {saga}");
        assert_eq!(saga["options"]["max_attempts"], 5, "{b}: {saga}");
        server.kill();

        // A flag changed, then the configuration file: each restart sees the same retries.
        let changed_config = config_file(db.name(), "changed.toml", CHANGED);
        let changed_config = changed_config.to_str().unwrap();
        let restarts: [&[&str]; 2] = [
            &["--config", first_config, "--retry-interval-ms", "2000"],
            &["--config", changed_config],
        ];
        for (n, extra) in restarts.into_iter().enumerate() {
            let server = Child::serve(&db.url, &format!("restarted-{n}"), extra).await;
            let api = Api::new(&server.url);
            let dtm = dtm(&server.url);
            // The server's defaults did change: a new saga gets them.
            let mut fresh = r.saga.clone();
            fresh["gid"] = json!(format!("fresh-{n}"));
            let (code, new) = api.post("/api/v1/transactions", fresh).await;
            assert_eq!(code, 201, "{b}: {new}");
            assert_ne!(new["options"], saga["options"], "{b}: {new}");

            for (body, first) in [(&r.saga, &saga), (&r.tcc, &tcc)] {
                let (code, again) = api.post("/api/v1/transactions", body.clone()).await;
                assert_eq!(code, 200, "{b}, restart {n}: {again}");
                assert_eq!(
                    first_answer(&again),
                    first_answer(first),
                    "{b}, restart {n}"
                );
            }
            let (code, answer) = dtm.post("/submit", r.dtm_saga.clone()).await;
            assert_eq!(
                (code, &answer["dtm_result"]),
                (200, &json!("SUCCESS")),
                "{b}: {answer}"
            );
            let (code, answer) = dtm.post("/prepare", r.dtm_msg.clone()).await;
            assert_eq!(
                (code, &answer["dtm_result"]),
                (200, &json!("SUCCESS")),
                "{b}: {answer}"
            );
            for first in [&dtm_saga, &dtm_msg] {
                let gid = first["gid"].as_str().unwrap();
                let (_, now) = api.get(&format!("/api/v1/transactions/{gid}")).await;
                assert_eq!(first_answer(&now), first_answer(first), "{b}, restart {n}");
            }

            // Stating a value other than the stored one is another request, whatever today's
            // defaults are (here: the restarted server's own retry interval).
            let mut other = r.saga.clone();
            other["options"] = json!({"retry_interval_ms": 2000});
            let mut tcc_other = r.tcc.clone();
            tcc_other["options"] = json!({"timeout_ms": 5000});
            for body in [other, tcc_other] {
                let (code, answer) = api.post("/api/v1/transactions", body).await;
                assert_eq!(
                    (code, &answer["error"]["code"]),
                    (409, &json!("gid_conflict")),
                    "{b}, restart {n}: {answer}"
                );
            }
            let mut dtm_other = r.dtm_saga.clone();
            dtm_other["retry_interval"] = json!(2);
            let mut msg_other = r.dtm_msg.clone();
            msg_other["retry_limit"] = json!(4);
            for (path, body) in [("/submit", dtm_other), ("/prepare", msg_other)] {
                let (code, answer) = dtm.post(path, body).await;
                assert_eq!(
                    (code, &answer["error"]["code"]),
                    (409, &json!("gid_conflict")),
                    "{b}, restart {n}: {answer}"
                );
            }
            server.kill();
        }

        // Every step ran once: no retry created its transaction again.
        for (gid, path) in [
            ("saga-1", "/s1/action"),
            ("saga-1", "/s2/action"),
            ("dtm-saga-1", "/d1/action"),
        ] {
            assert_eq!(p.count(gid, path), 1, "{b}: {gid} {path}");
        }
        db.drop_database().await;
    }
}

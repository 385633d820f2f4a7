//! DTM's door without a token (`--dtm-tenant`), over real HTTP on SQLite, PostgreSQL and
//! MariaDB: it takes callers from the networks `--dtm-tokenless-from` lists only, and such
//! a caller reads and changes only the transactions created without a token, never what
//! the tenant's token holders stored (issue 28's first outside probe, as a test).

use crate::common;

use common::auth::{Setup, code, get, loopback_participants, post, wait_status};
use idem::auth::Role;
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

async fn legacy_door(db: TestDatabase, from: &[&str]) -> Setup {
    let from = from.iter().map(|n| n.parse().unwrap()).collect();
    Setup::with(db, |c| {
        c.auth.dtm_tenant = Some("legacy".into());
        c.auth.dtm_tokenless_from = from;
        c.outbound_policy = loopback_participants();
    })
    .await
}

fn register(s: &Setup, gid: &str, branch: &str) -> Value {
    json!({"gid": gid, "branch_id": branch, "trans_type": "tcc", "status": "prepared",
           "data": "{\"from\":\"tokenless\"}",
           "confirm": s.recorder.url("/free/confirm"), "cancel": s.recorder.url("/free/cancel")})
}

/// The gids of a page of either door's list.
fn gids(all: &Value) -> Vec<&str> {
    all["transactions"]
        .as_array()
        .unwrap_or_else(|| panic!("no transactions: {all}"))
        .iter()
        .map(|t| t["gid"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn the_tokenless_door_neither_reads_nor_changes_what_token_holders_created() {
    for db in testing::all("dtm_door_isolation").await {
        let name = db.name().to_owned();
        let s = legacy_door(db, &["127.0.0.0/8", "::1/128"]).await;
        let legacy = s.token("legacy", Role::Client).await;

        // A token holder of `legacy`: a saga with a credential and a card number, and a
        // prepared TCC with one branch.
        let mut saga = s.saga("card-saga", "4111111111111111");
        saga["options"] = json!({"branch_headers": {"Authorization": "Bearer s3cret"}});
        let (status, answer) = post(&s, "/api/v1/transactions", Some(&legacy), saga).await;
        assert_eq!(status, 201, "{name}: {answer}");
        wait_status(&s, &legacy, "card-saga", "succeeded").await;
        let tcc = json!({"gid": "owned-tcc", "kind": "tcc", "branches": [{
            "branch_id": "b1", "confirm": s.recorder.url("/owned/confirm"),
            "cancel": s.recorder.url("/owned/cancel"), "payload": {"card": "4111111111111111"}}]});
        let (status, answer) = post(&s, "/api/v1/transactions", Some(&legacy), tcc).await;
        assert_eq!(status, 201, "{name}: {answer}");

        // Without a token: neither is there.
        let (status, all) = get(&s, "/api/dtmsvr/all?limit=100", None).await;
        assert_eq!(status, 200, "{name}: {all}");
        assert_eq!(gids(&all), Vec::<&str>::new(), "{name}: {all}");
        for gid in ["card-saga", "owned-tcc"] {
            let (status, seen) = get(&s, &format!("/api/dtmsvr/query?gid={gid}"), None).await;
            assert_eq!(
                (status, &seen["transaction"], &seen["branches"]),
                (200, &Value::Null, &json!([])),
                "{name}: {gid} seen without a token: {seen}"
            );
        }
        let seen = format!("{all}");
        assert!(
            !seen.contains("s3cret") && !seen.contains("4111"),
            "{name}: {seen}"
        );

        // Nor can it be changed: abort, submit, registerBranch and prepare over it are
        // answered as for a gid that does not exist (a prepare: the gid is taken).
        let tcc_body = json!({"gid": "owned-tcc", "trans_type": "tcc"});
        let saga_body = json!({"gid": "card-saga", "trans_type": "saga"});
        for (path, body, refused) in [
            ("abort", tcc_body.clone(), (404, "not_found")),
            ("submit", tcc_body.clone(), (404, "not_found")),
            (
                "registerBranch",
                register(&s, "owned-tcc", "intruder"),
                (404, "not_found"),
            ),
            ("prepare", tcc_body, (409, "gid_conflict")),
            ("abort", saga_body, (404, "not_found")),
        ] {
            let (status, answer) = post(&s, &format!("/api/dtmsvr/{path}"), None, body).await;
            assert_eq!((status, code(&answer)), refused, "{name}: {path}: {answer}");
        }

        // The token holder's TCC is as it was: prepared, its one branch, nothing called.
        let (status, owned) = get(&s, "/api/v1/transactions/owned-tcc", Some(&legacy)).await;
        assert_eq!(
            (status, owned["status"].as_str()),
            (200, Some("prepared")),
            "{name}: {owned}"
        );
        let branches: Vec<&str> = owned["branches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["branch_id"].as_str().unwrap())
            .collect();
        assert_eq!(branches, ["b1", "b1"], "{name}: {owned}");
        assert!(s.recorder.paths("owned-tcc").is_empty(), "{name}");
        // And its holder still drives it.
        let (status, answer) = post(
            &s,
            "/api/v1/transactions/owned-tcc/submit",
            Some(&legacy),
            json!({"wait_result": true}),
        )
        .await;
        assert_eq!(
            (status, answer["status"].as_str()),
            (200, Some("succeeded")),
            "{name}: {answer}"
        );

        // A token-less caller's own TCC works end to end, and its list shows it alone.
        let free = json!({"gid": "free-tcc", "trans_type": "tcc"});
        let (status, answer) = post(&s, "/api/dtmsvr/prepare", None, free.clone()).await;
        assert_eq!(status, 200, "{name}: {answer}");
        let (status, answer) = post(
            &s,
            "/api/dtmsvr/registerBranch",
            None,
            register(&s, "free-tcc", "01"),
        )
        .await;
        assert_eq!(status, 200, "{name}: {answer}");
        let submit = json!({"gid": "free-tcc", "trans_type": "tcc", "wait_result": true});
        let (status, answer) = post(&s, "/api/dtmsvr/submit", None, submit).await;
        assert_eq!(
            (status, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{name}: {answer}"
        );
        assert_eq!(s.recorder.count("free-tcc", "/free/confirm"), 1, "{name}");
        let (_, seen) = get(&s, "/api/dtmsvr/query?gid=free-tcc", None).await;
        assert_eq!(seen["transaction"]["status"], "succeed", "{name}: {seen}");
        let (_, all) = get(&s, "/api/dtmsvr/all?limit=100", None).await;
        assert_eq!(gids(&all), ["free-tcc"], "{name}: {all}");
        // Its own abort reaches it too.
        let (status, _) = post(
            &s,
            "/api/dtmsvr/prepare",
            None,
            json!({"gid": "free-2", "trans_type": "tcc"}),
        )
        .await;
        assert_eq!(status, 200, "{name}");
        let (status, answer) = post(
            &s,
            "/api/dtmsvr/abort",
            None,
            json!({"gid": "free-2", "trans_type": "tcc"}),
        )
        .await;
        assert_eq!(
            (status, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{name}: {answer}"
        );

        // The tenant's token holders still see everything of their tenant.
        wait_status(&s, &legacy, "free-2", "failed").await;
        let (_, list) = get(&s, "/api/v1/transactions?limit=100", Some(&legacy)).await;
        let mut native = gids(&list);
        native.sort_unstable();
        assert_eq!(
            native,
            ["card-saga", "free-2", "free-tcc", "owned-tcc"],
            "{name}: {list}"
        );
        let (_, all) = get(&s, "/api/dtmsvr/all?limit=100", Some(&legacy)).await;
        assert_eq!(gids(&all).len(), 4, "{name}: {all}");
        s.finish().await;
    }
}

/// A token-less caller from a network that is not listed needs a token like everyone;
/// nothing it sent is stored. (Loopback is left out of the list to be such a network.)
#[tokio::test]
async fn the_tokenless_door_is_open_to_the_listed_networks_only() {
    for db in testing::all("dtm_door_networks").await {
        let name = db.name().to_owned();
        let s = legacy_door(db, &["10.0.0.0/8"]).await;
        let saga = json!({"gid": "from-here", "trans_type": "saga",
                          "steps": [{"action": s.recorder.url("/d/action"), "compensate": s.recorder.url("/d/compensate")}],
                          "payloads": ["{}"]});
        let (status, answer) = post(&s, "/api/dtmsvr/submit", None, saga.clone()).await;
        assert_eq!(
            (status, code(&answer)),
            (401, "token_missing"),
            "{name}: {answer}"
        );
        let (status, answer) = get(&s, "/api/dtmsvr/query?gid=from-here", None).await;
        assert_eq!((status, code(&answer)), (401, "token_missing"), "{name}");
        assert!(
            s.store.load("legacy/from-here").await.unwrap().is_none(),
            "{name}: a refused request stored its saga"
        );
        // A token holder of the tenant is not affected.
        let legacy = s.token("legacy", Role::Client).await;
        let (status, answer) = post(&s, "/api/dtmsvr/submit", Some(&legacy), saga).await;
        assert_eq!(status, 200, "{name}: {answer}");
        s.finish().await;
    }
}

/// `idem serve` warns at start when DTM's door takes requests without a token on a
/// listener beyond loopback.
#[tokio::test]
async fn a_tokenless_door_beyond_loopback_is_warned_of_at_start() {
    let db = TestDatabase::create(Backend::Sqlite, "dtm_door_warning").await;
    let log = std::env::temp_dir().join(format!("{}.log", db.name()));
    let args = [
        "--auth",
        "tokens",
        "--dtm-tenant",
        "legacy",
        "--listen",
        "0.0.0.0:0",
    ];
    let idem = common::Child::serve_logged(&db.url, &args, &log).await;
    drop(idem);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.lines().any(|l| l.contains("WARN")
            && l.contains("without a token")
            && l.contains("127.0.0.0/8,::1/128")),
        "{text}"
    );
    let quiet = common::Child::serve_logged(&db.url, &args[..4], &log).await;
    drop(quiet);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("without a token"), "on loopback: {text}");
    let _ = std::fs::remove_file(&log);
    db.drop_database().await;
}

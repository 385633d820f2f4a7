//! Operators' bulk actions (`POST /api/v1/bulk`, `idem tx retry|force-stop|abort --status
//! ...`), on SQLite, PostgreSQL and MariaDB: a dry run changes nothing, a call takes at most
//! its limit (oldest first) and says whether more match, each transaction's outcome is
//! reported, the filter's age holds, and only operators act, within their tenant.

use crate::common;

use std::time::Duration;

use common::auth::{self, Setup};
use common::recorder::Recorder;
use common::{Api, Child};
use idem::auth::Role;
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const FOREVER: usize = 1_000_000;

/// A saga whose second step is refused and whose first compensation fails both attempts
/// it has: it stalls (compensations must succeed). Healed and retried, it ends `failed`.
fn stalling_saga(p: &Recorder, gid: &str) -> Value {
    json!({"gid": gid, "kind": "saga", "options": {"max_attempts": 2},
           "steps": [{"action": p.url("/ok"), "compensate": p.url("/flaky"), "payload": {}},
                     {"action": p.url("/no"), "compensate": p.url("/undo"), "payload": {}}]})
}

fn gids(answer: &Value) -> Vec<String> {
    answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["gid"].as_str().unwrap().to_owned())
        .collect()
}

async fn count_in(api: &Api, status: &str) -> usize {
    let (code, page) = api
        .get(&format!("/api/v1/transactions?status={status}&limit=1000"))
        .await;
    assert_eq!(code, 200, "{page}");
    page["transactions"].as_array().unwrap().len()
}

async fn bulk_on(db: TestDatabase) {
    let b = db.backend;
    let p = Recorder::start().await;
    p.answer("/flaky", None, FOREVER, 503);
    p.answer("/no", None, FOREVER, 409);
    let idem = Child::serve(&db.url, "bulk", &[]).await;
    let api = Api::new(&idem.url);
    let stalled: Vec<String> = (0..7).map(|i| format!("stalled-{i}")).collect();
    for gid in &stalled {
        let (code, body) = api
            .post("/api/v1/transactions", stalling_saga(&p, gid))
            .await;
        assert_eq!(code, 201, "{b}: {body}");
    }
    for gid in &stalled {
        api.wait_status(gid, &["stalled"], WAIT).await;
    }

    // A dry run: what would be retried, nothing changed.
    let (code, dry) = api
        .post(
            "/api/v1/bulk",
            json!({"operation": "retry", "status": "stalled", "dry_run": true, "limit": 5}),
        )
        .await;
    assert_eq!(code, 200, "{b}: {dry}");
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["more"], true, "{b}: 7 match, 5 taken");
    assert_eq!(gids(&dry), stalled[..5], "{b}: oldest first");
    assert!(
        dry["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["before"] == "stalled" && r.get("after").is_none())
    );
    assert_eq!(
        count_in(&api, "stalled").await,
        7,
        "{b}: a dry run changes nothing"
    );
    // The same on the database directly, as an operator without a coordinator would.
    let direct = common::idem_cli(&[
        "tx",
        "retry",
        "--database-url",
        &db.url,
        "--status",
        "stalled",
        "--dry-run",
        "--limit",
        "3",
    ]);
    assert!(
        direct.contains("dry run: 3 selected, nothing changed"),
        "{b}: {direct}"
    );
    assert!(
        direct.contains("stalled-0") && !direct.contains("stalled-3"),
        "{b}: {direct}"
    );
    assert!(direct.contains("more match"), "{b}: {direct}");

    // Too old a filter selects none of them.
    let (_, none) = api
        .post(
            "/api/v1/bulk",
            json!({"operation": "retry", "status": "stalled", "older_than_ms": 3_600_000}),
        )
        .await;
    assert_eq!(gids(&none), Vec::<String>::new(), "{b}: {none}");
    assert_eq!(none["more"], false);

    // The participant heals; two calls of at most 5 resume all 7.
    p.heal();
    let (code, first) = api
        .post(
            "/api/v1/bulk",
            json!({"operation": "retry", "status": "stalled", "limit": 5}),
        )
        .await;
    assert_eq!(code, 200, "{b}: {first}");
    assert_eq!(gids(&first), stalled[..5]);
    assert_eq!(first["more"], true);
    assert!(
        first["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["after"].is_string() && r["after"] != "stalled"),
        "{b}: {first}"
    );
    let (_, second) = api
        .post(
            "/api/v1/bulk",
            json!({"operation": "retry", "status": "stalled", "limit": 5}),
        )
        .await;
    assert_eq!(gids(&second), stalled[5..], "{b}: {second}");
    assert_eq!(second["more"], false);
    for gid in &stalled {
        api.wait_status(gid, &["failed"], WAIT).await;
    }

    // Prepared TCCs aborted in bulk from the command line: a dry run, then the action;
    // each one's Cancel is called.
    for gid in ["tcc-a", "tcc-b"] {
        let (code, body) = api
            .post("/api/v1/transactions", json!({"gid": gid, "kind": "tcc"}))
            .await;
        assert_eq!(code, 201, "{b}: {body}");
        let (code, body) = api
            .post(
                &format!("/api/v1/transactions/{gid}/branches"),
                json!({"branch_id": "x", "confirm": p.url("/confirm"), "cancel": p.url("/cancel"), "payload": {}}),
            )
            .await;
        assert!(code < 300, "{b}: {body}");
    }
    let dry = common::idem_cli(&[
        "tx",
        "abort",
        "--server",
        &idem.url,
        "--status",
        "prepared",
        "--kind",
        "tcc",
        "--dry-run",
    ]);
    assert!(
        dry.contains("tcc-a") && dry.contains("tcc-b") && dry.contains("would abort"),
        "{b}: {dry}"
    );
    assert!(
        dry.contains("dry run: 2 selected, nothing changed"),
        "{b}: {dry}"
    );
    assert_eq!(count_in(&api, "prepared").await, 2);
    let done = common::idem_cli(&[
        "tx", "abort", "--server", &idem.url, "--status", "prepared", "--kind", "tcc",
    ]);
    assert!(
        done.contains("2 selected, 2 done, 0 refused"),
        "{b}: {done}"
    );
    for gid in ["tcc-a", "tcc-b"] {
        api.wait_status(gid, &["failed"], WAIT).await;
        assert_eq!(p.count(gid, "/cancel"), 1, "{b}: {gid}");
        assert_eq!(p.count(gid, "/confirm"), 0, "{b}: {gid}");
    }

    // Bounds and bad input: 400 with a code, nothing done.
    for (body, code_wanted) in [
        (
            json!({"operation": "retry", "status": "stalled", "limit": 501}),
            "invalid_limit",
        ),
        (
            json!({"operation": "retry", "status": "stalled", "limit": 0}),
            "invalid_limit",
        ),
        (json!({"operation": "retry"}), "invalid_json"),
        (
            json!({"operation": "reboot", "status": "stalled"}),
            "invalid_operation",
        ),
        (
            json!({"operation": "retry", "status": "sleeping"}),
            "invalid_status",
        ),
    ] {
        let (code, answer) = api.post("/api/v1/bulk", body.clone()).await;
        assert_eq!(code, 400, "{b}: {body} → {answer}");
        assert_eq!(
            answer["error"]["code"], code_wanted,
            "{b}: {body} → {answer}"
        );
    }
    idem.kill();
    db.drop_database().await;
}

#[tokio::test]
async fn bulk_actions_on_sqlite() {
    bulk_on(TestDatabase::create(Backend::Sqlite, "bulk").await).await;
}

#[tokio::test]
async fn bulk_actions_on_postgres() {
    bulk_on(TestDatabase::create(Backend::Postgres, "bulk").await).await;
}

#[tokio::test]
async fn bulk_actions_on_mariadb() {
    bulk_on(TestDatabase::create(Backend::Mysql, "bulk").await).await;
}

/// With tokens: a client may not act in bulk; an operator acts in its own tenant only, and
/// another tenant's transactions with the same status are left alone.
#[tokio::test]
async fn only_operators_act_in_bulk_and_only_in_their_tenant() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let s = Setup::new(TestDatabase::create(backend, "bulk_tenants").await, |_| {}).await;
        let p = &s.recorder;
        p.answer("/flaky", None, FOREVER, 503);
        p.answer("/no", None, FOREVER, 409);
        let acme = s.token("acme", Role::Operator).await;
        let beta = s.token("beta", Role::Operator).await;
        let client = s.token("acme", Role::Client).await;
        for token in [&acme, &beta] {
            let (code, body) = auth::post(
                &s,
                "/api/v1/transactions",
                Some(token),
                stalling_saga(p, "same"),
            )
            .await;
            assert_eq!(code, 201, "{backend}: {body}");
            auth::wait_status(&s, token, "same", "stalled").await;
        }
        let retry = json!({"operation": "retry", "status": "stalled"});
        let (code, body) = auth::post(&s, "/api/v1/bulk", Some(&client), retry.clone()).await;
        assert_eq!(
            (code, auth::code(&body)),
            (403, "forbidden"),
            "{backend}: {body}"
        );
        let other = json!({"operation": "retry", "status": "stalled", "tenant": "beta"});
        let (code, body) = auth::post(&s, "/api/v1/bulk", Some(&acme), other).await;
        assert_eq!(
            (code, auth::code(&body)),
            (403, "forbidden"),
            "{backend}: {body}"
        );
        let (code, body) = auth::post(&s, "/api/v1/bulk", None, retry.clone()).await;
        assert_eq!(code, 401, "{backend}: {body}");

        p.heal();
        let (code, body) = auth::post(&s, "/api/v1/bulk", Some(&acme), retry).await;
        assert_eq!(code, 200, "{backend}: {body}");
        assert_eq!(gids(&body), vec!["same".to_owned()], "{backend}: {body}");
        auth::wait_status(&s, &acme, "same", "failed").await;
        let (_, beta_view) = auth::get(&s, "/api/v1/transactions/same", Some(&beta)).await;
        assert_eq!(
            beta_view["status"], "stalled",
            "{backend}: beta's is untouched"
        );
        s.finish().await;
    }
}

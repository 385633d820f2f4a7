//! A coordinator among others for months: a skewed host clock, node names that pods share,
//! overload, SIGTERM, waits that are never notified, a stale cached copy. Real `idem
//! serve` processes (or in-process servers where a setting has no flag), real HTTP, on
//! the databases several coordinators share.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::recorder::{Call, Recorder};
use common::{Api, Child};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn saga(p: &Recorder, gid: &str, steps: &[&str]) -> Value {
    let steps: Vec<Value> = steps
        .iter()
        .map(|s| json!({"action": p.url(&format!("/{s}/action")), "compensate": p.url(&format!("/{s}/compensate"))}))
        .collect();
    json!({"gid": gid, "kind": "saga", "steps": steps})
}

async fn shared_databases(test: &str) -> Vec<TestDatabase> {
    let mut out = Vec::new();
    for backend in [Backend::Postgres, Backend::Mysql] {
        if let Some(db) = TestDatabase::create(backend, test).await {
            out.push(db);
        }
    }
    out
}

/// Seen (from the code): leases and timeouts were the writer's wall-clock values compared
/// with the claimer's own clock, so a coordinator whose clock ran ahead took over live
/// transactions and aborted prepared ones early.
#[tokio::test]
async fn a_coordinator_whose_clock_runs_a_minute_ahead_neither_takes_over_nor_aborts_early() {
    for db in shared_databases("skewed_clock").await {
        let b = db.backend;
        let p = Recorder::start().await;
        p.delay("/slow/action", None, 1, Duration::from_secs(4));
        let steady = Child::serve(&db.url, "steady", &[]);
        let api = Api::new(steady.url.clone());
        let prepared =
            json!({"gid": "prepared-30s", "kind": "tcc", "options": {"timeout_ms": 30_000}});
        assert_eq!(
            api.post("/api/v1/transactions", prepared).await.0,
            201,
            "{b}"
        );
        let sentinel =
            json!({"gid": "prepared-1s", "kind": "tcc", "options": {"timeout_ms": 1_000}});
        assert_eq!(
            api.post("/api/v1/transactions", sentinel).await.0,
            201,
            "{b}"
        );
        assert_eq!(
            api.post("/api/v1/transactions", saga(&p, "slow-saga", &["slow"]))
                .await
                .0,
            201,
            "{b}"
        );
        p.wait_until(WAIT, |c| c.iter().any(|c| c.path == "/slow/action"))
            .await;

        let skewed = Child::serve(&db.url, "skewed", &["--test-clock-offset-ms", "60000"]);
        let skewed_api = Api::new(skewed.url.clone());
        // The skewed node tells the database's time, not its own.
        let (_, own) = skewed_api
            .post("/api/v1/transactions", saga(&p, "via-skewed", &["quick"]))
            .await;
        let (_, reference) = api.get("/api/v1/transactions/prepared-1s").await;
        let drift = own["created_at"].as_i64().unwrap() - reference["created_at"].as_i64().unwrap();
        assert!(
            (0..20_000).contains(&drift),
            "{b}: created {drift} ms after the other node's"
        );
        skewed_api
            .wait_status("via-skewed", &["succeeded"], WAIT)
            .await;

        // Both recovery loops run while the slow step is under way and the short timeout
        // passes.
        api.wait_status("prepared-1s", &["failed"], WAIT).await;
        api.wait_status("slow-saga", &["succeeded"], WAIT).await;
        assert_eq!(
            p.count("slow-saga", "/slow/action"),
            1,
            "{b}: taken over while its owner was calling"
        );
        let (_, tx) = api.get("/api/v1/transactions/prepared-30s").await;
        assert_eq!(tx["status"], "prepared", "{b}: aborted 30 s early: {tx:#}");
        drop((steady, skewed));
        db.drop_database().await;
    }
}

/// Seen (from the code): owner tokens used the first 24 characters of the node name and a
/// starting node released every lease with that prefix, so pods of one Deployment (which
/// share it, as they share the default name) took each other's live transactions.
#[tokio::test]
async fn pods_sharing_a_name_prefix_or_the_default_name_keep_each_others_leases() {
    let db = TestDatabase::create(Backend::Postgres, "shared_node_prefix")
        .await
        .unwrap();
    let p = Recorder::start().await;
    p.delay("/slow/action", None, 2, Duration::from_secs(3));
    let long_lease = ["--lease-ms", "60000"];
    for (first, second) in [
        (
            "checkout-coordinator-7d9f8c6b5-x2x4z",
            "checkout-coordinator-7d9f8c6b5-qq81m",
        ),
        // Both without --node: host name and port 0, the same default name.
        ("", ""),
    ] {
        let gid = format!("slow-{}", first.len());
        let a = Child::serve(&db.url, first, &long_lease);
        let api = Api::new(a.url.clone());
        assert_eq!(
            api.post("/api/v1/transactions", saga(&p, &gid, &["slow"]))
                .await
                .0,
            201
        );
        p.wait_until(WAIT, |c| c.iter().any(|c| c.gid == gid)).await;
        // Its peer starts while the call is under way.
        let b = Child::serve(&db.url, second, &long_lease);
        api.wait_status(&gid, &["succeeded"], WAIT).await;
        assert_eq!(
            p.count(&gid, "/slow/action"),
            1,
            "{first:?}/{second:?}: a peer took the lease"
        );
        drop((a, b));
    }
    db.drop_database().await;
}

/// Seen (from the code): a driver's lease covered the call but not its wait for a call
/// slot, so under overload the node's own recovery loop started a second driver.
#[tokio::test]
async fn a_round_waiting_for_a_call_slot_keeps_its_lease() {
    for db in idem_participant::testing::all("lease_covers_slot_wait").await {
        let server = common::coordinator_with(&db.url, |c| {
            c.engine.lease_ms = 1_000;
            c.engine.max_concurrent_calls = 1;
        })
        .await;
        let api = Api::new(server.url());
        let p = Recorder::start().await;
        p.delay("/s/action", None, 1_000, Duration::from_millis(500));
        let gids: Vec<String> = (0..8).map(|i| format!("queued-{i}")).collect();
        for gid in &gids {
            assert_eq!(
                api.post("/api/v1/transactions", saga(&p, gid, &["s"]))
                    .await
                    .0,
                201
            );
        }
        for gid in &gids {
            api.wait_status(gid, &["succeeded"], WAIT).await;
            assert_eq!(
                p.count(gid, "/s/action"),
                1,
                "{}: {gid} driven twice",
                db.backend
            );
        }
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// Seen: after SIGTERM the driver kept calling participants, an open `wait_result`
/// delayed exit up to 30 s, and the node called branches after it had handed its leases
/// back, so the other node called them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_waits_stops_calling_and_leaves_the_rest_to_the_other_node() {
    let db = TestDatabase::create(Backend::Postgres, "graceful_sigterm")
        .await
        .unwrap();
    let p = Recorder::start().await;
    for step in ["s1", "s2"] {
        p.delay(
            &format!("/{step}/action"),
            None,
            10_000,
            Duration::from_millis(300),
        );
    }
    let mut stopping = Child::serve(&db.url, "stopping", &["--shutdown-timeout-ms", "2000"]);
    let other = Child::serve(&db.url, "other", &[]);
    let api = Api::new(stopping.url.clone());
    let gids: Vec<String> = (0..40).map(|i| format!("inflight-{i:02}")).collect();
    for gid in &gids {
        assert_eq!(
            api.post("/api/v1/transactions", saga(&p, gid, &["s1", "s2"]))
                .await
                .0,
            201
        );
    }
    let mut waiting = saga(&p, "waited-on", &["s1", "s2"]);
    waiting["wait_result"] = json!(true);
    let waiter = {
        let api = api.clone();
        tokio::spawn(async move {
            let answer = api.post("/api/v1/transactions", waiting).await;
            (answer, Instant::now())
        })
    };
    p.wait_until(WAIT, |c| c.len() >= 10).await;
    stopping.signal("TERM");
    let signalled = Instant::now();
    let status = stopping
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("exits within the grace and a margin");
    let exited = Instant::now();
    println!("SIGTERM to exit: {:?} (grace 2 s)", exited - signalled);
    assert!(status.success(), "{status:?}");
    assert!(
        exited - signalled < Duration::from_secs(6),
        "took {:?}",
        exited - signalled
    );
    let ((code, tx), answered) = waiter.await.unwrap();
    assert_eq!(code, 201, "{tx}");
    assert!(
        answered <= exited,
        "the open wait was answered before the exit"
    );

    let other_api = Api::new(other.url.clone());
    for gid in gids.iter().chain(std::iter::once(&"waited-on".to_owned())) {
        other_api.wait_status(gid, &["succeeded"], WAIT).await;
    }
    let calls = p.calls();
    let by = |node: &str| -> Vec<&Call> {
        calls
            .iter()
            .filter(|c| c.agent.contains(&format!("({node})")))
            .collect()
    };
    let (from_stopping, from_other) = (by("stopping"), by("other"));
    assert!(!from_stopping.is_empty() && !from_other.is_empty());
    assert!(
        from_stopping.iter().all(|c| c.at <= exited),
        "a call after the exit"
    );
    let mut last_stopping: BTreeMap<&str, Instant> = BTreeMap::new();
    for c in &from_stopping {
        let at = last_stopping.entry(c.gid.as_str()).or_insert(c.at);
        *at = (*at).max(c.at);
    }
    for c in &from_other {
        if let Some(last) = last_stopping.get(c.gid.as_str()) {
            assert!(
                *last < c.at,
                "{}: the stopping node called after the other took over",
                c.gid
            );
        }
    }
    drop(other);
    db.drop_database().await;
}

/// Seen (from the code): a wait on a transaction already settled, or driven elsewhere,
/// left its waiter entry behind for good.
#[tokio::test]
async fn waits_leave_nothing_behind() {
    let db = TestDatabase::create(Backend::Sqlite, "waiters_removed")
        .await
        .unwrap();
    let server =
        common::coordinator_with(&db.url, |c| c.wait_timeout = Duration::from_millis(300)).await;
    let api = Api::new(server.url());
    let p = Recorder::start().await;
    let mut done = saga(&p, "done", &["a"]);
    done["wait_result"] = json!(true);
    assert_eq!(
        api.post("/api/v1/transactions", done.clone()).await.1["status"],
        "succeeded"
    );
    // Repeats of a settled one: nothing will ever notify these waits.
    for _ in 0..20 {
        api.post("/api/v1/transactions", done.clone()).await;
    }
    assert_eq!(
        server.engine.waiting(),
        0,
        "waits on a settled transaction left entries"
    );
    // A wait that times out, and a client that gives up, while the saga still runs.
    p.delay("/slow/action", None, 1, Duration::from_secs(3));
    let mut slow = saga(&p, "slow", &["slow"]);
    slow["wait_result"] = json!(true);
    let (_, tx) = api.post("/api/v1/transactions", slow.clone()).await;
    assert_eq!(tx["status"], "running", "the wait timed out first");
    assert_eq!(
        server.engine.waiting(),
        0,
        "a timed-out wait left its entry"
    );
    let gone = tokio::time::timeout(
        Duration::from_millis(50),
        api.post("/api/v1/transactions", slow),
    )
    .await;
    assert!(gone.is_err());
    // The abandoned request's wait ends at the server's wait timeout, not at the outcome.
    let deadline = Instant::now() + Duration::from_secs(2);
    while server.engine.waiting() > 0 {
        assert!(
            Instant::now() < deadline,
            "an abandoned wait left its entry"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, tx) = api.get("/api/v1/transactions/slow").await;
    assert_eq!(
        tx["status"], "running",
        "removed by the wait itself, not by the outcome"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// Seen (from the code): an operator's retry sent to a node holding a stale cached copy
/// could answer 200 (or a refusal) and change nothing.
#[tokio::test]
async fn a_retry_through_a_node_with_a_stale_copy_resumes_the_stall() {
    for db in shared_databases("stale_cached_retry").await {
        let b = db.backend;
        let p = Recorder::start().await;
        let first = Child::serve(&db.url, "first", &[]);
        let second = Child::serve(&db.url, "second", &[]);
        let (api1, api2) = (Api::new(first.url.clone()), Api::new(second.url.clone()));
        let branch =
            json!({"branch_id": "a", "confirm": p.url("/a/confirm"), "cancel": p.url("/a/cancel")});
        let create = json!({"gid": "stale", "kind": "tcc", "branches": [branch], "options": {"max_attempts": 2}});
        // The first node keeps a copy from the create: prepared.
        assert_eq!(
            api1.post("/api/v1/transactions", create).await.0,
            201,
            "{b}"
        );
        p.answer("/a/confirm", None, 2, 500);
        api2.post("/api/v1/transactions/stale/submit", json!({}))
            .await;
        api2.wait_status("stale", &["stalled"], WAIT).await;
        let (code, tx) = api1
            .post("/api/v1/transactions/stale/retry", json!({}))
            .await;
        assert_eq!(code, 200, "{b}: {tx}");
        assert_ne!(
            tx["status"], "prepared",
            "{b}: answered from the stale copy"
        );
        api1.wait_status("stale", &["succeeded"], WAIT).await;
        drop((first, second));
        db.drop_database().await;
    }
}

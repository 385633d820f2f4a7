//! A coordinator among others for months: a skewed host clock, node names that pods share,
//! overload, SIGTERM, waits that are never notified, a stale cached copy. Real `idem
//! serve` processes (or in-process servers where a setting has no flag), real HTTP, on
//! the databases several coordinators share. The applications and operators in them use
//! the typed client.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::Child;
use common::recorder::{Call, Recorder};
use common::typed::{self, created, created_tcc, wait_status};
use idem_client::{Client, Options, SagaBuilder, Status};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// A saga of `steps` on the recorder, without payloads, ready to create.
fn saga(idem: &Client, p: &Recorder, gid: &str, steps: &[&str]) -> SagaBuilder {
    steps.iter().fold(idem.saga(gid), |saga, s| {
        let action = p.url(&format!("/{s}/action"));
        saga.step(action, p.url(&format!("/{s}/compensate")), Value::Null)
    })
}

/// A TCC's options with only its global timeout set.
fn timeout_after(ms: u64) -> Options {
    Options {
        timeout_ms: Some(ms),
        ..Options::default()
    }
}

async fn shared_databases(test: &str) -> Vec<TestDatabase> {
    let mut out = Vec::new();
    for backend in [Backend::Postgres, Backend::Mysql] {
        let db = TestDatabase::create(backend, test).await;
        out.push(db);
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
        let steady = Child::serve(&db.url, "steady", &[]).await;
        let idem = typed::client(&steady.url);
        let prepared = idem
            .tcc("prepared-30s")
            .options(timeout_after(30_000))
            .create()
            .await
            .map(created_tcc);
        assert!(prepared.is_ok(), "{b}: {prepared:?}");
        let sentinel = idem
            .tcc("prepared-1s")
            .options(timeout_after(1_000))
            .create()
            .await
            .map(created_tcc);
        assert!(sentinel.is_ok(), "{b}: {sentinel:?}");
        let slow = saga(&idem, &p, "slow-saga", &["slow"])
            .send()
            .await
            .map(created);
        assert!(slow.is_ok(), "{b}: {slow:?}");
        p.wait_until(WAIT, |c| c.iter().any(|c| c.path == "/slow/action"))
            .await;

        let skewed = Child::serve(&db.url, "skewed", &["--test-clock-offset-ms", "60000"]).await;
        let skewed_idem = typed::client(&skewed.url);
        // The skewed node tells the database's time, not its own.
        let own = saga(&skewed_idem, &p, "via-skewed", &["quick"])
            .send()
            .await
            .map(created)
            .unwrap();
        let reference = idem.get("prepared-1s").await.unwrap();
        let drift = own.created_at - reference.created_at;
        assert!(
            (0..20_000).contains(&drift),
            "{b}: created {drift} ms after the other node's"
        );
        wait_status(&skewed_idem, "via-skewed", &[Status::Succeeded], WAIT).await;

        // Both recovery loops run while the slow step is under way and the short timeout
        // passes.
        wait_status(&idem, "prepared-1s", &[Status::Failed], WAIT).await;
        wait_status(&idem, "slow-saga", &[Status::Succeeded], WAIT).await;
        assert_eq!(
            p.count("slow-saga", "/slow/action"),
            1,
            "{b}: taken over while its owner was calling"
        );
        let tx = idem.get("prepared-30s").await.unwrap();
        assert_eq!(
            tx.status,
            Status::Prepared,
            "{b}: aborted 30 s early: {tx:#?}"
        );
        drop((steady, skewed));
        db.drop_database().await;
    }
}

/// Seen (from the code): owner tokens used the first 24 characters of the node name and a
/// starting node released every lease with that prefix, so pods of one Deployment (which
/// share it, as they share the default name) took each other's live transactions.
#[tokio::test]
async fn pods_sharing_a_name_prefix_or_the_default_name_keep_each_others_leases() {
    let db = TestDatabase::create(Backend::Postgres, "shared_node_prefix").await;
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
        let a = Child::serve(&db.url, first, &long_lease).await;
        let idem = typed::client(&a.url);
        let created = saga(&idem, &p, &gid, &["slow"]).send().await.map(created);
        assert!(created.is_ok(), "{created:?}");
        p.wait_until(WAIT, |c| c.iter().any(|c| c.gid == gid)).await;
        // Its peer starts while the call is under way.
        let b = Child::serve(&db.url, second, &long_lease).await;
        wait_status(&idem, &gid, &[Status::Succeeded], WAIT).await;
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
        let idem = typed::client(&server.url());
        let p = Recorder::start().await;
        p.delay("/s/action", None, 1_000, Duration::from_millis(500));
        let gids: Vec<String> = (0..8).map(|i| format!("queued-{i}")).collect();
        for gid in &gids {
            let created = saga(&idem, &p, gid, &["s"]).send().await.map(created);
            assert!(created.is_ok(), "{created:?}");
        }
        for gid in &gids {
            wait_status(&idem, gid, &[Status::Succeeded], WAIT).await;
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
    let db = TestDatabase::create(Backend::Postgres, "graceful_sigterm").await;
    let p = Recorder::start().await;
    for step in ["s1", "s2"] {
        p.delay(
            &format!("/{step}/action"),
            None,
            10_000,
            Duration::from_millis(300),
        );
    }
    let mut stopping = Child::serve(&db.url, "stopping", &["--shutdown-timeout-ms", "2000"]).await;
    let other = Child::serve(&db.url, "other", &[]).await;
    let idem = typed::client(&stopping.url);
    let gids: Vec<String> = (0..40).map(|i| format!("inflight-{i:02}")).collect();
    for gid in &gids {
        let created = saga(&idem, &p, gid, &["s1", "s2"])
            .send()
            .await
            .map(created);
        assert!(created.is_ok(), "{created:?}");
    }
    let waiting = saga(&idem, &p, "waited-on", &["s1", "s2"]).wait_result(true);
    let waiter = tokio::spawn(async move {
        let answer = waiting.send().await.map(created);
        (answer, Instant::now())
    });
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
    let (answer, answered) = waiter.await.unwrap();
    assert!(answer.is_ok(), "{answer:?}");
    assert!(
        answered <= exited,
        "the open wait was answered before the exit"
    );

    let other_idem = typed::client(&other.url);
    for gid in gids.iter().chain(std::iter::once(&"waited-on".to_owned())) {
        wait_status(&other_idem, gid, &[Status::Succeeded], WAIT).await;
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
    let db = TestDatabase::create(Backend::Sqlite, "waiters_removed").await;
    let server =
        common::coordinator_with(&db.url, |c| c.wait_timeout = Duration::from_millis(300)).await;
    let idem = typed::client(&server.url());
    let p = Recorder::start().await;
    let done = || saga(&idem, &p, "done", &["a"]).wait_result(true).create();
    assert_eq!(done().await.map(|t| t.status), Ok(Status::Succeeded));
    // Repeats of a settled one: nothing will ever notify these waits.
    for _ in 0..20 {
        done().await.unwrap();
    }
    assert_eq!(
        server.engine.waiting(),
        0,
        "waits on a settled transaction left entries"
    );
    // A wait that times out, and a client that gives up, while the saga still runs.
    p.delay("/slow/action", None, 1, Duration::from_secs(3));
    let slow = || {
        saga(&idem, &p, "slow", &["slow"])
            .wait_result(true)
            .create()
    };
    let tx = slow().await.unwrap();
    assert_eq!(tx.status, Status::Running, "the wait timed out first");
    assert_eq!(
        server.engine.waiting(),
        0,
        "a timed-out wait left its entry"
    );
    let gone = tokio::time::timeout(Duration::from_millis(50), slow()).await;
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
    let tx = idem.get("slow").await.unwrap();
    assert_eq!(
        tx.status,
        Status::Running,
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
        let first = Child::serve(&db.url, "first", &[]).await;
        let second = Child::serve(&db.url, "second", &[]).await;
        let (idem1, idem2) = (typed::client(&first.url), typed::client(&second.url));
        let options = Options {
            max_attempts: Some(2),
            ..Options::default()
        };
        // The first node keeps a copy from the create and the registration: prepared.
        let tcc = idem1
            .tcc("stale")
            .options(options)
            .create()
            .await
            .map(created_tcc);
        assert!(tcc.is_ok(), "{b}: {tcc:?}");
        let (confirm, cancel) = (p.url("/a/confirm"), p.url("/a/cancel"));
        tcc.unwrap()
            .register("a", &confirm, &cancel, Value::Null)
            .await
            .unwrap();
        p.answer("/a/confirm", None, 2, 500);
        idem2.submit("stale", false).await.unwrap();
        wait_status(&idem2, "stale", &[Status::Stalled], WAIT).await;
        let tx = idem1.retry("stale").await;
        assert!(tx.is_ok(), "{b}: {tx:?}");
        assert_ne!(
            tx.unwrap().status,
            Status::Prepared,
            "{b}: answered from the stale copy"
        );
        wait_status(&idem1, "stale", &[Status::Succeeded], WAIT).await;
        drop((first, second));
        db.drop_database().await;
    }
}

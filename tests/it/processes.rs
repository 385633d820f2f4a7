//! Real `idem serve` processes: killed with SIGKILL in the middle of phase 2, paused past
//! their lease, and two of them sharing one database.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::recorder::{Call, Recorder};
use common::typed::{self, created, created_tcc, register, wait_all, wait_status};
use common::{Child, idem_cli};
use idem_client::{Client, Error, Status, TxView};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// Creates a saga of `steps` (numbered from 1) on the recorder, without payloads.
async fn create_saga(
    idem: &Client,
    p: &Recorder,
    gid: &str,
    steps: usize,
) -> Result<TxView, Error> {
    let saga = (1..=steps).fold(idem.saga(gid), |saga, s| {
        let action = p.url(&format!("/s{s}/action"));
        saga.step(action, p.url(&format!("/s{s}/compensate")), Value::Null)
    });
    saga.send().await.map(created)
}

/// Calls per (gid, branch_id, op).
fn tally(calls: &[Call]) -> BTreeMap<(String, String, String), usize> {
    let mut out = BTreeMap::new();
    for c in calls {
        *out.entry((c.gid.clone(), c.branch_id.clone(), c.op.clone()))
            .or_insert(0) += 1;
    }
    out
}

async fn restart_recovery(db: TestDatabase) {
    let backend = db.backend;
    let p = Recorder::start().await;
    // Every Confirm and action takes a while, so the kill lands in the middle of phase 2.
    for id in ["a", "b"] {
        p.delay(
            &format!("/{id}/confirm"),
            None,
            1_000,
            Duration::from_millis(150),
        );
    }
    p.delay("/s2/action", None, 1_000, Duration::from_millis(150));
    let first = Child::serve(&db.url, "first", &[]).await;
    let idem = typed::client(&first.url);
    let mut tcc = Vec::new();
    for i in 0..12 {
        let gid = format!("tcc-{i}");
        let created = idem.tcc(&gid).create().await.map(created_tcc).unwrap();
        for id in ["a", "b"] {
            let registered = register(&created, &p, id).await;
            assert!(registered.is_ok(), "{backend}: {registered:?}");
        }
        tcc.push(gid);
    }
    let mut sagas = Vec::new();
    for i in 0..8 {
        let gid = format!("saga-{i}");
        let created = create_saga(&idem, &p, &gid, 3).await;
        assert!(created.is_ok(), "{backend}: {created:?}");
        sagas.push(gid);
    }
    for gid in &tcc {
        let submitted = idem.submit(gid, false).await;
        assert!(submitted.is_ok(), "{backend}: {submitted:?}");
    }
    // Some Confirms have been answered, not all: kill it.
    p.wait_until(WAIT, |calls| {
        calls.iter().filter(|c| c.op == "confirm").count() >= 4
    })
    .await;
    first.kill();
    let answered_before = p.calls().len();

    let second = Child::serve(&db.url, "second", &[]).await;
    let idem = typed::client(&second.url);
    wait_all(&idem, &tcc, &[Status::Succeeded], WAIT).await;
    wait_all(&idem, &sagas, &[Status::Succeeded], WAIT).await;
    let t = tally(&p.calls());
    for gid in &tcc {
        for id in ["a", "b"] {
            assert!(
                t.get(&(gid.clone(), id.into(), "confirm".into()))
                    .is_some_and(|n| *n >= 1),
                "{backend}: {gid}/{id} confirmed"
            );
            assert!(
                !t.contains_key(&(gid.clone(), id.into(), "cancel".into())),
                "{backend}: {gid}/{id} never cancelled"
            );
        }
    }
    for gid in &sagas {
        for step in ["01", "02", "03"] {
            assert!(
                t.contains_key(&(gid.clone(), step.into(), "action".into())),
                "{backend}: {gid}/{step}"
            );
            assert!(!t.contains_key(&(gid.clone(), step.into(), "compensate".into())));
        }
    }
    assert!(
        p.calls().len() > answered_before,
        "{backend}: the second process did the rest"
    );
    drop(second);
    db.drop_database().await;
}

#[tokio::test]
async fn sigkill_in_phase_two_then_restart_finishes_everything_sqlite() {
    restart_recovery(TestDatabase::create(Backend::Sqlite, "sigkill_sqlite").await).await;
}

#[tokio::test]
async fn sigkill_in_phase_two_then_restart_finishes_everything_postgres() {
    let db = TestDatabase::create(Backend::Postgres, "sigkill_postgres").await;
    restart_recovery(db).await;
}

#[tokio::test]
async fn sigkill_in_phase_two_then_restart_finishes_everything_mysql() {
    let db = TestDatabase::create(Backend::Mysql, "sigkill_mysql").await;
    restart_recovery(db).await;
}

/// Two coordinators on one database: prepared TCCs time out and both recovery loops race
/// to abort them; sagas are submitted to either. Every branch operation is delivered by
/// exactly one of them (the participant answers at once, so there is no retry).
async fn two_coordinators(db: TestDatabase) {
    let backend = db.backend;
    let p = Recorder::start().await;
    let a = Child::serve(&db.url, "a", &["--prepared-timeout-ms", "1500"]).await;
    let b = Child::serve(&db.url, "b", &["--prepared-timeout-ms", "1500"]).await;
    let clients = [typed::client(&a.url), typed::client(&b.url)];
    let mut timeouts = Vec::new();
    for i in 0..30 {
        let gid = format!("timeout-{i}");
        let tcc = clients[i % 2]
            .tcc(&gid)
            .create()
            .await
            .map(created_tcc)
            .unwrap();
        for id in ["a", "b"] {
            register(&tcc, &p, id).await.unwrap();
        }
        timeouts.push(gid);
    }
    let mut sagas = Vec::new();
    for i in 0..30 {
        let gid = format!("saga-{i}");
        let created = create_saga(&clients[i % 2], &p, &gid, 2).await;
        assert!(created.is_ok(), "{backend}: {created:?}");
        sagas.push(gid);
    }
    wait_all(&clients[0], &timeouts, &[Status::Failed], WAIT).await;
    wait_all(&clients[1], &sagas, &[Status::Succeeded], WAIT).await;
    let t = tally(&p.calls());
    for gid in &timeouts {
        for id in ["a", "b"] {
            assert_eq!(
                t.get(&(gid.clone(), id.into(), "cancel".into())),
                Some(&1),
                "{backend}: {gid}/{id} cancelled once"
            );
        }
    }
    for gid in &sagas {
        for step in ["01", "02"] {
            assert_eq!(
                t.get(&(gid.clone(), step.into(), "action".into())),
                Some(&1),
                "{backend}: {gid}/{step} once"
            );
        }
    }
    let calls = p.calls();
    let ops: HashSet<&str> = calls.iter().map(|c| c.op.as_str()).collect();
    assert!(
        !ops.contains("confirm") && !ops.contains("compensate"),
        "{backend}: {ops:?}"
    );
    drop((a, b));
    db.drop_database().await;
}

#[tokio::test]
async fn two_coordinators_share_one_postgres_database() {
    let db = TestDatabase::create(Backend::Postgres, "two_coordinators_postgres").await;
    two_coordinators(db).await;
}

#[tokio::test]
async fn two_coordinators_share_one_mariadb_database() {
    let db = TestDatabase::create(Backend::Mysql, "two_coordinators_mysql").await;
    two_coordinators(db).await;
}

/// A coordinator paused (SIGSTOP) past its lease loses the transaction to another; when
/// it wakes up its writes are refused and it stops, so the new owner's outcome stands.
async fn paused_owner(db: TestDatabase) {
    let backend = db.backend;
    let p = Recorder::start().await;
    // The first call of step 1 hangs long enough for the owner to be paused in it.
    p.delay("/s1/action", None, 1, Duration::from_millis(800));
    let stale = Child::serve(&db.url, "stale", &[]).await;
    let fresh = Child::serve(&db.url, "fresh", &[]).await;
    create_saga(&typed::client(&stale.url), &p, "paused", 2)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stale.signal("STOP");
    // The lease (1.5 s) lapses; the other coordinator claims and finishes the saga.
    let idem = typed::client(&fresh.url);
    let done = wait_status(&idem, "paused", &[Status::Succeeded], WAIT).await;
    stale.signal("CONT");
    // Give the woken owner time to try its stale writes, then check nothing moved.
    let calls_after = p.calls().len();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let now = idem.get("paused").await.unwrap();
    assert_eq!(now.status, Status::Succeeded, "{backend}");
    assert_eq!(
        now.updated_at, done.updated_at,
        "{backend}: the stale owner wrote nothing"
    );
    let late: Vec<String> = p.calls()[calls_after..]
        .iter()
        .map(|c| c.path.clone())
        .collect();
    assert!(
        late.iter().all(|x| x.ends_with("/action")),
        "{backend}: no compensation from the stale owner: {late:?}"
    );
    drop((stale, fresh));
    db.drop_database().await;
}

#[tokio::test]
async fn paused_owner_cannot_overwrite_postgres() {
    let db = TestDatabase::create(Backend::Postgres, "paused_owner_postgres").await;
    paused_owner(db).await;
}

#[tokio::test]
async fn paused_owner_cannot_overwrite_mariadb() {
    let db = TestDatabase::create(Backend::Mysql, "paused_owner_mysql").await;
    paused_owner(db).await;
}

/// The operator's commands through a running server's API.
#[tokio::test]
async fn operator_commands_list_show_retry_and_force_stop() {
    let db = TestDatabase::create(Backend::Sqlite, "operator_commands").await;
    let p = Recorder::start().await;
    let server = Child::serve(&db.url, "ops", &["--max-attempts", "2"]).await;
    let idem = typed::client(&server.url);
    for gid in ["stuck-1", "stuck-2"] {
        let tcc = idem.tcc(gid).create().await.map(created_tcc).unwrap();
        register(&tcc, &p, "a").await.unwrap();
        p.answer("/a/confirm", Some(gid), 2, 500);
        let tx = tcc.submit(true).await.unwrap();
        assert_eq!(tx.status, Status::Stalled, "{tx:#?}");
    }
    let list = idem_cli(&["tx", "list", "--server", &server.url, "--status", "stalled"]);
    assert!(
        list.contains("stuck-1") && list.contains("stuck-2"),
        "{list}"
    );
    assert!(list.contains("exhausted 2 attempts"), "{list}");

    let shown: serde_json::Value = serde_json::from_str(&idem_cli(&[
        "tx",
        "show",
        "--server",
        &server.url,
        "stuck-1",
        "--json",
    ]))
    .unwrap();
    assert_eq!(shown["status"], "stalled");
    assert_eq!(shown["history"].as_array().unwrap().len(), 2, "{shown:#}");

    // The server takes the retried transaction and completes it.
    let out = idem_cli(&["tx", "retry", "--server", &server.url, "stuck-1"]);
    assert!(out.contains("committing"), "{out}");
    wait_status(&idem, "stuck-1", &[Status::Succeeded], WAIT).await;

    let out = idem_cli(&[
        "tx",
        "force-stop",
        "--server",
        &server.url,
        "stuck-2",
        "--reason",
        "refunded by hand",
    ]);
    assert!(out.contains("failed"), "{out}");
    let tx = idem.get("stuck-2").await.unwrap();
    assert_eq!(
        (tx.status, tx.reason.as_deref()),
        (Status::Failed, Some("refunded by hand"))
    );
    assert_eq!(
        p.paths("stuck-2"),
        ["/a/confirm", "/a/confirm"],
        "nothing called after the stop"
    );
    drop(server);
    db.drop_database().await;
}

/// A coordinator restarted under the same node name resumes what its dead predecessor
/// owned at once, not after the (here one minute) lease.
#[tokio::test]
async fn restart_under_the_same_node_name_resumes_without_waiting_for_the_lease() {
    let db = TestDatabase::create(Backend::Sqlite, "same_node_restart").await;
    let p = Recorder::start().await;
    p.delay("/a/confirm", None, 1_000, Duration::from_millis(300));
    let long_lease = ["--lease-ms", "60000"];
    let first = Child::serve(&db.url, "node-1", &long_lease).await;
    let idem = typed::client(&first.url);
    let mut gids = Vec::new();
    for i in 0..5 {
        let gid = format!("resume-{i}");
        let tcc = idem.tcc(&gid).create().await.map(created_tcc);
        assert!(tcc.is_ok(), "{tcc:?}");
        register(&tcc.unwrap(), &p, "a").await.unwrap();
        idem.submit(&gid, false).await.unwrap();
        gids.push(gid);
    }
    p.wait_until(WAIT, |calls| calls.iter().any(|c| c.op == "confirm"))
        .await;
    first.kill();
    let started = std::time::Instant::now();
    let second = Child::serve(&db.url, "node-1", &long_lease).await;
    let idem = typed::client(&second.url);
    wait_all(&idem, &gids, &[Status::Succeeded], WAIT).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}: it waited for the lease",
        started.elapsed()
    );
    drop(second);
    db.drop_database().await;
}

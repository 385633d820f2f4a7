//! A write never lands after a newer one: a driver's save is a compare-and-set on the
//! version it last wrote, a renewal or a request never shortens a lease, and a claim
//! passes over the rows its claimer's own drivers hold.

use super::*;

fn failed_then_succeeded(tx: &Transaction) -> (Transition, Transition) {
    let key = BranchKey {
        branch_id: "01".into(),
        action: Action::Action,
    };
    let failed = apply(
        tx,
        &Event::Outcome {
            key: key.clone(),
            outcome: CallOutcome::Unknown("HTTP 500".into()),
        },
        Ctx::at(T0 + 10),
    )
    .unwrap();
    let succeeded = apply(
        &failed.tx,
        &Event::Outcome {
            key,
            outcome: CallOutcome::Success,
        },
        Ctx::at(T0 + 20),
    )
    .unwrap();
    (failed, succeeded)
}

fn attempt() -> AttemptRecord {
    AttemptRecord {
        number: 1,
        branch_id: "01".into(),
        action: Action::Action,
        attempt: 1,
        started_at: T0 + 5,
        duration_ms: 5,
        outcome: "unknown".into(),
        detail: Some("HTTP 500".into()),
    }
}

#[tokio::test]
async fn an_older_save_of_the_same_owner_never_lands_after_a_newer_one() {
    let dbs = common::stores("older_save_never_lands").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let tx = saga("s");
        let mine = lease("driver", T0 + 30_000);
        store.create(&tx, "h", Some(&mine)).await.unwrap();
        let (failed, succeeded) = failed_then_succeeded(&tx);
        let first = Save {
            before: &tx,
            after: &failed.tx,
            guard: Guard::Owner("driver", 0),
            lease: Some(&mine),
            attempts: &[attempt()],
        };
        assert_eq!(
            store.save(first.clone()).await.unwrap(),
            Saved::Saved,
            "{b}"
        );
        let second = Save {
            before: &failed.tx,
            after: &succeeded.tx,
            guard: Guard::Owner("driver", 1),
            lease: Some(&mine),
            attempts: &[],
        };
        assert_eq!(store.save(second).await.unwrap(), Saved::Saved, "{b}");
        // The first save again, as a write whose caller was cut would land late: same
        // owner, same expected status, but the version moved on.
        assert_eq!(store.save(first).await.unwrap(), Saved::Lost, "{b}");
        let stored = store.load("s").await.unwrap().unwrap();
        assert_eq!(stored.tx, succeeded.tx, "{b}: the newer state stands");
        assert_eq!(stored.version, 2, "{b}");
        assert_eq!(
            store.attempts("s", 0, 1_000).await.unwrap(),
            vec![attempt()],
            "{b}: once"
        );
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn a_renewal_never_shortens_a_lease_and_a_release_ends_it() {
    let dbs = common::stores("renewal_never_shortens").await;
    for (db, store) in &dbs {
        let b = db.backend;
        store
            .create(&saga("s"), "h", Some(&lease("driver", T0 + 1_000)))
            .await
            .unwrap();
        let until = |store: Arc<dyn Store>| async move {
            store.load("s").await.unwrap().unwrap().lease_until
        };
        assert!(store.renew("s", "driver", T0 + 9_000).await.unwrap());
        assert_eq!(until(store.clone()).await, Some(T0 + 9_000), "{b}");
        // An earlier renewal landing late: still the owner's, but the lease stands.
        assert!(store.renew("s", "driver", T0 + 5_000).await.unwrap());
        assert_eq!(until(store.clone()).await, Some(T0 + 9_000), "{b}");
        assert!(!store.renew("s", "other", T0 + 20_000).await.unwrap());
        assert!(!store.release("s", "other", T0).await.unwrap());
        assert!(store.release("s", "driver", T0 + 10).await.unwrap());
        assert_eq!(until(store.clone()).await, Some(T0 + 10), "{b}: released");
        let stored = store.load("s").await.unwrap().unwrap();
        assert_eq!(stored.owner_token.as_deref(), Some("driver"), "{b}");
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn a_request_that_keeps_the_owner_never_shortens_its_lease() {
    let dbs = common::stores("request_keeps_lease").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let tx = saga("s");
        let read = lease("driver", T0 + 1_000);
        store.create(&tx, "h", Some(&read)).await.unwrap();
        // The driver renews after the request read the row.
        assert!(store.renew("s", "driver", T0 + 60_000).await.unwrap());
        let (failed, succeeded) = failed_then_succeeded(&tx);
        let request = Save {
            before: &tx,
            after: &failed.tx,
            guard: Guard::Version(0),
            lease: Some(&read),
            attempts: &[],
        };
        assert_eq!(store.save(request).await.unwrap(), Saved::Saved, "{b}");
        let stored = store.load("s").await.unwrap().unwrap();
        assert_eq!(stored.lease_until, Some(T0 + 60_000), "{b}: not shortened");
        // A save that hands the row to another owner sets that owner's lease, whatever it is.
        let other = lease("other", T0 + 2_000);
        let take_over = Save {
            before: &failed.tx,
            after: &succeeded.tx,
            guard: Guard::Version(1),
            lease: Some(&other),
            attempts: &[],
        };
        assert_eq!(store.save(take_over).await.unwrap(), Saved::Saved, "{b}");
        let stored = store.load("s").await.unwrap().unwrap();
        assert_eq!(stored.owner_token.as_deref(), Some("other"), "{b}");
        assert_eq!(stored.lease_until, Some(T0 + 2_000), "{b}");
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn a_claim_passes_over_the_rows_its_claimer_holds() {
    let dbs = common::stores("claim_passes_over_held").await;
    for (db, store) in &dbs {
        let b = db.backend;
        for gid in ["s1", "s2", "s3"] {
            store
                .create(&saga(gid), "h", Some(&lease("lapsed", T0 + 100)))
                .await
                .unwrap();
        }
        let held = vec!["s1".to_owned(), "not-there".to_owned()];
        let got: HashSet<String> = store
            .claim_due(&lease("recovery", T0 + 30_000), T0 + 1_000, 10, &held)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.stored.tx.gid)
            .collect();
        assert_eq!(
            got,
            HashSet::from(["s2".to_owned(), "s3".to_owned()]),
            "{b}"
        );
        let s1 = store.load("s1").await.unwrap().unwrap();
        assert_eq!(s1.owner_token.as_deref(), Some("lapsed"), "{b}: untouched");
        let got = store
            .claim_due(&lease("later", T0 + 30_000), T0 + 1_000, 10, &[])
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "{b}: released from the list, it is due");
    }
    common::cleanup(dbs).await;
}

/// The server cuts a writer's lock wait before the coordinator's own bound does: the write
/// fails with the server's own (curable) error rather than being abandoned mid-statement,
/// where it could still commit later. SQLite has no server: its writer runs in-process.
#[tokio::test]
async fn the_server_cuts_a_writers_lock_wait_below_the_call_timeout() {
    use sqlx::Connection;
    let dbs = common::stores("server_cuts_lock_wait").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let tx = saga("s");
        let mine = lease("driver", T0 + 30_000);
        store.create(&tx, "h", Some(&mine)).await.unwrap();
        let lock = "BEGIN; SELECT gid FROM idem_global WHERE gid = 's' FOR UPDATE";
        let holder: Box<dyn std::any::Any> = match b {
            idem_sql::Backend::Sqlite => continue,
            idem_sql::Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
                sqlx::raw_sql(lock).execute(&mut conn).await.unwrap();
                Box::new(conn)
            }
            idem_sql::Backend::Mysql => {
                let mut conn = sqlx::MySqlConnection::connect(&db.url).await.unwrap();
                sqlx::raw_sql(lock).execute(&mut conn).await.unwrap();
                Box::new(conn)
            }
        };
        let (failed, _) = failed_then_succeeded(&tx);
        let save = Save {
            before: &tx,
            after: &failed.tx,
            guard: Guard::Owner("driver", 0),
            lease: Some(&mine),
            attempts: &[],
        };
        let call_timeout = ConnectOptions::default().call_timeout;
        let started = std::time::Instant::now();
        let error = store
            .save(save.clone())
            .await
            .expect_err("the row is locked");
        assert!(
            !matches!(error, StoreError::TimedOut(_)),
            "{b}: the server's cut, not the coordinator's: {error}"
        );
        assert!(!error.is_permanent(), "{b}: a retry can cure it: {error}");
        assert!(
            started.elapsed() < call_timeout,
            "{b}: {:?}",
            started.elapsed()
        );
        drop(holder);
        assert_eq!(store.save(save).await.unwrap(), Saved::Saved, "{b}");
    }
    common::cleanup(dbs).await;
}

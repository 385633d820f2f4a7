//! The store on SQLite, PostgreSQL and MariaDB: conditional writes, fencing, claims.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;

use idem_core::*;
use idem_store::*;

const T0: Millis = 1_700_000_000_000;

fn tcc(gid: &str) -> Transaction {
    Transaction::prepared(gid, Kind::Tcc, TxOptions::default(), T0)
}

fn branches(id: &str) -> Vec<Branch> {
    vec![
        Branch::new(
            id,
            Action::Confirm,
            0,
            format!("http://p/{id}/confirm"),
            "{\"n\":1}",
            T0,
        ),
        Branch::new(
            id,
            Action::Cancel,
            0,
            format!("http://p/{id}/cancel"),
            "{\"n\":1}",
            T0,
        ),
    ]
}

fn lease(token: &str, until: Millis) -> Lease {
    Lease {
        token: token.into(),
        until,
    }
}

fn saga(gid: &str) -> Transaction {
    let steps = (0..2)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/a"),
            compensate: format!("http://p/{i}/c"),
            payload: format!("{{\"i\":{i}}}").into(),
        })
        .collect();
    Transaction::saga(gid, steps, TxOptions::default(), T0)
}

#[tokio::test]
async fn create_load_and_idempotent_create() {
    let dbs = common::stores("create_load_and_idempotent_create").await;
    for (db, store) in &dbs {
        let tx = saga("Saga-1");
        assert_eq!(
            store
                .create(&tx, "h1", Some(&lease("a", T0 + 1)))
                .await
                .unwrap(),
            Created::Inserted
        );
        let stored = store.load("Saga-1").await.unwrap().expect("stored");
        assert_eq!(stored.tx, tx, "{}: round trip", db.backend);
        assert_eq!(stored.request_hash, "h1");
        assert_eq!(stored.owner_token.as_deref(), Some("a"));

        match store.create(&tx, "h2", None).await.unwrap() {
            Created::Exists(existing) => {
                assert_eq!(
                    existing.request_hash, "h1",
                    "{}: the first request stays",
                    db.backend
                )
            }
            other => panic!("{}: {other:?}", db.backend),
        }
        // gids are case-sensitive everywhere (MariaDB's default collation is not).
        assert_eq!(
            store.create(&saga("saga-1"), "h3", None).await.unwrap(),
            Created::Inserted
        );
        assert!(store.load("missing").await.unwrap().is_none());
    }
    common::cleanup(dbs).await;
}

/// Concurrent creates share batches; a batch holding a gid that is taken must still insert
/// the others (on MySQL the batch's one INSERT fails on the duplicate and is redone one by
/// one), and concurrent saves and renewals each learn their own outcome.
#[tokio::test]
async fn batched_writes_each_get_their_own_outcome() {
    let dbs = common::stores("batched_writes_outcomes").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let taken = saga("taken");
        assert_eq!(
            store.create(&taken, "h", None).await.unwrap(),
            Created::Inserted
        );
        let creates = (0..20).map(|i| {
            let store = Arc::clone(store);
            async move {
                let tx = if i == 7 {
                    saga("taken")
                } else {
                    saga(&format!("new-{i:02}"))
                };
                (tx.gid.clone(), store.create(&tx, "h", None).await.unwrap())
            }
        });
        for (gid, created) in futures::future::join_all(creates).await {
            match gid.as_str() {
                "taken" => assert!(matches!(created, Created::Exists(_)), "{b}: {created:?}"),
                _ => {
                    assert_eq!(created, Created::Inserted, "{b}: {gid}");
                    let stored = store.load(&gid).await.unwrap().expect("inserted");
                    assert_eq!(stored.tx.branches.len(), 4, "{b}: {gid}");
                }
            }
        }
        // Saves racing with the same guard: one of each pair wins; renewals of a token
        // that owns the row succeed, of one that does not fail.
        let owned = lease("owner", T0 + 1_000);
        let mut rows = Vec::new();
        for i in 0..10 {
            let tx = saga(&format!("race-{i}"));
            store.create(&tx, "h", Some(&owned)).await.unwrap();
            rows.push(tx);
        }
        let saves = rows.iter().flat_map(|tx| {
            (0..2).map(move |n| {
                let store = Arc::clone(store);
                let mut after = tx.clone();
                after.status = if n == 0 {
                    Status::Succeeded
                } else {
                    Status::Failed
                };
                let before = tx.clone();
                async move {
                    let save = Save {
                        before: &before,
                        after: &after,
                        guard: Guard::Version(0),
                        lease: None,
                        attempts: &[],
                    };
                    store.save(save).await.unwrap()
                }
            })
        });
        let outcomes = futures::future::join_all(saves).await;
        for pair in outcomes.chunks(2) {
            let won = pair.iter().filter(|s| **s == Saved::Saved).count();
            assert_eq!(won, 1, "{b}: {outcomes:?}");
        }
        let mine = lease("mine", T0 + 1_000);
        store
            .create(&saga("leased"), "h", Some(&mine))
            .await
            .unwrap();
        let (ok, refused) = futures::future::join(
            store.renew("leased", "mine", T0 + 9_000),
            store.renew("leased-nope", "mine", T0 + 9_000),
        )
        .await;
        assert_eq!((ok.unwrap(), refused.unwrap()), (true, false), "{b}");
        let leased = store.load("leased").await.unwrap().unwrap();
        assert_eq!(leased.lease_until, Some(T0 + 9_000), "{b}");
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn register_is_atomic_with_the_prepared_status() {
    let dbs = common::stores("register_is_atomic_with_the_prepared_status").await;
    for (db, store) in &dbs {
        let b = db.backend;
        store.create(&tcc("g"), "h", None).await.unwrap();
        assert_eq!(
            store
                .register("g", &branches("a"), T0, Access::Tenant)
                .await
                .unwrap(),
            Registered::Stored
        );
        assert_eq!(
            store
                .register("g", &branches("a"), T0, Access::Tenant)
                .await
                .unwrap(),
            Registered::Stored,
            "{b}: repeat"
        );
        let mut changed = branches("a");
        changed[0].payload = "{\"n\":2}".into();
        assert_eq!(
            store
                .register("g", &changed, T0, Access::Tenant)
                .await
                .unwrap(),
            Registered::Conflict(BranchKey {
                branch_id: "a".into(),
                action: Action::Confirm
            })
        );
        assert_eq!(
            store
                .register("nope", &branches("a"), T0, Access::Tenant)
                .await
                .unwrap(),
            Registered::NotFound
        );

        let stored = store.load("g").await.unwrap().unwrap();
        assert_eq!(stored.tx.branches.len(), 2, "{b}");
        // Submit: conditional on the version read.
        let next = apply(&stored.tx, &Event::Submit, Ctx::at(T0 + 1))
            .unwrap()
            .tx;
        let l = lease("owner", T0 + 100);
        let saved = store
            .save(Save {
                before: &stored.tx,
                after: &next,
                guard: Guard::Version(stored.version),
                lease: Some(&l),
                attempts: &[],
            })
            .await
            .unwrap();
        assert_eq!(saved, Saved::Saved);
        assert_eq!(
            store
                .register("g", &branches("late"), T0, Access::Tenant)
                .await
                .unwrap(),
            Registered::NotPrepared(Status::Committing),
            "{b}: no branch after the decision"
        );
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn a_submit_that_read_before_a_registration_cannot_commit_without_it() {
    let dbs = common::stores("a_submit_that_read_before_a_registration").await;
    for (db, store) in &dbs {
        store.create(&tcc("g"), "h", None).await.unwrap();
        store
            .register("g", &branches("a"), T0, Access::Tenant)
            .await
            .unwrap();
        let read = store.load("g").await.unwrap().unwrap();
        // A branch registers between the submit's read and its write.
        store
            .register("g", &branches("b"), T0, Access::Tenant)
            .await
            .unwrap();
        let next = apply(&read.tx, &Event::Submit, Ctx::at(T0 + 1)).unwrap().tx;
        let saved = store
            .save(Save {
                before: &read.tx,
                after: &next,
                guard: Guard::Version(read.version),
                lease: None,
                attempts: &[],
            })
            .await
            .unwrap();
        assert_eq!(
            saved,
            Saved::Lost,
            "{}: the stale submit must re-read",
            db.backend
        );
        let fresh = store.load("g").await.unwrap().unwrap();
        assert_eq!(fresh.tx.branches.len(), 4);
        assert_eq!(fresh.tx.status, Status::Prepared);
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn concurrent_registrations_and_submit_never_lose_a_branch() {
    let dbs = common::stores("concurrent_registrations_and_submit").await;
    for (db, store) in &dbs {
        store.create(&tcc("g"), "h", None).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..12 {
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move {
                let id = format!("b{i}");
                (
                    id.clone(),
                    store
                        .register("g", &branches(&id), T0, Access::Tenant)
                        .await
                        .unwrap(),
                )
            }));
        }
        // Submit races the registrations, retrying on a lost race as the API does.
        let submitter = {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                loop {
                    let read = store.load("g").await.unwrap().unwrap();
                    let next = apply(&read.tx, &Event::Submit, Ctx::at(T0 + 1)).unwrap().tx;
                    let saved = store
                        .save(Save {
                            before: &read.tx,
                            after: &next,
                            guard: Guard::Version(read.version),
                            lease: None,
                            attempts: &[],
                        })
                        .await
                        .unwrap();
                    if saved == Saved::Saved {
                        return next;
                    }
                }
            })
        };
        let mut registered = HashSet::new();
        for t in tasks {
            let (id, result) = t.await.unwrap();
            match result {
                Registered::Stored => {
                    registered.insert(id);
                }
                Registered::NotPrepared(Status::Committing) => {}
                other => panic!("{}: {other:?}", db.backend),
            }
        }
        let committed = submitter.await.unwrap();
        let confirmed: HashSet<String> = committed
            .branches
            .iter()
            .filter(|b| b.action == Action::Confirm)
            .map(|b| b.branch_id.to_string())
            .collect();
        assert_eq!(
            confirmed, registered,
            "{}: every registered branch is in the committed state",
            db.backend
        );
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn saves_are_fenced_by_owner_token_and_status() {
    let dbs = common::stores("saves_are_fenced_by_owner_token_and_status").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let tx = saga("s");
        let first = lease("first", T0 + 1_000);
        store.create(&tx, "h", Some(&first)).await.unwrap();
        let step = apply(
            &tx,
            &Event::Outcome {
                key: BranchKey {
                    branch_id: "01".into(),
                    action: Action::Action,
                },
                outcome: CallOutcome::Unknown("HTTP 500".into()),
            },
            Ctx::at(T0 + 10),
        )
        .unwrap();
        let attempt = AttemptRecord {
            number: 1,
            branch_id: "01".into(),
            action: Action::Action,
            attempt: 1,
            started_at: T0 + 5,
            duration_ms: 5,
            outcome: "unknown".into(),
            detail: Some("HTTP 500".into()),
        };
        // The first owner's lease expires; a second coordinator claims the row.
        let second = lease("second", T0 + 5_000);
        let claimed = store.claim_due(&second, T0 + 2_000, 10, &[]).await.unwrap();
        assert_eq!(claimed.len(), 1, "{b}");
        // The claim says whose the row was: a takeover, for the metrics and the log.
        assert_eq!(claimed[0].previous_owner.as_deref(), Some("first"), "{b}");
        let claimed: Vec<_> = claimed.into_iter().map(|c| c.stored).collect();
        assert_eq!(claimed[0].owner_token.as_deref(), Some("second"));

        // The stale first owner wakes up and tries to write: refused.
        let stale = store
            .save(Save {
                before: &tx,
                after: &step.tx,
                guard: Guard::Owner("first", 0),
                lease: Some(&first),
                attempts: std::slice::from_ref(&attempt),
            })
            .await
            .unwrap();
        assert_eq!(stale, Saved::Lost, "{b}: a stale owner cannot overwrite");
        let unchanged = store.load("s").await.unwrap().unwrap();
        assert_eq!(unchanged.tx, tx, "{b}: nothing of the stale write landed");
        assert!(store.attempts("s", 0, 1_000).await.unwrap().is_empty());
        assert!(!store.renew("s", "first", T0 + 9_000).await.unwrap());

        // The new owner's write lands, with the branch change and the attempt.
        let saved = store
            .save(Save {
                before: &tx,
                after: &step.tx,
                guard: Guard::Owner("second", 1),
                lease: Some(&second),
                attempts: std::slice::from_ref(&attempt),
            })
            .await
            .unwrap();
        assert_eq!(saved, Saved::Saved);
        let now = store.load("s").await.unwrap().unwrap();
        assert_eq!(now.tx, step.tx, "{b}");
        assert_eq!(store.attempts("s", 0, 1_000).await.unwrap(), vec![attempt]);
        assert!(store.renew("s", "second", T0 + 9_000).await.unwrap());
        assert_eq!(
            store.load("s").await.unwrap().unwrap().lease_until,
            Some(T0 + 9_000)
        );

        // Wrong expected status: refused too.
        let wrong = store
            .save(Save {
                before: &tx,
                after: &step.tx,
                guard: Guard::Owner("second", 2),
                lease: Some(&second),
                attempts: &[],
            })
            .await
            .unwrap();
        assert_eq!(
            wrong,
            Saved::Saved,
            "{b}: same status (running), owner and version"
        );
        let mut other_status = tx.clone();
        other_status.status = Status::Aborting;
        let wrong = store
            .save(Save {
                before: &other_status,
                after: &step.tx,
                guard: Guard::Owner("second", 3),
                lease: Some(&second),
                attempts: &[],
            })
            .await
            .unwrap();
        assert_eq!(wrong, Saved::Lost, "{b}: status is not aborting");
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn claims_take_only_due_unowned_rows_and_never_the_same_row_twice() {
    let dbs = common::stores("claims_take_only_due_unowned_rows").await;
    for (db, store) in &dbs {
        let b = db.backend;
        // 40 due sagas without an owner, one with a live lease, one not due yet, one
        // finished and one prepared TCC without a timeout.
        for i in 0..40 {
            store
                .create(&saga(&format!("due-{i:02}")), "h", None)
                .await
                .unwrap();
        }
        store
            .create(&saga("leased"), "h", Some(&lease("alive", T0 + 60_000)))
            .await
            .unwrap();
        let mut later = saga("later");
        later.next_attempt_at = Some(T0 + 60_000);
        store.create(&later, "h", None).await.unwrap();
        let mut done = saga("done");
        done.status = Status::Succeeded;
        done.next_attempt_at = None;
        store.create(&done, "h", None).await.unwrap();
        store.create(&tcc("prepared"), "h", None).await.unwrap();

        let now = T0 + 1_000;
        let mut claimers = Vec::new();
        for c in 0..4 {
            let store = Arc::clone(store);
            claimers.push(tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let l = lease(&format!("c{c}"), now + 30_000);
                    let got: Vec<_> = store
                        .claim_due(&l, now, 7, &[])
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|c| c.stored)
                        .collect();
                    if got.is_empty() {
                        return mine;
                    }
                    for s in got {
                        assert_eq!(s.owner_token.as_deref(), Some(l.token.as_str()));
                        mine.push(s.tx.gid);
                    }
                }
            }));
        }
        let mut all = Vec::new();
        for c in claimers {
            all.extend(c.await.unwrap());
        }
        let unique: HashSet<&String> = all.iter().collect();
        assert_eq!(
            all.len(),
            40,
            "{b}: every due row claimed once, got {all:?}"
        );
        assert_eq!(unique.len(), 40, "{b}: no row claimed twice");
        assert!(all.iter().all(|g| g.starts_with("due-")), "{b}: {all:?}");

        // Once the live lease expires, that row is claimable too.
        let got = store
            .claim_due(&lease("late", T0 + 200_000), T0 + 60_001, 100, &[])
            .await
            .unwrap();
        let gids: HashSet<String> = got.into_iter().map(|c| c.stored.tx.gid).collect();
        assert!(
            gids.contains("leased") && gids.contains("later"),
            "{b}: {gids:?}"
        );
        assert!(
            !gids.contains("done") && !gids.contains("prepared"),
            "{b}: {gids:?}"
        );
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn list_filters_and_pages() {
    let dbs = common::stores("list_filters_and_pages").await;
    for (db, store) in &dbs {
        let b = db.backend;
        for i in 0..7 {
            let mut tx = saga(&format!("s{i}"));
            tx.created_at = T0 + i;
            store.create(&tx, "h", None).await.unwrap();
            let mut t = tcc(&format!("t{i}"));
            t.created_at = T0 + i;
            store.create(&t, "h", None).await.unwrap();
        }
        let mut seen = Vec::new();
        let mut filter = ListFilter {
            kind: Some(Kind::Saga),
            limit: 3,
            ..Default::default()
        };
        loop {
            let page = store.list(&filter).await.unwrap();
            seen.extend(page.items.iter().map(|s| s.tx.gid.clone()));
            match page.next {
                Some(next) => filter.after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, ["s6", "s5", "s4", "s3", "s2", "s1", "s0"], "{b}");
        let prepared = store
            .list(&ListFilter {
                statuses: vec![Status::Prepared],
                created_from: Some(T0 + 2),
                created_to: Some(T0 + 4),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        let gids: Vec<&str> = prepared.items.iter().map(|s| s.tx.gid.as_str()).collect();
        assert_eq!(gids, ["t3", "t2"], "{b}");
    }
    common::cleanup(dbs).await;
}

/// The tenant column is derived from the key in the database: a bare gid is the default
/// tenant's (every row stored before tenants existed), `acme/x` is acme's; lists and counts
/// by tenant see only their own, and the longest key fits on every database.
#[tokio::test]
async fn tenants_are_derived_from_the_key_and_filter_lists_and_counts() {
    let dbs = common::stores("tenants_filter").await;
    let longest = format!(
        "{}/{}",
        "t".repeat(idem_types::MAX_TENANT_LEN),
        "g".repeat(idem_types::MAX_ID_LEN)
    );
    for (db, store) in &dbs {
        let b = db.backend;
        for gid in [
            "plain",
            "acme/order-1",
            "acme/order-2",
            "globex/order-1",
            longest.as_str(),
        ] {
            let created = store.create(&saga(gid), "h", None).await.unwrap();
            assert!(
                matches!(created, idem_store::Created::Inserted),
                "{b}: {gid}"
            );
        }
        let in_tenant = |tenant: &str| ListFilter {
            tenant: Some(tenant.to_owned()),
            limit: 100,
            ..Default::default()
        };
        let gids = |page: idem_store::Page| -> Vec<String> {
            let mut g: Vec<String> = page.items.into_iter().map(|s| s.tx.gid).collect();
            g.sort();
            g
        };
        assert_eq!(
            gids(store.list(&in_tenant("acme")).await.unwrap()),
            ["acme/order-1", "acme/order-2"],
            "{b}"
        );
        assert_eq!(
            gids(store.list(&in_tenant("default")).await.unwrap()),
            ["plain"],
            "{b}"
        );
        assert_eq!(
            gids(store.list(&in_tenant("globex")).await.unwrap()),
            ["globex/order-1"],
            "{b}"
        );
        let running = [Status::Running];
        assert_eq!(store.count(Some("acme"), &running).await.unwrap(), 2, "{b}");
        assert_eq!(
            store.count(Some("nobody"), &running).await.unwrap(),
            0,
            "{b}"
        );
        assert_eq!(store.count(None, &running).await.unwrap(), 5, "{b}");
        assert!(store.load(&longest).await.unwrap().is_some(), "{b}");
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn active_summary_counts_the_non_terminal_rows_by_status() {
    let dbs = common::stores("active_summary_counts_non_terminal").await;
    for (db, store) in &dbs {
        let b = db.backend;
        assert_eq!(store.active_summary().await.unwrap(), vec![], "{b}");
        store.create(&saga("r1"), "h", None).await.unwrap();
        let mut r2 = saga("r2");
        r2.created_at = T0 - 7_000;
        store.create(&r2, "h", None).await.unwrap();
        let mut done = saga("done");
        done.status = Status::Succeeded;
        done.created_at = T0 - 60_000;
        store.create(&done, "h", None).await.unwrap();
        let mut stalled = saga("stalled");
        stalled.status = Status::Stalled;
        stalled.stalled_from = Some(Status::Running);
        stalled.created_at = T0 - 3_000;
        store.create(&stalled, "h", None).await.unwrap();
        store.create(&tcc("p"), "h", None).await.unwrap();

        let mut got = store.active_summary().await.unwrap();
        got.sort_by_key(|s| s.status.as_str());
        let want = vec![
            StatusSummary {
                status: Status::Prepared,
                count: 1,
                oldest_created_at: T0,
            },
            StatusSummary {
                status: Status::Running,
                count: 2,
                oldest_created_at: T0 - 7_000,
            },
            StatusSummary {
                status: Status::Stalled,
                count: 1,
                oldest_created_at: T0 - 3_000,
            },
        ];
        assert_eq!(got, want, "{b}: finished rows are not counted");
    }
    common::cleanup(dbs).await;
}

mod stale_writes;

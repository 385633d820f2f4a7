//! The barrier's TCC guarantees, on every backend, through the library API (the example
//! participants' tests exercise the same over HTTP): duplicates, empty rollback,
//! anti-suspension, failed steps. `barrier_more.rs`: sagas, msg, shared transactions,
//! typed pools, keys and purge, deadlocks.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{BarrierRecord, LeanPool, Op, Outcome, ParticipantError, barrier_records};
use sqlx::Any;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_identical_tries_run_once() {
    for db in testing::all("fifty_concurrent_identical_tries_run_once").await {
        let pool = setup(&db).await;
        let g = gid("t50");
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let ran = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (pool, g, start, ran) = (pool.clone(), g.clone(), start.clone(), ran.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                tcc(&g, Op::Try)
                    .run(&pool, |tx| {
                        let ran = ran.clone();
                        async move {
                            ran.fetch_add(1, Ordering::SeqCst);
                            bump(&tx, 1).await
                        }
                    })
                    .await
            }));
        }
        let mut results = HashSet::new();
        let mut executed = 0;
        for task in tasks {
            match task.await.unwrap().expect("no error reaches the caller") {
                Outcome::Executed(t) => {
                    executed += 1;
                    results.insert(t);
                }
                Outcome::Duplicate(t) => {
                    results.insert(t);
                }
                other => panic!("{}: unexpected {other:?}", db.backend),
            }
        }
        assert_eq!(executed, 1, "{}", db.backend);
        assert_eq!(
            results.len(),
            1,
            "{}: all 50 get the first result",
            db.backend
        );
        assert_eq!(counter(&pool).await, 1, "{}", db.backend);
        // Attempts that lost a lock conflict may have entered the closure and rolled back;
        // exactly one committed.
        assert!(ran.load(Ordering::SeqCst) >= 1);
        pool.close().await;
        db.drop_database().await;
    }
}

/// The same guarantees when steps take their connections from a `LeanPool` (which hands a
/// connection back only after a clean COMMIT or ROLLBACK).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lean_pool_steps_run_once_and_a_failed_step_leaves_no_open_transaction() {
    for db in testing::all("lean_pool_steps_run_once").await {
        let pool = setup(&db).await;
        let lean = LeanPool::<Any>::new((*pool.connect_options()).clone(), 2);
        let g = gid("lean");
        let start = Arc::new(tokio::sync::Barrier::new(30));
        let mut tasks = Vec::new();
        for _ in 0..30 {
            let (lean, g, start) = (lean.clone(), g.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                tcc(&g, Op::Try)
                    .run(&lean, |tx| async move { bump(&tx, 1).await })
                    .await
            }));
        }
        let mut executed = 0;
        for task in tasks {
            match task.await.unwrap().expect("no error reaches the caller") {
                Outcome::Executed(_) => executed += 1,
                Outcome::Duplicate(_) => {}
                other => panic!("{}: unexpected {other:?}", db.backend),
            }
        }
        assert_eq!(executed, 1, "{}", db.backend);
        assert_eq!(counter(&pool).await, 1, "{}", db.backend);

        // A Confirm whose business step fails after changing the counter: rolled back,
        // and the connection it used must not carry the open transaction into later steps.
        for _ in 0..3 {
            let failed = tcc(&g, Op::Confirm)
                .run(&lean, |tx| async move {
                    bump(&tx, 100).await?;
                    Err::<u64, _>(ParticipantError::refused("not today"))
                })
                .await;
            assert!(failed.is_err(), "{}", db.backend);
        }
        assert_eq!(counter(&pool).await, 1, "{}: rolled back", db.backend);
        let confirmed = tcc(&g, Op::Confirm)
            .run(&lean, |tx| async move { bump(&tx, 10).await })
            .await
            .expect("the retried Confirm runs");
        assert!(matches!(confirmed, Outcome::Executed(_)), "{}", db.backend);
        assert_eq!(counter(&pool).await, 11, "{}", db.backend);
        lean.close().await;
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_try_is_an_empty_rollback_and_blocks_late_tries() {
    for db in testing::all("cancel_before_try_is_an_empty_rollback").await {
        let pool = setup(&db).await;
        let g = gid("hang");
        let cancel = tcc(&g, Op::Cancel)
            .run(&pool, |tx| async move { bump(&tx, -1).await })
            .await
            .unwrap();
        assert_eq!(cancel, Outcome::EmptyRollback, "{}", db.backend);
        for _ in 0..2 {
            let late = tcc(&g, Op::Try)
                .run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap();
            assert_eq!(late, Outcome::Rejected, "{}", db.backend);
        }
        // A repeated Cancel is still an empty rollback, and still does nothing.
        let again = tcc(&g, Op::Cancel)
            .run(&pool, |tx| async move { bump(&tx, -1).await })
            .await
            .unwrap();
        assert_eq!(again, Outcome::EmptyRollback);
        assert_eq!(counter(&pool).await, 0, "{}", db.backend);

        let rows = barrier_records(&pool, &g).await.unwrap();
        let summary: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (r.op.clone(), r.reason.clone(), r.outcome.clone()))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("cancel".into(), "cancel".into(), "empty_rollback".into()),
                ("try".into(), "cancel".into(), "guard".into()),
            ],
            "{}",
            db.backend
        );
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_try_either_both_or_neither() {
    const ROUNDS: usize = 100;
    for db in testing::all("cancel_racing_try_either_both_or_neither").await {
        let pool = setup(&db).await;
        let (mut both, mut neither) = (0, 0);
        for round in 0..ROUNDS {
            let g = gid("race");
            let start = Arc::new(tokio::sync::Barrier::new(2));
            let try_call = {
                let (pool, g, start) = (pool.clone(), g.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    tcc(&g, Op::Try)
                        .run(&pool, |tx| async move { bump(&tx, 1).await })
                        .await
                })
            };
            let cancel_call = {
                let (pool, g, start) = (pool.clone(), g.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    tcc(&g, Op::Cancel)
                        .run(&pool, |tx| async move { bump(&tx, -1).await })
                        .await
                })
            };
            let t = try_call.await.unwrap().expect("try: no error surfaces");
            let c = cancel_call
                .await
                .unwrap()
                .expect("cancel: no error surfaces");
            match (&t, &c) {
                (Outcome::Executed(_), Outcome::Executed(_)) => both += 1,
                (Outcome::Rejected, Outcome::EmptyRollback) => neither += 1,
                _ => panic!("{} round {round}: try {t:?}, cancel {c:?}", db.backend),
            }
            assert_eq!(counter(&pool).await, 0, "{} round {round}", db.backend);
        }
        println!(
            "{}: {ROUNDS} rounds, both ran {both}, neither ran {neither}",
            db.backend
        );
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_confirm_and_cancel_apply_once() {
    for db in testing::all("duplicate_confirm_and_cancel_apply_once").await {
        let pool = setup(&db).await;
        // Confirm path.
        let g = gid("dup-confirm");
        tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 10).await })
            .await
            .unwrap();
        let first = tcc(&g, Op::Confirm)
            .run(&pool, |tx| async move { bump(&tx, 100).await })
            .await
            .unwrap();
        let second = tcc(&g, Op::Confirm)
            .run(&pool, |tx| async move { bump(&tx, 100).await })
            .await
            .unwrap();
        assert!(matches!(first, Outcome::Executed(_)));
        assert_eq!(
            second,
            Outcome::Duplicate(first.clone().into_result().unwrap())
        );
        assert_eq!(counter(&pool).await, 110, "{}", db.backend);
        // Cancel path, with the duplicates concurrent.
        let g = gid("dup-cancel");
        tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        let (c1, c2) = (tcc(&g, Op::Cancel), tcc(&g, Op::Cancel));
        let (a, b) = tokio::join!(
            c1.run(&pool, |tx| async move { bump(&tx, -1).await }),
            c2.run(&pool, |tx| async move { bump(&tx, -1).await }),
        );
        let kinds: HashSet<&str> = [a.as_ref().unwrap().kind(), b.as_ref().unwrap().kind()].into();
        assert_eq!(
            kinds,
            HashSet::from(["executed", "duplicate"]),
            "{}",
            db.backend
        );
        assert_eq!(a.unwrap().into_result(), b.unwrap().into_result());
        assert_eq!(counter(&pool).await, 110, "{}", db.backend);
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_closure_leaves_no_row_and_the_retry_runs() {
    for db in testing::all("failing_closure_leaves_no_row").await {
        let pool = setup(&db).await;
        let g = gid("fail");
        let err = tcc(&g, Op::Try)
            .run(&pool, |tx| async move {
                bump(&tx, 1).await?;
                Err::<u64, _>(ParticipantError::refused("not today"))
            })
            .await
            .unwrap_err();
        assert!(err.is_refusal());
        assert_eq!(
            barrier_records(&pool, &g).await.unwrap(),
            Vec::<BarrierRecord>::new()
        );
        assert_eq!(
            counter(&pool).await,
            0,
            "{}: the business change rolled back",
            db.backend
        );

        let retry = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(retry, Outcome::Executed(_)), "{}", db.backend);
        assert_eq!(counter(&pool).await, 1);
        let rows = barrier_records(&pool, &g).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].outcome, "executed");
        assert_eq!(rows[0].reason, "try");
        assert!(rows[0].result.is_some());
        pool.close().await;
        db.drop_database().await;
    }
}

//! The barrier's guarantees, on every backend, through the library API (the example
//! participants' tests exercise the same over HTTP).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{
    Barrier, BarrierDatabase, BarrierRecord, Dialect, LeanPool, MsgState, Op, Outcome,
    ParticipantError, TransType, barrier_records, create_barrier_table, query_prepared,
};
use sqlx::{Any, Row};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saga_compensation_and_steps() {
    for db in testing::all("saga_compensation_and_steps").await {
        let pool = setup(&db).await;
        let g = gid("saga");
        let action = |step: u32| {
            Barrier::new(TransType::Saga, &g, "01", Op::Action)
                .unwrap()
                .step(step)
        };
        // Two independently guarded steps in one call.
        assert!(matches!(
            action(1)
                .run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap(),
            Outcome::Executed(_)
        ));
        assert!(matches!(
            action(2)
                .run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap(),
            Outcome::Executed(_)
        ));
        assert!(matches!(
            action(1)
                .run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap(),
            Outcome::Duplicate(_)
        ));
        assert_eq!(counter(&pool).await, 2);
        let comp = Barrier::new(TransType::Saga, &g, "01", Op::Compensate).unwrap();
        assert!(matches!(
            comp.run(&pool, |tx| async move { bump(&tx, -1).await })
                .await
                .unwrap(),
            Outcome::Executed(_)
        ));
        assert!(matches!(
            comp.run(&pool, |tx| async move { bump(&tx, -1).await })
                .await
                .unwrap(),
            Outcome::Duplicate(_)
        ));
        assert_eq!(counter(&pool).await, 1);
        // Compensating a branch whose action never ran, then the late action.
        let g2 = gid("saga-hang");
        let comp = Barrier::new(TransType::Saga, &g2, "02", Op::Compensate).unwrap();
        assert_eq!(
            comp.run(&pool, |tx| async move { bump(&tx, -1).await })
                .await
                .unwrap(),
            Outcome::EmptyRollback
        );
        let late = Barrier::new(TransType::Saga, &g2, "02", Op::Action).unwrap();
        assert_eq!(
            late.run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap(),
            Outcome::Rejected
        );
        assert_eq!(counter(&pool).await, 1);
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_in_shares_the_callers_transaction() {
    for db in testing::all("run_in_shares_the_callers_transaction").await {
        let pool = setup(&db).await;
        let g = gid("run-in");
        let begin = Dialect::from_url(&db.url).unwrap().begin_statement();
        // Rolled back by the caller: nothing stays.
        let mut tx = match begin {
            Some(b) => pool.begin_with(b).await.unwrap(),
            None => pool.begin().await.unwrap(),
        };
        let o = tcc(&g, Op::Try)
            .run_in(&mut tx, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(o, Outcome::Executed(_)));
        tx.rollback().await.unwrap();
        assert_eq!(counter(&pool).await, 0);
        assert!(barrier_records(&pool, &g).await.unwrap().is_empty());
        // Committed by the caller.
        let mut tx = match begin {
            Some(b) => pool.begin_with(b).await.unwrap(),
            None => pool.begin().await.unwrap(),
        };
        let o = tcc(&g, Op::Try)
            .run_in(&mut tx, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(o, Outcome::Executed(_)));
        tx.commit().await.unwrap();
        assert_eq!(counter(&pool).await, 1);
        let dup = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(dup, Outcome::Duplicate(o.into_result().unwrap()));
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msg_back_check_sees_commit_or_blocks_the_late_local_transaction() {
    for db in testing::all("msg_back_check").await {
        let pool = setup(&db).await;
        // Committed local transaction.
        let g = gid("msg-ok");
        let o = Barrier::msg(&g)
            .unwrap()
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(o, Outcome::Executed(_)));
        assert_eq!(
            query_prepared(&pool, &g).await.unwrap(),
            MsgState::Committed
        );
        assert_eq!(
            query_prepared(&pool, &g).await.unwrap(),
            MsgState::Committed
        );
        // Never committed: the back-check says rolled back, and the late local transaction
        // can no longer commit its change.
        let g = gid("msg-lost");
        assert_eq!(
            query_prepared(&pool, &g).await.unwrap(),
            MsgState::RolledBack
        );
        let late = Barrier::msg(&g)
            .unwrap()
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected);
        assert_eq!(
            query_prepared(&pool, &g).await.unwrap(),
            MsgState::RolledBack
        );
        assert_eq!(counter(&pool).await, 1, "{}", db.backend);
        pool.close().await;
        db.drop_database().await;
    }
}

/// The same steps on each backend's typed pool (not `Any`): a Cancel before its Try, the
/// late Try, a Confirm whose Try was turned away, and a Confirm after its Try.
async fn typed_steps<DB: BarrierDatabase>(pool: &sqlx::Pool<DB>, backend: testing::Backend) {
    create_barrier_table(pool).await.unwrap();
    let g = gid("typed");
    let b = tcc(&g, Op::Cancel);
    assert_eq!(
        b.run(pool, |_tx| async { Ok(1) }).await.unwrap(),
        Outcome::EmptyRollback,
        "{backend}"
    );
    let b = tcc(&g, Op::Try);
    assert_eq!(
        b.run(pool, |_tx| async { Ok(1) }).await.unwrap(),
        Outcome::Rejected,
        "{backend}"
    );
    let b = tcc(&g, Op::Confirm);
    let refused = b.run(pool, |_tx| async { Ok(7) }).await.unwrap_err();
    assert!(refused.is_confirm_without_try(), "{backend}: {refused}");

    let g = gid("typed-ok");
    let b = tcc(&g, Op::Try);
    assert_eq!(
        b.run(pool, |_tx| async { Ok(1) }).await.unwrap(),
        Outcome::Executed(1),
        "{backend}"
    );
    let b = tcc(&g, Op::Confirm);
    assert_eq!(
        b.run(pool, |_tx| async { Ok(7) }).await.unwrap(),
        Outcome::Executed(7),
        "{backend}"
    );
    assert_eq!(
        b.run(pool, |_tx| async { Ok(8) }).await.unwrap(),
        Outcome::Duplicate(7),
        "{backend}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_pools_work_too() {
    use idem_participant::testing::Backend;
    for db in testing::all("typed_pools_work_too").await {
        match db.backend {
            Backend::Sqlite => {
                let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
                typed_steps(&pool, db.backend).await;
                pool.close().await;
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                typed_steps(&pool, db.backend).await;
                pool.close().await;
            }
            Backend::Mysql => {
                let pool = sqlx::MySqlPool::connect(&db.url).await.unwrap();
                typed_steps(&pool, db.backend).await;
                pool.close().await;
            }
        }
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_case_sensitive_and_purge_keeps_recent_rows() {
    for db in testing::all("keys_are_case_sensitive").await {
        let pool = setup(&db).await;
        let g = gid("Case");
        let upper = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        let lower = tcc(&g.to_lowercase(), Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(upper, Outcome::Executed(_)));
        assert!(
            matches!(lower, Outcome::Executed(_)),
            "{}: gids differing in case are distinct",
            db.backend
        );
        let purged = idem_participant::purge_barriers(
            &pool,
            idem_participant::DEFAULT_TABLE,
            std::time::Duration::from_secs(3600),
        )
        .await
        .unwrap();
        assert_eq!(purged, 0, "{}", db.backend);
        // Age one row by a day, then purge with a one-hour retention.
        let old = match db.backend {
            testing::Backend::Sqlite => "'2000-01-01T00:00:00.000Z'",
            testing::Backend::Postgres => "now() - interval '1 day'",
            testing::Backend::Mysql => "NOW(3) - INTERVAL 1 DAY",
        };
        let dialect = Dialect::from_url(&db.url).unwrap();
        sqlx::query(dialect.sql(&format!(
            "UPDATE idem_barrier SET created_at = {old} WHERE gid = ?"
        )))
        .bind(g.clone())
        .execute(&pool)
        .await
        .unwrap();
        let purged = idem_participant::purge_barriers(
            &pool,
            idem_participant::DEFAULT_TABLE,
            std::time::Duration::from_secs(3600),
        )
        .await
        .unwrap();
        assert_eq!(purged, 1, "{}", db.backend);
        assert_eq!(
            barrier_records(&pool, &g.to_lowercase())
                .await
                .unwrap()
                .len(),
            1
        );
        pool.close().await;
        db.drop_database().await;
    }
}

/// Two steps whose business statements lock two rows in opposite orders: the database
/// detects the deadlock and kills one transaction; the barrier re-runs it, and both steps
/// succeed without the deadlock reaching the caller. (Not on SQLite: `BEGIN IMMEDIATE`
/// serialises writers, so it cannot deadlock, and the rendezvous below would wait forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlock_in_the_business_step_is_retried_not_surfaced() {
    for db in testing::all("deadlock_is_retried").await {
        if db.backend == testing::Backend::Sqlite {
            db.drop_database().await;
            continue;
        }
        let pool = setup(&db).await;
        sqlx::query("INSERT INTO counters (name, value) VALUES ('a', 0), ('b', 0)")
            .execute(&pool)
            .await
            .unwrap();
        let rendezvous = Arc::new(tokio::sync::Barrier::new(2));
        let calls = Arc::new(AtomicUsize::new(0));
        let step = |g: String, first: &'static str, second: &'static str| {
            let (pool, rendezvous, calls) = (pool.clone(), rendezvous.clone(), calls.clone());
            tokio::spawn(async move {
                let synced = Arc::new(std::sync::atomic::AtomicBool::new(false));
                tcc(&g, Op::Try)
                    .run(&pool, |tx| {
                        let (rendezvous, calls, synced) =
                            (rendezvous.clone(), calls.clone(), synced.clone());
                        async move {
                            calls.fetch_add(1, Ordering::SeqCst);
                            let bump = "UPDATE counters SET value = value + 1 WHERE name = ?";
                            sqlx::query(tx.sql(bump))
                                .bind(first)
                                .execute(&mut *tx.conn())
                                .await?;
                            // Only the first attempt meets the other step half-way.
                            if !synced.swap(true, Ordering::SeqCst) {
                                rendezvous.wait().await;
                            }
                            sqlx::query(tx.sql(bump))
                                .bind(second)
                                .execute(&mut *tx.conn())
                                .await?;
                            Ok(first.to_owned())
                        }
                    })
                    .await
            })
        };
        let one = step(gid("dl1"), "a", "b");
        let two = step(gid("dl2"), "b", "a");
        let (one, two) = (one.await.unwrap(), two.await.unwrap());
        assert_eq!(
            one.expect("no deadlock surfaces"),
            Outcome::Executed("a".into()),
            "{}",
            db.backend
        );
        assert_eq!(
            two.expect("no deadlock surfaces"),
            Outcome::Executed("b".into()),
            "{}",
            db.backend
        );
        assert!(
            calls.load(Ordering::SeqCst) >= 3,
            "{}: one step was re-run",
            db.backend
        );
        let values: Vec<i64> =
            sqlx::query("SELECT value FROM counters WHERE name IN ('a', 'b') ORDER BY name")
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<i64, _>(0))
                .collect();
        assert_eq!(values, vec![2, 2], "{}: each step counted once", db.backend);
        pool.close().await;
        db.drop_database().await;
    }
}

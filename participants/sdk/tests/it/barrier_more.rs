//! More of the barrier's guarantees, on every backend: saga steps, a step inside the
//! caller's transaction, the msg back-check, typed pools, keys and purge, and deadlocks in
//! the business step (see `barrier.rs` for the TCC ones).

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{
    Barrier, BarrierDatabase, DEFAULT_TENANT, Dialect, MsgState, Op, Outcome, TransType,
    barrier_records, create_barrier_table, query_prepared,
};
use sqlx::Row;

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
            query_prepared(&pool, DEFAULT_TENANT, &g).await.unwrap(),
            MsgState::Committed
        );
        assert_eq!(
            query_prepared(&pool, DEFAULT_TENANT, &g).await.unwrap(),
            MsgState::Committed
        );
        // Never committed: the back-check says rolled back, and the late local transaction
        // can no longer commit its change.
        let g = gid("msg-lost");
        assert_eq!(
            query_prepared(&pool, DEFAULT_TENANT, &g).await.unwrap(),
            MsgState::RolledBack
        );
        let late = Barrier::msg(&g)
            .unwrap()
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected);
        assert_eq!(
            query_prepared(&pool, DEFAULT_TENANT, &g).await.unwrap(),
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
        common::age_rows(&pool, &db, &g, 1).await;
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

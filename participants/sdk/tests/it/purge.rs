//! The scheduled barrier purge on every backend: rows past the window derived from the
//! coordinator's settings go, younger ones stay and keep doing their job; and what a purged
//! guard no longer prevents.

use crate::common;

use std::time::Duration;

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{
    BarrierRetention, CoordinatorSettings, DEFAULT_TABLE, Op, Outcome, barrier_records,
    purge_barriers, spawn_barrier_purge,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduled_purge_takes_rows_past_the_derived_window_and_keeps_the_rest() {
    for db in testing::all("scheduled_barrier_purge").await {
        let b = db.backend;
        let pool = setup(&db).await;
        // An old transaction: its Cancel came first and left the guard that rejects a
        // late Try. A young one: the same, a moment ago.
        let (old, young) = (gid("old"), gid("young"));
        for g in [&old, &young] {
            let cancel = tcc(g, Op::Cancel)
                .run(&pool, |tx| async move { bump(&tx, -1).await })
                .await
                .unwrap();
            assert!(matches!(cancel, Outcome::EmptyRollback), "{b}");
        }
        common::age_rows(&pool, &db, &old, 10_000).await;

        let coordinator = CoordinatorSettings {
            max_branches: 3,
            ..CoordinatorSettings::default()
        };
        let retention = BarrierRetention::new(coordinator, Duration::from_secs(7 * 86_400));
        assert!(retention.window() > Duration::from_secs(8 * 86_400), "{b}");
        let task = spawn_barrier_purge(
            pool.clone(),
            DEFAULT_TABLE,
            retention,
            Duration::from_millis(20),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !barrier_records(&pool, &old).await.unwrap().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{b}: the old rows stay"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // More passes run; the young guard stays and still rejects its late Try.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!task.is_finished(), "{b}: the purge keeps running");
        assert_eq!(
            barrier_records(&pool, &young).await.unwrap().len(),
            2,
            "{b}"
        );
        let late_try = tcc(&young, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(late_try, Outcome::Rejected), "{b}: {late_try:?}");
        // What the window is for: with the old guard gone, a Try that arrives that late
        // runs, after its Cancel, and nothing will undo it.
        let too_late = tcc(&old, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(
            matches!(too_late, Outcome::Executed(_)),
            "{b}: {too_late:?}"
        );
        assert_eq!(counter(&pool).await, 1, "{b}: its effect stays");
        task.abort();
        pool.close().await;
        db.drop_database().await;
    }
}

/// A client that calls its Try itself keeps sending it until its retries end, long after
/// the transaction timed out and its Cancel left the guard. The window derived with the
/// client's retry period keeps the guard until then, so the late Try is rejected; the
/// coordinator's own schedule alone would have purged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_outlives_a_try_the_client_keeps_retrying() {
    for db in testing::all("client_try_window").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let g = gid("late-client");
        let cancel = tcc(&g, Op::Cancel)
            .run(&pool, |tx| async move { bump(&tx, -1).await })
            .await
            .unwrap();
        assert!(matches!(cancel, Outcome::EmptyRollback), "{b}");
        // Clients retry for 30 days; the Try arrives 20 days after the guard was written.
        let coordinator = CoordinatorSettings {
            client_retry_period_ms: 30 * 86_400_000,
            max_branches: 1,
            ..CoordinatorSettings::default()
        };
        let retention = BarrierRetention::new(coordinator, Duration::ZERO);
        let without_clients = BarrierRetention::new(
            CoordinatorSettings {
                client_retry_period_ms: 0,
                ..coordinator
            },
            Duration::ZERO,
        );
        let twenty_days = Duration::from_secs(20 * 86_400);
        assert!(without_clients.window() < twenty_days, "{b}");
        assert!(retention.window() > twenty_days, "{b}");
        common::age_rows(&pool, &db, &g, 20).await;
        let purged = purge_barriers(&pool, DEFAULT_TABLE, retention.window())
            .await
            .unwrap();
        assert_eq!(purged, 0, "{b}");
        let late_try = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(late_try, Outcome::Rejected), "{b}: {late_try:?}");
        assert_eq!(counter(&pool).await, 0, "{b}: the late Try did nothing");
        // Past the client's retries the guard has done its job and goes.
        common::age_rows(&pool, &db, &g, 40).await;
        let purged = purge_barriers(&pool, DEFAULT_TABLE, retention.window())
            .await
            .unwrap();
        assert!(purged > 0, "{b}");
        assert!(barrier_records(&pool, &g).await.unwrap().is_empty(), "{b}");
        pool.close().await;
        db.drop_database().await;
    }
}

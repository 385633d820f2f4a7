//! The scheduled barrier purge on every backend: rows past the window derived from the
//! coordinator's settings go, younger ones stay and keep doing their job; and what a purged
//! guard no longer prevents.

mod common;

use std::time::Duration;

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{
    BarrierRetention, CoordinatorSettings, DEFAULT_TABLE, Op, Outcome, barrier_records,
    spawn_barrier_purge,
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

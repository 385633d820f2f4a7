//! Job units on every backend: a rerun under a new execution id skips finished units and
//! retries failed ones, concurrent runners of one unit do it once, a chunked unit resumes
//! from its checkpoint after its runner's lease ran out (and the old runner writes nothing
//! more), retention keeps unfinished units, and the metrics.
//!
//! The business table `ledger` has no unique key, so a unit (or item) applied twice would
//! show as a second row.

use std::sync::Arc;
use std::time::Duration;

use idem_participant::jobs::{
    ChunkOutcome, JOB_UNITS_TOTAL, JobSummary, JobUnits, MIN_JOB_UNIT_RETENTION, Progress,
    UnitClaim, UnitKey, UnitOutcome, UnitStatus, create_job_tables, describe, job_unit_stats,
    purge_job_units,
};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{LocalTx, ManualClock, ParticipantError};
use sqlx::{Any, AnyPool};

use crate::kit_support::ledger;
use ledger::{book, booked};

use crate::kit_support::recorder;
use recorder::counter_value;

const DATE: &str = "2026-11-30";

async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
    create_job_tables(&pool).await.expect("job units");
    create_job_tables(&pool)
        .await
        .expect("creating twice is harmless");
    ledger::create(&pool).await;
    pool
}

fn unit_name(key: &UnitKey) -> String {
    format!("{}/{}/{}", key.shard, key.source_id, key.batch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_with_a_new_execution_id_skips_finished_units_and_retries_failed_ones() {
    for db in testing::all("a_rerun_skips_finished_units").await {
        let pool = setup(&db).await;
        let units = JobUnits::new("settlement", DATE).unwrap();
        let keys: Vec<UnitKey> = (0..5)
            .map(|i| UnitKey::new(i % 2, format!("merchant-{i}"), "page-1"))
            .collect();
        assert_eq!(units.plan(&pool, &keys).await.unwrap(), 5);
        assert_eq!(units.plan(&pool, &keys).await.unwrap(), 0, "planned once");
        // The first run: unit 3 fails after writing (its write must roll back).
        for (i, key) in keys.iter().enumerate() {
            let name = unit_name(key);
            let got = units
                .run_unit(&pool, "exec-1", key.clone(), |tx| {
                    let name = name.clone();
                    async move {
                        book(&tx, &name, 0, 3).await?;
                        if i == 3 {
                            return Err(ParticipantError::transient("source timed out"));
                        }
                        Ok(Some("3".to_owned()))
                    }
                })
                .await;
            assert_eq!(got.is_ok(), i != 3, "{} unit {i}: {got:?}", db.backend);
        }
        let after_first = units.summary(&pool).await.unwrap();
        assert_eq!(
            after_first,
            JobSummary {
                done: 4,
                failed: 1,
                ..JobSummary::default()
            },
            "{}",
            db.backend
        );
        assert_eq!(
            booked(&pool, &unit_name(&keys[3])).await,
            (0, 0),
            "rolled back"
        );
        // A manual rerun of the same business date: a new execution id, the same units.
        let mut ran = Vec::new();
        for key in &keys {
            let name = unit_name(key);
            let got = units
                .run_unit(&pool, "exec-2", key.clone(), |tx| {
                    let name = name.clone();
                    async move {
                        book(&tx, &name, 0, 3).await?;
                        Ok(None)
                    }
                })
                .await
                .expect("rerun");
            ran.push(got);
        }
        for (i, got) in ran.iter().enumerate() {
            let expected = if i == 3 {
                UnitOutcome::Done
            } else {
                UnitOutcome::AlreadyDone {
                    by_execution: "exec-1".into(),
                }
            };
            assert_eq!(got, &expected, "{} unit {i}", db.backend);
            assert_eq!(
                booked(&pool, &unit_name(&keys[i])).await,
                (3, 3),
                "{} unit {i}",
                db.backend
            );
        }
        let retried = units.unit(&pool, &keys[3]).await.unwrap().expect("known");
        assert_eq!(retried.status, UnitStatus::Done);
        assert_eq!(retried.execution_id.as_deref(), Some("exec-2"));
        assert_eq!(retried.attempts, 2, "a failed attempt and a good one");
        let done = units.unit(&pool, &keys[0]).await.unwrap().unwrap();
        assert_eq!(done.checkpoint.as_deref(), Some("3"));
        assert_eq!(done.attempts, 1);
        // Another business date is other units.
        let tomorrow = JobUnits::new("settlement", "2026-12-01").unwrap();
        assert_eq!(
            tomorrow.summary(&pool).await.unwrap(),
            JobSummary::default()
        );
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runners_of_one_unit_do_it_once() {
    for db in testing::all("concurrent_runners_of_one_unit_do_it_once").await {
        let pool = setup(&db).await;
        let units = Arc::new(JobUnits::new("settlement", DATE).unwrap());
        let key = UnitKey::new(0, "merchant-x", "page-1");
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (pool, units, key) = (pool.clone(), units.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                let execution = format!("exec-{i}");
                units
                    .run_unit(&pool, &execution, key, |tx| async move {
                        book(&tx, "unit-x", 0, 4).await?;
                        Ok(None)
                    })
                    .await
            }));
        }
        let mut done = 0;
        for task in tasks {
            match task.await.unwrap().expect("every runner is answered") {
                UnitOutcome::Done => done += 1,
                UnitOutcome::AlreadyDone { by_execution } => {
                    assert!(by_execution.starts_with("exec-"))
                }
                other => panic!("{}: {other:?}", db.backend),
            }
        }
        assert_eq!(done, 1, "{}", db.backend);
        assert_eq!(booked(&pool, "unit-x").await, (4, 4), "{}", db.backend);
        db.drop_database().await;
    }
}

/// The chunked unit of these tests: items 0..10, two per chunk; the checkpoint is the next
/// item.
async fn next_chunk(
    tx: LocalTx<'static, Any>,
    checkpoint: Option<String>,
) -> Result<Progress, ParticipantError> {
    ledger::two_items(tx, "chunked", checkpoint, 10).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_unit_resumes_from_its_checkpoint_after_the_lease_ran_out() {
    for db in testing::all("a_chunked_unit_resumes_from_its_checkpoint").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(1_700_000_000_000);
        let units = JobUnits::new("export", DATE)
            .unwrap()
            .with_clock(Arc::new(clock.clone()))
            .with_lease(Duration::from_secs(30));
        let key = UnitKey::new(2, "file-a", "part-1");
        let UnitClaim::Acquired(mut first) =
            units.claim(&pool, "exec-1", key.clone()).await.unwrap()
        else {
            panic!("{}: the first claim wins", db.backend)
        };
        assert_eq!((first.checkpoint.clone(), first.attempt), (None, 1));
        for expected in ["2", "4"] {
            let got = units.chunk(&pool, &mut first, next_chunk).await.unwrap();
            assert_eq!(got, ChunkOutcome::Continued);
            assert_eq!(first.checkpoint.as_deref(), Some(expected));
        }
        // The first runner stops (killed); while its lease is live nobody else may take it.
        let busy = units.claim(&pool, "exec-2", key.clone()).await.unwrap();
        assert!(
            matches!(busy, UnitClaim::Busy { .. }),
            "{}: {busy:?}",
            db.backend
        );
        clock.advance(31_000);
        let UnitClaim::Acquired(mut second) =
            units.claim(&pool, "exec-2", key.clone()).await.unwrap()
        else {
            panic!("{}: the expired lease is taken over", db.backend)
        };
        assert_eq!(
            second.checkpoint.as_deref(),
            Some("4"),
            "resumes where it stopped"
        );
        assert_eq!(second.attempt, 2);
        assert_ne!(second.owner_token, first.owner_token);
        // The first runner wakes up: its chunk is refused before its work runs.
        let late = units.chunk(&pool, &mut first, next_chunk).await.unwrap();
        assert_eq!(late, ChunkOutcome::Lost, "{}", db.backend);
        assert!(
            !units.fail(&pool, &first).await.unwrap(),
            "not its unit any more"
        );
        let mut last = ChunkOutcome::Continued;
        let mut chunks = 0;
        while last == ChunkOutcome::Continued {
            last = units.chunk(&pool, &mut second, next_chunk).await.unwrap();
            chunks += 1;
        }
        assert_eq!(
            (last, chunks),
            (ChunkOutcome::Finished, 3),
            "{}",
            db.backend
        );
        assert_eq!(
            booked(&pool, "chunked").await,
            (10, 10),
            "{}: every item once",
            db.backend
        );
        let row = units.unit(&pool, &key).await.unwrap().unwrap();
        assert_eq!(row.status, UnitStatus::Done);
        assert_eq!(row.execution_id.as_deref(), Some("exec-2"));
        assert_eq!(row.lease_until_ms, None, "a finished unit holds no lease");
        // A third run finds it done, whether it claims or runs it whole.
        let again = units.claim(&pool, "exec-3", key.clone()).await.unwrap();
        assert_eq!(
            again,
            UnitClaim::AlreadyDone {
                by_execution: "exec-2".into()
            }
        );
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_given_up_as_failed_is_retried_from_its_checkpoint() {
    for db in testing::all("a_unit_given_up_as_failed_is_retried").await {
        let pool = setup(&db).await;
        let units = JobUnits::new("export", DATE).unwrap();
        let key = UnitKey::new(0, "file-c", "part-1");
        let UnitClaim::Acquired(mut lease) =
            units.claim(&pool, "exec-1", key.clone()).await.unwrap()
        else {
            panic!("first claim")
        };
        assert_eq!(
            units.chunk(&pool, &mut lease, next_chunk).await.unwrap(),
            ChunkOutcome::Continued
        );
        // A chunk that fails rolls back its writes and keeps the last checkpoint.
        let failed = units
            .chunk(&pool, &mut lease, |tx, _checkpoint| async move {
                book(&tx, "chunked", 100, 101).await?;
                Err::<Progress, _>(ParticipantError::transient("source down"))
            })
            .await;
        assert!(failed.is_err());
        assert!(units.fail(&pool, &lease).await.unwrap());
        let row = units.unit(&pool, &key).await.unwrap().unwrap();
        assert_eq!(
            (row.status, row.checkpoint.as_deref()),
            (UnitStatus::Failed, Some("2"))
        );
        assert_eq!(row.lease_until_ms, None);
        // The next run takes the FAILED unit at once and resumes where it stopped.
        let UnitClaim::Acquired(mut retry) =
            units.claim(&pool, "exec-2", key.clone()).await.unwrap()
        else {
            panic!("{}: a FAILED unit is claimable", db.backend)
        };
        assert_eq!((retry.checkpoint.as_deref(), retry.attempt), (Some("2"), 2));
        while units.chunk(&pool, &mut retry, next_chunk).await.unwrap() == ChunkOutcome::Continued {
        }
        assert_eq!(booked(&pool, "chunked").await, (10, 10), "{}", db.backend);
        assert_eq!(units.summary(&pool).await.unwrap().done, 1);
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_of_a_chunked_unit_give_it_to_one_runner() {
    for db in testing::all("concurrent_claims_of_a_chunked_unit").await {
        let pool = setup(&db).await;
        let units = Arc::new(JobUnits::new("export", DATE).unwrap());
        let key = UnitKey::new(0, "file-b", "part-1");
        let mut tasks = Vec::new();
        for i in 0..10 {
            let (pool, units, key) = (pool.clone(), units.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                units.claim(&pool, &format!("exec-{i}"), key).await
            }));
        }
        let mut acquired = 0;
        for task in tasks {
            match task.await.unwrap().expect("answered") {
                UnitClaim::Acquired(_) => acquired += 1,
                UnitClaim::Busy { .. } => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(acquired, 1, "{}", db.backend);
        assert_eq!(units.summary(&pool).await.unwrap().running, 1);
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_old_done_units() {
    for db in testing::all("retention_deletes_only_old_done_units").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(1_700_000_000_000);
        let units = JobUnits::new("settlement", DATE)
            .unwrap()
            .with_clock(Arc::new(clock.clone()));
        for i in 0..3 {
            let key = UnitKey::new(0, format!("done-{i}"), "b");
            units
                .run_unit(&pool, "exec-1", key, |_tx| async { Ok(None) })
                .await
                .unwrap();
        }
        units
            .plan(&pool, &[UnitKey::new(0, "pending", "b")])
            .await
            .unwrap();
        let _ = units
            .run_unit(
                &pool,
                "exec-1",
                UnitKey::new(0, "failed", "b"),
                |_tx| async { Err(ParticipantError::transient("x")) },
            )
            .await;
        let claim = units
            .claim(&pool, "exec-1", UnitKey::new(0, "running", "b"))
            .await
            .unwrap();
        assert!(matches!(claim, UnitClaim::Acquired(_)));
        clock.advance(10 * 24 * 3600 * 1000);
        units
            .run_unit(
                &pool,
                "exec-2",
                UnitKey::new(0, "young-done", "b"),
                |_tx| async { Ok(None) },
            )
            .await
            .unwrap();
        let short = purge_job_units(&pool, Duration::from_secs(60), 100, &clock).await;
        assert!(
            short.is_err_and(|e| e.is_refusal()),
            "a window under a day is refused"
        );
        let stats = job_unit_stats(&pool).await.unwrap();
        assert_eq!(
            (stats.rows, stats.oldest_done_at_ms),
            (7, Some(1_700_000_000_000)),
            "{}",
            db.backend
        );
        let deleted = purge_job_units(&pool, 7 * MIN_JOB_UNIT_RETENTION, 2, &clock)
            .await
            .unwrap();
        assert_eq!(deleted, 3, "{}", db.backend);
        let left: Vec<String> = units
            .units(&pool)
            .await
            .unwrap()
            .into_iter()
            .map(|u| u.key.source_id)
            .collect();
        let stats = job_unit_stats(&pool).await.unwrap();
        let young_at = 1_700_000_000_000 + 10 * 24 * 3600 * 1000;
        assert_eq!(
            (stats.rows, stats.oldest_done_at_ms),
            (4, Some(young_at)),
            "{}",
            db.backend
        );
        assert_eq!(
            left,
            ["failed", "pending", "running", "young-done"],
            "{}",
            db.backend
        );
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_are_refused_before_any_write() {
    for db in testing::all("job_bad_keys_are_refused").await {
        let pool = setup(&db).await;
        let units = JobUnits::new("settlement", DATE).unwrap();
        let bad_keys = [
            UnitKey::new(-1, "a", "b"),
            UnitKey::new(0, "a".repeat(129), "b"),
            UnitKey::new(0, "a", ""),
        ];
        for key in bad_keys {
            let err = units
                .run_unit(&pool, "exec-1", key, |_tx| async { Ok(None) })
                .await
                .unwrap_err();
            assert!(err.is_refusal(), "{err}");
        }
        let long_exec = "e".repeat(65);
        let err = units
            .run_unit(&pool, &long_exec, UnitKey::new(0, "a", "b"), |_tx| async {
                Ok(None)
            })
            .await
            .unwrap_err();
        assert!(err.is_refusal(), "{err}");
        assert!(
            units.units(&pool).await.unwrap().is_empty(),
            "{}",
            db.backend
        );
        db.drop_database().await;
    }
}

// Alone in its process: a snapshot resets every counter of the process-wide recorder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_units_by_job_and_outcome() {
    if !testing::in_own_process("jobs::metrics_count_units_by_job_and_outcome") {
        return;
    }
    let snapshotter = recorder::snapshotter(describe);
    for db in testing::all("metrics_count_units_by_job_and_outcome").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(1_700_000_000_000);
        let units = JobUnits::new("metrics-job", DATE)
            .unwrap()
            .with_clock(Arc::new(clock.clone()));
        let _ = snapshotter.snapshot();
        let key = UnitKey::new(0, "s", "b");
        units
            .run_unit(&pool, "e1", key.clone(), |_tx| async { Ok(None) })
            .await
            .unwrap();
        units
            .run_unit(&pool, "e2", key, |_tx| async { Ok(None) })
            .await
            .unwrap();
        let _ = units
            .run_unit(&pool, "e1", UnitKey::new(0, "f", "b"), |_tx| async {
                Err(ParticipantError::transient("x"))
            })
            .await;
        let chunked = UnitKey::new(1, "c", "b");
        let UnitClaim::Acquired(mut lease) =
            units.claim(&pool, "e1", chunked.clone()).await.unwrap()
        else {
            panic!("claim")
        };
        assert!(matches!(
            units.claim(&pool, "e2", chunked.clone()).await.unwrap(),
            UnitClaim::Busy { .. }
        ));
        clock.advance(DURATION_PAST_LEASE);
        let UnitClaim::Acquired(_) = units.claim(&pool, "e2", chunked).await.unwrap() else {
            panic!("takeover")
        };
        let lost = units
            .chunk(&pool, &mut lease, |_tx, _c| async {
                Ok(Progress::Finished(None))
            })
            .await
            .unwrap();
        assert_eq!(lost, ChunkOutcome::Lost);
        let counters = recorder::counters(snapshotter);
        let ours: Vec<_> = counters
            .iter()
            .filter(|(name, labels, _)| {
                name == JOB_UNITS_TOTAL && labels.contains(&("job".into(), "metrics-job".into()))
            })
            .collect();
        assert!(
            ours.iter().all(|(_, labels, _)| labels.len() == 2),
            "job and outcome only: {ours:?}"
        );
        for outcome in ["done", "skipped", "failed", "busy", "lost"] {
            let n = counter_value(
                &counters,
                JOB_UNITS_TOTAL,
                &[("job", "metrics-job"), ("outcome", outcome)],
            );
            assert_eq!(n, 1, "{} {outcome}: {ours:?}", db.backend);
        }
        db.drop_database().await;
    }
}

const DURATION_PAST_LEASE: i64 = 61_000;

//! The consumer log on every backend: one business effect per event id whatever the
//! deliveries (repeats under other broker ids, 20 at once), nothing kept from a failed
//! handler, scopes by group and handler version, retention, and its metrics.
//!
//! The business table `credits` has no unique key of its own, so a second application of
//! an event would show as a second row.

use std::sync::Arc;
use std::time::Duration;

use idem_participant::consumer::{
    CONSUMER_PURGED_TOTAL, CONSUMER_TOTAL, ConsumerLog, Handled, MIN_CONSUMER_LOG_RETENTION,
    consumer_log_stats, create_consumer_tables, describe, purge_consumer_log,
};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{Backend, LocalTx, ManualClock, ParticipantError};
use sqlx::{Any, AnyPool, Row};

use crate::kit_support::recorder;
use recorder::counter_value;

async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
    create_consumer_tables(&pool).await.expect("consumer log");
    create_consumer_tables(&pool)
        .await
        .expect("creating twice is harmless");
    sqlx::query("CREATE TABLE credits (event_id VARCHAR(128) NOT NULL, amount BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .expect("business table");
    pool
}

/// The business change of these tests: one credit row for the event.
async fn credit(
    tx: LocalTx<'static, Any>,
    event_id: String,
    amount: i64,
) -> Result<i64, ParticipantError> {
    sqlx::query(tx.sql("INSERT INTO credits (event_id, amount) VALUES (?, ?)"))
        .bind(event_id)
        .bind(amount)
        .execute(&mut *tx.conn())
        .await?;
    Ok(amount)
}

async fn credits(pool: &AnyPool, event_id: &str) -> i64 {
    let backend = Backend::from_url(pool.connect_options().database_url.as_str()).unwrap();
    sqlx::query(backend.sql("SELECT COUNT(*) FROM credits WHERE event_id = ?"))
        .bind(event_id)
        .fetch_one(pool)
        .await
        .expect("count credits")
        .get::<i64, _>(0)
}

async fn log_rows(pool: &AnyPool) -> i64 {
    sqlx::query("SELECT COUNT(*) FROM idem_consumer_log")
        .fetch_one(pool)
        .await
        .expect("count log rows")
        .get::<i64, _>(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_and_a_producer_retry_are_absorbed() {
    for db in testing::all("a_redelivery_and_a_producer_retry_are_absorbed").await {
        let pool = setup(&db).await;
        let log = ConsumerLog::new("billing", "v1").unwrap();
        let first = log
            .handle(&pool, "order-paid-1", Some("seq-7"), |tx| {
                credit(tx, "order-paid-1".into(), 100)
            })
            .await
            .expect("first delivery");
        assert_eq!(first, Handled::Processed(100), "{}", db.backend);
        // The broker redelivers (same message id), and the producer retried its publish (a
        // new message id for the same business event).
        for broker_id in ["seq-7", "seq-9"] {
            let again = log
                .handle(&pool, "order-paid-1", Some(broker_id), |tx| {
                    credit(tx, "order-paid-1".into(), 100)
                })
                .await
                .expect("repeat");
            assert_eq!(again, Handled::Duplicate, "{} {broker_id}", db.backend);
        }
        assert_eq!(credits(&pool, "order-paid-1").await, 1, "{}", db.backend);
        let record = log
            .record(&pool, "order-paid-1")
            .await
            .unwrap()
            .expect("logged");
        assert_eq!(
            record.broker_message_id.as_deref(),
            Some("seq-7"),
            "the applying delivery"
        );
        assert_eq!(record.result.as_deref(), Some("100"));
        assert!(log.record(&pool, "order-paid-2").await.unwrap().is_none());
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_deliveries_of_one_event_apply_it_once() {
    for db in testing::all("twenty_concurrent_deliveries_of_one_event_apply_it_once").await {
        let pool = setup(&db).await;
        let log = Arc::new(ConsumerLog::new("billing", "v1").unwrap());
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (pool, log) = (pool.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                let broker_id = format!("delivery-{i}");
                log.handle(&pool, "evt-concurrent", Some(&broker_id), |tx| {
                    credit(tx, "evt-concurrent".into(), 5)
                })
                .await
            }));
        }
        let mut processed = 0;
        for task in tasks {
            match task.await.unwrap().expect("every delivery is answered") {
                Handled::Processed(5) => processed += 1,
                Handled::Duplicate => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(processed, 1, "{}", db.backend);
        assert_eq!(credits(&pool, "evt-concurrent").await, 1, "{}", db.backend);
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handler_leaves_no_log_row_and_the_redelivery_applies_it() {
    for db in testing::all("a_failed_handler_leaves_no_log_row_and_the_redelivery_applies_it").await
    {
        let pool = setup(&db).await;
        let log = ConsumerLog::new("billing", "v1").unwrap();
        // The credit is written, then the handler fails: both the credit and the log row
        // must go, or the redelivery would be skipped and the event lost (seed §17).
        let failed = log
            .handle(&pool, "evt-fail", Some("m1"), |tx| async move {
                credit(tx, "evt-fail".into(), 1).await?;
                Err::<i64, _>(ParticipantError::transient("downstream down"))
            })
            .await;
        assert!(failed.is_err(), "{}", db.backend);
        assert_eq!(credits(&pool, "evt-fail").await, 0, "{}", db.backend);
        assert_eq!(log_rows(&pool).await, 0, "{}", db.backend);
        let retried = log
            .handle(&pool, "evt-fail", Some("m2"), |tx| {
                credit(tx, "evt-fail".into(), 1)
            })
            .await
            .expect("redelivery");
        assert_eq!(retried, Handled::Processed(1));
        assert_eq!(credits(&pool, "evt-fail").await, 1, "{}", db.backend);
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_and_handler_versions_are_separate_scopes_and_bad_ids_are_refused() {
    for db in
        testing::all("groups_and_handler_versions_are_separate_scopes_and_bad_ids_are_refused")
            .await
    {
        let pool = setup(&db).await;
        let logs = [
            ConsumerLog::new("billing", "v1").unwrap(),
            ConsumerLog::new("shipping", "v1").unwrap(),
            ConsumerLog::new("billing", "v2").unwrap(),
        ];
        for log in &logs {
            let got = log
                .handle(&pool, "evt-scoped", None, |tx| {
                    credit(tx, "evt-scoped".into(), 1)
                })
                .await
                .unwrap();
            assert_eq!(got, Handled::Processed(1), "{} {log:?}", db.backend);
        }
        assert_eq!(credits(&pool, "evt-scoped").await, 3, "one per scope");
        for bad in [String::new(), "e".repeat(129)] {
            let err = logs[0]
                .handle(&pool, &bad, None, |tx| credit(tx, "bad".into(), 1))
                .await
                .unwrap_err();
            assert!(err.is_refusal(), "{}: {err}", db.backend);
        }
        // A broker id longer than the column is cut, not an error: it is only a diagnosis.
        let long = "m".repeat(300);
        logs[0]
            .handle(&pool, "evt-long-broker-id", Some(&long), |tx| {
                credit(tx, "x".into(), 1)
            })
            .await
            .expect("long broker id");
        let record = logs[0]
            .record(&pool, "evt-long-broker-id")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.broker_message_id.map(|m| m.len()), Some(128));
        assert_eq!(credits(&pool, "bad").await, 0);
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_only_rows_older_than_the_window() {
    for db in testing::all("retention_deletes_only_rows_older_than_the_window").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(1_700_000_000_000);
        let log = ConsumerLog::new("billing", "v1")
            .unwrap()
            .with_clock(Arc::new(clock.clone()));
        for i in 0..5 {
            let id = format!("old-{i}");
            log.handle(&pool, &id, None, |tx| credit(tx, id.clone(), 1))
                .await
                .unwrap();
        }
        clock.advance(3 * 24 * 3600 * 1000);
        log.handle(&pool, "young", None, |tx| credit(tx, "young".into(), 1))
            .await
            .unwrap();
        let short = purge_consumer_log(&pool, Duration::from_secs(3600), 100, &clock).await;
        assert!(
            short.is_err_and(|e| e.is_refusal()),
            "a window under a day is refused"
        );
        assert_eq!(
            log_rows(&pool).await,
            6,
            "nothing deleted by a refused purge"
        );
        let stats = consumer_log_stats(&pool).await.unwrap();
        assert_eq!(
            (stats.rows, stats.oldest_processed_at_ms),
            (6, Some(1_700_000_000_000))
        );
        let deleted = purge_consumer_log(&pool, 2 * MIN_CONSUMER_LOG_RETENTION, 2, &clock)
            .await
            .unwrap();
        assert_eq!(deleted, 5, "{}: the old rows, in batches of 2", db.backend);
        assert!(log.record(&pool, "young").await.unwrap().is_some());
        let stats = consumer_log_stats(&pool).await.unwrap();
        let young_at = 1_700_000_000_000 + 3 * 24 * 3600 * 1000;
        assert_eq!(
            (stats.rows, stats.oldest_processed_at_ms),
            (1, Some(young_at)),
            "{}",
            db.backend
        );
        // What a too-early purge costs: the purged event, replayed, is applied again.
        let replay = log
            .handle(&pool, "old-0", None, |tx| credit(tx, "old-0".into(), 1))
            .await
            .unwrap();
        assert_eq!(replay, Handled::Processed(1));
        assert_eq!(credits(&pool, "old-0").await, 2);
        db.drop_database().await;
    }
}

// Alone in its process: a snapshot resets every counter of the process-wide recorder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_outcomes_by_group_and_never_label_an_event_id() {
    if !testing::in_own_process(
        "consumer::metrics_count_outcomes_by_group_and_never_label_an_event_id",
    ) {
        return;
    }
    let snapshotter = recorder::snapshotter(describe);
    for db in testing::all("metrics_count_outcomes_by_group_and_never_label_an_event_id").await {
        let pool = setup(&db).await;
        let group = "metrics-group";
        let log = ConsumerLog::new(group, "v1").unwrap();
        let _ = snapshotter.snapshot();
        log.handle(&pool, "m-1", None, |tx| credit(tx, "m-1".into(), 1))
            .await
            .unwrap();
        log.handle(&pool, "m-1", None, |tx| credit(tx, "m-1".into(), 1))
            .await
            .unwrap();
        let _ = log
            .handle(&pool, "m-2", None, |_tx| async {
                Err::<i64, _>(ParticipantError::transient("x"))
            })
            .await;
        let clock = ManualClock::at(i64::MAX / 2);
        let purged = purge_consumer_log(&pool, MIN_CONSUMER_LOG_RETENTION, 10, &clock)
            .await
            .unwrap();
        let snapshot = recorder::counters(snapshotter);
        for outcome in ["processed", "duplicate", "failed"] {
            assert_eq!(
                counter_value(
                    &snapshot,
                    CONSUMER_TOTAL,
                    &[("group", group), ("outcome", outcome)]
                ),
                1,
                "{} {outcome}",
                db.backend
            );
        }
        assert_eq!(counter_value(&snapshot, CONSUMER_PURGED_TOTAL, &[]), purged);
        assert_eq!(purged, 1);
        assert!(
            snapshot
                .iter()
                .flat_map(|(_, l, _)| l)
                .all(|(_, v)| !v.starts_with("m-")),
            "no event id in a label"
        );
        db.drop_database().await;
    }
}

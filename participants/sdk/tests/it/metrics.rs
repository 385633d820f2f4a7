//! The barrier's metrics, read back from a recorder installed in this test process, on every
//! backend: each outcome, a lock-conflict retry (staged on PostgreSQL and MariaDB; SQLite's
//! `BEGIN IMMEDIATE` serialises writers, so it has none to stage), the step histogram, the
//! HELP text, and no gid in a label.
//!
//! The recorder is process-global, so the test runs alone in a child process of its own.

use crate::common;
use crate::kit_support::recorder;

use common::{bump, counter, gid, setup, tcc};
use idem_participant::metrics::{
    BARRIER_OUTCOMES, LOCK_CONFLICT_RETRIES, STEP_SECONDS, describe_metrics,
};
use idem_participant::{Backend, Op, Outcome, ParticipantError, testing};
use metrics_util::debugging::{DebugValue, Snapshotter};

fn snapshotter() -> &'static Snapshotter {
    recorder::snapshotter(describe_metrics)
}

/// One snapshot: (name, labels, value, description). A snapshot takes what was recorded
/// since the one before (counters are swapped to zero, histogram samples taken), so each
/// is the change of its own steps.
struct Seen(Vec<Sample>);

type Sample = (String, Vec<(String, String)>, DebugValue, Option<String>);

impl Seen {
    fn now() -> Seen {
        Seen(
            snapshotter()
                .snapshot()
                .into_vec()
                .into_iter()
                .map(|(key, _, help, value)| {
                    let (_, key) = key.into_parts();
                    let labels = key
                        .labels()
                        .map(|l| (l.key().to_owned(), l.value().to_owned()))
                        .collect();
                    (
                        key.name().to_owned(),
                        labels,
                        value,
                        help.map(|h| h.to_string()),
                    )
                })
                .collect(),
        )
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.0.iter().filter(move |(n, l, _, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.matching(name, labels)
            .map(|(_, _, v, _)| match v {
                DebugValue::Counter(c) => *c,
                other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    fn outcome(&self, op: &str, outcome: &str) -> u64 {
        self.counter(BARRIER_OUTCOMES, &[("op", op), ("outcome", outcome)])
    }
}

/// A statement that fails as a lost lock conflict does, once, inside the step.
fn staged_conflict(backend: Backend) -> Option<&'static str> {
    match backend {
        Backend::Postgres => {
            Some("DO $$ BEGIN RAISE EXCEPTION 'staged conflict' USING ERRCODE = '40001'; END $$")
        }
        Backend::Mysql => {
            Some("SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = 1213, MESSAGE_TEXT = 'staged deadlock'")
        }
        Backend::Sqlite => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_barrier_counts_each_outcome_its_retries_and_its_latency() {
    if !testing::in_own_process(
        "metrics::the_barrier_counts_each_outcome_its_retries_and_its_latency",
    ) {
        return;
    }
    snapshotter();
    for db in testing::all("sdk_metrics").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let mut gids = Vec::new();
        Seen::now();

        // Executed, then its duplicate.
        let g = gid("m-exec");
        gids.push(g.clone());
        for _ in 0..2 {
            tcc(&g, Op::Try)
                .run(&pool, |tx| async move { bump(&tx, 1).await })
                .await
                .unwrap();
        }
        // A Cancel before its Try (empty rollback), then the late Try (rejected).
        let g = gid("m-susp");
        gids.push(g.clone());
        let cancel = tcc(&g, Op::Cancel)
            .run(&pool, |tx| async move { bump(&tx, -1).await })
            .await
            .unwrap();
        assert_eq!(cancel, Outcome::EmptyRollback, "{b}");
        let late = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected, "{b}");
        // A Confirm whose Try never ran, and a step that fails.
        let g = gid("m-conf");
        gids.push(g.clone());
        let refused = tcc(&g, Op::Confirm)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await;
        assert!(
            matches!(refused, Err(ParticipantError::ConfirmWithoutTry(_))),
            "{b}"
        );
        let g = gid("m-fail");
        gids.push(g.clone());
        let failed = tcc(&g, Op::Try)
            .run(&pool, |_tx| async move {
                Err::<u64, _>(ParticipantError::transient("staged failure"))
            })
            .await;
        assert!(failed.is_err(), "{b}");

        let after = Seen::now();
        let moved = |op: &str, outcome: &str| after.outcome(op, outcome);
        assert_eq!(moved("try", "executed"), 1, "{b}");
        assert_eq!(moved("try", "duplicate"), 1, "{b}");
        assert_eq!(moved("cancel", "empty_rollback"), 1, "{b}");
        assert_eq!(moved("try", "rejected"), 1, "{b}");
        assert_eq!(moved("confirm", "confirm_without_try"), 1, "{b}");
        assert_eq!(moved("try", "error"), 1, "{b}");
        let steps = after
            .matching(STEP_SECONDS, &[("op", "try")])
            .map(|(_, _, v, _)| match v {
                DebugValue::Histogram(samples) => samples.len(),
                other => panic!("{STEP_SECONDS} is not a histogram: {other:?}"),
            })
            .sum::<usize>();
        // The four Trys above.
        assert_eq!(steps, 4, "{b}");
        assert_eq!(
            counter(&pool).await,
            1,
            "{b}: only the first Try changed anything"
        );

        // A lost lock conflict re-runs the step, which then executes.
        if let Some(sql) = staged_conflict(b) {
            let g = gid("m-lock");
            gids.push(g.clone());
            let attempts = std::sync::atomic::AtomicU32::new(0);
            let attempts = &attempts;
            let outcome = tcc(&g, Op::Try)
                .run(&pool, |tx| async move {
                    if attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        sqlx::raw_sql(sql).execute(&mut *tx.conn()).await?;
                    }
                    bump(&tx, 1).await
                })
                .await
                .unwrap();
            assert!(matches!(outcome, Outcome::Executed(_)), "{b}");
            let after = Seen::now();
            let retries = after.counter(LOCK_CONFLICT_RETRIES, &[("op", "try")]);
            assert_eq!(retries, 1, "{b}");
            assert_eq!(after.outcome("try", "executed"), 1, "{b}");
            assert_eq!(counter(&pool).await, 2, "{b}: the re-run committed once");
        }

        for (name, labels, _, help) in &Seen::now().0 {
            if name.starts_with("idem_participant_") {
                assert!(help.as_deref().is_some_and(|h| !h.is_empty()), "{name}");
            }
            for (_, value) in labels {
                assert!(!gids.contains(value), "{b}: {name} has a gid label");
            }
        }
        pool.close().await;
        db.drop_database().await;
    }
}

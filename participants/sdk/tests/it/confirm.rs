//! A TCC Confirm runs only after its Try executed and committed, on every backend: a
//! Confirm that gets there first is refused as retryable and leaves nothing behind, so a
//! Try arriving after it can no longer reserve what nobody would release.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{bump, counter, gid, setup, tcc};
use idem_participant::testing;
use idem_participant::{Dialect, Op, Outcome, ParticipantError, barrier_records};
use sqlx::{Any, AnyPool};

/// (op, reason, outcome) of every barrier row of `g`, in key order.
async fn rows(pool: &AnyPool, g: &str) -> Vec<(String, String, String)> {
    barrier_records(pool, g)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.op, r.reason, r.outcome))
        .collect()
}

fn row(op: &str, reason: &str, outcome: &str) -> (String, String, String) {
    (op.into(), reason.into(), outcome.into())
}

/// A Confirm of `g` whose closure counts its runs in `ran` and adds 100 to the counter.
async fn confirm(
    pool: &AnyPool,
    g: &str,
    ran: &Arc<AtomicUsize>,
) -> Result<Outcome<u64>, ParticipantError> {
    tcc(g, Op::Confirm)
        .run(pool, |tx| {
            let ran = ran.clone();
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                bump(&tx, 100).await
            }
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_without_try_is_refused_retryably_then_runs_once_after_the_try() {
    for db in testing::all("confirm_without_try_is_refused_retryably").await {
        let pool = setup(&db).await;
        let g = gid("early");
        let ran = Arc::new(AtomicUsize::new(0));
        // Refused as often as it is retried, and each time nothing stays.
        for _ in 0..2 {
            let err = confirm(&pool, &g, &ran).await.unwrap_err();
            assert!(err.is_confirm_without_try(), "{}: {err}", db.backend);
            assert_eq!(err.status_code(), 503, "{}", db.backend);
            assert_eq!(err.kind(), "confirm_without_try");
            assert_eq!(ran.load(Ordering::SeqCst), 0, "{}", db.backend);
            assert_eq!(rows(&pool, &g).await, vec![], "{}", db.backend);
            assert_eq!(counter(&pool).await, 0, "{}", db.backend);
        }
        // The same inside a caller's transaction, which the caller rolls back on `Err`.
        let begin = Dialect::from_url(&db.url).unwrap().begin_statement();
        let mut tx = match begin {
            Some(b) => pool.begin_with(b).await.unwrap(),
            None => pool.begin().await.unwrap(),
        };
        let in_caller = tcc(&g, Op::Confirm)
            .run_in(&mut tx, |tx| async move { bump(&tx, 100).await })
            .await
            .unwrap_err();
        assert!(in_caller.is_confirm_without_try(), "{}", db.backend);
        tx.rollback().await.unwrap();
        assert_eq!(rows(&pool, &g).await, vec![], "{}", db.backend);

        let tried = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(tried, Outcome::Executed(_)), "{}", db.backend);
        let first = confirm(&pool, &g, &ran).await.unwrap();
        assert!(matches!(first, Outcome::Executed(_)), "{}", db.backend);
        let again = confirm(&pool, &g, &ran).await.unwrap();
        assert_eq!(again, Outcome::Duplicate(first.into_result().unwrap()));
        assert_eq!(ran.load(Ordering::SeqCst), 1, "{}", db.backend);
        assert_eq!(counter(&pool).await, 101, "{}", db.backend);
        assert_eq!(
            rows(&pool, &g).await,
            vec![
                row("confirm", "confirm", "executed"),
                row("try", "try", "executed")
            ],
            "{}",
            db.backend
        );
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_after_an_empty_rollback_is_refused_and_never_runs() {
    for db in testing::all("confirm_after_an_empty_rollback").await {
        let pool = setup(&db).await;
        let g = gid("cancelled");
        let ran = Arc::new(AtomicUsize::new(0));
        let cancel = tcc(&g, Op::Cancel)
            .run(&pool, |tx| async move { bump(&tx, -1).await })
            .await
            .unwrap();
        assert_eq!(cancel, Outcome::EmptyRollback, "{}", db.backend);
        for _ in 0..2 {
            let err = confirm(&pool, &g, &ran).await.unwrap_err();
            assert!(err.is_confirm_without_try(), "{}: {err}", db.backend);
            assert!(err.to_string().contains("cancel ran first"), "{err}");
        }
        // The late Try is still turned away, and the Confirm still refused after it.
        let late = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected, "{}", db.backend);
        let err = confirm(&pool, &g, &ran).await.unwrap_err();
        assert!(err.is_confirm_without_try(), "{}: {err}", db.backend);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "{}", db.backend);
        assert_eq!(counter(&pool).await, 0, "{}", db.backend);
        assert_eq!(
            rows(&pool, &g).await,
            vec![
                row("cancel", "cancel", "empty_rollback"),
                row("try", "cancel", "guard")
            ],
            "{}: no Confirm row stays",
            db.backend
        );
        pool.close().await;
        db.drop_database().await;
    }
}

/// The Try writes a hold row; the Confirm's closure settles it, and counts a Confirm that
/// found no hold (a Confirm that ran without a committed Try) instead of failing, so that
/// such a run could not hide behind a rollback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_racing_its_try_never_runs_without_an_executed_try() {
    const PAIRS: usize = 20;
    for db in testing::all("confirm_racing_its_try").await {
        let pool = setup(&db).await;
        sqlx::query("CREATE TABLE holds (gid VARCHAR(128) PRIMARY KEY, confirmed BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        let blind = Arc::new(AtomicUsize::new(0));
        let gids: Vec<String> = (0..PAIRS).map(|_| gid("race")).collect();
        let start = Arc::new(tokio::sync::Barrier::new(2 * PAIRS));
        let mut pairs = Vec::new();
        for (i, g) in gids.iter().enumerate() {
            let try_call = {
                let (pool, g, start) = (pool.clone(), g.clone(), start.clone());
                async move {
                    start.wait().await;
                    tcc(&g, Op::Try)
                        .run(&pool, |tx| async move {
                            sqlx::query(tx.sql("INSERT INTO holds (gid, confirmed) VALUES (?, 0)"))
                                .bind(tx.call().gid().to_owned())
                                .execute(&mut *tx.conn())
                                .await?;
                            Ok(())
                        })
                        .await
                }
            };
            let confirm_call = {
                let (pool, g, start, blind) =
                    (pool.clone(), g.clone(), start.clone(), blind.clone());
                async move {
                    start.wait().await;
                    settle(&pool, &g, &blind).await
                }
            };
            // Half the pairs spawn the Confirm first, so neither always starts ahead.
            let (t, c) = if i % 2 == 0 {
                let t = tokio::spawn(try_call);
                (t, tokio::spawn(confirm_call))
            } else {
                let c = tokio::spawn(confirm_call);
                (tokio::spawn(try_call), c)
            };
            pairs.push((t, c));
        }
        let (mut ran, mut refused) = (0, Vec::new());
        for ((t, c), g) in pairs.into_iter().zip(&gids) {
            let t = t.await.unwrap().expect("try: no error surfaces");
            assert_eq!(t, Outcome::Executed(()), "{} {g}", db.backend);
            match c.await.unwrap() {
                Ok(Outcome::Executed(())) => ran += 1,
                Err(e) if e.is_confirm_without_try() => refused.push(g.clone()),
                other => panic!("{} {g}: confirm {other:?}", db.backend),
            }
        }
        assert_eq!(blind.load(Ordering::SeqCst), 0, "{}", db.backend);
        // The coordinator's retry of every refused Confirm: its Try has committed now.
        for g in &refused {
            let retried = settle(&pool, g, &blind).await.unwrap();
            assert_eq!(retried, Outcome::Executed(()), "{} {g}", db.backend);
        }
        assert_eq!(blind.load(Ordering::SeqCst), 0, "{}", db.backend);
        for g in &gids {
            let confirmed: i64 = sqlx::query_scalar(
                Dialect::from_url(&db.url)
                    .unwrap()
                    .sql("SELECT confirmed FROM holds WHERE gid = ?"),
            )
            .bind(g.clone())
            .fetch_one(&pool)
            .await
            .unwrap();
            assert_eq!(confirmed, 1, "{} {g}: confirmed exactly once", db.backend);
            let dup = settle(&pool, g, &blind).await.unwrap();
            assert_eq!(dup, Outcome::Duplicate(()), "{} {g}", db.backend);
        }
        println!(
            "{}: {PAIRS} pairs, confirm ran after its try {ran}, refused first {}",
            db.backend,
            refused.len()
        );
        pool.close().await;
        db.drop_database().await;
    }
}

/// The racing test's Confirm: settle this gid's hold, counting in `blind` a run that finds
/// none.
async fn settle(
    pool: &AnyPool,
    g: &str,
    blind: &Arc<AtomicUsize>,
) -> Result<Outcome<()>, ParticipantError> {
    tcc(g, Op::Confirm)
        .run(pool, |tx: idem_participant::StepTx<'static, Any>| {
            let blind = blind.clone();
            async move {
                let settled =
                    sqlx::query(tx.sql("UPDATE holds SET confirmed = confirmed + 1 WHERE gid = ?"))
                        .bind(tx.call().gid().to_owned())
                        .execute(&mut *tx.conn())
                        .await?
                        .rows_affected();
                if settled != 1 {
                    blind.fetch_add(1, Ordering::SeqCst);
                }
                Ok(())
            }
        })
        .await
}

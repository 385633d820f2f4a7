//! The kit's local transaction, on every backend: what the closure writes commits with an
//! `Ok` and is gone after an `Err`.

use crate::common;

use common::{counter, setup};
use idem_participant::{ParticipantError, RetryPolicy, run_local, testing};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_transaction_commits_on_ok_and_rolls_back_on_err() {
    for db in testing::all("a_local_transaction_commits_on_ok_and_rolls_back_on_err").await {
        let pool = setup(&db).await;
        let kept = run_local(&pool, RetryPolicy::default(), "test", |tx| async move {
            sqlx::query(tx.sql("UPDATE counters SET value = value + ? WHERE name = 'c'"))
                .bind(5_i64)
                .execute(&mut *tx.conn())
                .await?;
            Ok::<_, ParticipantError>("kept")
        })
        .await
        .expect("commits");
        assert_eq!(kept, "kept");
        assert_eq!(counter(&pool).await, 5, "{}", db.backend);
        let failed = run_local(&pool, RetryPolicy::default(), "test", |tx| async move {
            sqlx::query(tx.sql("UPDATE counters SET value = value + ? WHERE name = 'c'"))
                .bind(100_i64)
                .execute(&mut *tx.conn())
                .await?;
            Err::<(), _>(ParticipantError::refused("no"))
        })
        .await;
        assert!(
            failed.as_ref().is_err_and(ParticipantError::is_refusal),
            "{failed:?}"
        );
        assert_eq!(counter(&pool).await, 5, "{}: rolled back", db.backend);
        db.drop_database().await;
    }
}

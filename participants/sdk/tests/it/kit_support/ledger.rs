//! The business table of the job-unit tests: `ledger` has no unique key, so an item booked
//! twice shows as a second row.

use idem_participant::jobs::Progress;
use idem_participant::{Backend, LocalTx, ParticipantError};
use sqlx::{Any, AnyPool, Row};

/// Creates `ledger`.
pub async fn create(pool: &AnyPool) {
    sqlx::query("CREATE TABLE ledger (unit VARCHAR(200) NOT NULL, item BIGINT NOT NULL)")
        .execute(pool)
        .await
        .expect("business table");
}

/// The business change: one ledger row per item of `unit`, `from..to`.
pub async fn book(
    tx: &LocalTx<'static, Any>,
    unit: &str,
    from: i64,
    to: i64,
) -> Result<(), ParticipantError> {
    for item in from..to {
        sqlx::query(tx.sql("INSERT INTO ledger (unit, item) VALUES (?, ?)"))
            .bind(unit.to_owned())
            .bind(item)
            .execute(&mut *tx.conn())
            .await?;
    }
    Ok(())
}

/// (rows, distinct items) booked for `unit`.
pub async fn booked(pool: &AnyPool, unit: &str) -> (i64, i64) {
    let backend = Backend::from_url(pool.connect_options().database_url.as_str()).unwrap();
    let row = sqlx::query(
        backend.sql("SELECT COUNT(*), COUNT(DISTINCT item) FROM ledger WHERE unit = ?"),
    )
    .bind(unit.to_owned())
    .fetch_one(pool)
    .await
    .expect("count ledger");
    (row.get::<i64, _>(0), row.get::<i64, _>(1))
}

/// One chunk of a unit of `total` items, two per chunk: books them from the checkpoint
/// (the next item) and reports the next checkpoint, or finished at `total`.
pub async fn two_items(
    tx: LocalTx<'static, Any>,
    unit: &str,
    checkpoint: Option<String>,
    total: i64,
) -> Result<Progress, ParticipantError> {
    let from: i64 = checkpoint.as_deref().unwrap_or("0").parse().unwrap();
    let to = (from + 2).min(total);
    book(&tx, unit, from, to).await?;
    Ok(if to == total {
        Progress::Finished(Some(total.to_string()))
    } else {
        Progress::Continue(to.to_string())
    })
}

//! The nightly settlement: for one business date, the paid orders of each shard summed into
//! one `order_settlement` line, under the SDK's job units.
//!
//! A unit is (job `order-settlement`, business date, shard, source `orders`, batch `paid`):
//! what it processes, never the run's execution id. The line and the unit's DONE commit in
//! one local transaction, so a rerun with a new execution id (a scheduler's retry, an
//! operator's manual run) skips every unit a previous run finished and only does the rest;
//! two runs at once split the units between them.

use idem_participant::ParticipantError;
use idem_participant::jobs::{JobSummary, JobUnits, UnitKey, UnitOutcome};
use idem_participant::kit::SharedClock;
use sqlx::{AnyPool, Row};

use super::SETTLEMENT_SHARDS;
use super::store::PAID;

/// The job's name.
pub const JOB: &str = "order-settlement";

/// What one run did, unit by unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunReport {
    /// Units this run settled.
    pub done: u64,
    /// Units an earlier or concurrent run had settled (skipped).
    pub skipped: u64,
    /// Units another runner held (left to it).
    pub busy: u64,
    /// The units' states after the run.
    pub summary: JobSummary,
}

/// Settles `business_date` (`YYYY-MM-DD`) as run `execution_id`.
pub async fn settle(
    pool: &AnyPool,
    clock: SharedClock,
    business_date: &str,
    execution_id: &str,
) -> Result<RunReport, ParticipantError> {
    let units = JobUnits::new(JOB, business_date)?.with_clock(clock);
    let keys: Vec<UnitKey> = (0..SETTLEMENT_SHARDS)
        .map(|shard| UnitKey::new(i64::try_from(shard).expect("few shards"), "orders", "paid"))
        .collect();
    units.plan(pool, &keys).await?;
    let (mut done, mut skipped, mut busy) = (0, 0, 0);
    for key in keys {
        let shard = key.shard;
        let outcome = units
            .run_unit(pool, execution_id, key, |tx| async move {
                // SUM of a BIGINT is NUMERIC on PostgreSQL and DECIMAL on MySQL, which
                // sqlx::Any does not decode: cast it back to a 64-bit integer.
                let integer = match tx.dialect() {
                    idem_participant::Backend::Mysql => "SIGNED",
                    _ => "BIGINT",
                };
                let sql = format!(
                    "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(amount_minor), 0) AS {integer}) AS total \
                     FROM orders WHERE business_date = ? AND status = ? AND shard = ?"
                );
                let row = sqlx::query(tx.sql(&sql))
                .bind(business_date)
                .bind(PAID)
                .bind(shard)
                .fetch_one(&mut *tx.conn())
                .await?;
                let orders: i64 = row.try_get("n")?;
                let total: i64 = row.try_get("total")?;
                sqlx::query(tx.sql(
                    "INSERT INTO order_settlement (business_date, shard, orders, amount_minor, execution_id) \
                     VALUES (?, ?, ?, ?, ?)",
                ))
                .bind(business_date)
                .bind(shard)
                .bind(orders)
                .bind(total)
                .bind(execution_id)
                .execute(&mut *tx.conn())
                .await?;
                Ok(Some(orders.to_string()))
            })
            .await?;
        match outcome {
            UnitOutcome::Done => done += 1,
            UnitOutcome::AlreadyDone { .. } => skipped += 1,
            UnitOutcome::Busy { .. } => busy += 1,
        }
    }
    let summary = units.summary(pool).await?;
    Ok(RunReport {
        done,
        skipped,
        busy,
        summary,
    })
}

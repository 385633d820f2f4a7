//! The job-unit table: its DDL, retention and size.

use std::time::Duration;

use sqlx::Pool;

use super::{JOB_UNIT_TABLE, JOB_UNITS_PURGED_TOTAL, MIN_JOB_UNIT_RETENTION, lease_ms};
use crate::backend::{Arg, BarrierDatabase, CellKind};
use crate::error::ParticipantError;
use crate::kit::Clock;
use crate::kit::refuse_short_window;

/// Creates `idem_job_unit` (if absent) on `pool`'s backend.
pub async fn create_job_tables<DB: BarrierDatabase>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    crate::kit::run_script(
        pool,
        include_str!("../../sql/jobs.sqlite.sql"),
        include_str!("../../sql/jobs.postgres.sql"),
        include_str!("../../sql/jobs.mysql.sql"),
    )
    .await
}

/// Deletes DONE units last changed more than `older_than` ago (by `clock`), `batch` rows
/// per statement; returns how many went. PENDING, RUNNING (whatever its lease) and FAILED
/// units are kept: they are work not yet done. A window shorter than
/// [`MIN_JOB_UNIT_RETENTION`] is refused; give the range of business dates that may be
/// rerun (seed §24).
pub async fn purge_job_units<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    older_than: Duration,
    batch: u32,
    clock: &dyn Clock,
) -> Result<u64, ParticipantError> {
    refuse_short_window("job unit", older_than, MIN_JOB_UNIT_RETENTION)?;
    let cutoff = clock.now_ms().saturating_sub(lease_ms(older_than));
    let deleted = crate::kit::delete_all_in_batches(
        pool,
        JOB_UNIT_TABLE,
        "status = 'DONE' AND updated_at_ms < ?",
        vec![Arg::Int(cutoff)],
        batch,
    )
    .await?;
    metrics::counter!(JOB_UNITS_PURGED_TOTAL).increment(deleted);
    Ok(deleted)
}

/// How big the job-unit table is and how old its oldest DONE unit (what retention would
/// delete): with the retention window, the cleanup lag (seed §28). Counts the whole table;
/// call it from a periodic task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobUnitStats {
    /// Units of every job and date.
    pub rows: u64,
    /// `updated_at_ms` of the oldest DONE unit, if any.
    pub oldest_done_at_ms: Option<i64>,
}

/// Reads [`JobUnitStats`].
pub async fn job_unit_stats<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<JobUnitStats, ParticipantError> {
    let mut conn = pool.acquire().await?;
    let sql =
        "SELECT COUNT(*), MIN(CASE WHEN status = 'DONE' THEN updated_at_ms END) FROM idem_job_unit";
    let kinds = &[CellKind::Int, CellKind::Int];
    let rows = DB::fetch_cells(&mut conn, sql.to_owned(), Vec::new(), kinds).await?;
    let row = rows.first();
    Ok(JobUnitStats {
        rows: row
            .and_then(|r| r[0].int())
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or_default(),
        oldest_done_at_ms: row.and_then(|r| r[1].int()),
    })
}

//! The table of the records: its DDL, the forward step that brings a table made by an
//! older SDK up to date, and retention.

use std::time::Duration;

use sqlx::Pool;

use super::{IDEMPOTENCY_PURGED_TOTAL, IdempotencyError, MIN_RETENTION, TABLE, invalid};
use crate::backend::{Arg, BarrierDatabase};
use crate::kit::SharedClock;
use idem_sql::Backend;

/// The DDL of `idem_idempotency` for a backend (shipped as `sql/idempotency.*.sql`).
pub fn idempotency_ddl(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => include_str!("../../sql/idempotency.sqlite.sql"),
        Backend::Postgres => include_str!("../../sql/idempotency.postgres.sql"),
        Backend::Mysql => include_str!("../../sql/idempotency.mysql.sql"),
    }
}

/// The forward step of `idem_idempotency` for a backend (shipped as
/// `sql/idempotency_upgrade.*.sql`): what a table created by an older SDK lacks.
pub fn idempotency_upgrade_ddl(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => include_str!("../../sql/idempotency_upgrade.sqlite.sql"),
        Backend::Postgres => include_str!("../../sql/idempotency_upgrade.postgres.sql"),
        Backend::Mysql => include_str!("../../sql/idempotency_upgrade.mysql.sql"),
    }
}

/// Creates `idem_idempotency` and its indexes if they do not exist, then runs the forward
/// step, so a table an older SDK created gains the columns this one writes (its rows keep
/// answering as before). Safe at every start, and by several instances at once.
pub async fn create_idempotency_tables<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<(), sqlx::Error> {
    crate::kit::run_script(
        pool,
        idempotency_ddl(Backend::Sqlite),
        idempotency_ddl(Backend::Postgres),
        idempotency_ddl(Backend::Mysql),
    )
    .await?;
    crate::kit::run_forward_step(
        pool,
        idempotency_upgrade_ddl(Backend::Sqlite),
        idempotency_upgrade_ddl(Backend::Postgres),
        idempotency_upgrade_ddl(Backend::Mysql),
        |statement| statement,
    )
    .await
}

/// Deletes terminal records (`SUCCEEDED`, `FAILED_FINAL`, `FAILED_RETRYABLE`) last
/// written more than `older_than` before `clock`'s now, `batch` rows per statement;
/// returns how many went. `PROCESSING` and `UNKNOWN` rows are never deleted, whatever
/// their age: their outcome is not known, and without the row a repeat would run the
/// request again. The window is the business's repeat window (§24: the longest a client
/// keeps retrying); a window under [`MIN_RETENTION`] is refused. (The rows' times are the
/// database's; `clock` is the caller's, so the cut moves by the skew between the two,
/// seconds against a window of hours.)
pub async fn purge_idempotency<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    older_than: Duration,
    batch: u32,
    clock: &SharedClock,
) -> Result<u64, IdempotencyError> {
    if older_than < MIN_RETENTION {
        return Err(invalid(
            "retention_too_short",
            format!(
                "an idempotency window of {older_than:?} is under the minimum {MIN_RETENTION:?}: a client retrying after the purge would run its request again"
            ),
        ));
    }
    let window = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let cutoff = clock.now_ms().saturating_sub(window);
    let deleted = crate::kit::delete_all_in_batches(
        pool,
        TABLE,
        "status IN ('SUCCEEDED', 'FAILED_FINAL', 'FAILED_RETRYABLE') AND updated_at_ms < ?",
        vec![Arg::Int(cutoff)],
        batch,
    )
    .await?;
    metrics::counter!(IDEMPOTENCY_PURGED_TOTAL).increment(deleted);
    Ok(deleted)
}

//! The callback table: creating it and its retention.

use std::time::Duration;

use sqlx::Pool;

use super::{DEFAULT_CALLBACK_TABLE, MIN_CALLBACK_RETENTION};
use crate::backend::{Arg, BarrierDatabase};
use crate::error::ParticipantError;
use crate::kit::{SharedClock, check_table_name, split_sql_script};
use idem_sql::Backend;

const SQLITE_DDL: &str = include_str!("../../sql/callback.sqlite.sql");
const POSTGRES_DDL: &str = include_str!("../../sql/callback.postgres.sql");
const MYSQL_DDL: &str = include_str!("../../sql/callback.mysql.sql");

/// Creates `idem_payment_callback` (and its index) if it does not exist.
pub async fn create_callback_tables<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<(), sqlx::Error> {
    create_callback_tables_named(pool, DEFAULT_CALLBACK_TABLE).await
}

/// [`create_callback_tables`] under another table name.
pub async fn create_callback_tables_named<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    check_table_name(table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let dialect = DB::pool_dialect(pool);
    let text = match dialect {
        Backend::Sqlite => SQLITE_DDL,
        Backend::Postgres => POSTGRES_DDL,
        Backend::Mysql => MYSQL_DDL,
    };
    let mut conn = pool.acquire().await?;
    for statement in split_sql_script(text) {
        DB::exec(
            &mut conn,
            statement.replace(DEFAULT_CALLBACK_TABLE, table),
            Vec::new(),
        )
        .await?;
    }
    Ok(())
}

/// Deletes CREDITED rows of the callback table `table` ([`DEFAULT_CALLBACK_TABLE`], or the
/// name given to [`PaymentCallbacks::with_table`](super::PaymentCallbacks::with_table))
/// received more than `older_than` ago, `batch` rows per statement; CONFLICT rows stay
/// until a human deals with them. Refuses a window shorter than [`MIN_CALLBACK_RETENTION`]
/// (the seed's §24: the window is the provider's notification period) and a malformed
/// table name.
pub async fn purge_payment_callbacks<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
    older_than: Duration,
    batch: u32,
    clock: &SharedClock,
) -> Result<u64, ParticipantError> {
    check_table_name(table).map_err(ParticipantError::refused)?;
    if older_than < MIN_CALLBACK_RETENTION {
        return Err(ParticipantError::refused(format!(
            "a callback retention of {older_than:?} is shorter than the minimum {MIN_CALLBACK_RETENTION:?}"
        )));
    }
    let window = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let cutoff = clock.now_ms().saturating_sub(window);
    let deleted = crate::kit::delete_all_in_batches(
        pool,
        table,
        "outcome = 'CREDITED' AND received_at_ms < ?",
        vec![Arg::Int(cutoff)],
        batch,
    )
    .await?;
    Ok(deleted)
}

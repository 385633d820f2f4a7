//! The SQL the consumer log and the job units share: insert-if-absent inside a local
//! transaction, their DDL scripts, and the retention floor.

use std::time::Duration;

use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase};
use crate::error::{DbErrorKind, ParticipantError, classify};
use crate::kit::LocalTx;
use crate::schema::split_sql_script;
use idem_sql::Backend;

/// Inserts one row into `table` unless a row with the same unique key (`conflict`, its
/// columns) exists; true when this call inserted it. `columns` is `(a, b) VALUES (?, ?)`.
///
/// The insert itself decides, never a read before it (two readers would both see
/// "absent"): PostgreSQL and SQLite skip the row with `ON CONFLICT DO NOTHING` (which does
/// not abort PostgreSQL's transaction); MySQL/MariaDB get a plain `INSERT` and error 1062,
/// which rolls back only that statement. A concurrent inserter of the same key waits for
/// the first transaction and then sees its row, or inserts if it rolled back.
pub(crate) async fn insert_if_absent<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    table: &str,
    columns: &str,
    conflict: &str,
    args: Vec<Arg>,
) -> Result<bool, ParticipantError> {
    let sql = match tx.dialect() {
        Backend::Postgres | Backend::Sqlite => {
            format!("INSERT INTO {table} {columns} ON CONFLICT ({conflict}) DO NOTHING")
        }
        Backend::Mysql => format!("INSERT INTO {table} {columns}"),
    };
    match crate::kit::local::exec(tx, &sql, args).await {
        Ok(n) => Ok(n == 1),
        Err(e)
            if tx.dialect() == Backend::Mysql
                && classify(tx.dialect(), &e) == DbErrorKind::UniqueViolation =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Runs the DDL script of `pool`'s backend, statement by statement.
pub(crate) async fn run_script<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    sqlite: &str,
    postgres: &str,
    mysql: &str,
) -> Result<(), sqlx::Error> {
    let script = match DB::pool_dialect(pool) {
        Backend::Sqlite => sqlite,
        Backend::Postgres => postgres,
        Backend::Mysql => mysql,
    };
    let mut conn = pool.acquire().await?;
    for statement in split_sql_script(script) {
        DB::exec(&mut conn, statement, Vec::new()).await?;
    }
    Ok(())
}

/// Refuses a retention window below `min`: deleting the record of a repeat that may still
/// arrive re-executes it (seed §24).
pub(crate) fn refuse_short_window(
    what: &str,
    older_than: Duration,
    min: Duration,
) -> Result<(), ParticipantError> {
    if older_than < min {
        return Err(ParticipantError::refused(format!(
            "{what} retention of {}s is shorter than the minimum {}s: a repeat arriving later would run again",
            older_than.as_secs(),
            min.as_secs()
        )));
    }
    Ok(())
}

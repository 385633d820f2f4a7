//! PostgreSQL.

use std::str::FromStr;

use futures::FutureExt;
use futures::future::BoxFuture;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult};
use sqlx::{Pool, Postgres, Transaction};

use super::sql::{ACTIVE_STATUSES, Dialect, SqlStore};
use super::{ConnectOptions, Lease, Result};
use crate::core::Millis;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

impl Dialect for Postgres {
    const BACKEND: &'static str = "postgres";
    const NUMBERED_PARAMETERS: bool = true;
    // A caught unique violation would abort the whole PostgreSQL transaction.
    const ON_DUPLICATE_DO_NOTHING: &'static str = " ON CONFLICT DO NOTHING";

    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<(), sqlx::migrate::MigrateError>> {
        MIGRATOR.run(pool).boxed()
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn begin_write(pool: &Pool<Self>) -> BoxFuture<'_, sqlx::Result<Transaction<'static, Self>>> {
        pool.begin().boxed()
    }

    fn claim<'a>(
        store: &'a SqlStore<Self>,
        lease: &'a Lease,
        now: Millis,
        limit: u32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<String>>> {
        async move {
            // SKIP LOCKED: coordinators scanning at the same time take different rows
            // instead of queueing behind each other's locks.
            let sql = format!(
                "UPDATE idem_global SET owner_token = $1, lease_until = $2, version = version + 1 \
                 WHERE gid IN (SELECT gid FROM idem_global \
                   WHERE status IN {ACTIVE_STATUSES} AND next_attempt_at <= $3 \
                     AND (lease_until IS NULL OR lease_until < $3) \
                   ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING gid"
            );
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
                .bind(&lease.token)
                .bind(lease.until)
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(&store.pool)
                .await
        }
        .boxed()
    }
}

pub async fn connect(url: &str, options: &ConnectOptions) -> Result<SqlStore<Postgres>> {
    let connect = PgConnectOptions::from_str(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(options.max_connections)
        .connect_with(connect)
        .await?;
    Ok(SqlStore::new(pool))
}

//! MySQL and MariaDB: the claim, the writers' session settings, migrations, the clock,
//! and (in `batch`) a batch of writes as one transaction of `JSON_TABLE` statements on a
//! lean connection.
//!
//! Sessions run `READ COMMITTED`, which takes no gap locks. An UPDATE cannot take its rows
//! from a limited subquery on its own table here, so a claim first locks the due rows
//! (`FOR UPDATE SKIP LOCKED`) and then takes them over, in one transaction. The writers'
//! sessions cut a lock wait (`innodb_lock_wait_timeout`) and, on MariaDB, a statement and
//! an idle transaction (`max_statement_time`, `idle_transaction_timeout`) below the store's
//! call timeout. Tables use `utf8mb4_bin`, so ids compare case-sensitively as on the other
//! databases.

mod batch;

use std::str::FromStr;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem_sql::{Backend, LeanPool};
use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{Executor, MySql, Pool};

use super::pools::{self, Suspicion};
use super::sql::group_commit::{JobResult, Work};
use super::sql::{ACTIVE_STATUSES, ClaimedRow, SqlStore, StoreDatabase, json_list, take_over};
use super::{ConnectOptions, Lease, Result, TenantScope};
use idem_core::Millis;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/mysql");

impl StoreDatabase for MySql {
    const BACKEND: Backend = Backend::Mysql;
    // SYSDATE(3), not NOW(3): NOW() is the start of the statement's transaction.
    const NOW_MS: &'static str = "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)";
    // MariaDB 10.6 and MySQL 8.0 have SKIP LOCKED (the claim uses it too).
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const ON_DUPLICATE_DO_NOTHING: &'static str = "";
    // VALUES(): MariaDB has no alias for the new row.
    const UPSERT_COORDINATOR: &'static str = " ON DUPLICATE KEY UPDATE \
         last_seen_at = VALUES(last_seen_at), \
         last_claim_at = COALESCE(VALUES(last_claim_at), last_claim_at)";

    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<()>> {
        crate::sql::schema::migrate(pool, &MIGRATOR).boxed()
    }

    const TABLE_EXISTS: &'static str = "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?";

    fn rows_affected(result: &MySqlQueryResult) -> u64 {
        result.rows_affected()
    }

    fn write_batch<'a>(
        store: &'a SqlStore<Self>,
        works: &'a [Work],
    ) -> BoxFuture<'a, Result<Vec<JobResult>>> {
        batch::write(store, works).boxed()
    }

    fn claim<'a>(
        store: &'a SqlStore<Self>,
        lease: &'a Lease,
        now: Millis,
        limit: u32,
        held: &'a [String],
        tenants: TenantScope<'a>,
    ) -> BoxFuture<'a, sqlx::Result<Vec<ClaimedRow>>> {
        async move {
            // MariaDB cannot UPDATE ... WHERE gid IN (subquery with LIMIT) on the same
            // table, so lock the due rows first (they exist, and READ COMMITTED takes no
            // gap locks), then take them over, in one transaction.
            let select = format!(
                "SELECT gid, owner_token FROM idem_global \
                 WHERE status IN {ACTIVE_STATUSES} AND next_attempt_at <= ? \
                   AND (lease_until IS NULL OR lease_until < ?) \
                   AND gid NOT IN (SELECT h.gid FROM JSON_TABLE(?, '$[*]' COLUMNS (gid \
                     VARCHAR(300) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS h) \
                   AND tenant NOT IN (SELECT s.tenant FROM JSON_TABLE(?, '$[*]' COLUMNS (tenant \
                     VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS s) \
                   AND (? IS NULL OR tenant = ?) \
                 ORDER BY next_attempt_at LIMIT ? FOR UPDATE SKIP LOCKED"
            );
            let mut db = store.pool().begin().await?;
            let rows: Vec<ClaimedRow> = sqlx::query_as(sqlx::AssertSqlSafe(select))
                .bind(now)
                .bind(now)
                .bind(json_list(held)?)
                .bind(json_list(tenants.skip)?)
                .bind(tenants.only)
                .bind(tenants.only)
                .bind(i64::from(limit))
                .fetch_all(&mut *db)
                .await?;
            if rows.is_empty() {
                db.commit().await?;
                return Ok(rows);
            }
            take_over::<MySql>(lease, &rows).execute(&mut *db).await?;
            db.commit().await?;
            Ok(rows)
        }
        .boxed()
    }
}

/// Locking reads under REPEATABLE READ also lock the gaps between index records, which
/// blocks inserts of new transactions and invites deadlocks.
const READ_COMMITTED: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

fn read_committed(conn: &mut sqlx::MySqlConnection) -> BoxFuture<'_, sqlx::Result<()>> {
    async move {
        conn.execute(READ_COMMITTED).await?;
        Ok(())
    }
    .boxed()
}

/// The writers' sessions: READ COMMITTED, and the server cuts a statement, a lock wait and
/// an idle open transaction below the coordinator's own bound (see [`pools::ServerCut`]).
/// `max_statement_time` and `idle_transaction_timeout` are MariaDB's; MySQL has neither
/// (its `max_execution_time` bounds only SELECTs), so there only the lock wait is cut.
fn writer_session(
    conn: &mut sqlx::MySqlConnection,
    cut: pools::ServerCut,
) -> BoxFuture<'_, sqlx::Result<()>> {
    async move {
        conn.execute(READ_COMMITTED).await?;
        let lock_secs = cut.lock.as_secs().max(1);
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut *conn)
            .await?;
        let set = if version.contains("MariaDB") {
            format!(
                "SET SESSION innodb_lock_wait_timeout = {lock_secs}, \
                 max_statement_time = {:.3}, idle_transaction_timeout = {}",
                cut.statement.as_secs_f64(),
                cut.statement.as_secs().max(1)
            )
        } else {
            format!("SET SESSION innodb_lock_wait_timeout = {lock_secs}")
        };
        conn.execute(sqlx::AssertSqlSafe(set)).await?;
        Ok(())
    }
    .boxed()
}

pub async fn connect(
    url: &str,
    options: &ConnectOptions,
    suspicion: &Suspicion,
) -> Result<SqlStore<MySql>> {
    let url = url.replacen("mariadb://", "mysql://", 1);
    let connect = MySqlConnectOptions::from_str(&url)?;
    pools::probe(&connect, options.connect_timeout).await?;
    let pool = pools::server_pool::<MySql>(options, suspicion)
        .after_connect(|conn, _| read_committed(conn))
        .connect_lazy_with(connect.clone());
    let cut = pools::ServerCut::below(options.call_timeout);
    Ok(SqlStore::new(pool).with_lean(
        LeanPool::with_options(connect, pools::lean(options))
            .after_connect(Arc::new(move |conn| writer_session(conn, cut))),
    ))
}

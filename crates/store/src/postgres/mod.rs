//! PostgreSQL: its claim query, the writers' session settings, migrations, the clock,
//! and (in `batch`) a batch of writes as one statement over `unnest`ed arrays, with no
//! BEGIN/COMMIT.
//!
//! Claims lock the due rows with `FOR UPDATE SKIP LOCKED`, so coordinators claiming at once
//! take different rows. The writers run on a [`LeanPool`] rather than sqlx's pool, which
//! pings every connection it takes back (a second round trip per statement); the lean
//! pool takes a connection back only when its statement succeeded and closes it otherwise.
//! Their sessions force generic plans that find rows by primary key, and cut a statement
//! and a lock wait below the store's call timeout (`statement_timeout`, `lock_timeout`).
//! Use the Unix socket or `sslmode=disable` on loopback.

mod batch;

use std::str::FromStr;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem_sql::{Backend, LeanPool};
use sqlx::postgres::{PgConnectOptions, PgQueryResult};
use sqlx::{Pool, Postgres};

use super::pools::{self, Suspicion};
use super::sql::group_commit::{JobResult, Work};
use super::sql::{ACTIVE_STATUSES, ClaimedRow, SqlStore, StoreDatabase};
use super::{ConnectOptions, Lease, Result, TenantScope};
use idem_core::Millis;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

/// Session settings of the writers' connections. Their statements join a batch's rows to
/// the tables by primary key, and a nested loop over that key is the right plan at any
/// table size; the planner, left to choose, once cached a full scan made while the table
/// was small (or had no statistics: autovacuum may be off) and kept it at every size. A
/// generic plan also spares planning each batch.
const WRITER_SESSION: [(&str, &str); 4] = [
    ("plan_cache_mode", "force_generic_plan"),
    ("enable_seqscan", "off"),
    ("enable_hashjoin", "off"),
    ("enable_mergejoin", "off"),
];

/// Tables the writers' generic plans look rows up in by primary key.
const HOT_TABLES: &str = "'idem_global', 'idem_branch'";

/// Gives the planner statistics for tables that hold rows but were never analyzed (as when
/// autovacuum is off, or has not come round yet). Without them, a generic plan made while
/// `idem_global` held a few hundred rows looked gids up through `idem_global_created`
/// (created_at, gid) — a scan of the whole index per row — and the writers' connections
/// kept that plan as the table grew: a coordinator started on such a database wrote at
/// half the rate of one started on an empty one. Best effort: a role that may not
/// analyze the tables only loses the hint.
async fn analyze_if_never_analyzed(pool: &Pool<Postgres>) {
    let never: sqlx::Result<Vec<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT relname::text FROM pg_stat_user_tables \
         WHERE schemaname = current_schema() AND relname IN ({HOT_TABLES}) \
           AND last_analyze IS NULL AND last_autoanalyze IS NULL"
    )))
    .fetch_all(pool)
    .await;
    for table in never.unwrap_or_default() {
        // The name comes from the fixed list above, not from input. Whether it holds rows
        // is asked of the table itself: the statistics system learns of other sessions'
        // inserts only when they go idle, up to seconds later.
        let holds_rows = format!("SELECT EXISTS (SELECT 1 FROM {table})");
        let holds_rows: sqlx::Result<bool> = sqlx::query_scalar(sqlx::AssertSqlSafe(holds_rows))
            .fetch_one(pool)
            .await;
        if !matches!(holds_rows, Ok(true)) {
            continue;
        }
        let analyze = format!("ANALYZE {table}");
        if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(analyze))
            .execute(pool)
            .await
        {
            tracing::warn!(%table, error = %e, "could not analyze a table without statistics");
        }
    }
}

impl StoreDatabase for Postgres {
    const BACKEND: Backend = Backend::Postgres;
    // clock_timestamp(), not now(): now() is the start of the transaction.
    const NOW_MS: &'static str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    // A caught unique violation would abort the whole PostgreSQL transaction.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const ON_DUPLICATE_DO_NOTHING: &'static str = " ON CONFLICT DO NOTHING";
    const UPSERT_COORDINATOR: &'static str = " ON CONFLICT (node) DO UPDATE SET \
         last_seen_at = excluded.last_seen_at, \
         last_claim_at = COALESCE(excluded.last_claim_at, idem_coordinator.last_claim_at)";

    const TABLE_EXISTS: &'static str = "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = ?";

    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<()>> {
        async move {
            crate::sql::schema::migrate(pool, &MIGRATOR).await?;
            analyze_if_never_analyzed(pool).await;
            Ok(())
        }
        .boxed()
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
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
            // SKIP LOCKED: coordinators scanning at the same time take different rows
            // instead of queueing behind each other's locks. RETURNING shows the new row,
            // so the old owner comes from the locked subquery.
            let sql = format!(
                "UPDATE idem_global g SET owner_token = $1, lease_until = $2, version = g.version + 1 \
                 FROM (SELECT gid, owner_token FROM idem_global \
                   WHERE status IN {ACTIVE_STATUSES} AND next_attempt_at <= $3 \
                     AND (lease_until IS NULL OR lease_until < $3) \
                     AND gid <> ALL($5::varchar[]) \
                     AND tenant <> ALL($6::varchar[]) \
                     AND ($7::varchar IS NULL OR tenant = $7) \
                   ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) old \
                 WHERE g.gid = old.gid \
                 RETURNING g.gid, old.owner_token"
            );
            sqlx::query_as::<_, ClaimedRow>(sqlx::AssertSqlSafe(sql))
                .bind(&lease.token)
                .bind(lease.until)
                .bind(now)
                .bind(i64::from(limit))
                .bind(held)
                .bind(tenants.skip)
                .bind(tenants.only)
                .fetch_all(store.pool())
                .await
        }
        .boxed()
    }
}

pub async fn connect(
    url: &str,
    options: &ConnectOptions,
    suspicion: &Suspicion,
) -> Result<SqlStore<Postgres>> {
    let connect = PgConnectOptions::from_str(url)?;
    pools::probe(&connect, options.connect_timeout).await?;
    let pool =
        pools::server_pool::<Postgres>(options, suspicion).connect_lazy_with(connect.clone());
    // The lean pool serves the writers alone (creates and saves, in batches).
    let cut = pools::ServerCut::below(options.call_timeout);
    let writers = connect.options(WRITER_SESSION).options([
        ("statement_timeout", cut.statement.as_millis().max(1)),
        ("lock_timeout", cut.lock.as_millis().max(1)),
    ]);
    Ok(SqlStore::new(pool).with_lean(LeanPool::with_options(writers, pools::lean(options))))
}

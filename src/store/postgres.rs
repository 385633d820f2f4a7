//! PostgreSQL.

use std::str::FromStr;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem_sql::{Backend, LeanPool};
use sqlx::postgres::{PgConnectOptions, PgQueryResult};
use sqlx::{Pool, Postgres};

use super::pools::{self, Suspicion};
use super::sql::binds::{
    bind_attempt, bind_branch_insert, bind_branch_set, bind_global_insert, bind_global_update,
};
use super::sql::{
    ACTIVE_STATUSES, BRANCH_COLUMNS, BRANCH_SET, BranchGroup, ClaimedRow, GLOBAL_COLUMNS,
    GLOBAL_SET, SqlStore, StoreDatabase,
};
use super::{ConnectOptions, Guard, Lease, Result, Save, Saved};
use crate::core::Millis;

type Tx = crate::core::Transaction;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

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

    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<(), sqlx::migrate::MigrateError>> {
        MIGRATOR.run(pool).boxed()
    }

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }

    fn save_in_one_statement<'a>(
        store: &'a SqlStore<Self>,
        save: &'a Save<'a>,
        groups: &'a [BranchGroup<'a>],
    ) -> Option<BoxFuture<'a, Result<Saved>>> {
        Some(save_with_ctes(store, save, groups).boxed())
    }

    fn create_in_one_statement<'a>(
        store: &'a SqlStore<Self>,
        tx: &'a Tx,
        request_hash: &'a str,
        lease: Option<&'a Lease>,
    ) -> Option<BoxFuture<'a, Result<bool>>> {
        Some(create_with_ctes(store, tx, request_hash, lease).boxed())
    }

    fn claim<'a>(
        store: &'a SqlStore<Self>,
        lease: &'a Lease,
        now: Millis,
        limit: u32,
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
                   ORDER BY next_attempt_at LIMIT $4 FOR UPDATE SKIP LOCKED) old \
                 WHERE g.gid = old.gid \
                 RETURNING g.gid, old.owner_token"
            );
            sqlx::query_as::<_, ClaimedRow>(sqlx::AssertSqlSafe(sql))
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

pub async fn connect(
    url: &str,
    options: &ConnectOptions,
    suspicion: &Suspicion,
) -> Result<SqlStore<Postgres>> {
    let connect = PgConnectOptions::from_str(url)?;
    pools::probe(&connect, options.connect_timeout).await?;
    let pool =
        pools::server_pool::<Postgres>(options, suspicion).connect_lazy_with(connect.clone());
    let mut store = SqlStore::new(pool);
    // The lean pool runs the hot writes, each keyed by a primary key: a generic plan is
    // right whatever the table's statistics say, and saves planning every execution. A
    // custom plan once picked a status index full of dead entries (every transaction
    // passes through `running`) over the primary key.
    let hot = connect.options([("plan_cache_mode", "force_generic_plan")]);
    store.lean = Some(LeanPool::with_options(hot, pools::lean(options)));
    Ok(store)
}

/// A whole save as one statement: the global row's conditional UPDATE, and, only if it
/// matched, the branch UPDATEs and the attempt INSERT, as data-modifying CTEs. One round
/// trip and no BEGIN/COMMIT; atomic like any single statement. The branch UPDATEs name
/// the gid as a parameter rather than joining the CTE: joined, the plan cached on a
/// connection while the table was small scanned the whole table on every save.
async fn save_with_ctes(
    store: &SqlStore<Postgres>,
    save: &Save<'_>,
    groups: &[BranchGroup<'_>],
) -> Result<Saved> {
    let guard = match save.guard {
        Guard::Owner(_) => "owner_token = ?",
        Guard::Version(_) => "version = ?",
    };
    let mut sql = format!(
        "WITH g AS (UPDATE idem_global SET {GLOBAL_SET} WHERE gid = ? AND {} RETURNING gid)",
        key_only_guard(&format!("status = ? AND {guard}"))
    );
    for (i, group) in groups.iter().enumerate() {
        let ids = vec!["?"; group.branch_ids.len()].join(", ");
        sql.push_str(&format!(
            ", b{i} AS (UPDATE idem_branch SET {BRANCH_SET} \
             WHERE idem_branch.gid = ? AND EXISTS (SELECT 1 FROM g) AND idem_branch.action = ? AND idem_branch.branch_id IN ({ids}))"
        ));
    }
    if !save.attempts.is_empty() {
        let row = "(?::varchar, ?::varchar, ?::int, ?::bigint, ?::bigint, ?::varchar, ?::text)";
        let rows = vec![row; save.attempts.len()].join(", ");
        sql.push_str(&format!(
            ", a AS (INSERT INTO idem_attempt (gid, branch_id, action, attempt, started_at, duration_ms, outcome, detail) \
             SELECT g.gid, v.* FROM g, (VALUES {rows}) AS v(branch_id, action, attempt, started_at, duration_ms, outcome, detail))"
        ));
    }
    sql.push_str(" SELECT count(*) FROM g");
    let mut query = bind_global_update!(
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(Postgres::BACKEND.rewrite(&sql))),
        save
    );
    for group in groups {
        let b = group.values;
        query = bind_branch_set!(query, b)
            .bind(save.after.gid.as_str())
            .bind(b.action.as_str());
        for id in &group.branch_ids {
            query = query.bind(*id);
        }
    }
    for a in save.attempts {
        query = bind_attempt!(query, a);
    }
    let matched = count_on(store, store.lean.as_ref(), query).await?;
    Ok(if matched == 0 {
        Saved::Lost
    } else {
        Saved::Saved
    })
}

/// `condition` written so that the planner cannot use it to choose an index: a row is
/// found by its primary key, and the condition is checked on that row. Left visible, the
/// status in it made the planner prefer an index that leads with the status (the
/// transaction list's, retention's), whose `running` entries grow with every transaction
/// that ever ran until a vacuum removes them, over the primary key: a generic plan made
/// while the table was small, or without statistics, kept doing so for every save.
fn key_only_guard(condition: &str) -> String {
    format!("(CASE WHEN {condition} THEN TRUE ELSE FALSE END)")
}

/// Creates the global row and its branches in one statement; false if the gid was taken.
async fn create_with_ctes(
    store: &SqlStore<Postgres>,
    tx: &Tx,
    request_hash: &str,
    lease: Option<&Lease>,
) -> Result<bool> {
    let marks = vec!["?"; 19].join(", ");
    let mut sql = format!(
        "WITH g AS (INSERT INTO idem_global ({GLOBAL_COLUMNS}) VALUES ({marks}) ON CONFLICT DO NOTHING RETURNING gid)"
    );
    if !tx.branches.is_empty() {
        let row = "(?::varchar, ?::varchar, ?::int, ?::text, ?::text, ?::varchar, ?::int, ?::bigint, ?::text, ?::bigint, ?::bigint, ?::bigint)";
        let rows = vec![row; tx.branches.len()].join(", ");
        sql.push_str(&format!(
            ", b AS (INSERT INTO idem_branch ({BRANCH_COLUMNS}) \
             SELECT g.gid, v.* FROM g, (VALUES {rows}) AS v(branch_id, action, seq, url, payload, status, attempts, next_attempt_at, last_error, in_progress_since, updated_at, finished_at))"
        ));
    }
    sql.push_str(" SELECT count(*) FROM g");
    let options = serde_json::to_string(&tx.options)
        .map_err(|e| super::StoreError::Corrupt(e.to_string()))?;
    let mut query = bind_global_insert!(
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(Postgres::BACKEND.rewrite(&sql))),
        tx,
        request_hash,
        options,
        lease
    );
    for b in &tx.branches {
        query = bind_branch_insert!(query, b);
    }
    Ok(count_on(store, store.lean.as_ref(), query).await? == 1)
}

/// Runs a `SELECT count(*)`-shaped statement on a lean connection if there is one.
async fn count_on(
    store: &SqlStore<Postgres>,
    lean: Option<&LeanPool<Postgres>>,
    query: sqlx::query::QueryScalar<'_, Postgres, i64, sqlx::postgres::PgArguments>,
) -> sqlx::Result<i64> {
    match lean {
        Some(lean) => {
            let mut conn = lean.get().await?;
            let result = query.fetch_one(&mut *conn).await;
            conn.keep_if_ok(result)
        }
        None => query.fetch_one(&store.pool).await,
    }
}

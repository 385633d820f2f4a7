//! The console's overview of one tenant, and the coordinators seen.
//!
//! Each read is one indexed statement: the counts one grouped read of (tenant, status),
//! the lists walks of (tenant, status) or (tenant, created_at), the minutes grouped reads
//! of (tenant, created_at) and (tenant, finished_at).

use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, IntoArguments, Type};

use super::rows::GlobalRow;
use super::statements::{ACTIVE_STATUSES, GLOBAL_READ};
use super::{SqlStore, StoreDatabase};
use crate::{CoordinatorSeen, MAX_NODE_LEN, Overview, Result, StoreError, StoredTx};
use idem_core::{Millis, Status};

/// A coordinator's row unseen this long is deleted by the next write of any coordinator.
pub const FORGET_AFTER_MS: Millis = 7 * 24 * 3_600_000;
/// A minute, in the epoch milliseconds the timestamps are stored in.
const MINUTE_MS: i64 = 60_000;

impl<DB> SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> GlobalRow: FromRow<'r, DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    pub(super) async fn overview_of(
        &self,
        tenant: &str,
        since: Millis,
        limit: u32,
    ) -> Result<Overview> {
        let sql = self
            .sql
            .dynamic("SELECT status, count(*) FROM idem_global WHERE tenant = ? GROUP BY status");
        let rows = sqlx::query_as::<DB, (String, i64)>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        let counts = rows
            .into_iter()
            .map(|(status, n)| {
                let status = status
                    .parse::<Status>()
                    .map_err(|_| StoreError::Corrupt(format!("unknown status {status:?}")))?;
                Ok((status, n as u64))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Overview {
            counts,
            stalled: self.oldest(tenant, "('stalled')", limit).await?,
            oldest_active: self.oldest(tenant, ACTIVE_STATUSES, limit).await?,
            created: self.per_minute(tenant, "created_at", since).await?,
            finished: self.per_minute(tenant, "finished_at", since).await?,
        })
    }

    /// The tenant's `limit` oldest transactions in any of `statuses` (an SQL list).
    async fn oldest(&self, tenant: &str, statuses: &str, limit: u32) -> Result<Vec<StoredTx>> {
        let sql = self.sql.dynamic(&format!(
            "SELECT {GLOBAL_READ} FROM idem_global WHERE tenant = ? AND status IN {statuses} \
             ORDER BY created_at, gid LIMIT ?"
        ));
        let rows = sqlx::query_as::<DB, GlobalRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(i64::from(limit.clamp(1, 100)))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| r.into_stored(Vec::new()))
            .collect()
    }

    /// How many of the tenant's transactions have `column` (a timestamp) in each minute
    /// from `since` on. The minute is the timestamp less its remainder, which every
    /// database computes in integers alike.
    async fn per_minute(
        &self,
        tenant: &str,
        column: &str,
        since: Millis,
    ) -> Result<Vec<(Millis, u64)>> {
        let sql = self.sql.dynamic(&format!(
            "SELECT {column} - {column} % {MINUTE_MS} AS minute, count(*) FROM idem_global \
             WHERE tenant = ? AND {column} >= ? GROUP BY minute ORDER BY minute"
        ));
        let rows = sqlx::query_as::<DB, (i64, i64)>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(|(m, n)| (m, n as u64)).collect())
    }

    pub(super) async fn upsert_coordinator(
        &self,
        node: &str,
        now: Millis,
        claimed_at: Option<Millis>,
    ) -> Result<()> {
        let node = match node.char_indices().nth(MAX_NODE_LEN) {
            Some((cut, _)) => &node[..cut],
            None => node,
        };
        let sql = self.sql.dynamic(&format!(
            "INSERT INTO idem_coordinator (node, last_seen_at, last_claim_at) VALUES (?, ?, ?){}",
            DB::UPSERT_COORDINATOR
        ));
        sqlx::query::<DB>(sqlx::AssertSqlSafe(sql))
            .bind(node)
            .bind(now)
            .bind(claimed_at)
            .execute(&self.pool)
            .await?;
        // Nodes come and go (a pod's name is new at each start): their rows would pile up.
        let sql = self
            .sql
            .dynamic("DELETE FROM idem_coordinator WHERE last_seen_at < ?");
        sqlx::query::<DB>(sqlx::AssertSqlSafe(sql))
            .bind(now - FORGET_AFTER_MS)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub(super) async fn coordinator_rows(&self, since: Millis) -> Result<Vec<CoordinatorSeen>> {
        let sql = self.sql.dynamic(
            "SELECT node, last_seen_at, last_claim_at FROM idem_coordinator \
             WHERE last_seen_at >= ? ORDER BY node LIMIT 1000",
        );
        let rows = sqlx::query_as::<DB, (String, i64, Option<i64>)>(sqlx::AssertSqlSafe(sql))
            .bind(since)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(node, last_seen_at, last_claim_at)| CoordinatorSeen {
                node,
                last_seen_at,
                last_claim_at,
            })
            .collect())
    }
}

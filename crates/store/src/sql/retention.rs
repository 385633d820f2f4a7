//! Retention: deleting finished transactions, one bounded batch per database transaction.

use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Type};

use super::{SqlStore, StoreDatabase};
use crate::{Purged, Result};
use idem_core::Millis;

/// The terminal statuses; `stalled` is not one (it waits for an operator).
const TERMINAL: &str = "('succeeded', 'failed')";

impl<DB> SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    pub(super) async fn purge_finished_batch(
        &self,
        finished_before: Millis,
        limit: u32,
    ) -> Result<Purged> {
        let mut db = DB::BACKEND.begin(&self.pool).await?;
        // Locked until the commit (SQLite: the whole database is, by BEGIN IMMEDIATE), and
        // skipped when another coordinator's pass holds them: concurrent passes take
        // different batches instead of queueing behind each other.
        let select = self.sql.dynamic(&format!(
            "SELECT gid FROM idem_global WHERE status IN {TERMINAL} AND finished_at < ? LIMIT ?{}",
            DB::SKIP_LOCKED
        ));
        let gids: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(select))
            .bind(finished_before)
            .bind(i64::from(limit))
            .fetch_all(&mut *db)
            .await?;
        if gids.is_empty() {
            db.commit().await?;
            return Ok(Purged::default());
        }
        let marks = vec!["?"; gids.len()].join(", ");
        // The status and age again: a terminal status never changes, but this delete must
        // not depend on that reasoning to leave a live transaction alone.
        let globals = self.sql.dynamic(&format!(
            "DELETE FROM idem_global WHERE gid IN ({marks}) \
             AND status IN {TERMINAL} AND finished_at < ?"
        ));
        let mut query = sqlx::query::<DB>(sqlx::AssertSqlSafe(globals));
        for gid in &gids {
            query = query.bind(gid.as_str());
        }
        let global = DB::rows_affected(&query.bind(finished_before).execute(&mut *db).await?);
        // Children only of the gids whose global row is gone now (this transaction sees
        // its own deletes); the schema has no foreign keys to cascade.
        let mut children = [0u64; 2];
        for (count, table) in children.iter_mut().zip(["idem_branch", "idem_attempt"]) {
            let sql = self.sql.dynamic(&format!(
                "DELETE FROM {table} WHERE gid IN ({marks}) AND NOT EXISTS \
                 (SELECT 1 FROM idem_global g WHERE g.gid = {table}.gid)"
            ));
            let mut query = sqlx::query::<DB>(sqlx::AssertSqlSafe(sql));
            for gid in &gids {
                query = query.bind(gid.as_str());
            }
            *count = DB::rows_affected(&query.execute(&mut *db).await?);
        }
        db.commit().await?;
        Ok(Purged {
            global,
            branch: children[0],
            attempt: children[1],
        })
    }
}

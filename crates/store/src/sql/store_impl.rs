//! [`Store`] for every database, on top of the statements, rows and writes beside it.

use sqlx::{ColumnIndex, Decode, Encode, Executor, FromRow, IntoArguments, Type};

use super::group_commit;
use super::rows::{AttemptRow, BranchRow, GlobalRow};
use std::collections::HashMap;

use super::statements::{ACTIVE_STATUSES, GLOBAL_READ, NON_TERMINAL_STATUSES};
use super::writes::branch_groups;
use super::{SqlStore, StoreDatabase, q, saved_if};
use crate::{
    AttemptRecord, Claimed, CoordinatorSeen, Created, Lease, ListFilter, Overview, Page, Purged,
    Registered, Result, Save, Saved, StatusSummary, Store, StoreError, StoredTx, TenantScope,
    TokenRecord,
};
use idem_core::{Access, Branch, Millis, Status, Transaction};

// The bounds below say "the generic code can run these statements and decode these rows
// on this database"; every sqlx backend satisfies them.
#[async_trait::async_trait]
impl<DB> Store for SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> GlobalRow: FromRow<'r, DB::Row>,
    for<'r> BranchRow: FromRow<'r, DB::Row>,
    for<'r> AttemptRow: FromRow<'r, DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
    for<'r> Option<i64>: Decode<'r, DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn backend(&self) -> &'static str {
        DB::BACKEND.name()
    }

    async fn ping(&self, timeout: std::time::Duration) -> Result<()> {
        let check = async {
            sqlx::raw_sql("SELECT 1").execute(&self.pool).await?;
            self.ready_check.as_ref().map_or(Ok(()), |check| check())
        };
        tokio::time::timeout(timeout, check)
            .await
            .unwrap_or(Err(StoreError::TimedOut(timeout)))
    }

    async fn migrate(&self) -> Result<()> {
        DB::migrate(&self.pool).await
    }

    async fn create(
        &self,
        tx: &Transaction,
        request_hash: &str,
        lease: Option<&Lease>,
    ) -> Result<Created> {
        if let Some(queue) = self.batch.get() {
            return match group_commit::create(queue, tx, request_hash, lease).await? {
                true => Ok(Created::Inserted),
                false => self.existing(&tx.gid).await,
            };
        }
        let mut db = self.begin_write().await?;
        if !self.create_in(db.conn(), tx, request_hash, lease).await? {
            db.end(false).await?;
            return self.existing(&tx.gid).await;
        }
        db.end(true).await?;
        Ok(Created::Inserted)
    }

    async fn save(&self, save: Save<'_>) -> Result<Saved> {
        if let Some(queue) = self.batch.get() {
            return group_commit::save(queue, &save).await;
        }
        let groups = branch_groups(save.before, save.after);
        if groups.is_empty()
            && save.attempts.is_empty()
            && super::batch_rows::trim_upto(&save).is_none()
        {
            // A decision or a lease alone: one conditional UPDATE needs no transaction.
            let done = match &self.lean {
                Some(lean) => {
                    let mut conn = lean.get().await?;
                    let done = self.update_global(&save).execute(&mut *conn).await;
                    conn.keep_if_ok(done)?
                }
                None => self.update_global(&save).execute(&self.pool).await?,
            };
            return Ok(saved_if(DB::rows_affected(&done)));
        }
        let mut db = self.begin_write().await?;
        let saved = self.save_in(db.conn(), &save, &groups).await?;
        db.end(saved == Saved::Saved).await?;
        Ok(saved)
    }

    async fn load(&self, gid: &str) -> Result<Option<StoredTx>> {
        self.load_one(gid).await
    }

    async fn register(
        &self,
        gid: &str,
        branches: &[Branch],
        now: Millis,
        access: Access,
    ) -> Result<Registered> {
        let mut db = DB::BACKEND.begin(&self.pool).await?;
        // Lock the global row in the prepared status: a concurrent submit waits for this
        // transaction, and a registration after a submit finds nothing to lock.
        let locked = q::<DB>(&self.sql.lock_prepared)
            .bind(now)
            .bind(gid)
            .bind(now)
            .execute(&mut *db)
            .await?;
        if DB::rows_affected(&locked) == 0 {
            db.rollback().await?;
            return Ok(match self.load(gid).await? {
                Some(stored) if stored.tx.admits(access) => {
                    Registered::NotPrepared(stored.tx.status)
                }
                _ => Registered::NotFound,
            });
        }
        let mut stored = self.load_global(&mut db, gid).await?;
        // Read under the row's lock: the row registered into is the one that admitted it.
        if !stored.tx.admits(access) {
            db.rollback().await?;
            return Ok(Registered::NotFound);
        }
        stored.tx.branches = self.load_branches(&mut db, gid).await?;
        match idem_core::register(&stored.tx, branches.to_vec(), now) {
            Ok(idem_core::Registration::AlreadyRegistered) => {
                db.rollback().await?;
                Ok(Registered::Stored)
            }
            Ok(idem_core::Registration::New(new)) => {
                // Counted under the row lock taken above, after any registration that held
                // it before us committed: two registrations cannot both take the last place.
                let ids: std::collections::HashSet<&str> = stored
                    .tx
                    .branches
                    .iter()
                    .chain(&new)
                    .map(|b| &*b.branch_id)
                    .collect();
                if ids.len() > self.max_branches {
                    db.rollback().await?;
                    return Err(StoreError::TooManyBranches {
                        count: ids.len(),
                        max: self.max_branches,
                    });
                }
                self.insert_branches(&mut db, gid, &new).await?;
                db.commit().await?;
                Ok(Registered::Stored)
            }
            Err(idem_core::CoreError::BranchConflict(key)) => {
                db.rollback().await?;
                Ok(Registered::Conflict(key))
            }
            Err(_) => {
                db.rollback().await?;
                Ok(Registered::NotPrepared(stored.tx.status))
            }
        }
    }

    async fn claim_due_of(
        &self,
        lease: &Lease,
        now: Millis,
        limit: u32,
        held: &[String],
        tenants: TenantScope<'_>,
    ) -> Result<Vec<Claimed>> {
        let mut previous: HashMap<String, Option<String>> =
            DB::claim(self, lease, now, limit, held, tenants)
                .await?
                .into_iter()
                .collect();
        let gids: Vec<String> = previous.keys().cloned().collect();
        // A claimed row can only change under our token now, so reading it after the claim
        // is consistent.
        let loaded = self.load_many(&gids).await?;
        Ok(loaded
            .into_iter()
            .map(|stored| Claimed {
                previous_owner: previous.remove(&stored.tx.gid).flatten(),
                stored,
            })
            .collect())
    }

    async fn release_node(&self, token_prefix: &str) -> Result<u64> {
        let sql = self.sql.dynamic(&format!(
            "UPDATE idem_global SET lease_until = NULL \
             WHERE status IN {ACTIVE_STATUSES} AND substr(owner_token, 1, ?) = ?"
        ));
        let done = sqlx::query::<DB>(sqlx::AssertSqlSafe(sql))
            .bind(token_prefix.len() as i32)
            .bind(token_prefix)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done))
    }

    async fn count(&self, tenant: Option<&str>, statuses: &[Status]) -> Result<u64> {
        let marks = vec!["?"; statuses.len().max(1)].join(", ");
        let in_tenant = if tenant.is_some() {
            " AND tenant = ?"
        } else {
            ""
        };
        let sql = self.sql.dynamic(&format!(
            "SELECT count(*) FROM idem_global WHERE status IN ({marks}){in_tenant}"
        ));
        let mut query = sqlx::query_scalar::<DB, i64>(sqlx::AssertSqlSafe(sql));
        for s in statuses {
            query = query.bind(s.as_str());
        }
        if statuses.is_empty() {
            query = query.bind("");
        }
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        Ok(query.fetch_one(&self.pool).await? as u64)
    }

    async fn insert_token(&self, token: &TokenRecord) -> Result<bool> {
        self.insert_token_row(token).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.token_rows().await
    }

    async fn revoke_token(&self, id: &str, now: Millis) -> Result<bool> {
        self.revoke_token_row(id, now).await
    }

    async fn active_summary(&self) -> Result<Vec<StatusSummary>> {
        let sql = self.sql.dynamic(&format!(
            "SELECT status, count(*), min(created_at) FROM idem_global \
             WHERE status IN {NON_TERMINAL_STATUSES} GROUP BY status"
        ));
        let rows = sqlx::query_as::<DB, (String, i64, i64)>(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|(status, count, oldest)| {
                let status = status
                    .parse::<Status>()
                    .map_err(|_| StoreError::Corrupt(format!("unknown status {status:?}")))?;
                Ok(StatusSummary {
                    status,
                    count: count as u64,
                    oldest_created_at: oldest,
                })
            })
            .collect()
    }

    async fn overview(&self, tenant: &str, since: Millis, limit: u32) -> Result<Overview> {
        self.overview_of(tenant, since, limit).await
    }

    async fn coordinator_seen(
        &self,
        node: &str,
        now: Millis,
        claimed_at: Option<Millis>,
    ) -> Result<()> {
        self.upsert_coordinator(node, now, claimed_at).await
    }

    async fn coordinators(&self, since: Millis) -> Result<Vec<CoordinatorSeen>> {
        self.coordinator_rows(since).await
    }

    async fn db_now(&self) -> Result<Millis> {
        let now = sqlx::query_scalar::<DB, i64>(DB::NOW_MS)
            .fetch_one(&self.pool)
            .await?;
        Ok(now)
    }

    async fn purge_finished(&self, finished_before: Millis, limit: u32) -> Result<Purged> {
        self.purge_finished_batch(finished_before, limit.max(1))
            .await
    }

    async fn renew(&self, gid: &str, token: &str, until: Millis) -> Result<bool> {
        self.lease_change(gid, token, until, false).await
    }

    async fn release(&self, gid: &str, token: &str, now: Millis) -> Result<bool> {
        self.lease_change(gid, token, now, true).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page> {
        let mut sql = format!("SELECT {GLOBAL_READ} FROM idem_global WHERE 1 = 1");
        if filter.tenant.is_some() {
            sql.push_str(" AND tenant = ?");
        }
        if filter.tokenless_only {
            // Spelled as the partial index's condition, so that SQLite uses it.
            sql.push_str(" AND tokenless = TRUE");
        }
        if !filter.statuses.is_empty() {
            let marks = vec!["?"; filter.statuses.len()].join(", ");
            sql.push_str(&format!(" AND status IN ({marks})"));
        }
        if filter.kind.is_some() {
            sql.push_str(" AND kind = ?");
        }
        if filter.created_from.is_some() {
            sql.push_str(" AND created_at >= ?");
        }
        if filter.created_to.is_some() {
            sql.push_str(" AND created_at < ?");
        }
        let (before, order) = if filter.oldest_first {
            (">", "ASC")
        } else {
            ("<", "DESC")
        };
        if filter.after.is_some() {
            sql.push_str(&format!(
                " AND (created_at {before} ? OR (created_at = ? AND gid {before} ?))"
            ));
        }
        sql.push_str(&format!(
            " ORDER BY created_at {order}, gid {order} LIMIT ?"
        ));
        let sql = self.sql.dynamic(&sql);
        let limit = filter.limit.clamp(1, 1_000);
        let mut query = sqlx::query_as::<DB, GlobalRow>(sqlx::AssertSqlSafe(sql));
        if let Some(tenant) = &filter.tenant {
            query = query.bind(tenant.as_str());
        }
        for status in &filter.statuses {
            query = query.bind(status.as_str());
        }
        if let Some(kind) = filter.kind {
            query = query.bind(kind.as_str());
        }
        if let Some(from) = filter.created_from {
            query = query.bind(from);
        }
        if let Some(to) = filter.created_to {
            query = query.bind(to);
        }
        if let Some((created, gid)) = &filter.after {
            query = query.bind(*created).bind(*created).bind(gid.as_str());
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        let items = rows
            .into_iter()
            .map(|r| r.into_stored(Vec::new()))
            .collect::<Result<Vec<_>>>()?;
        let next = (items.len() == limit as usize)
            .then(|| items.last().map(|s| (s.tx.created_at, s.tx.gid.clone())))
            .flatten();
        Ok(Page { items, next })
    }

    async fn attempts(&self, gid: &str, after: i64, limit: u32) -> Result<Vec<AttemptRecord>> {
        let rows: Vec<AttemptRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_attempts.clone()))
                .bind(gid)
                .bind(after)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter().map(AttemptRow::into_record).collect()
    }
}

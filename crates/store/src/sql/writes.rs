//! Writes inside one write transaction: a create with its branches, a save (the global
//! row's conditional update, the changed branches, the attempts). A batch of them is each
//! database's own (`StoreDatabase::write_batch`).

use std::collections::HashMap;
use std::sync::Arc;

use idem_sql::Leased;
use sqlx::{Database, Encode, Executor, IntoArguments, Type};

use super::binds::{
    bind_attempt, bind_branch_insert, bind_branch_set, bind_global_insert, bind_global_update,
};
use super::group_commit::{self, WriterSettings};
use super::rows::corrupt;
use super::statements::INSERT_BATCH;
use super::{SqlStore, StoreDatabase, is_unique_violation, q, saved_if};
use crate::{Guard, Lease, Result, Save, Saved};
use idem_core::{Branch, BranchKey, Transaction};

/// Branch operations changed by a save that get the same new values: one UPDATE each.
pub struct BranchGroup<'a> {
    /// Carries the new values (status, attempts, ...); its action is the group's.
    pub values: &'a Branch,
    pub branch_ids: Vec<&'a str>,
}

/// Groups the branches `after` changed relative to `before` by their new values, so that
/// the common case (every Confirm answered alike) is one statement.
pub fn branch_groups<'a>(before: &Transaction, after: &'a Transaction) -> Vec<BranchGroup<'a>> {
    let old: HashMap<BranchKey, &Branch> = before.branches.iter().map(|b| (b.key(), b)).collect();
    let mut groups: Vec<BranchGroup<'a>> = Vec::new();
    for branch in &after.branches {
        if old.get(&branch.key()).is_some_and(|b| *b == branch) {
            continue;
        }
        let same = |v: &Branch| {
            v.action == branch.action
                && v.status == branch.status
                && v.attempts == branch.attempts
                && v.next_attempt_at == branch.next_attempt_at
                && v.last_error == branch.last_error
                && v.in_progress_since == branch.in_progress_since
                && v.updated_at == branch.updated_at
                && v.finished_at == branch.finished_at
        };
        match groups
            .iter_mut()
            .find(|g| same(g.values) && g.branch_ids.len() < INSERT_BATCH)
        {
            Some(g) => g.branch_ids.push(&branch.branch_id),
            None => groups.push(BranchGroup {
                values: branch,
                branch_ids: vec![&branch.branch_id],
            }),
        }
    }
    groups
}

/// A write transaction of a create or a save: on a lean connection when the store has a
/// lean pool (no release round trip), else on sqlx's pool.
pub(crate) enum WriteTx<DB: Database> {
    Pooled(sqlx::Transaction<'static, DB>),
    Lean(Leased<DB>),
}

impl<DB: StoreDatabase> WriteTx<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        match self {
            WriteTx::Pooled(tx) => tx,
            WriteTx::Lean(conn) => conn,
        }
    }

    /// Commits (`true`) or rolls back.
    pub(crate) async fn end(self, commit: bool) -> sqlx::Result<()> {
        match self {
            WriteTx::Pooled(tx) if commit => tx.commit().await,
            WriteTx::Pooled(tx) => tx.rollback().await,
            WriteTx::Lean(mut conn) => {
                let end = if commit { "COMMIT" } else { "ROLLBACK" };
                let done = sqlx::raw_sql(end).execute(&mut *conn).await.map(|_| ());
                // Back to the pool only once the transaction ended cleanly; an error (or a
                // `?` before this point) drops and closes the connection.
                conn.keep_if_ok(done)
            }
        }
    }
}

impl<DB: StoreDatabase> SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    pub(crate) async fn begin_write(&self) -> sqlx::Result<WriteTx<DB>> {
        match &self.lean {
            Some(lean) => {
                let mut conn = lean.get().await?;
                sqlx::raw_sql(DB::BACKEND.begin_sql())
                    .execute(&mut *conn)
                    .await?;
                Ok(WriteTx::Lean(conn))
            }
            None => Ok(WriteTx::Pooled(DB::BACKEND.begin(&self.pool).await?)),
        }
    }
}

impl<DB> SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q [u8]>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Type<DB>,
{
    /// Inserts a new transaction with its branches inside `conn`'s transaction; false if
    /// the gid is taken (nothing written).
    pub(crate) async fn create_in(
        &self,
        conn: &mut DB::Connection,
        tx: &Transaction,
        request_hash: &str,
        lease: Option<&Lease>,
    ) -> Result<bool> {
        let options = serde_json::to_string(&tx.options).map_err(corrupt)?;
        let insert = bind_global_insert!(
            q::<DB>(&self.sql.insert_global),
            tx,
            request_hash,
            options.as_str(),
            lease
        )
        .execute(&mut *conn)
        .await;
        let inserted = match insert {
            Ok(done) => DB::rows_affected(&done) == 1,
            Err(e) if is_unique_violation(&e) => false,
            Err(e) => return Err(e.into()),
        };
        if inserted {
            self.insert_branches(conn, &tx.gid, &tx.branches).await?;
        }
        Ok(inserted)
    }

    /// Writes a save inside `conn`'s transaction. `Lost` writes nothing.
    pub(super) async fn save_in(
        &self,
        conn: &mut DB::Connection,
        save: &Save<'_>,
        groups: &[BranchGroup<'_>],
    ) -> Result<Saved> {
        let done = self.update_global(save).execute(&mut *conn).await?;
        if saved_if(DB::rows_affected(&done)) == Saved::Lost {
            return Ok(Saved::Lost);
        }
        let gid = save.after.gid.as_str();
        for group in groups {
            let b = group.values;
            let mut update = bind_branch_set!(
                q::<DB>(&self.sql.update_branches[group.branch_ids.len() - 1]),
                b
            )
            .bind(gid)
            .bind(b.action.as_str());
            for id in &group.branch_ids {
                update = update.bind(*id);
            }
            update.execute(&mut *conn).await?;
        }
        for chunk in save.attempts.chunks(INSERT_BATCH) {
            let mut insert = q::<DB>(&self.sql.insert_attempts[chunk.len() - 1]);
            for a in chunk {
                insert = bind_attempt!(insert.bind(gid), a);
            }
            insert.execute(&mut *conn).await?;
        }
        if let Some(upto) = super::batch_rows::trim_upto(save) {
            q::<DB>(&self.sql.trim_attempts)
                .bind(gid)
                .bind(upto)
                .execute(&mut *conn)
                .await?;
        }
        Ok(Saved::Saved)
    }

    /// Makes this store write through its writer tasks: concurrent creates and saves share
    /// commits. The tasks hold the store weakly: they end when the store is dropped.
    pub fn start_group_commit(self: &Arc<Self>, settings: WriterSettings)
    where
        DB: 'static,
    {
        if self.batch.set(group_commit::Queue::new()).is_ok() {
            let queue = self.batch.get().expect("set just now");
            group_commit::spawn_writers(
                Arc::downgrade(self),
                queue,
                settings,
                |store, works| async move { DB::write_batch(&store, &works).await },
            );
        }
    }

    /// A renewal's or a release's UPDATE with its new expiry bound; the gid and token
    /// follow.
    pub(crate) fn lease_update(
        &self,
        until: idem_core::Millis,
        release: bool,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        if release {
            q::<DB>(&self.sql.release).bind(until)
        } else {
            q::<DB>(&self.sql.renew).bind(until).bind(until)
        }
    }

    /// A renewal or a release, through the writers when they run.
    pub(crate) async fn lease_change(
        &self,
        gid: &str,
        token: &str,
        until: idem_core::Millis,
        release: bool,
    ) -> Result<bool> {
        if let Some(queue) = self.batch.get() {
            return group_commit::renew(queue, gid, token, until, release).await;
        }
        let done = self
            .lease_update(until, release)
            .bind(gid)
            .bind(token)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    /// The conditional UPDATE of the global row for a save.
    pub(crate) fn update_global<'s>(
        &'s self,
        save: &'s Save<'s>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        let sql = match save.guard {
            Guard::Owner(..) => &self.sql.update_global_owned,
            Guard::Version(_) => &self.sql.update_global_by_version,
        };
        bind_global_update!(q::<DB>(sql), save)
    }

    pub(super) async fn insert_branches(
        &self,
        conn: &mut DB::Connection,
        gid: &str,
        branches: &[Branch],
    ) -> Result<()> {
        for chunk in branches.chunks(INSERT_BATCH) {
            let mut insert = q::<DB>(&self.sql.insert_branches[chunk.len() - 1]);
            for b in chunk {
                insert = bind_branch_insert!(insert.bind(gid), b);
            }
            insert.execute(&mut *conn).await?;
        }
        Ok(())
    }
}

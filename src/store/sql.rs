//! The store logic shared by every database, written once over sqlx's generic traits.
//!
//! SQL is written with `?` placeholders and translated to `$n` for PostgreSQL when the
//! store is opened. What differs between databases beyond that is behind [`Dialect`].

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use idem_participant::{LeanPool, Leased};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::*;
use crate::core::{self, TxOptions};

/// Binds the values of [`GLOBAL_SET`] and the WHERE of a save's conditional update, in
/// statement order: the same for every database and for both ways of writing a save.
macro_rules! bind_global_update {
    ($query:expr, $save:expr) => {{
        let save = $save;
        let (before, after) = (save.before, save.after);
        let query = $query
            .bind(after.status.as_str())
            .bind(after.stalled_from.map(|s| s.as_str()))
            .bind(after.attempts)
            .bind(after.next_attempt_at)
            .bind($crate::store::sql::clip(&after.last_error))
            .bind($crate::store::sql::clip(&after.reason))
            .bind(after.timeout_at)
            .bind(after.updated_at)
            .bind(after.finished_at)
            .bind(save.lease.map(|l| l.token.as_str()))
            .bind(save.lease.map(|l| l.until))
            .bind(after.gid.as_str())
            .bind(before.status.as_str());
        match save.guard {
            $crate::store::Guard::Owner(token) => query.bind(token),
            $crate::store::Guard::Version(version) => query.bind(version),
        }
    }};
}

/// Binds the values of an insert of the global row ([`GLOBAL_COLUMNS`] order).
macro_rules! bind_global_insert {
    ($query:expr, $tx:expr, $request_hash:expr, $options:expr, $lease:expr) => {{
        let (tx, lease) = ($tx, $lease);
        $query
            .bind(tx.gid.as_str())
            .bind(tx.kind.as_str())
            .bind(tx.status.as_str())
            .bind(tx.stalled_from.map(|s| s.as_str()))
            .bind($request_hash)
            .bind($options)
            .bind(tx.timeout_at)
            .bind(tx.attempts)
            .bind(tx.next_attempt_at)
            .bind($crate::store::sql::clip(&tx.last_error))
            .bind($crate::store::sql::clip(&tx.reason))
            .bind(lease.map(|l| l.token.as_str()))
            .bind(lease.map(|l| l.until))
            .bind(0i64)
            .bind(tx.created_at)
            .bind(tx.updated_at)
            .bind(tx.finished_at)
    }};
}

/// Binds a branch group's new values ([`BRANCH_SET`] order).
macro_rules! bind_branch_set {
    ($query:expr, $branch:expr) => {{
        let b = $branch;
        $query
            .bind(b.status.as_str())
            .bind(b.attempts)
            .bind(b.next_attempt_at)
            .bind($crate::store::sql::clip(&b.last_error))
            .bind(b.in_progress_since)
            .bind(b.updated_at)
            .bind(b.finished_at)
    }};
}

/// Binds a branch row's columns after its gid, in the order of the branch INSERTs.
macro_rules! bind_branch_insert {
    ($query:expr, $branch:expr) => {{
        let b = $branch;
        // The columns after the payload are those a branch update sets, in that order.
        bind_branch_set!(
            $query
                .bind(b.branch_id.as_str())
                .bind(b.action.as_str())
                .bind(b.seq)
                .bind(b.url.as_str())
                .bind(b.payload.as_str()),
            b
        )
    }};
}

/// Binds an attempt row's columns after its gid, in the order of the attempt INSERTs.
macro_rules! bind_attempt {
    ($query:expr, $attempt:expr) => {{
        let a = $attempt;
        $query
            .bind(a.branch_id.as_str())
            .bind(a.action.as_str())
            .bind(a.attempt)
            .bind(a.started_at)
            .bind(a.duration_ms)
            .bind(a.outcome.as_str())
            .bind($crate::store::sql::clip(&a.detail))
    }};
}

pub(crate) use {
    bind_attempt, bind_branch_insert, bind_branch_set, bind_global_insert, bind_global_update,
};

/// What a database does its own way.
pub trait Dialect: Database + Sized {
    const BACKEND: &'static str;
    /// `$1, $2, ...` instead of `?`.
    const NUMBERED_PARAMETERS: bool;
    /// Appended to inserts that may hit an existing key. PostgreSQL and SQLite skip the
    /// row; MySQL has no clause that only ignores duplicate keys without also making the
    /// affected-rows count ambiguous, so it reports the duplicate as an error, which
    /// MySQL (unlike PostgreSQL) does not let abort the transaction.
    const ON_DUPLICATE_DO_NOTHING: &'static str;

    /// Applies this database's migrations (`migrations/<backend>/`).
    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<(), sqlx::migrate::MigrateError>>;

    /// sqlx has no database-neutral accessor for the affected-row count.
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// Reads the database's clock as epoch milliseconds (one BIGINT column).
    const NOW_MS: &'static str;

    /// The statement that starts a write transaction on a lean connection (see
    /// [`Dialect::begin_write`]).
    const BEGIN_WRITE: &'static str = "BEGIN";

    /// Starts a transaction that will write. SQLite takes the write lock at once
    /// (`BEGIN IMMEDIATE`) so that two writers never deadlock upgrading read locks.
    fn begin_write(
        pool: &Pool<Self>,
    ) -> BoxFuture<'_, sqlx::Result<sqlx::Transaction<'static, Self>>>;

    /// A database that can store a whole save in one statement (PostgreSQL's
    /// data-modifying CTEs) does it here; `None` means: use a transaction.
    fn save_in_one_statement<'a>(
        _store: &'a SqlStore<Self>,
        _save: &'a Save<'a>,
        _groups: &'a [BranchGroup<'a>],
    ) -> Option<BoxFuture<'a, Result<Saved>>> {
        None
    }

    /// Likewise for creating a transaction with its branches.
    fn create_in_one_statement<'a>(
        _store: &'a SqlStore<Self>,
        _tx: &'a Transaction,
        _request_hash: &'a str,
        _lease: Option<&'a Lease>,
    ) -> Option<BoxFuture<'a, Result<bool>>> {
        None
    }

    /// Claims due rows for `lease` and returns their gids.
    fn claim<'a>(
        store: &'a SqlStore<Self>,
        lease: &'a Lease,
        now: Millis,
        limit: u32,
    ) -> BoxFuture<'a, sqlx::Result<Vec<String>>>;
}

pub(super) const GLOBAL_COLUMNS: &str = "gid, kind, status, stalled_from, request_hash, options, timeout_at, \
     attempts, next_attempt_at, last_error, reason, owner_token, lease_until, version, \
     created_at, updated_at, finished_at";
pub(super) const BRANCH_COLUMNS: &str = "gid, branch_id, action, seq, url, payload, status, attempts, \
     next_attempt_at, last_error, in_progress_since, updated_at, finished_at";
pub(super) const ATTEMPT_COLUMNS: &str =
    "branch_id, action, attempt, started_at, duration_ms, outcome, detail";
pub(super) const ACTIVE_STATUSES: &str = "('prepared', 'running', 'committing', 'aborting')";

/// The statements, translated for one database once.
pub struct Statements {
    pub insert_global: Arc<str>,
    pub select_global: Arc<str>,
    pub select_branches: Arc<str>,
    pub update_global_owned: Arc<str>,
    pub update_global_by_version: Arc<str>,
    pub lock_prepared: Arc<str>,
    pub renew: Arc<str>,
    pub select_attempts: Arc<str>,
    insert_branches: Vec<Arc<str>>,
    insert_attempts: Vec<Arc<str>>,
    update_branches: Vec<Arc<str>>,
    numbered: bool,
}

/// Rows per multi-row statement; more rows take several statements.
pub(super) const INSERT_BATCH: usize = 16;

impl Statements {
    fn new(numbered: bool, on_duplicate: &str) -> Statements {
        let t = |sql: String| -> Arc<str> { translate(&sql, numbered).into() };
        let rows = |n: usize, width: usize| -> String {
            let row = format!("({})", vec!["?"; width].join(", "));
            vec![row; n].join(", ")
        };
        Statements {
            insert_global: t(format!(
                "INSERT INTO idem_global ({GLOBAL_COLUMNS}) VALUES {}{on_duplicate}",
                rows(1, 17)
            )),
            select_global: t(format!(
                "SELECT {GLOBAL_COLUMNS} FROM idem_global WHERE gid = ?"
            )),
            select_branches: t(format!(
                "SELECT {BRANCH_COLUMNS} FROM idem_branch WHERE gid = ? ORDER BY seq, branch_id, action"
            )),
            update_global_owned: t(format!(
                "UPDATE idem_global SET {GLOBAL_SET} WHERE gid = ? AND status = ? AND owner_token = ?"
            )),
            update_global_by_version: t(format!(
                "UPDATE idem_global SET {GLOBAL_SET} WHERE gid = ? AND status = ? AND version = ?"
            )),
            lock_prepared: t(
                "UPDATE idem_global SET version = version + 1, updated_at = ? \
                 WHERE gid = ? AND status = 'prepared' AND (timeout_at IS NULL OR timeout_at > ?)"
                    .into(),
            ),
            renew: t(
                "UPDATE idem_global SET lease_until = ? WHERE gid = ? AND owner_token = ?".into(),
            ),
            select_attempts: t(format!(
                "SELECT {ATTEMPT_COLUMNS} FROM idem_attempt WHERE gid = ? ORDER BY id"
            )),
            insert_branches: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "INSERT INTO idem_branch ({BRANCH_COLUMNS}) VALUES {}",
                        rows(n, 13)
                    ))
                })
                .collect(),
            update_branches: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "UPDATE idem_branch SET {BRANCH_SET} WHERE gid = ? AND action = ? AND branch_id IN ({})",
                        vec!["?"; n].join(", ")
                    ))
                })
                .collect(),
            insert_attempts: (1..=INSERT_BATCH)
                .map(|n| {
                    t(format!(
                        "INSERT INTO idem_attempt (gid, {ATTEMPT_COLUMNS}) VALUES {}",
                        rows(n, 8)
                    ))
                })
                .collect(),
            numbered,
        }
    }

    /// Translates a `?` statement built at run time (a list filter, an IN list).
    pub fn dynamic(&self, sql: &str) -> String {
        translate(sql, self.numbered)
    }
}

pub(super) const BRANCH_SET: &str = "status = ?, attempts = ?, next_attempt_at = ?, \
     last_error = ?, in_progress_since = ?, updated_at = ?, finished_at = ?";

pub(super) const GLOBAL_SET: &str = "status = ?, stalled_from = ?, attempts = ?, next_attempt_at = ?, \
     last_error = ?, reason = ?, timeout_at = ?, updated_at = ?, finished_at = ?, \
     owner_token = ?, lease_until = ?, version = version + 1";

/// `?` to `$1, $2, ...` outside string literals.
pub fn translate(sql: &str, numbered: bool) -> String {
    if !numbered {
        return sql.to_owned();
    }
    let mut out = String::with_capacity(sql.len() + 16);
    let mut n = 0;
    let mut in_string = false;
    for c in sql.chars() {
        match c {
            '\'' => {
                in_string = !in_string;
                out.push(c);
            }
            '?' if !in_string => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

/// A global row as stored.
#[derive(Debug, Clone, FromRow)]
pub struct GlobalRow {
    pub gid: String,
    pub kind: String,
    pub status: String,
    pub stalled_from: Option<String>,
    pub request_hash: String,
    pub options: String,
    pub timeout_at: Option<i64>,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub reason: Option<String>,
    pub owner_token: Option<String>,
    pub lease_until: Option<i64>,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

/// A branch row as stored.
#[derive(Debug, Clone, FromRow)]
pub struct BranchRow {
    pub gid: String,
    pub branch_id: String,
    pub action: String,
    pub seq: i32,
    pub url: String,
    pub payload: String,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub in_progress_since: Option<i64>,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

#[derive(Debug, Clone, FromRow)]
struct AttemptRow {
    branch_id: String,
    action: String,
    attempt: i32,
    started_at: i64,
    duration_ms: i64,
    outcome: String,
    detail: Option<String>,
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl BranchRow {
    fn into_branch(self) -> Result<Branch> {
        Ok(Branch {
            branch_id: self.branch_id,
            action: self.action.parse().map_err(corrupt)?,
            seq: self.seq,
            url: self.url,
            payload: self.payload,
            status: self.status.parse().map_err(corrupt)?,
            attempts: self.attempts,
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error,
            in_progress_since: self.in_progress_since,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
        })
    }
}

impl GlobalRow {
    fn into_stored(self, branches: Vec<Branch>) -> Result<StoredTx> {
        let options: TxOptions = serde_json::from_str(&self.options).map_err(corrupt)?;
        Ok(StoredTx {
            tx: Transaction {
                gid: self.gid,
                kind: self.kind.parse().map_err(corrupt)?,
                status: self.status.parse().map_err(corrupt)?,
                stalled_from: self
                    .stalled_from
                    .map(|s| s.parse())
                    .transpose()
                    .map_err(corrupt)?,
                options,
                timeout_at: self.timeout_at,
                attempts: self.attempts,
                next_attempt_at: self.next_attempt_at,
                last_error: self.last_error,
                reason: self.reason,
                created_at: self.created_at,
                updated_at: self.updated_at,
                finished_at: self.finished_at,
                branches,
            },
            request_hash: self.request_hash,
            owner_token: self.owner_token,
            lease_until: self.lease_until,
            version: self.version,
        })
    }
}

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

/// The store for one database.
pub struct SqlStore<DB: Dialect> {
    pub pool: Pool<DB>,
    /// Connections for the hot single-statement writes (PostgreSQL's create and save),
    /// handed back without the round trip `sqlx::Pool` spends on every release.
    pub lean: Option<LeanPool<DB>>,
    pub sql: Statements,
    /// What a readiness check looks at beyond `SELECT 1` answering (SQLite: its file).
    pub ready_check: Option<Box<dyn Fn() -> Result<()> + Send + Sync>>,
    /// Set by [`SqlStore::start_group_commit`]: writes go through one writer task.
    batch: std::sync::OnceLock<tokio::sync::mpsc::Sender<Job>>,
    /// See [`super::ConnectOptions::max_branches`].
    max_branches: usize,
}

impl<DB: Dialect> SqlStore<DB> {
    pub fn new(pool: Pool<DB>) -> Self {
        SqlStore {
            pool,
            lean: None,
            ready_check: None,
            sql: Statements::new(DB::NUMBERED_PARAMETERS, DB::ON_DUPLICATE_DO_NOTHING),
            batch: std::sync::OnceLock::new(),
            max_branches: super::DEFAULT_MAX_BRANCHES,
        }
    }

    /// Sets how many branches [`Store::register`] lets one transaction hold.
    pub fn max_branches(mut self, max: usize) -> Self {
        self.max_branches = max;
        self
    }
}

/// A write transaction of a create or a save: on a lean connection when the store has a
/// lean pool (no release round trip), else on sqlx's pool.
enum WriteTx<DB: Database> {
    Pooled(sqlx::Transaction<'static, DB>),
    Lean(Leased<DB>),
}

impl<DB: Dialect> WriteTx<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    fn conn(&mut self) -> &mut DB::Connection {
        match self {
            WriteTx::Pooled(tx) => tx,
            WriteTx::Lean(conn) => conn,
        }
    }

    /// Commits (`true`) or rolls back.
    async fn end(self, commit: bool) -> sqlx::Result<()> {
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

impl<DB: Dialect> SqlStore<DB>
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    async fn begin_write(&self) -> sqlx::Result<WriteTx<DB>> {
        match &self.lean {
            Some(lean) => {
                let mut conn = lean.get().await?;
                sqlx::raw_sql(DB::BEGIN_WRITE).execute(&mut *conn).await?;
                Ok(WriteTx::Lean(conn))
            }
            None => Ok(WriteTx::Pooled(DB::begin_write(&self.pool).await?)),
        }
    }
}

fn q<DB: Database>(sql: &Arc<str>) -> sqlx::query::Query<'static, DB, DB::Arguments> {
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
}

/// Error texts and reasons longer than this are cut before they are stored (the API refuses
/// longer client reasons; idem's own can quote a participant's answer).
const MAX_ERROR_LEN: usize = 2_000;

pub(super) fn clip(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(|s| {
        if s.len() <= MAX_ERROR_LEN {
            s
        } else {
            let mut end = MAX_ERROR_LEN;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            &s[..end]
        }
    })
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

// The bounds below say "the generic code can run these statements and decode these rows
// on this database"; every sqlx backend satisfies them.
#[async_trait::async_trait]
impl<DB> Store for SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> GlobalRow: FromRow<'r, DB::Row>,
    for<'r> BranchRow: FromRow<'r, DB::Row>,
    for<'r> AttemptRow: FromRow<'r, DB::Row>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    fn backend(&self) -> &'static str {
        <DB as Dialect>::BACKEND
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
        DB::migrate(&self.pool).await?;
        Ok(())
    }

    async fn create(
        &self,
        tx: &Transaction,
        request_hash: &str,
        lease: Option<&Lease>,
    ) -> Result<Created> {
        if let Some(one) = DB::create_in_one_statement(self, tx, request_hash, lease) {
            return match one.await? {
                true => Ok(Created::Inserted),
                false => self.existing(&tx.gid).await,
            };
        }
        if let Some(queue) = self.batch.get() {
            let (reply, answer) = tokio::sync::oneshot::channel();
            let job = Job::Create {
                tx: Box::new(tx.clone()),
                request_hash: request_hash.to_owned(),
                lease: lease.cloned(),
                reply,
            };
            queue.send(job).await.map_err(|_| closed())?;
            return match answer.await.map_err(|_| closed())?? {
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
        let groups = branch_groups(save.before, save.after);
        if let Some(one) = DB::save_in_one_statement(self, &save, &groups) {
            return one.await;
        }
        if let Some(queue) = self.batch.get() {
            let (reply, answer) = tokio::sync::oneshot::channel();
            queue
                .send(Job::Save {
                    save: Box::new(OwnedSave::of(&save)),
                    reply,
                })
                .await
                .map_err(|_| closed())?;
            return answer.await.map_err(|_| closed())?;
        }
        if groups.is_empty() && save.attempts.is_empty() {
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

    async fn register(&self, gid: &str, branches: &[Branch], now: Millis) -> Result<Registered> {
        let mut db = DB::begin_write(&self.pool).await?;
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
                None => Registered::NotFound,
                Some(stored) => Registered::NotPrepared(stored.tx.status),
            });
        }
        let mut stored = self.load_global(&mut db, gid).await?;
        stored.tx.branches = self.load_branches(&mut db, gid).await?;
        match core::register(&stored.tx, branches.to_vec(), now) {
            Ok(core::Registration::AlreadyRegistered) => {
                db.rollback().await?;
                Ok(Registered::Stored)
            }
            Ok(core::Registration::New(new)) => {
                // Counted under the row lock taken above, after any registration that held
                // it before us committed: two registrations cannot both take the last place.
                let ids: std::collections::HashSet<&str> = stored
                    .tx
                    .branches
                    .iter()
                    .chain(&new)
                    .map(|b| b.branch_id.as_str())
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
            Err(core::CoreError::BranchConflict(key)) => {
                db.rollback().await?;
                Ok(Registered::Conflict(key))
            }
            Err(_) => {
                db.rollback().await?;
                Ok(Registered::NotPrepared(stored.tx.status))
            }
        }
    }

    async fn claim_due(&self, lease: &Lease, now: Millis, limit: u32) -> Result<Vec<StoredTx>> {
        let gids = DB::claim(self, lease, now, limit).await?;
        // A claimed row can only change under our token now, so reading it after the claim
        // is consistent.
        self.load_many(&gids).await
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

    async fn count(&self, statuses: &[Status]) -> Result<u64> {
        let marks = vec!["?"; statuses.len().max(1)].join(", ");
        let sql = self.sql.dynamic(&format!(
            "SELECT count(*) FROM idem_global WHERE status IN ({marks})"
        ));
        let mut query = sqlx::query_scalar::<DB, i64>(sqlx::AssertSqlSafe(sql));
        for s in statuses {
            query = query.bind(s.as_str());
        }
        if statuses.is_empty() {
            query = query.bind("");
        }
        Ok(query.fetch_one(&self.pool).await? as u64)
    }

    async fn db_now(&self) -> Result<Millis> {
        let now = sqlx::query_scalar::<DB, i64>(DB::NOW_MS)
            .fetch_one(&self.pool)
            .await?;
        Ok(now)
    }

    async fn renew(&self, gid: &str, token: &str, until: Millis) -> Result<bool> {
        let done = q::<DB>(&self.sql.renew)
            .bind(until)
            .bind(gid)
            .bind(token)
            .execute(&self.pool)
            .await?;
        Ok(DB::rows_affected(&done) == 1)
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page> {
        let mut sql = format!("SELECT {GLOBAL_COLUMNS} FROM idem_global WHERE 1 = 1");
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
        if filter.after.is_some() {
            sql.push_str(" AND (created_at < ? OR (created_at = ? AND gid < ?))");
        }
        sql.push_str(" ORDER BY created_at DESC, gid DESC LIMIT ?");
        let sql = self.sql.dynamic(&sql);
        let limit = filter.limit.clamp(1, 1_000);
        let mut query = sqlx::query_as::<DB, GlobalRow>(sqlx::AssertSqlSafe(sql));
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

    async fn attempts(&self, gid: &str) -> Result<Vec<AttemptRecord>> {
        let rows: Vec<AttemptRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_attempts.clone()))
                .bind(gid)
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(|r| {
                Ok(AttemptRecord {
                    branch_id: r.branch_id,
                    action: r.action.parse().map_err(corrupt)?,
                    attempt: r.attempt,
                    started_at: r.started_at,
                    duration_ms: r.duration_ms,
                    outcome: r.outcome,
                    detail: r.detail,
                })
            })
            .collect()
    }
}

impl<DB> SqlStore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> GlobalRow: FromRow<'r, DB::Row>,
    for<'r> BranchRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Type<DB>,
{
    /// Loads several transactions with two queries per batch of gids.
    async fn load_many(&self, gids: &[String]) -> Result<Vec<StoredTx>> {
        let mut out = Vec::with_capacity(gids.len());
        for chunk in gids.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let globals = self.sql.dynamic(&format!(
                "SELECT {GLOBAL_COLUMNS} FROM idem_global WHERE gid IN ({marks})"
            ));
            let branches = self.sql.dynamic(&format!(
                "SELECT {BRANCH_COLUMNS} FROM idem_branch WHERE gid IN ({marks})"
            ));
            let mut gq = sqlx::query_as::<DB, GlobalRow>(sqlx::AssertSqlSafe(globals));
            let mut bq = sqlx::query_as::<DB, BranchRow>(sqlx::AssertSqlSafe(branches));
            for gid in chunk {
                gq = gq.bind(gid.as_str());
                bq = bq.bind(gid.as_str());
            }
            let rows = gq.fetch_all(&self.pool).await?;
            let mut by_gid: HashMap<String, Vec<Branch>> = HashMap::new();
            for row in bq.fetch_all(&self.pool).await? {
                let gid = row.gid.clone();
                by_gid.entry(gid).or_default().push(row.into_branch()?);
            }
            for row in rows {
                let mut branches = by_gid.remove(&row.gid).unwrap_or_default();
                core::sort_branches(&mut branches);
                out.push(row.into_stored(branches)?);
            }
        }
        Ok(out)
    }

    async fn load_one(&self, gid: &str) -> Result<Option<StoredTx>> {
        let mut conn = self.pool.acquire().await?;
        let row: Option<GlobalRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_global.clone()))
                .bind(gid)
                .fetch_optional(&mut *conn)
                .await?;
        let Some(row) = row else { return Ok(None) };
        let branches = self.load_branches(&mut conn, gid).await?;
        Ok(Some(row.into_stored(branches)?))
    }

    /// What is stored under a gid that an insert found taken.
    async fn existing(&self, gid: &str) -> Result<Created> {
        match self.load_one(gid).await? {
            Some(existing) => Ok(Created::Exists(Box::new(existing))),
            // Deleted between the insert and this read; report it as taken anyway.
            None => Err(StoreError::Corrupt(format!("gid {gid} vanished"))),
        }
    }

    /// Inserts a new transaction with its branches inside `conn`'s transaction; false if
    /// the gid is taken (nothing written).
    async fn create_in(
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
    async fn save_in(
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
        Ok(Saved::Saved)
    }

    /// Runs queued writes in one transaction: one commit (one fsync) for all of them.
    async fn write_batch(&self, jobs: &[Job]) -> Result<Vec<JobResult>> {
        let mut db = DB::begin_write(&self.pool).await?;
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            results.push(match job {
                Job::Create {
                    tx,
                    request_hash,
                    lease,
                    ..
                } => JobResult::Created(
                    self.create_in(&mut db, tx, request_hash, lease.as_ref())
                        .await?,
                ),
                Job::Save { save, .. } => {
                    let save = save.borrow();
                    let groups = branch_groups(save.before, save.after);
                    JobResult::Saved(self.save_in(&mut db, &save, &groups).await?)
                }
            });
        }
        db.commit().await?;
        Ok(results)
    }

    /// Makes this store group concurrent writes into shared commits, through one writer
    /// task. The task holds the store weakly: it ends when the store is dropped.
    pub fn start_group_commit(self: &Arc<Self>)
    where
        DB: 'static,
    {
        // Bounded: when the disk falls behind, writers wait here (backpressure) instead of
        // queueing without limit in memory.
        let (queue, mut jobs) = tokio::sync::mpsc::channel::<Job>(GROUP_COMMIT_QUEUE);
        if self.batch.set(queue).is_err() {
            return;
        }
        let store = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(first) = jobs.recv().await {
                let mut batch = vec![first];
                while batch.len() < GROUP_COMMIT_MAX {
                    match jobs.try_recv() {
                        Ok(job) => batch.push(job),
                        Err(_) => break,
                    }
                }
                let Some(store) = store.upgrade() else { return };
                match store.write_batch(&batch).await {
                    Ok(results) => {
                        for (job, result) in batch.into_iter().zip(results) {
                            job.answer(Ok(result));
                        }
                    }
                    // One bad write must not fail the others: retry each on its own.
                    Err(_) if batch.len() > 1 => {
                        for job in batch {
                            let result = store.write_batch(std::slice::from_ref(&job)).await;
                            job.answer(result.map(|mut r| r.remove(0)));
                        }
                    }
                    // A batch of one: its own error, so the caller can tell a refused
                    // write from a lost connection.
                    Err(e) => {
                        if let Some(job) = batch.into_iter().next() {
                            job.answer(Err(e));
                        }
                    }
                }
            }
        });
    }

    /// The conditional UPDATE of the global row for a save.
    fn update_global<'s>(
        &'s self,
        save: &'s Save<'s>,
    ) -> sqlx::query::Query<'static, DB, DB::Arguments> {
        let sql = match save.guard {
            Guard::Owner(_) => &self.sql.update_global_owned,
            Guard::Version(_) => &self.sql.update_global_by_version,
        };
        bind_global_update!(q::<DB>(sql), save)
    }

    async fn load_global(&self, conn: &mut DB::Connection, gid: &str) -> Result<StoredTx> {
        let row: GlobalRow = sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_global.clone()))
            .bind(gid)
            .fetch_one(&mut *conn)
            .await?;
        row.into_stored(Vec::new())
    }

    async fn load_branches(&self, conn: &mut DB::Connection, gid: &str) -> Result<Vec<Branch>> {
        let rows: Vec<BranchRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_branches.clone()))
                .bind(gid)
                .fetch_all(&mut *conn)
                .await?;
        let mut branches = rows
            .into_iter()
            .map(BranchRow::into_branch)
            .collect::<Result<Vec<_>>>()?;
        // Sorted here rather than by SQL: collations order branch ids differently.
        core::sort_branches(&mut branches);
        Ok(branches)
    }

    async fn insert_branches(
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

/// Writes per shared commit, at most.
const GROUP_COMMIT_MAX: usize = 128;

/// Writes waiting for the writer task, at most.
const GROUP_COMMIT_QUEUE: usize = 1_024;

fn saved_if(rows: u64) -> Saved {
    if rows == 0 { Saved::Lost } else { Saved::Saved }
}

fn closed() -> StoreError {
    StoreError::Batch("the store's writer has stopped".into())
}

/// A write queued for the group-commit writer, with where to send its result.
pub enum Job {
    Create {
        tx: Box<Transaction>,
        request_hash: String,
        lease: Option<Lease>,
        reply: tokio::sync::oneshot::Sender<Result<bool>>,
    },
    Save {
        save: Box<OwnedSave>,
        reply: tokio::sync::oneshot::Sender<Result<Saved>>,
    },
}

pub enum JobResult {
    Created(bool),
    Saved(Saved),
}

impl Job {
    fn answer(self, result: Result<JobResult>) {
        match self {
            Job::Create { reply, .. } => {
                let _ = reply.send(result.map(|r| matches!(r, JobResult::Created(true))));
            }
            Job::Save { reply, .. } => {
                let _ = reply.send(result.map(|r| match r {
                    JobResult::Saved(s) => s,
                    JobResult::Created(_) => Saved::Lost,
                }));
            }
        }
    }
}

/// A [`Save`] that owns its data, to cross into the writer task.
pub struct OwnedSave {
    before: Transaction,
    after: Transaction,
    owner: Option<String>,
    version: i64,
    lease: Option<Lease>,
    attempts: Vec<AttemptRecord>,
}

impl OwnedSave {
    fn of(save: &Save<'_>) -> OwnedSave {
        let (owner, version) = match save.guard {
            Guard::Owner(token) => (Some(token.to_owned()), 0),
            Guard::Version(v) => (None, v),
        };
        OwnedSave {
            before: save.before.clone(),
            after: save.after.clone(),
            owner,
            version,
            lease: save.lease.cloned(),
            attempts: save.attempts.to_vec(),
        }
    }

    fn borrow(&self) -> Save<'_> {
        Save {
            before: &self.before,
            after: &self.after,
            guard: match &self.owner {
                Some(token) => Guard::Owner(token),
                None => Guard::Version(self.version),
            },
            lease: self.lease.as_ref(),
            attempts: &self.attempts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::translate;

    #[test]
    fn placeholders_are_numbered_outside_strings() {
        assert_eq!(
            translate("a = ? AND b = '?' AND c IN (?, ?)", true),
            "a = $1 AND b = '?' AND c IN ($2, $3)"
        );
        assert_eq!(translate("a = ?", false), "a = ?");
    }
}

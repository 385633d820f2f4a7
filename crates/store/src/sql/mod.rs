//! The store logic shared by every database, written once over sqlx's generic traits.
//!
//! SQL is written with `?` placeholders and rewritten for the database's placeholder style
//! ([`idem_sql::Backend`]) when the store is opened. What differs between databases beyond
//! that is behind [`StoreDatabase`].
//!
//! - `statements.rs`: the SQL texts; `binds.rs`: their bind values, in statement order;
//! - `rows.rs`: the rows as stored, their mapping to the core's types, and the loads;
//! - `writes.rs`: creates, saves and registrations' inserts inside a write transaction;
//! - `group_commit.rs`: concurrent writes queued for one writer task and shared commits;
//! - `overview.rs`: the console's per-tenant overview and the coordinators seen;
//! - `retention.rs`: finished transactions deleted in bounded batches;
//! - `schema.rs`: migrations checked against what a newer binary applied (upgrades and
//!   rollbacks);
//! - `tokens.rs`: the API tokens' rows; `batch_rows.rs`: a batch decomposed into the rows
//!   it writes, table by table, for the per-database batch statements;
//! - `store_impl.rs`: the [`Store`](crate::Store) trait on top of them.

use std::sync::Arc;

use futures::future::BoxFuture;
use idem_sql::{Backend, LeanPool};
use sqlx::{Database, Pool};

use super::{Lease, Result, Saved, TenantScope};
use idem_core::Millis;

pub(super) mod batch_rows;
pub(crate) mod binds;
pub(super) mod group_commit;
mod overview;
mod retention;
mod rows;
pub(crate) mod schema;
mod statements;
mod store_impl;
mod tokens;
mod writes;

pub use group_commit::WriterSettings;
pub use rows::{BranchRow, GlobalRow};
pub use statements::Statements;
pub(super) use statements::{ACTIVE_STATUSES, ATTEMPT_COLUMNS, BRANCH_COLUMNS, GLOBAL_COLUMNS};
pub use writes::{BranchGroup, branch_groups};

/// What a database does its own way.
pub trait StoreDatabase: Database + Sized {
    /// Which database this is: its name, its placeholders, how it begins a write.
    const BACKEND: Backend;
    /// Appended to inserts that may hit an existing key. PostgreSQL and SQLite skip the
    /// row; MySQL has no clause that only ignores duplicate keys without also making the
    /// affected-rows count ambiguous, so it reports the duplicate as an error, which
    /// MySQL (unlike PostgreSQL) does not let abort the transaction.
    const ON_DUPLICATE_DO_NOTHING: &'static str;

    /// Appended to the insert of a coordinator's row: an existing row of the node is
    /// updated instead (its last claim kept when this pass claimed nothing).
    const UPSERT_COORDINATOR: &'static str;

    /// Applies this database's migrations (`migrations/<backend>/`) through
    /// [`schema::migrate`], which checks first that the migrations this binary does not know
    /// let it run.
    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<()>>;

    /// Counts (0 or 1) the tables of the current database named by the one bind value.
    const TABLE_EXISTS: &'static str;

    /// sqlx has no database-neutral accessor for the affected-row count.
    fn rows_affected(result: &Self::QueryResult) -> u64;

    /// Reads the database's clock as epoch milliseconds (one BIGINT column).
    const NOW_MS: &'static str;

    /// Appended to a locking read that should pass over rows another transaction holds
    /// (retention's batches); empty where writers are serialised anyway (SQLite).
    const SKIP_LOCKED: &'static str;

    /// Writes a whole batch of queued creates, saves and lease changes, in one commit, in
    /// this database's own way (PostgreSQL: one statement; SQLite: one statement per table
    /// and kind of write; MySQL: one transaction of `JSON_TABLE` statements). Results in
    /// the order of `works`.
    fn write_batch<'a>(
        store: &'a SqlStore<Self>,
        works: &'a [group_commit::Work],
    ) -> BoxFuture<'a, Result<Vec<group_commit::JobResult>>>;

    /// Claims due rows for `lease`, none of `held` and only of the tenants `tenants`
    /// allows, and returns their gids with the owner token each had.
    fn claim<'a>(
        store: &'a SqlStore<Self>,
        lease: &'a Lease,
        now: Millis,
        limit: u32,
        held: &'a [String],
        tenants: TenantScope<'a>,
    ) -> BoxFuture<'a, sqlx::Result<Vec<ClaimedRow>>>;
}

/// A claimed row's gid and the owner token it had before the claim.
pub type ClaimedRow = (String, Option<String>);

/// The store for one database. Its fields are its own: a backend builds it with
/// [`SqlStore::new`] and the `with_` methods, and reads the pools through accessors.
pub struct SqlStore<DB: StoreDatabase> {
    pool: Pool<DB>,
    /// Connections for the hot single-statement writes (PostgreSQL's create and save),
    /// handed back without the round trip `sqlx::Pool` spends on every release.
    lean: Option<LeanPool<DB>>,
    sql: Statements,
    /// What a readiness check looks at beyond `SELECT 1` answering (SQLite: its file).
    ready_check: Option<ReadyCheck>,
    /// Set by [`SqlStore::start_group_commit`]: writes go through the writer tasks.
    batch: std::sync::OnceLock<group_commit::Queue>,
    /// See [`super::ConnectOptions::max_branches`].
    max_branches: usize,
}

impl<DB: StoreDatabase> SqlStore<DB> {
    pub fn new(pool: Pool<DB>) -> Self {
        SqlStore {
            pool,
            lean: None,
            ready_check: None,
            sql: Statements::new(DB::BACKEND, DB::ON_DUPLICATE_DO_NOTHING),
            batch: std::sync::OnceLock::new(),
            max_branches: super::DEFAULT_MAX_BRANCHES,
        }
    }

    /// Sets how many branches [`super::Store::register`] lets one transaction hold.
    pub fn max_branches(mut self, max: usize) -> Self {
        self.max_branches = max;
        self
    }

    /// Writes go through `lean`'s connections (see the field).
    pub fn with_lean(mut self, lean: LeanPool<DB>) -> Self {
        self.lean = Some(lean);
        self
    }

    /// A readiness check also runs `check` (see the field).
    pub fn with_ready_check(mut self, check: ReadyCheck) -> Self {
        self.ready_check = Some(check);
        self
    }

    /// sqlx's pool: reads, and writes where there is no lean pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The writers' connections, if the backend gave the store any.
    pub fn lean(&self) -> Option<&LeanPool<DB>> {
        self.lean.as_ref()
    }
}

/// What a readiness check runs beyond `SELECT 1`.
pub type ReadyCheck = Box<dyn Fn() -> Result<()> + Send + Sync>;

pub(crate) fn q<DB: Database>(sql: &Arc<str>) -> sqlx::query::Query<'static, DB, DB::Arguments> {
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
}

/// The second half of a claim that read (and on MySQL locked) its rows first: the same
/// rows taken over for `lease`. `rows` is not empty.
pub(crate) fn take_over<'q, DB: Database>(
    lease: &'q Lease,
    rows: &'q [ClaimedRow],
) -> sqlx::query::Query<'q, DB, DB::Arguments>
where
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let update = format!(
        "UPDATE idem_global SET owner_token = ?, lease_until = ?, version = version + 1 \
         WHERE gid IN ({})",
        vec!["?"; rows.len()].join(", ")
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(update))
        .bind(lease.token.as_str())
        .bind(lease.until);
    for (gid, _) in rows {
        query = query.bind(gid.as_str());
    }
    query
}

/// `held` as a JSON array of strings: how SQLite and MySQL take a list of any length as
/// one parameter.
pub(crate) fn json_list(held: &[String]) -> sqlx::Result<String> {
    serde_json::to_string(held).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

pub(crate) fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

fn saved_if(rows: u64) -> Saved {
    if rows == 0 { Saved::Lost } else { Saved::Saved }
}

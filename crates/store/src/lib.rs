//! Durable storage of global transactions and branch operations.
//!
//! One [`Store`] trait, one implementation per database. The logic common to all three
//! lives once in [`sql::SqlStore`], generic over the sqlx database; what really differs
//! (how to claim due rows, writes in one statement, migrations, the clock) lives in one
//! module per database, and the placeholders and the statement that begins a write come
//! from the backend ([`idem_sql::Backend`], shared with the participant SDK).
//!
//! Invariants every implementation keeps:
//! - a branch operation is stored once per (gid, branch_id, action): the primary key;
//! - every save of a global row is a conditional update on its expected status and version
//!   and, for an engine holding a lease, its owner token; zero rows updated means someone
//!   else moved it ([`Saved::Lost`]) and the caller re-reads instead of overwriting; a save
//!   that keeps the owner never shortens the lease;
//! - a lease renewal or release is conditional on the owner token alone (not on the status
//!   or version, which the owner's own saves move); a renewal never shortens the lease;
//! - a row is claimed (taken over after its lease expired) with a conditional update too.
//!
//! Beside the trait: `errors` (which database errors a retry can cure, and their kinds for
//! `idem_store_errors_total`), `pools` (pool limits and the idle check), `bounded` (every
//! call to a server database cut at the call timeout, every failed call counted), `wait`
//! (waiting for the database at start), `sql` (the store written once), and one module per
//! database.

use std::sync::Arc;
use std::time::Duration;

use idem_sql::Backend;

use idem_core::{Access, Branch, BranchKey, Kind, Millis, Status, Transaction};

mod bounded;
mod errors;
pub mod metrics;
mod mysql;
pub mod pools;
mod postgres;
pub mod sql;
mod sqlite;
mod wait;

pub use sqlite::{BackupSummary, backup_sqlite};
pub use wait::{OpenError, open_when_ready};

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The schema holds a migration this binary does not know, applied by a newer binary
    /// that recorded it needs at least `needs` (see `sql/schema.rs`).
    #[error(
        "the database was migrated by idem {applied_by} (migration {version}), which needs idem {needs} or later; this is idem {this}: run idem {needs} or later"
    )]
    SchemaTooNew {
        version: i64,
        applied_by: String,
        needs: String,
        this: String,
    },
    /// The schema holds a migration this binary does not know and nothing says whether
    /// this binary may run on it.
    #[error(
        "the database holds migration {version}, which this idem ({this}) does not know and which records no compatibility: run the idem that applied it, or a later one"
    )]
    SchemaUnknown { version: i64, this: String },
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    #[error("unsupported database URL {0:?}: use sqlite:, postgres:// or mysql://")]
    UnsupportedUrl(String),
    #[error("write failed: {0}")]
    Batch(String),
    /// A registration would take a transaction past [`ConnectOptions::max_branches`];
    /// nothing was stored.
    #[error("the transaction would have {count} branches; the limit is {max}")]
    TooManyBranches { count: usize, max: usize },
    #[error("the database did not answer within {0:?}")]
    TimedOut(Duration),
    /// `idem backup` could not make or check its copy.
    #[error("backup failed: {0}")]
    Backup(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The right to drive a transaction until `until`, identified by a token that is new for
/// every claim. Writes carry the token; once someone else claims the row, they fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub token: String,
    pub until: Millis,
}

/// A transaction as stored, with what the state machine does not see.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTx {
    pub tx: Transaction,
    /// SHA-256 of the canonical request that created it.
    pub request_hash: String,
    pub owner_token: Option<String>,
    pub lease_until: Option<Millis>,
    pub version: i64,
}

/// Result of [`Store::create`].
#[derive(Clone, Debug, PartialEq)]
pub enum Created {
    Inserted,
    /// The gid was taken; here is what is stored under it.
    Exists(Box<StoredTx>),
}

/// Result of [`Store::register`].
#[derive(Clone, Debug, PartialEq)]
pub enum Registered {
    /// The operations are stored (now or by an identical earlier request).
    Stored,
    NotFound,
    /// The transaction is no longer prepared, or its timeout passed.
    NotPrepared(Status),
    /// The same branch operation exists with another URL or payload.
    Conflict(BranchKey),
}

/// Which condition guards a save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard<'a> {
    /// An engine that holds the lease under this token and last wrote (or claimed) the row
    /// at this version: a compare-and-set, so a save of its own that lands late (its call
    /// was cut, the driver moved on) can never match after a newer one did.
    Owner(&'a str, i64),
    /// A client or operator request that read the row at this version: conditional on the
    /// status and the version (so a branch registered in between is not missed), and it
    /// takes the transaction over from whoever held it.
    Version(i64),
}

/// One conditional write of a transaction's new state.
#[derive(Clone, Debug)]
pub struct Save<'a> {
    pub before: &'a Transaction,
    pub after: &'a Transaction,
    pub guard: Guard<'a>,
    /// The owner to record from now on; `None` releases the row (no owner, no lease).
    pub lease: Option<&'a Lease>,
    /// Calls that did not succeed, for the history.
    pub attempts: &'a [AttemptRecord],
}

/// Result of [`Store::save`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Saved {
    Saved,
    /// The row was not in the expected status or is owned by someone else: nothing was
    /// written. Re-read before doing anything else.
    Lost,
}

/// One call to a participant that did not simply succeed (shared with the API's
/// clients, as the history of a transaction's view).
pub use idem_types::AttemptRecord;

/// A row [`Store::claim_due`] took over, with the owner token it had before: another
/// process's token means a takeover (its lease ran out, or it handed the row back).
#[derive(Clone, Debug, PartialEq)]
pub struct Claimed {
    pub stored: StoredTx,
    pub previous_owner: Option<String>,
}

/// Whose due rows a claim may take: how the engine keeps each tenant to its share of the
/// transactions it drives.
#[derive(Clone, Copy, Debug, Default)]
pub struct TenantScope<'a> {
    /// None of these tenants' rows.
    pub skip: &'a [String],
    /// Only this tenant's rows, when given.
    pub only: Option<&'a str>,
}

/// Non-terminal transactions of one status, as [`Store::active_summary`] counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusSummary {
    pub status: Status,
    pub count: u64,
    /// The `created_at` of the oldest of them.
    pub oldest_created_at: Millis,
}

/// Filters for [`Store::list`]. Results come newest first (unless `oldest_first`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListFilter {
    /// Only this tenant's transactions; `None`: every tenant's (the operator's direct view).
    pub tenant: Option<String>,
    /// Only those created through DTM's door without a token (what such a caller may see).
    pub tokenless_only: bool,
    /// Any of these statuses; empty means all.
    pub statuses: Vec<Status>,
    pub kind: Option<Kind>,
    pub created_from: Option<Millis>,
    pub created_to: Option<Millis>,
    /// Continue after this (created_at, gid), as returned in a page's `next`.
    pub after: Option<(Millis, String)>,
    pub limit: u32,
    /// Oldest first instead of newest first (an operator's bulk action takes those that
    /// waited longest).
    pub oldest_first: bool,
}

/// An API token as stored: never its secret, only the secret's SHA-256 (hex).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRecord {
    pub id: String,
    pub tenant: String,
    /// `client`, `operator` or `admin`.
    pub role: String,
    pub secret_hash: String,
    pub label: String,
    pub created_at: Millis,
    pub revoked_at: Option<Millis>,
}

/// Rows removed by one batch of [`Store::purge_finished`], by table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    pub global: u64,
    pub branch: u64,
    pub attempt: u64,
}

impl Purged {
    pub fn add(&mut self, other: Purged) {
        self.global += other.global;
        self.branch += other.branch;
        self.attempt += other.attempt;
    }
}

/// What the console's overview reads of one tenant ([`Store::overview`]); the lists'
/// transactions come without their branches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overview {
    /// Per status that has any: how many.
    pub counts: Vec<(Status, u64)>,
    /// Stalled ones, oldest first.
    pub stalled: Vec<StoredTx>,
    /// Active (not stalled, not terminal) ones, oldest first.
    pub oldest_active: Vec<StoredTx>,
    /// Per minute (its start, epoch ms) with any since the asked time: how many were created.
    pub created: Vec<(Millis, u64)>,
    /// Likewise: how many finished.
    pub finished: Vec<(Millis, u64)>,
}

/// A coordinator's row of `idem_coordinator`, written by its recovery loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorSeen {
    pub node: String,
    pub last_seen_at: Millis,
    /// When a pass of its recovery loop last claimed transactions.
    pub last_claim_at: Option<Millis>,
}

/// The longest node name `idem_coordinator` keeps; a longer one is cut.
pub const MAX_NODE_LEN: usize = 64;

/// A page of transactions, without their branches.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    pub items: Vec<StoredTx>,
    pub next: Option<(Millis, String)>,
}

#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// `sqlite`, `postgres` or `mysql`.
    fn backend(&self) -> &'static str;

    /// Checks that the database answers (`SELECT 1`; SQLite: and that its file is still
    /// there), within `timeout`.
    async fn ping(&self, timeout: Duration) -> Result<()>;

    /// Applies the schema migrations. Safe to run again and from several processes.
    async fn migrate(&self) -> Result<()>;

    /// Inserts a new transaction with its branches, unless the gid exists.
    async fn create(
        &self,
        tx: &Transaction,
        request_hash: &str,
        lease: Option<&Lease>,
    ) -> Result<Created>;

    async fn load(&self, gid: &str) -> Result<Option<StoredTx>>;

    /// Adds TCC branch operations, atomically with the check that the transaction is
    /// still prepared (a submit that commits first wins; a registration after it fails)
    /// and that `access` admits it ([`Registered::NotFound`] otherwise).
    async fn register(
        &self,
        gid: &str,
        branches: &[Branch],
        now: Millis,
        access: Access,
    ) -> Result<Registered>;

    /// Writes a new state, conditionally (see [`Guard`]).
    async fn save(&self, save: Save<'_>) -> Result<Saved>;

    /// Claims up to `limit` unfinished transactions that are due and whose lease expired
    /// (or that have no owner), but none of `held` (the caller's own live drivers, whose
    /// leases may have lapsed while the database stalled: a second driver beside them
    /// would send again what they already did), and returns them. Several coordinators can
    /// call this at once: each row goes to one of them.
    async fn claim_due(
        &self,
        lease: &Lease,
        now: Millis,
        limit: u32,
        held: &[String],
    ) -> Result<Vec<Claimed>> {
        self.claim_due_of(lease, now, limit, held, TenantScope::default())
            .await
    }

    /// [`Store::claim_due`] of some tenants' rows only (see [`TenantScope`]).
    async fn claim_due_of(
        &self,
        lease: &Lease,
        now: Millis,
        limit: u32,
        held: &[String],
        tenants: TenantScope<'_>,
    ) -> Result<Vec<Claimed>>;

    /// Extends a lease to `until`; false if the token no longer owns the row. Never
    /// shortens it: a renewal that lands after a later one leaves the later one standing.
    async fn renew(&self, gid: &str, token: &str, until: Millis) -> Result<bool>;

    /// Ends a lease at `now` (the token stays, so the owner's own recovery loop can tell a
    /// row it handed back from a takeover); false if the token no longer owns the row.
    async fn release(&self, gid: &str, token: &str, now: Millis) -> Result<bool>;

    async fn list(&self, filter: &ListFilter) -> Result<Page>;

    /// A page of one transaction's kept history: at most `limit` records numbered above
    /// `after`, by number (oldest first).
    async fn attempts(&self, gid: &str, after: i64, limit: u32) -> Result<Vec<AttemptRecord>>;

    /// Lets the leases of a dead process of this node lapse now: a coordinator restarted
    /// under the same node name resumes its transactions at once instead of after the
    /// lease. Only one process may run under a node name at a time (the default name, host
    /// and port, ensures it). Returns how many transactions were released.
    async fn release_node(&self, token_prefix: &str) -> Result<u64>;

    /// How many transactions are in any of these statuses (of one tenant, if given).
    async fn count(&self, tenant: Option<&str>, statuses: &[Status]) -> Result<u64>;

    /// Stores a new API token; false when a token with its id exists.
    async fn insert_token(&self, token: &TokenRecord) -> Result<bool>;

    /// Every token, revoked ones included (the authentication cache's refresh).
    async fn tokens(&self) -> Result<Vec<TokenRecord>>;

    /// Revokes a token; false when no live token has that id.
    async fn revoke_token(&self, id: &str, now: Millis) -> Result<bool>;

    /// Per non-terminal status (stalled included) that has any: how many, and the oldest's
    /// creation time. One grouped read of the status index, for the metrics' sampler.
    async fn active_summary(&self) -> Result<Vec<StatusSummary>>;

    /// One tenant's counts by status, its `limit` oldest stalled and oldest active
    /// transactions, and its creations and finishes per minute from `since` on.
    async fn overview(&self, tenant: &str, since: Millis, limit: u32) -> Result<Overview>;

    /// Records that `node`'s recovery loop ran at `now` (and claimed something then, if
    /// `claimed_at` is given): an upsert of its row. Rows unseen for a week go.
    async fn coordinator_seen(
        &self,
        node: &str,
        now: Millis,
        claimed_at: Option<Millis>,
    ) -> Result<()>;

    /// The coordinators seen at or after `since`, by node name.
    async fn coordinators(&self, since: Millis) -> Result<Vec<CoordinatorSeen>>;

    /// The database's clock, in milliseconds since the epoch: the one time every
    /// coordinator sharing the database agrees on (see `engine::SyncedClock`).
    async fn db_now(&self) -> Result<Millis>;

    /// Retention, one batch in its own short database transaction: deletes up to `limit`
    /// terminal transactions (succeeded or failed) that finished before `finished_before`,
    /// with their branch and attempt rows. The delete itself re-checks status and age, and
    /// children go only for gids whose global row is gone, so a transaction that is not
    /// terminal is never touched, whatever races it. Several coordinators may run it at
    /// once: they lock different rows where the database can skip locked ones, and a row
    /// deleted twice is deleted once.
    async fn purge_finished(&self, finished_before: Millis, limit: u32) -> Result<Purged>;
}

/// How to open a store.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// Connections to a server database.
    pub max_connections: u32,
    /// SQLite: `synchronous=FULL` (fsync at every commit). Off, commits survive a crash
    /// of idem but not of the machine.
    pub sqlite_full_sync: bool,
    /// Branches one TCC transaction may hold (branch ids, however many operations each
    /// has). [`Store::register`] counts under the transaction's row lock, so concurrent
    /// registrations cannot pass it together. The API refuses longer sagas and msgs before
    /// they reach the store.
    pub max_branches: usize,
    /// Server databases: opening one connection (TCP, TLS, authentication) at start and
    /// in the lean pool, and the ping of an idle connection.
    pub connect_timeout: Duration,
    /// Server databases: waiting for a pooled connection, opening one included (sqlx's
    /// pool retries a refused connection within it).
    pub acquire_timeout: Duration,
    /// Server databases: one store call as a whole, statements on an open connection
    /// included: what bounds a partition (see `bounded.rs`).
    pub call_timeout: Duration,
    /// Server databases: a pooled connection idle longer than this is pinged before use.
    pub check_idle_after: Duration,
    /// Server databases: a pooled connection idle longer than this is closed.
    pub idle_timeout: Duration,
    /// Server databases: a connection older than this is closed when it is next released.
    pub max_lifetime: Duration,
}

/// Branches or steps per transaction unless the operator says otherwise (`--max-branches`).
pub const DEFAULT_MAX_BRANCHES: usize = 100;

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            max_connections: 16,
            sqlite_full_sync: true,
            max_branches: DEFAULT_MAX_BRANCHES,
            connect_timeout: Duration::from_secs(5),
            acquire_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            check_idle_after: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(10 * 60),
            max_lifetime: Duration::from_secs(30 * 60),
        }
    }
}

/// Opens the store the URL names: `sqlite:path`, `postgres://...` or `mysql://...`
/// (MariaDB too). Does not migrate.
pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Store>> {
    let max = options.max_branches.max(1);
    match Backend::from_url(url) {
        Some(Backend::Sqlite) => {
            // SQLite has one writer at a time: concurrent transactions share commits.
            let store = Arc::new(sqlite::connect(url, options).await?.max_branches(max));
            store.start_group_commit(sql::WriterSettings {
                writers: 1,
                timeout: None,
            });
            Ok(Arc::new(bounded::Bounded::uncut(store)))
        }
        Some(Backend::Postgres) => {
            let suspicion = pools::Suspicion::default();
            let store = postgres::connect(url, options, &suspicion)
                .await?
                .max_branches(max);
            let store = Arc::new(store);
            store.start_group_commit(server_writers(options));
            Ok(bounded(store, options, suspicion))
        }
        Some(Backend::Mysql) => {
            let suspicion = pools::Suspicion::default();
            let store = mysql::connect(url, options, &suspicion)
                .await?
                .max_branches(max);
            let store = Arc::new(store);
            store.start_group_commit(server_writers(options));
            Ok(bounded(store, options, suspicion))
        }
        None => Err(StoreError::UnsupportedUrl(url.to_owned())),
    }
}

/// Opens the store of a database that exists already; never creates one (an SQLite file
/// that is not there is an error) and does not migrate. For the operator's commands.
pub async fn connect_existing(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Store>> {
    if Backend::from_url(url) == Some(Backend::Sqlite) {
        let store = Arc::new(sqlite::connect_existing(url, options).await?);
        store.start_group_commit(sql::WriterSettings {
            writers: 1,
            timeout: None,
        });
        Ok(store)
    } else {
        // Connecting to a server never creates its database.
        connect(url, options).await
    }
}

/// Writer tasks of a server database's store: while one writes its batch, the next
/// gathers behind the other. Measured (`empty`, 32 clients): one writer made MariaDB wait
/// on its statements one batch at a time (1,057 sagas/s), four made batches of one or two
/// writes (1,372/s, 0.42 ms CPU); two gave 1,454/s at 0.36 ms, and PostgreSQL the same
/// with any of the three.
const SERVER_WRITERS: usize = 2;

/// How a server database's creates and saves are written: in batches by
/// [`SERVER_WRITERS`] writers, each batch bounded by the call timeout.
fn server_writers(options: &ConnectOptions) -> sql::WriterSettings {
    sql::WriterSettings {
        writers: SERVER_WRITERS,
        timeout: Some(options.call_timeout),
    }
}

/// A server database's store with its calls bounded, and its lean pool told of trouble.
fn bounded<DB: sql::StoreDatabase>(
    store: Arc<sql::SqlStore<DB>>,
    options: &ConnectOptions,
    suspicion: pools::Suspicion,
) -> Arc<dyn Store>
where
    sql::SqlStore<DB>: Store,
{
    if let Some(lean) = store.lean().cloned() {
        suspicion.also(move || lean.check_idle());
    }
    Arc::new(bounded::Bounded::new(
        store,
        options.call_timeout,
        suspicion,
    ))
}

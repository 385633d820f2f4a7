//! SQLite, the embedded default: WAL, `BEGIN IMMEDIATE` for writes, `synchronous=FULL`
//! unless `--sqlite-full-sync=false`, `temp_store=memory`, a 10 s busy timeout. Its one
//! writer has a connection of its own and writes a batch as one multi-statement call (in
//! `batch`). SQLite has no network, so its calls are not cut at the call timeout; its lock
//! waits end at the busy timeout.

mod backup;
mod batch;

pub use backup::{BackupSummary, backup_sqlite};

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use idem_sql::Backend;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult,
    SqliteSynchronous,
};
use sqlx::{Pool, Sqlite};

use super::sql::group_commit::{JobResult, Work};
use super::sql::{ACTIVE_STATUSES, ClaimedRow, SqlStore, StoreDatabase, json_list, take_over};
use super::{ConnectOptions, Lease, Result, TenantScope};
use idem_core::Millis;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

impl StoreDatabase for Sqlite {
    const BACKEND: Backend = Backend::Sqlite;
    // SQLite runs in this process: its clock is the host's, shared by every process that
    // can open the same file.
    const NOW_MS: &'static str =
        "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    // BEGIN IMMEDIATE already holds every other writer off.
    const SKIP_LOCKED: &'static str = "";
    const ON_DUPLICATE_DO_NOTHING: &'static str = " ON CONFLICT DO NOTHING";
    const UPSERT_COORDINATOR: &'static str = " ON CONFLICT (node) DO UPDATE SET \
         last_seen_at = excluded.last_seen_at, \
         last_claim_at = COALESCE(excluded.last_claim_at, idem_coordinator.last_claim_at)";

    fn migrate(pool: &Pool<Self>) -> BoxFuture<'_, Result<()>> {
        crate::sql::schema::migrate(pool, &MIGRATOR).boxed()
    }

    const TABLE_EXISTS: &'static str =
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?";

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
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
            // RETURNING shows only the new row, so the old owners are read first, in the
            // same write transaction (BEGIN IMMEDIATE: nobody writes in between).
            let select = format!(
                "SELECT gid, owner_token FROM idem_global \
                 WHERE status IN {ACTIVE_STATUSES} AND next_attempt_at <= ? \
                   AND (lease_until IS NULL OR lease_until < ?) \
                   AND gid NOT IN (SELECT value FROM json_each(?)) \
                   AND tenant NOT IN (SELECT value FROM json_each(?)) \
                   AND (? IS NULL OR tenant = ?) \
                 ORDER BY next_attempt_at LIMIT ?"
            );
            let mut db = Self::BACKEND.begin(store.pool()).await?;
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
            if !rows.is_empty() {
                take_over::<Sqlite>(lease, &rows).execute(&mut *db).await?;
            }
            db.commit().await?;
            Ok(rows)
        }
        .boxed()
    }
}

pub async fn connect(url: &str, options: &ConnectOptions) -> Result<SqlStore<Sqlite>> {
    open(url, options, true).await
}

/// Opens a database file that must exist already, for the operator's commands: a
/// mistyped path or the wrong working directory must be an error, not a new empty
/// database. Its journal mode stays as the coordinator set it.
pub async fn connect_existing(url: &str, options: &ConnectOptions) -> Result<SqlStore<Sqlite>> {
    open(url, options, false).await
}

async fn open(url: &str, options: &ConnectOptions, create: bool) -> Result<SqlStore<Sqlite>> {
    // `create_if_missing` overrides the URL's `mode=rwc`, so the caller's choice holds.
    let mut connect = SqliteConnectOptions::from_str(url)?
        .create_if_missing(create)
        .synchronous(if options.sqlite_full_sync {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        })
        .busy_timeout(Duration::from_secs(10))
        // A batch's `UPDATE ... FROM` materialises its rows in a temporary table, which
        // SQLite otherwise backs with a file made and unlinked for each batch.
        .pragma("temp_store", "memory");
    if create {
        connect = connect.journal_mode(SqliteJournalMode::Wal);
    }
    let pool = SqlitePoolOptions::new()
        .test_before_acquire(false)
        .max_connections(options.max_connections.clamp(1, 8))
        .connect_with(connect.clone())
        .await?;
    // The file exists now. A connection opened later must not create it again: removed
    // while idem runs, it would come back empty, without the schema, beside connections
    // still writing to the removed one.
    let connect = connect.create_if_missing(false);
    pool.set_connect_options(connect.clone());
    // The writer's own connection: SQLite has one writer at a time anyway, and on one
    // connection its page cache stays warm (spread over the pool's, every batch found the
    // pages it changed last time in another connection's cache and read them again).
    let mut store = SqlStore::new(pool).with_lean(
        idem_sql::LeanPool::with_options(
            connect,
            idem_sql::LeanPoolOptions {
                max_connections: 1,
                max_lifetime: None,
                ..idem_sql::LeanPoolOptions::default()
            },
        )
        .after_connect(std::sync::Arc::new(|conn: &mut sqlx::SqliteConnection| {
            async move {
                sqlx::Executor::execute(conn, batch::CREATE_WRITTEN).await?;
                Ok(())
            }
            .boxed()
        })),
    );
    if let Some(file) = main_file(store.pool()).await? {
        let opened = FileId::of(&file)?;
        store = store.with_ready_check(Box::new(move || opened.still_at(&file)));
    }
    Ok(store)
}

/// The main database file as SQLite resolved it; `None` in memory.
async fn main_file(pool: &Pool<Sqlite>) -> Result<Option<PathBuf>> {
    let files: Vec<(i64, String, String)> = sqlx::query_as("PRAGMA database_list")
        .fetch_all(pool)
        .await?;
    Ok(files
        .into_iter()
        .find(|(_, name, file)| name == "main" && !file.is_empty())
        .map(|(_, _, file)| PathBuf::from(file)))
}

/// Which file a path named when the store opened it.
struct FileId {
    #[cfg(unix)]
    dev_ino: (u64, u64),
}

impl FileId {
    fn of(path: &Path) -> Result<FileId> {
        let meta = std::fs::metadata(path).map_err(sqlx::Error::Io)?;
        #[cfg(not(unix))]
        let _ = meta;
        Ok(FileId {
            #[cfg(unix)]
            dev_ino: {
                use std::os::unix::fs::MetadataExt;
                (meta.dev(), meta.ino())
            },
        })
    }

    /// Removed, moved or replaced while open, the file idem writes to is not the one the
    /// next start will open: commits would still succeed, and be lost. Not ready, then.
    fn still_at(&self, path: &Path) -> Result<()> {
        let gone = |what: &str| {
            let e = std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the SQLite database file {} {what}", path.display()),
            );
            super::StoreError::Database(sqlx::Error::Io(e))
        };
        let now = FileId::of(path).map_err(|_| gone("is gone"))?;
        #[cfg(unix)]
        if now.dev_ino != self.dev_ino {
            return Err(gone("was replaced by another file"));
        }
        #[cfg(not(unix))]
        let _ = now;
        Ok(())
    }
}

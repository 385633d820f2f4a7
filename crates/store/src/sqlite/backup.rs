//! An online copy of an SQLite database: `VACUUM INTO` reads one consistent snapshot in a
//! read transaction, so coordinators keep writing while it runs, and the copy holds every
//! transaction committed before the snapshot and nothing after it. Copying the file instead
//! is not a backup: a live WAL database is the file plus its `-wal`, which a file copy does
//! not capture consistently.

use std::path::Path;
use std::str::FromStr;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _};

use crate::{Result, StoreError};

/// What a backup holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupSummary {
    /// Transactions in the copy.
    pub transactions: i64,
    /// Of them, not finished (driven again after a restore).
    pub unfinished: i64,
    /// The newest migration applied to the copied schema.
    pub schema_version: i64,
}

/// Copies the SQLite database at `database_url` to the new file `to` while it may be in
/// use, then checks the copy (`PRAGMA integrity_check`) and reads what it holds. Refuses
/// to overwrite an existing file.
pub async fn backup_sqlite(database_url: &str, to: &Path) -> Result<BackupSummary> {
    if to.exists() {
        return Err(StoreError::Backup(format!(
            "{} exists: a backup goes to a new file",
            to.display()
        )));
    }
    let target = to
        .to_str()
        .ok_or_else(|| StoreError::Backup(format!("{} is not UTF-8", to.display())))?;
    let source = SqliteConnectOptions::from_str(database_url)?
        .create_if_missing(false)
        .read_only(true);
    let mut conn = source.connect().await?;
    sqlx::query("VACUUM INTO ?")
        .bind(target)
        .execute(&mut conn)
        .await?;
    conn.close().await?;

    let copy = SqliteConnectOptions::new().filename(to).read_only(true);
    let mut conn = copy.connect().await?;
    let check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&mut conn)
        .await?;
    if check != "ok" {
        return Err(StoreError::Backup(format!(
            "the copy failed its integrity check: {check}"
        )));
    }
    let (transactions, unfinished): (i64, i64) = sqlx::query_as(
        "SELECT count(*), coalesce(sum(CASE WHEN status IN ('succeeded', 'failed') \
         THEN 0 ELSE 1 END), 0) FROM idem_global",
    )
    .fetch_one(&mut conn)
    .await?;
    let schema_version: i64 =
        sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM _sqlx_migrations")
            .fetch_one(&mut conn)
            .await?;
    conn.close().await?;
    Ok(BackupSummary {
        transactions,
        unfinished,
        schema_version,
    })
}

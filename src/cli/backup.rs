//! `idem backup`: a consistent online copy of the SQLite database, made while coordinators
//! run. PostgreSQL and MariaDB have their own tools for that (`pg_dump`, `mariadb-dump
//! --single-transaction --hex-blob`); docs/operations.md#backup-and-restore says how, and what a
//! restore does to transactions in flight.

use std::path::PathBuf;

use clap::Args;

use super::{BoxError, DatabaseArgs, redact};
use crate::store::backup_sqlite;
use idem_sql::Backend;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The `idem serve` configuration file: its `database_url` is the database copied (a
    /// flag or IDEM_DATABASE_URL overrides it).
    #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// The new file the copy goes to (an existing file is not overwritten).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
}

pub async fn run(args: BackupArgs) -> Result<(), BoxError> {
    let url = &args.db.database_url;
    match Backend::from_url(url) {
        Some(Backend::Sqlite) => {}
        Some(Backend::Postgres) => {
            return Err(format!(
                "idem backup copies SQLite databases; for PostgreSQL use \
                 `pg_dump --format=custom` (see docs/operations.md#backup-and-restore): {}",
                redact(url)
            )
            .into());
        }
        Some(Backend::Mysql) => {
            return Err(format!(
                "idem backup copies SQLite databases; for MariaDB and MySQL use \
                 `mariadb-dump --single-transaction --hex-blob` (see docs/operations.md#backup-and-restore): {}",
                redact(url)
            )
            .into());
        }
        None => return Err(format!("unsupported database URL {}", redact(url)).into()),
    }
    let summary = backup_sqlite(url, &args.to).await?;
    println!(
        "backed up {} to {}: {} transactions ({} unfinished), schema {}",
        redact(url),
        args.to.display(),
        summary.transactions,
        summary.unfinished,
        summary.schema_version
    );
    Ok(())
}

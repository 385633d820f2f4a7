//! The `idem` command line: one module per command group.
//!
//! `serve` runs the coordinator, `config` prints the settings it would run with; `tx` is
//! the operator's tool, which talks to a running coordinator over its HTTP API (or, asked
//! explicitly, to the database). `migrate` applies the schema, `backup` copies an SQLite
//! database while it is in use; `token` issues and revokes
//! API tokens and `signing` makes signing keys, both on their own (no coordinator);
//! `logging` sets up the log once the configuration is read. The test tools (replay,
//! chaos, bench) are in the lab crate's `idem-lab` binary.

use clap::{Args, Parser, Subcommand};

use crate::server;
use crate::store::ConnectOptions;

pub mod backup;
pub mod config;
pub mod logging;
pub mod serve;
pub mod signing;
pub mod token;
pub mod tx;

pub use config::{LoadError, Loaded};
pub use logging::{LogArgs, LogFormat, init_logging, report_fatal};
pub use serve::ServeArgs;
pub use tx::{TargetArgs, TxCommand};

/// What `idem --version` prints after the name: the version and the commit it was built
/// from (`build.rs`).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("IDEM_COMMIT"), ")");

/// The SQLite file used when no database is named: in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db?mode=rwc";

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version = VERSION,
    about = "A TCC/Saga branch-transaction coordinator"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// sqlite:PATH, postgres://... or mysql://... (MariaDB too).
    #[arg(
        long,
        env = "IDEM_DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        hide_env_values = true
    )]
    pub database_url: String,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The `idem serve` configuration file: its `database_url` is the database migrated
    /// (a flag or IDEM_DATABASE_URL overrides it).
    #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
    pub config: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub db: DatabaseArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the coordinator (migrates the database first).
    Serve(ServeArgs),
    /// Print the configuration `serve` would run with, given the same flags, environment
    /// and --config file: each setting with where it came from, secrets redacted.
    Config(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(MigrateArgs),
    /// Copy the SQLite database to a new file while coordinators run (PostgreSQL and
    /// MariaDB: their own dump tools, see docs/operations.md).
    Backup(backup::BackupArgs),
    /// Inspect and operate on transactions, through a running coordinator's API (or, with
    /// --database-url, on its database).
    #[command(subcommand)]
    Tx(TxCommand),
    /// Issue, list and revoke API tokens (`idem serve --auth tokens`), on the database.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Make signing keys for branch calls, and the key file participants verify with.
    #[command(subcommand)]
    Signing(signing::SigningCommand),
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Cli {
    /// Parses `argv`, with the values of a `--config` file under the flags and their
    /// environment variables, and checks that `serve`'s settings agree.
    pub fn load(
        argv: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
    ) -> Result<Loaded<Cli>, LoadError> {
        let loaded: Loaded<Cli> = config::load(argv)?;
        // `config` prints what `serve` would run with: it refuses what `serve` refuses.
        if let Command::Serve(args) | Command::Config(args) = &loaded.cli.command {
            args.check().map_err(LoadError::Settings)?;
        }
        Ok(loaded)
    }

    /// How this command logs: the server as configured; the operator's commands only
    /// what goes wrong.
    pub fn logging(&self) -> (LogFormat, &str) {
        match &self.command {
            Command::Serve(args) => (args.log.log_format, &args.log.log_level),
            _ => (LogFormat::Text, "warn"),
        }
    }
}

pub async fn run(loaded: Loaded<Cli>) -> Result<(), BoxError> {
    if let Command::Config(_) = &loaded.cli.command {
        print!("{}", config::render(&loaded));
        if let Some(directives) = logging::rust_log() {
            println!("# RUST_LOG={directives} is set: it overrides log_level");
        }
        return Ok(());
    }
    if let (Command::Serve(_), Some(file)) = (&loaded.cli.command, &loaded.file) {
        tracing::info!(file = %file.path.display(), keys = file.keys.len(), "configuration file read");
    }
    match loaded.cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Config(_) => Ok(()),
        Command::Migrate(MigrateArgs { db, .. }) => {
            server::open_store(&db.database_url, &ConnectOptions::default()).await?;
            println!("migrated {}", redact(&db.database_url));
            Ok(())
        }
        Command::Backup(args) => backup::run(args).await,
        Command::Tx(cmd) => tx::run(cmd).await,
        Command::Token(cmd) => token::run(cmd).await,
        Command::Signing(cmd) => signing::run(cmd),
    }
}

/// Hides the secrets of a database URL before printing it: the password of its userinfo,
/// and the value of every query parameter whose name says it is one
/// (`?password=`, `sslpassword=`, a token or a secret).
pub fn redact(url: &str) -> String {
    let Ok(mut u) = reqwest::Url::parse(url) else {
        return url.to_owned();
    };
    let mut changed = false;
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
        changed = true;
    }
    let secret = |name: &str| {
        let name = name.to_ascii_lowercase();
        ["password", "passwd", "pwd", "secret", "token"]
            .iter()
            .any(|word| name.contains(word))
    };
    if u.query_pairs().any(|(name, _)| secret(&name)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) { "***".into() } else { value };
                (name.into_owned(), value.into_owned())
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
        changed = true;
    }
    if changed {
        u.to_string()
    } else {
        url.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("sqlite://idem.db"), "sqlite://idem.db");
        assert_eq!(
            redact("postgres://u@h/db?sslmode=disable&password=secret"),
            "postgres://u@h/db?sslmode=disable&password=***"
        );
        assert_eq!(
            redact("mysql://u:a@h/db?sslPassword=b&ssl-mode=REQUIRED"),
            "mysql://u:***@h/db?sslPassword=***&ssl-mode=REQUIRED"
        );
        assert_eq!(
            redact("postgres://h/db?sslmode=disable"),
            "postgres://h/db?sslmode=disable"
        );
    }

    #[test]
    fn cli_parses() {
        Cli::parse_from(["idem", "serve", "--listen", "0.0.0.0:9000"]);
        Cli::parse_from(["idem", "tx", "list", "--status", "stalled"]);
        Cli::parse_from(["idem", "tx", "force-stop", "g1", "--reason", "x"]);
    }
}

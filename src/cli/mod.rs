//! The `idem` command line: one module per command group.
//!
//! `serve` runs the coordinator; `tx` is the operator's tool, which talks to a running
//! coordinator over its HTTP API (or, asked explicitly, to the database). The test tools
//! (replay, chaos, bench) are in the lab crate's `idem-lab` binary.

use clap::{Args, Parser, Subcommand};

use crate::server;
use crate::store::ConnectOptions;

pub mod serve;
pub mod tx;

pub use serve::ServeArgs;
pub use tx::{TargetArgs, TxCommand};

/// The SQLite file used when no database is named: in the working directory.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://idem.db?mode=rwc";

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "A TCC/Saga branch-transaction coordinator"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone)]
pub struct DatabaseArgs {
    /// sqlite:PATH, postgres://... or mysql://... (MariaDB too).
    #[arg(long, env = "IDEM_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the coordinator (migrates the database first).
    Serve(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Inspect and operate on transactions, through a running coordinator's API (or, with
    /// --database-url, on its database).
    #[command(subcommand)]
    Tx(TxCommand),
}

/// Logs to stderr at `default` (or `RUST_LOG`), and counts SQL statements for `/metrics`
/// when `IDEM_COUNT_SQL=1` (the benchmark's counting pass); spans go to `otlp` too when
/// it runs (`--otlp-endpoint`). Both binaries start this way.
pub fn init_logging(default: &str, otlp: Option<&crate::telemetry::Otlp>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)));
    crate::metrics::set_sql_counting(std::env::var("IDEM_COUNT_SQL").is_ok_and(|v| v == "1"));
    let counting = crate::metrics::SqlCountingLayer.with_filter(crate::metrics::counting_filter());
    tracing_subscriber::registry()
        .with(log)
        .with(counting)
        .with(otlp.map(|o| o.layer()))
        .init();
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Migrate(db) => {
            server::open_store(&db.database_url, &ConnectOptions::default()).await?;
            println!("migrated {}", redact(&db.database_url));
            Ok(())
        }
        Command::Tx(cmd) => tx::run(cmd).await,
    }
}

/// Hides a password in a database URL before printing it.
pub fn redact(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("sqlite://idem.db"), "sqlite://idem.db");
    }

    #[test]
    fn cli_parses() {
        Cli::parse_from(["idem", "serve", "--listen", "0.0.0.0:9000"]);
        Cli::parse_from(["idem", "tx", "list", "--status", "stalled"]);
        Cli::parse_from(["idem", "tx", "force-stop", "g1", "--reason", "x"]);
    }
}

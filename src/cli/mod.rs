//! The `idem` command line: one module per command group.
//!
//! `serve` runs the coordinator; `tx` is the operator's tool, which talks to a running
//! coordinator over its HTTP API (or, asked explicitly, to the database); `replay`,
//! `chaos` and `bench` are the test tools.

use clap::{Args, Parser, Subcommand};

use crate::faults::FaultPlan;
use crate::server;
use crate::store::ConnectOptions;

mod bench;
mod chaos;
mod replay;
mod serve;
pub mod tx;

pub use bench::BenchArgs;
pub use chaos::ChaosArgs;
pub use replay::ReplayArgs;
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
    /// Run a failure scenario file (or re-run a recorded run and compare) against the
    /// example participants on embedded SQLite, and print its timeline.
    Replay(ReplayArgs),
    /// A chaos run: many orders, random faults, coordinators killed with SIGKILL; checks
    /// the invariants at the end.
    Chaos(ChaosArgs),
    /// Load test: C clients run global transactions end to end against an `idem serve`
    /// process and the example participants; prints throughput, latency, SQL per
    /// transaction and the coordinator's peak RSS.
    Bench(BenchArgs),
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Migrate(db) => {
            server::open_store(&db.database_url, &ConnectOptions::default()).await?;
            println!("migrated {}", redact(&db.database_url));
            Ok(())
        }
        Command::Tx(cmd) => tx::run(cmd).await,
        Command::Replay(args) => replay::replay(args).await,
        Command::Chaos(args) => chaos::chaos(args).await,
        Command::Bench(args) => bench::bench(args).await,
    }
}

/// Reads a fault plan file: TOML if it ends in `.toml`, JSON otherwise.
pub fn read_plan(path: &std::path::Path) -> Result<FaultPlan, BoxError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let toml = path.extension().is_some_and(|e| e == "toml");
    FaultPlan::parse(&text, toml)
        .map_err(|e| format!("invalid fault plan {}: {e}", path.display()).into())
}

/// Hides a password in a database URL before printing it.
fn redact(url: &str) -> String {
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

//! The `idem-lab` command line: `serve` (the coordinator, with fault plans and timelines),
//! `replay`, `chaos` and `bench`.

use clap::{Parser, Subcommand};

use crate::faults::FaultPlan;

mod bench;
mod chaos;
mod replay;
mod serve;

pub use bench::BenchArgs;
pub use chaos::ChaosArgs;
pub use replay::ReplayArgs;
pub use serve::LabServeArgs;

pub type BoxError = idem::cli::BoxError;

#[derive(Debug, Parser)]
#[command(
    name = "idem-lab",
    version,
    about = "Failure replay, chaos runs and the benchmark for idem"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// `idem serve`, plus a fault plan injected into participant calls and crash points,
    /// and a timeline of the run. Boxed: `idem serve`'s options outweigh the other
    /// commands' many times over.
    Serve(Box<LabServeArgs>),
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

pub async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.command {
        Command::Serve(args) => serve::serve(*args).await,
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

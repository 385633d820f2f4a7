//! `idem-lab replay`: a scenario file, or a recorded run re-run and compared.

use clap::Args;

use super::BoxError;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A scenario (JSON or TOML, see lab/tests/scenarios/) or a recording made with --record.
    pub file: std::path::PathBuf,
    /// Write the run (scenario, faults, timeline, final state) here, for a later replay.
    #[arg(long)]
    pub record: Option<std::path::PathBuf>,
}

pub(super) async fn replay(args: ReplayArgs) -> Result<(), BoxError> {
    use crate::scenario::{self, Recording, RunConfig, Scenario};
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| format!("cannot read {}: {e}", args.file.display()))?;
    let recording: Option<Recording> = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .filter(|v| v.get("timeline").is_some() && v.get("scenario").is_some())
        .map(serde_json::from_value)
        .transpose()?;
    let scenario = match &recording {
        Some(r) => r.scenario.clone(),
        None => Scenario::read(&args.file)?,
    };
    let work_dir = std::env::temp_dir().join(format!("idem-replay-{}", std::process::id()));
    let config = RunConfig::sqlite(std::env::current_exe()?, work_dir.clone());
    println!("scenario {}: {}", scenario.name, scenario.description);
    let report = scenario::run(&scenario, &config).await?;
    let _ = std::fs::remove_dir_all(&work_dir);
    println!("\ntimeline:");
    for line in report.describe_timeline() {
        println!("  {line}");
    }
    println!("\nfinal state:");
    for (gid, status) in &report.statuses {
        println!("  {gid}: {status}");
    }
    for (sku, [available, reserved, sold]) in &report.stock {
        println!("  stock {sku}: available {available}, reserved {reserved}, sold {sold}");
    }
    for (account, balance) in &report.balances {
        println!("  balance {account}: {balance}");
    }
    for (user, n) in &report.coupons {
        println!("  coupons of {user}: {n}");
    }
    println!("\n{}", report.summary());
    let replayed = Recording::of(&scenario, &report);
    let mut failed = !report.violations.is_empty();
    for v in &report.violations {
        println!("VIOLATION: {v}");
    }
    if let Some(recorded) = &recording {
        let differences = recorded.differences(&replayed);
        if differences.is_empty() {
            println!("the replay reproduces the recording: same faults, same final state");
        }
        for d in &differences {
            println!("DIFFERENCE: {d}");
        }
        failed |= !differences.is_empty();
    }
    if let Some(path) = &args.record {
        std::fs::write(path, serde_json::to_string_pretty(&replayed)?)?;
        println!("recorded to {}", path.display());
    }
    if failed {
        return Err("the run did not hold".into());
    }
    Ok(())
}

//! `idem-lab serve`: the coordinator of `idem serve`, with a fault plan in front of its
//! transport and its crash points, and a timeline of what it did.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use idem::engine::Observer;
use idem::transport::Transport;

use super::{BoxError, read_plan};
use crate::faults::{CrashOnPlan, FaultyTransport, Timeline};

#[derive(Debug, Args)]
pub struct LabServeArgs {
    #[command(flatten)]
    pub serve: idem::cli::ServeArgs,
    /// A fault plan (JSON, or TOML by extension) to inject into participant calls and
    /// crash points.
    #[arg(long)]
    pub fault_plan: Option<PathBuf>,
    /// Append the timeline of calls, faults and status changes to this file (JSON lines).
    #[arg(long)]
    pub record: Option<PathBuf>,
}

pub(super) async fn serve(args: LabServeArgs) -> Result<(), BoxError> {
    let plan = args
        .fault_plan
        .as_deref()
        .map(read_plan)
        .transpose()?
        .map(Arc::new);
    let record = args.record;
    idem::cli::serve::run_with(args.serve, |config| async move {
        let node = config.engine.node.clone();
        let timeline = record
            .as_deref()
            .map(|path| Timeline::to_file(&node, path))
            .transpose()?;
        let mut observers: Vec<Arc<dyn Observer>> = Vec::new();
        if let Some(t) = &timeline {
            observers.push(Arc::clone(t) as Arc<dyn Observer>);
        }
        let mut transport: Arc<dyn Transport> = Arc::new(config.transport()?);
        if let Some(plan) = &plan {
            observers.push(Arc::new(CrashOnPlan::new(
                Arc::clone(plan),
                &node,
                timeline,
            )));
            transport = Arc::new(FaultyTransport::new(transport, Arc::clone(plan)));
        }
        Ok(idem::server::start_with(config, transport, observers).await?)
    })
    .await
}

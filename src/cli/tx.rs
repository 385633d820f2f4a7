//! `idem tx`: the operator's commands.

use std::sync::Arc;

use clap::Subcommand;

use super::{BoxError, DatabaseArgs};
use crate::api::native::TxView;
use crate::core::{Kind, Status};
use crate::engine::{Engine, EngineConfig, SystemClock};
use crate::server;
use crate::store::{ConnectOptions, ListFilter};
use crate::transport::HttpTransport;

#[derive(Debug, Subcommand)]
pub enum TxCommand {
    /// List transactions, newest first.
    List {
        #[command(flatten)]
        db: DatabaseArgs,
        #[arg(long)]
        status: Option<Status>,
        #[arg(long)]
        kind: Option<Kind>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one transaction with its branches and retry history, as JSON.
    Show {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
    },
    /// Resume a stalled transaction (or make a backing-off one due now). A running
    /// `idem serve` on the same database picks it up.
    Retry {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
    },
    /// Mark a transaction failed and call nothing more for it.
    ForceStop {
        #[command(flatten)]
        db: DatabaseArgs,
        gid: String,
        #[arg(long, default_value = "force-stopped by an operator")]
        reason: String,
    },
}

/// An engine for operator commands: it changes rows but never drives them.
async fn admin_engine(db: &DatabaseArgs) -> Result<Arc<Engine>, BoxError> {
    let store = server::open_store(&db.database_url, &ConnectOptions::default()).await?;
    let config = EngineConfig {
        drive: false,
        ..EngineConfig::default()
    };
    Ok(Engine::new(
        store,
        Arc::new(HttpTransport::new()?),
        Arc::new(SystemClock),
        config,
    ))
}

pub(super) async fn run(cmd: TxCommand) -> Result<(), BoxError> {
    match cmd {
        TxCommand::List {
            db,
            status,
            kind,
            limit,
            json,
        } => {
            let engine = admin_engine(&db).await?;
            let filter = ListFilter {
                statuses: status.into_iter().collect(),
                kind,
                limit,
                ..ListFilter::default()
            };
            let page = engine.store().list(&filter).await?;
            if json {
                let views: Vec<TxView> = page.items.iter().map(|s| TxView::new(s, None)).collect();
                println!("{}", serde_json::to_string_pretty(&views)?);
                return Ok(());
            }
            println!(
                "{:<40} {:<5} {:<11} {:>8}  {:<24} LAST ERROR",
                "GID", "KIND", "STATUS", "ATTEMPTS", "CREATED (UTC ms)"
            );
            for s in &page.items {
                let tx = &s.tx;
                println!(
                    "{:<40} {:<5} {:<11} {:>8}  {:<24} {}",
                    tx.gid,
                    tx.kind,
                    tx.status,
                    tx.attempts,
                    tx.created_at,
                    tx.last_error.as_deref().unwrap_or("")
                );
            }
            Ok(())
        }
        TxCommand::Show { db, gid } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.load(&gid).await?;
            let history = engine.store().attempts(&gid).await?;
            println!(
                "{}",
                serde_json::to_string_pretty(&TxView::new(&stored, Some(history)))?
            );
            Ok(())
        }
        TxCommand::Retry { db, gid } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.retry(&gid).await?;
            println!(
                "{gid}: {} (a running idem serve will continue it)",
                stored.tx.status
            );
            Ok(())
        }
        TxCommand::ForceStop { db, gid, reason } => {
            let engine = admin_engine(&db).await?;
            let stored = engine.force_stop(&gid, &reason).await?;
            println!("{gid}: {}", stored.tx.status);
            Ok(())
        }
    }
}

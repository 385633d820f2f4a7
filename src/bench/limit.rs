//! The limit: the same SQL as one idem global transaction, grouped into the same commits,
//! run by pgbench against a database holding every table (coordinator and participants),
//! with the same number of clients. What idem reaches is compared with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Error, Workload};
use idem_participant::testing::{Backend, TestDatabase};

/// The script for a workload, under `bench/limit/<backend>/`.
pub fn script(root: &Path, backend: &str, workload: Workload) -> PathBuf {
    let name = match workload {
        Workload::Tcc => "tcc",
        Workload::Saga => "saga",
        _ => "empty",
    };
    root.join("bench/limit")
        .join(backend)
        .join(format!("{name}.sql"))
}

/// Runs the PostgreSQL limit script with pgbench (`-M prepared`, through the Unix socket)
/// and returns its transactions per second.
pub async fn postgres(
    root: &Path,
    workload: Workload,
    clients: usize,
    duration: Duration,
) -> Result<f64, Error> {
    let db = TestDatabase::create(Backend::Postgres, "limit")
        .await
        .ok_or("IDEM_TEST_SKIP names postgres")?;
    let socket_url = super::local_socket(&db);
    let result = async {
        // Every table in one database: the coordinator's (its migrations) and the
        // participants' (their DDL), seeded as the benchmark seeds them.
        crate::server::open_store(&socket_url, &crate::store::ConnectOptions::default()).await?;
        let inventory = idem_demo::inventory::open(&socket_url).await?;
        let payment = idem_demo::payment::open(&socket_url).await?;
        for i in 0..super::SKUS {
            idem_demo::inventory::seed(&inventory, &format!("sku-{i}"), 1_000_000_000).await?;
        }
        for i in 0..super::ACCOUNTS {
            idem_demo::payment::seed(&payment, &format!("acct-{i}"), 1_000_000_000_000).await?;
        }
        inventory.close().await;
        payment.close().await;
        let script = script(root, "postgres", workload);
        let out = tokio::process::Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-j", "2"])
            .args([
                "-c",
                &clients.to_string(),
                "-T",
                &duration.as_secs().max(1).to_string(),
            ])
            .args(["-h", "/var/run/postgresql", "-U", "postgres", "-f"])
            .arg(&script)
            .arg(db.name())
            .output()
            .await
            .map_err(|e| format!("cannot run pgbench: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let tps = text
            .lines()
            .find(|l| l.starts_with("tps = "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| {
                format!(
                    "pgbench gave no rate: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })?;
        Ok::<f64, Error>(tps)
    }
    .await;
    db.drop_database().await;
    result
}

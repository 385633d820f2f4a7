//! `idem chaos`: many random orders under random faults, coordinator kills, long outages
//! and database restarts, with the invariants checked at the end.

use clap::Args;

use super::BoxError;

#[derive(Debug, Args)]
pub struct ChaosArgs {
    #[arg(long, default_value_t = 1_000)]
    pub orders: usize,
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Share of participant calls that meet a fault (some calls meet two, and delivered
    /// duplicates add calls, so the measured share comes out a little lower).
    #[arg(long, default_value_t = 0.3)]
    pub fault_rate: f64,
    /// Coordinator processes sharing the database.
    #[arg(long, default_value_t = 2)]
    pub coordinators: usize,
    /// SIGKILLs of a coordinator during the run.
    #[arg(long, default_value_t = 3)]
    pub kills: u32,
    #[arg(long, default_value_t = 5_000)]
    pub kill_every_ms: u64,
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Long outages: a participant refuses every Confirm, Cancel and compensation of a run
    /// of orders (which have a small retry budget) until all of them have stalled or
    /// ended; then it comes back and the operator retries what stalled.
    #[arg(long, default_value_t = 2)]
    pub outages: usize,
    /// Orders each outage hits (0: one in fifty, at least ten).
    #[arg(long, default_value_t = 0)]
    pub outage_orders: usize,
    /// Where the coordinators and participants keep their data: sqlite (files in a
    /// temporary directory), postgres or mysql (fresh databases on the server named by
    /// IDEM_TEST_POSTGRES_URL / IDEM_TEST_MYSQL_URL, default the local one; dropped after).
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
}

pub(super) async fn chaos(args: ChaosArgs) -> Result<(), BoxError> {
    use crate::scenario::{self, ChaosConfig, RunConfig};
    use idem_participant::testing::{Backend, TestDatabase};
    let config = ChaosConfig {
        orders: args.orders,
        concurrency: args.concurrency,
        fault_rate: args.fault_rate,
        coordinators: args.coordinators,
        kills: args.kills,
        kill_every_ms: args.kill_every_ms,
        seed: args.seed,
        outages: args.outages,
        outage_orders: args.outage_orders,
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-{}", std::process::id()));
    let mut run = RunConfig::sqlite(std::env::current_exe()?, work_dir.clone());
    run.progress = true;
    let backend = match args.backend.as_str() {
        "sqlite" => None,
        "postgres" => Some(Backend::Postgres),
        "mysql" => Some(Backend::Mysql),
        other => return Err(format!("unknown backend {other}: sqlite, postgres or mysql").into()),
    };
    let mut databases = Vec::new();
    if let Some(backend) = backend {
        for _ in 0..4 {
            let db = TestDatabase::create(backend, "chaos")
                .await
                .ok_or("IDEM_TEST_SKIP names this backend")?;
            databases.push(db);
        }
        run.coordinator_db = databases[0].url.clone();
        run.inventory_db = databases[1].url.clone();
        run.payment_db = databases[2].url.clone();
        run.coupon_db = databases[3].url.clone();
    }
    println!(
        "chaos: {} orders, {} at a time, faults on ~{:.0} % of calls, {} coordinators on {}, {} SIGKILLs every {} ms",
        config.orders,
        config.concurrency,
        config.fault_rate * 100.0,
        config.coordinators,
        args.backend,
        config.kills,
        config.kill_every_ms
    );
    let planned = scenario
        .orders
        .iter()
        .filter(|o| scenario::planned_to_fail(&scenario, o))
        .count();
    println!(
        "planned: {planned} orders refused by design ({:.1} %: over-stock, unknown campaign, client abort); {} long outages of {} orders each",
        100.0 * planned as f64 / config.orders.max(1) as f64,
        scenario.outages.len(),
        config.orders_per_outage()
    );
    let report = scenario::run(&scenario, &run).await;
    for db in databases {
        db.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(&work_dir);
    let report = report?;
    println!("{}", report.summary());
    for v in report.violations.iter().take(50) {
        println!("VIOLATION: {v}");
    }
    if report.violations.is_empty() {
        println!(
            "every transaction is terminal; stock conserved and never negative; balances never negative; succeeded orders applied once; failed orders undone; no coupon issued twice; no call past its attempt cap; every order a long outage met stalled, then ended after the operator's retry"
        );
        Ok(())
    } else {
        Err(format!("{} violations", report.violations.len()).into())
    }
}

//! A small chaos run in every CI: random orders under random faults on over 20 % of the
//! participant calls, three SIGKILLs of a coordinator, two coordinators sharing
//! PostgreSQL, and two long outages (inventory, then payment) that outlast the retry
//! budget of the orders they hit. `idem chaos` runs the full size.

use std::path::PathBuf;

use idem::scenario::{self, ChaosConfig, RunConfig};
use idem_participant::testing::{Backend, TestDatabase};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_small_on_postgres_with_two_coordinators_and_kills() {
    let mut dbs = Vec::new();
    for _ in 0..4 {
        match TestDatabase::create(Backend::Postgres, "chaos_small").await {
            Some(db) => dbs.push(db),
            None => return,
        }
    }
    let config = ChaosConfig {
        orders: 150,
        concurrency: 8,
        fault_rate: 0.3,
        coordinators: 2,
        kills: 3,
        kill_every_ms: 1_500,
        seed: 7,
        outages: 2,
        outage_orders: 10,
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-test-{}", std::process::id()));
    let run = RunConfig {
        idem_bin: PathBuf::from(env!("CARGO_BIN_EXE_idem")),
        coordinator_db: dbs[0].url.clone(),
        inventory_db: dbs[1].url.clone(),
        payment_db: dbs[2].url.clone(),
        coupon_db: dbs[3].url.clone(),
        work_dir: work_dir.clone(),
        progress: false,
    };
    let report = scenario::run(&scenario, &run)
        .await
        .expect("the chaos run completes");
    println!("{}", report.summary());
    assert!(
        report.violations.is_empty(),
        "{}",
        report.violations.join("\n")
    );
    assert_eq!(report.statuses.len(), 150);
    assert!(
        report.statuses.values().all(|s| s.is_terminal()),
        "{:?}",
        report.statuses
    );
    // Both outages met orders, and what they met stalled, then finished after the
    // operator's retry (the violations above cover each order; this guards the totals).
    assert_eq!(report.healed_at.len(), 2, "{:?}", report.healed_at);
    let met: std::collections::BTreeSet<&str> =
        report.outage_hits.iter().map(|h| h.gid.as_str()).collect();
    assert!(met.len() >= 5, "only {} orders met an outage", met.len());
    assert!(
        report.stalled_seen.len() >= met.len(),
        "{} stalled, {} met an outage",
        report.stalled_seen.len(),
        met.len()
    );
    assert!(report.restarts >= 3, "{} restarts", report.restarts);
    let share = report.faults() as f64 / report.calls() as f64;
    assert!(share >= 0.2, "faults on {:.1} % of calls", share * 100.0);
    for db in dbs {
        db.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(work_dir);
}

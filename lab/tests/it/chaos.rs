//! A small chaos run in every CI: random orders under random faults on over 20 % of the
//! participant calls, three SIGKILLs of a coordinator, two coordinators sharing
//! PostgreSQL, and two long outages (inventory, then payment) that outlast the retry
//! budget of the orders they hit. Then `idem-lab chaos` itself with a restart of the database
//! server in the middle (a private PostgreSQL: the shared one must stay up), and with one
//! coordinator's clock a minute off. `idem-lab chaos` runs the full size.

use std::path::PathBuf;

use crate::private_postgres::PrivatePostgres;
use idem::core::Status;
use idem_lab::scenario::{self, ChaosConfig, RunConfig};
use idem_participant::testing::{Backend, TestDatabase};
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_small_on_postgres_with_two_coordinators_and_kills() {
    let mut dbs = Vec::new();
    for _ in 0..4 {
        dbs.push(TestDatabase::create(Backend::Postgres, "chaos_small").await);
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
        ..ChaosConfig::default()
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-test-{}", std::process::id()));
    let run = RunConfig {
        idem_bin: PathBuf::from(env!("CARGO_BIN_EXE_idem-lab")),
        coordinator_db: dbs[0].url.clone(),
        inventory_db: dbs[1].url.clone(),
        payment_db: dbs[2].url.clone(),
        coupon_db: dbs[3].url.clone(),
        work_dir: work_dir.clone(),
        progress: false,
        db_restart_command: None,
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

/// When the server last started, as it says.
async fn postmaster_start(url: &str) -> f64 {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    let at: f64 =
        sqlx::query_scalar("SELECT extract(epoch FROM pg_postmaster_start_time())::float8")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    conn.close().await.unwrap();
    at
}

/// The database server restarts while orders are in flight: coordinators, participants and
/// the runner's client ride it out, and every check holds. `idem-lab chaos` as an operator runs
/// it, pointed at a private server by the same variable the by-hand runs would use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_rides_out_a_database_restart() {
    let pg = PrivatePostgres::start("chaos_rides_out_a_database_restart");
    let admin = pg.admin_url();
    let started = postmaster_start(&admin).await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem-lab"))
        .args(["chaos", "--orders", "120", "--concurrency", "8"])
        .args(["--fault-rate", "0.2", "--coordinators", "2", "--seed", "11"])
        .args(["--kills", "1", "--kill-every-ms", "1500"])
        .args(["--outages", "1", "--outage-orders", "10"])
        .args(["--backend", "postgres", "--db-restarts", "1"])
        .args(["--db-restart-command", &pg.restart_command()])
        .env("IDEM_TEST_POSTGRES_URL", &admin)
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("\nviolations: 0\n"), "{stdout}");
    assert!(stdout.contains("transactions: 120 ("), "{stdout}");
    // Half way through the orders, and back: the runner checked the server's uptime; the
    // server's own start time says the same.
    assert!(
        stdout.contains("database restarts: 1 (at order 60, back after "),
        "{stdout}"
    );
    assert!(
        postmaster_start(&admin).await > started,
        "the server restarted"
    );
}

/// One coordinator's wall clock runs a minute ahead. Leases and timeouts are compared on
/// the database's clock, so nothing changes: no violation, and no more failed orders than
/// the faults explain (a coordinator that trusted its own clock would see every lease
/// lapsed and every prepared TCC timed out, and abort them).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_with_a_coordinator_clock_a_minute_ahead() {
    let mut dbs = Vec::new();
    for _ in 0..4 {
        dbs.push(TestDatabase::create(Backend::Postgres, "chaos_skewed_clock").await);
    }
    let config = ChaosConfig {
        orders: 150,
        concurrency: 8,
        fault_rate: 0.3,
        coordinators: 2,
        kills: 2,
        kill_every_ms: 1_500,
        seed: 5,
        outages: 1,
        outage_orders: 10,
        skewed_clock_ms: Some(60_000),
        ..ChaosConfig::default()
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-skew-{}", std::process::id()));
    let run = RunConfig {
        idem_bin: PathBuf::from(env!("CARGO_BIN_EXE_idem-lab")),
        coordinator_db: dbs[0].url.clone(),
        inventory_db: dbs[1].url.clone(),
        payment_db: dbs[2].url.clone(),
        coupon_db: dbs[3].url.clone(),
        work_dir: work_dir.clone(),
        progress: false,
        db_restart_command: None,
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
    assert!(report.statuses.values().all(|s| s.is_terminal()));
    let planned = scenario
        .orders
        .iter()
        .filter(|o| scenario::planned_to_fail(&scenario, o))
        .count();
    let failed = report
        .statuses
        .values()
        .filter(|s| **s == Status::Failed)
        .count();
    // Lost Try answers add about one order in ten to the planned failures at this rate.
    assert!(
        failed <= planned + config.orders / 5,
        "{failed} failed, {planned} planned"
    );
    for db in dbs {
        db.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(work_dir);
}

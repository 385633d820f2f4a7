//! `idem-lab chaos`: many random orders under random faults, coordinator kills, long outages
//! and database restarts, with the invariants checked at the end.

use std::path::Path;

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
    /// Restarts of the database server during the run, spread evenly over the orders
    /// (postgres and mysql only). Everything must ride them out: coordinators, participants
    /// and this runner's client.
    #[arg(long, default_value_t = 0)]
    pub db_restarts: u32,
    /// The shell command that restarts the database server (run with `sh -c`; the runner
    /// then waits until the server accepts connections and checks from its uptime that it
    /// did restart). Default: PostgreSQL `pg_ctlcluster <version> main restart` (the
    /// version from /etc/postgresql); MariaDB: stop `mariadbd` and start it again with
    /// start-stop-daemon.
    #[arg(long, value_name = "COMMAND")]
    pub db_restart_command: Option<String>,
    /// Run the last coordinator with its wall clock this many ms off (`idem serve
    /// --test-clock-offset-ms`); the others keep the true time.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub skewed_clock_ms: Option<i64>,
    /// Freezes of the coordinators' database links, spread evenly over the orders: a proxy
    /// between each coordinator and the server passes no byte for a while, its sockets
    /// kept open (postgres, mysql); on sqlite another process holds the write lock as long.
    #[arg(long, default_value_t = 0)]
    pub db_freezes: u32,
    /// The freezes' lengths in ms, used in turn. Default: half the database call timeout,
    /// between it and the 2 s lease, and twice the lease.
    #[arg(long, value_delimiter = ',', value_name = "MS,...")]
    pub db_freeze_ms: Vec<u64>,
    /// Latency episodes on the database links (postgres, mysql), each two leases long.
    #[arg(long, default_value_t = 0)]
    pub db_latencies: u32,
    /// Added to every chunk of bytes, each way, during a latency episode.
    #[arg(long, default_value_t = 20, value_name = "MS")]
    pub db_latency_ms: u64,
    /// Cuts of the database links (postgres, mysql): every open connection reset.
    #[arg(long, default_value_t = 0)]
    pub db_cuts: u32,
    /// The coordinators' bound on one database call (`idem serve
    /// --database-call-timeout-ms`). Default: idem's own, or 1000 ms with database-link
    /// faults, so that freezes can outlast it without outlasting the lease.
    #[arg(long, value_name = "MS")]
    pub database_call_timeout_ms: Option<u64>,
}

/// Stops `mariadbd` and starts it again as this machine starts it. `--stop --retry` waits
/// until the old process is gone (SIGTERM: a clean shutdown, as `mariadb-admin shutdown`
/// does), so the start that follows cannot find it still running and do nothing.
pub const MARIADB_RESTART: &str = "start-stop-daemon --stop --oknodo --retry 120 --exec /usr/sbin/mariadbd \
     && start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd";

/// The command that restarts the local database server of `backend`.
pub fn default_restart_command(backend: &str, etc_postgresql: &Path) -> Result<String, BoxError> {
    match backend {
        "postgres" => {
            let version = postgres_version(etc_postgresql)?;
            Ok(format!("pg_ctlcluster {version} main restart"))
        }
        "mysql" => Ok(MARIADB_RESTART.to_owned()),
        _ => Err(
            "--db-restarts needs --backend postgres or mysql: SQLite has no server to restart"
                .into(),
        ),
    }
}

/// The newest PostgreSQL version with a `main` cluster under `/etc/postgresql`.
fn postgres_version(etc: &Path) -> Result<String, BoxError> {
    let entries = std::fs::read_dir(etc).map_err(|e| {
        format!(
            "cannot read {}: {e}; name the restart command with --db-restart-command",
            etc.display()
        )
    })?;
    let mut versions: Vec<(f64, String)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join("main").is_dir())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.parse::<f64>().ok().map(|v| (v, name))
        })
        .collect();
    versions.sort_by(|a, b| a.0.total_cmp(&b.0));
    versions.pop().map(|(_, name)| name).ok_or_else(|| {
        format!(
            "no PostgreSQL cluster `main` under {}; name the restart command with --db-restart-command",
            etc.display()
        )
        .into()
    })
}

pub(super) async fn chaos(args: ChaosArgs) -> Result<(), BoxError> {
    use crate::scenario::{self, ChaosConfig, DbLinkChaos, RunConfig};
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
        db_restarts: args.db_restarts,
        skewed_clock_ms: args.skewed_clock_ms,
        db_link: DbLinkChaos {
            freezes: args.db_freezes,
            freeze_ms: args.db_freeze_ms,
            latencies: args.db_latencies,
            latency_ms: args.db_latency_ms,
            cuts: args.db_cuts,
        },
        database_call_timeout_ms: args.database_call_timeout_ms,
    };
    // Found before any database is made, so a wrong setup costs nothing.
    let restart_command = match (args.db_restarts, args.db_restart_command) {
        (0, _) => None,
        (_, Some(command)) if args.backend != "sqlite" => Some(command),
        (_, _) => Some(default_restart_command(
            &args.backend,
            Path::new("/etc/postgresql"),
        )?),
    };
    let scenario = scenario::chaos_scenario(&config);
    let work_dir = std::env::temp_dir().join(format!("idem-chaos-{}", std::process::id()));
    let mut run = RunConfig::sqlite(std::env::current_exe()?, work_dir.clone());
    run.progress = true;
    run.db_restart_command.clone_from(&restart_command);
    let backend = match Backend::from_name(&args.backend) {
        Some(Backend::Sqlite) => None,
        Some(server) => Some(server),
        None => {
            return Err(format!(
                "unknown backend {}: sqlite, postgres or mysql",
                args.backend
            )
            .into());
        }
    };
    let mut databases = Vec::new();
    if let Some(backend) = backend {
        for _ in 0..4 {
            let db = TestDatabase::create(backend, "chaos").await;
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
    if let Some(command) = &restart_command {
        println!(
            "database restarts: {}, spread evenly over the orders, by `{command}`",
            config.db_restarts
        );
    }
    if !scenario.plan.db_link.is_empty() {
        let each: Vec<String> = scenario
            .plan
            .db_link
            .iter()
            .map(|r| format!("{} at order {}", r.fault.label(), r.at_order))
            .collect();
        println!(
            "database-link faults (database call timeout {} ms, lease {} ms): {}",
            scenario
                .settings
                .database_call_timeout_ms
                .unwrap_or_default(),
            scenario.settings.lease_ms,
            each.join("; ")
        );
    }
    if let Some(ms) = config.skewed_clock_ms {
        println!(
            "coordinator c{} runs with its wall clock {ms} ms off",
            config.coordinators.max(1) - 1
        );
    }
    let report = scenario::run(&scenario, &run).await;
    for db in databases {
        db.drop_database().await;
    }
    let clean = report.as_ref().is_ok_and(|r| r.violations.is_empty());
    if clean {
        let _ = std::fs::remove_dir_all(&work_dir);
    }
    let report = report?;
    println!("{}", report.summary());
    if !report.violations.is_empty() {
        println!("VIOLATIONS:\n{}", report.violation_digest(10));
        println!(
            "the coordinators' logs and the timeline are kept in {}",
            work_dir.display()
        );
    }
    if report.violations.is_empty() {
        println!(
            "every transaction is terminal; stock conserved and never negative; balances never negative; succeeded orders applied once; failed orders undone; no coupon issued twice; no call past its attempt cap; every order a long outage met stalled, then ended after the operator's retry; every database restart and database-link fault happened and was ridden out; no coordinator row ever went back; saga steps called in order; no step called again by the process that saw it succeed; no takeover while a coordinator ran alone; every action of a failed saga compensated; every failed call stored once"
        );
        Ok(())
    } else {
        Err(format!("{} violations", report.violations.len()).into())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn the_postgres_restart_names_the_newest_cluster() {
        let etc =
            std::env::temp_dir().join(format!("idem-etc-pg-{}", uuid::Uuid::new_v4().simple()));
        for dir in ["13/main", "15/main", "16", "notes"] {
            std::fs::create_dir_all(etc.join(dir)).unwrap();
        }
        // 16 has no `main` cluster, "notes" is no version.
        assert_eq!(
            default_restart_command("postgres", &etc).unwrap(),
            "pg_ctlcluster 15 main restart"
        );
        std::fs::remove_dir_all(&etc).unwrap();
        let err = default_restart_command("postgres", &etc).unwrap_err();
        assert!(err.to_string().contains("--db-restart-command"), "{err}");
        assert!(
            default_restart_command("mysql", &etc)
                .unwrap()
                .contains("mariadbd")
        );
        let err = default_restart_command("sqlite", &etc).unwrap_err();
        assert!(err.to_string().contains("no server to restart"), "{err}");
    }

    #[test]
    fn the_runs_at_scale_parse() {
        let args = |backend: &str| {
            let line = format!(
                "idem-lab chaos --orders 10000 --fault-rate 0.3 --coordinators 3 --kills 4 \
                 --kill-every-ms 15000 --db-restarts 2 --skewed-clock-ms -60000 --backend {backend} \
                 --db-freezes 3 --db-freeze-ms 500,4000 --db-cuts 1 --database-call-timeout-ms 1500"
            );
            match Cli::parse_from(line.split_whitespace()).command {
                Command::Chaos(args) => args,
                other => panic!("{other:?}"),
            }
        };
        let a = args("postgres");
        assert_eq!(
            (
                a.orders,
                a.coordinators,
                a.kills,
                a.db_restarts,
                a.skewed_clock_ms
            ),
            (10_000, 3, 4, 2, Some(-60_000))
        );
        assert_eq!(a.db_restart_command, None);
        assert_eq!(
            (
                a.db_freezes,
                a.db_freeze_ms.as_slice(),
                a.db_cuts,
                a.db_latencies
            ),
            (3, &[500, 4_000][..], 1, 0)
        );
        assert_eq!(a.database_call_timeout_ms, Some(1_500));
        assert_eq!(args("mysql").backend, "mysql");
    }
}

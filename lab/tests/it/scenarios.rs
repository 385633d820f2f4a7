//! The named failure scenarios in `tests/scenarios/`, each run with real `idem serve`
//! processes and real HTTP, on the databases the file names (default: SQLite and
//! PostgreSQL; MariaDB too for the racing ones).

use std::path::PathBuf;

use idem_lab::scenario::{self, RunConfig, Scenario};
use idem_participant::testing::{Backend, TestDatabase};

async fn run_file(name: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(format!("{name}.json"));
    let scenario = Scenario::read(&path).unwrap_or_else(|e| panic!("{e}"));
    let backends: Vec<Backend> = if scenario.backends.is_empty() {
        vec![Backend::Sqlite, Backend::Postgres]
    } else {
        scenario
            .backends
            .iter()
            .map(|b| Backend::from_name(b).unwrap_or_else(|| panic!("{name}: unknown backend {b}")))
            .collect()
    };
    for backend in backends {
        let test = format!("scenario_{name}");
        let mut dbs = Vec::new();
        for _ in 0..4 {
            dbs.push(TestDatabase::create(backend, &test).await);
        }
        let work_dir = std::env::temp_dir().join(format!(
            "idem-scenario-{name}-{backend}-{}",
            std::process::id()
        ));
        let config = RunConfig {
            idem_bin: PathBuf::from(env!("CARGO_BIN_EXE_idem-lab")),
            coordinator_db: dbs[0].url.clone(),
            inventory_db: dbs[1].url.clone(),
            payment_db: dbs[2].url.clone(),
            coupon_db: dbs[3].url.clone(),
            work_dir: work_dir.clone(),
            progress: false,
            db_restart_command: None,
        };
        let report = scenario::run(&scenario, &config)
            .await
            .unwrap_or_else(|e| panic!("{name} on {backend}: {e}"));
        println!(
            "== {name} on {backend}: {} faults, {} restarts, {} ms",
            report.faults(),
            report.restarts,
            report.wall_ms
        );
        for line in report.describe_timeline() {
            println!("   {line}");
        }
        assert!(
            report.violations.is_empty(),
            "{name} on {backend}:\n{}",
            report.violations.join("\n")
        );
        for db in dbs {
            db.drop_database().await;
        }
        let _ = std::fs::remove_dir_all(work_dir);
    }
}

macro_rules! scenarios {
    ($($test:ident => $file:literal),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                run_file($file).await;
            }
        )*
    };
}

scenarios! {
    cancel_before_try => "cancel-before-try",
    confirm_response_lost => "confirm-response-lost",
    try_response_lost_then_abort => "try-response-lost-then-abort",
    duplicate_callback_storm => "duplicate-callback-storm",
    participant_down_for_a_while => "participant-down-for-a-while",
    crash_after_decision_before_calls => "crash-after-decision-before-calls",
    crash_after_branch_success_before_record => "crash-after-branch-success-before-record",
    stale_owner_writes_late => "stale-owner-writes-late",
    saga_compensation_fails_then_succeeds => "saga-compensation-fails-then-succeeds",
    attempts_exhausted_stalled_manual_retry => "attempts-exhausted-stalled-manual-retry",
}

/// Every file in tests/scenarios/ has a test above.
#[test]
fn every_scenario_file_is_run() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let this = include_str!("scenarios.rs");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let stem = name.trim_end_matches(".json");
        assert!(
            this.contains(&format!("\"{stem}\"")),
            "{name} has no test in tests/it/scenarios.rs"
        );
    }
}

//! The database link frozen under load (issue 27): 200 four-step sagas whose steps answer
//! 500 once and then succeed, one real `idem serve` process whose database calls are
//! bounded to 2 s (`--database-call-timeout-ms`), and its link to the database frozen by
//! the lab's proxy for longer than that bound: once for less than the lease, once for
//! longer than the lease. Whatever the coordinator's writes did while the link was frozen,
//! every saga must end succeeded with each failed call once in its history (its 500
//! included: another failure, such as a step timing out on a loaded machine, is allowed
//! beside it), and the run's
//! invariants hold: no branch row ever goes back, steps are called in order, no step that
//! succeeded is called again by the process, the lone coordinator never takes over from
//! itself, every executed action of a failed saga is compensated.
//!
//! SQLite has no link to freeze; its stall is another process holding the write lock
//! past the call bound (a backup, an operator's open transaction): the coordinator's writes
//! then wait, time out for their callers, and may still go through when the lock is
//! released, which is the same hazard.

use std::collections::BTreeMap;
use std::path::PathBuf;

use idem::core::{Kind, Status};
use idem_lab::faults::{DbLinkFault, DbLinkRule, Fault, FaultPlan, FaultRule, Match, Side};
use idem_lab::scenario::{
    self, Expect, Order, OrderBranch, Participant, RunConfig, Scenario, Settings,
};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::json;

const ORDERS: usize = 200;
const CALL_TIMEOUT_MS: u64 = 2_000;
/// When the freeze starts, after the last saga was started.
const FREEZE_AFTER_MS: u64 = 1_000;

/// One case: how long the link freezes, and the coordinator's lease.
struct Case {
    name: &'static str,
    freeze_ms: u64,
    lease_ms: u64,
}

/// Longer than the call bound, shorter than the lease: no other coordinator may take
/// anything over, the writes that timed out must not land over newer ones.
const SHORTER_THAN_THE_LEASE: Case = Case {
    name: "freeze-within-lease",
    freeze_ms: 6_000,
    lease_ms: 10_000,
};

/// Longer than the lease, one coordinator: nobody else exists to take over, so its own
/// recovery must not take over from its own drivers.
const LONGER_THAN_THE_LEASE: Case = Case {
    name: "freeze-past-lease",
    freeze_ms: 7_000,
    lease_ms: 4_000,
};

/// SQLite: idem does not cut its SQLite calls (no network to be cut from); a write
/// waits for the lock up to SQLite's busy timeout (10 s), then fails, unwritten. Held
/// longer than that, within the lease: the writes fail for sure and must be retried, never
/// land late, never let the process take over from itself.
const SQLITE_LOCK_PAST_THE_BUSY_TIMEOUT: Case = Case {
    name: "write-lock-held",
    freeze_ms: 12_000,
    lease_ms: 20_000,
};

fn scenario(case: &Case) -> Scenario {
    let skus = 4;
    let orders: Vec<Order> = (0..ORDERS)
        .map(|n| {
            let user = format!("user-{n}");
            let step = |participant, payload| OrderBranch {
                participant,
                payload,
            };
            Order {
                gid: format!("{}-{n:03}", case.name),
                kind: Kind::Saga,
                branches: vec![
                    step(
                        Participant::Inventory,
                        json!({"sku": format!("sku-{}", n % skus), "quantity": 1}),
                    ),
                    step(
                        Participant::Coupon,
                        json!({"user": user, "coupon": "CAMP0"}),
                    ),
                    step(
                        Participant::Inventory,
                        json!({"sku": format!("sku-{}", (n + 1) % skus), "quantity": 1}),
                    ),
                    step(
                        Participant::Coupon,
                        json!({"user": user, "coupon": "CAMP1"}),
                    ),
                ],
                abort: false,
                late_try: false,
                retry_if_stalled: false,
                options: None,
            }
        })
        .collect();
    let plan = FaultPlan {
        name: case.name.into(),
        rules: vec![FaultRule {
            // Every step's first call reaches its participant and is answered 500.
            matches: Match {
                op: Some("action".into()),
                attempt: Some(1),
                ..Match::default()
            },
            side: Side::Participant,
            probability: None,
            times: None,
            fault: Fault::Status { status: 500 },
        }],
        // Every saga is under way (they all start at once), a step or two in.
        db_link: vec![DbLinkRule {
            at_order: ORDERS - 1,
            after_ms: FREEZE_AFTER_MS,
            node: None,
            fault: DbLinkFault::Freeze { ms: case.freeze_ms },
        }],
        ..FaultPlan::default()
    };
    Scenario {
        name: case.name.into(),
        description: "the database link frozen past the call bound under a load of sagas".into(),
        plan,
        coordinators: 1,
        concurrency: ORDERS,
        settings: Settings {
            max_attempts: 30,
            // Each step waits this long between its 500 and its success: a saga takes
            // some 2 s, so the freeze finds every one of them mid-way.
            retry_interval_ms: 500,
            max_retry_interval_ms: 1_000,
            request_timeout_ms: 2_000,
            lease_ms: case.lease_ms,
            database_call_timeout_ms: Some(CALL_TIMEOUT_MS),
            ..Settings::default()
        },
        stock: (0..skus).map(|i| (format!("sku-{i}"), 1_000)).collect(),
        accounts: BTreeMap::new(),
        campaigns: [("CAMP0".to_owned(), 1_000), ("CAMP1".to_owned(), 1_000)].into(),
        expect: Expect {
            status: orders
                .iter()
                .map(|o| (o.gid.clone(), Status::Succeeded))
                .collect(),
            // The 500 of every step, stored (once: checked for every run).
            min_failed_calls_per_step: Some(1),
            ..Expect::default()
        },
        orders,
        outages: Vec::new(),
        backends: Vec::new(),
    }
}

/// One run at a time: five runs of 200 sagas at once on a small machine would measure the
/// machine's load more than the freeze (each run's databases are its own either way).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn run(backend: Backend, case: &Case) {
    let _turn = ONE_AT_A_TIME.lock().await;
    let test = format!("db_link_{}", case.name);
    let mut dbs = Vec::new();
    for _ in 0..4 {
        dbs.push(TestDatabase::create(backend, &test).await);
    }
    let scenario = scenario(case);
    let work_dir = std::env::temp_dir().join(format!(
        "idem-{}-{backend}-{}",
        case.name,
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
    let report = scenario::run(&scenario, &config).await;
    // Dropped whatever the outcome: this test is meant to fail until the coordinator is
    // right, and must not leave four databases behind each time.
    for db in dbs {
        db.drop_database().await;
    }
    let report = report.unwrap_or_else(|e| panic!("{} on {backend}: {e}", case.name));
    println!("== {} on {backend}\n{}", case.name, report.summary());
    // The freeze happened, and outlasted the call bound.
    assert_eq!(report.db_link.len(), 1, "{backend}: {:?}", report.db_link);
    assert!(case.freeze_ms > CALL_TIMEOUT_MS);
    assert!(
        report.row_samples > 10,
        "{backend}: {} samples",
        report.row_samples
    );
    assert!(
        report.violations.is_empty(),
        "{} on {backend} (link frozen {} ms, {FREEZE_AFTER_MS} ms after all {ORDERS} sagas started, database calls bounded to {CALL_TIMEOUT_MS} ms, lease {} ms, one coordinator): {} violations\n{}\n(the coordinator's log and the timeline: {})",
        case.name,
        case.freeze_ms,
        case.lease_ms,
        report.violations.len(),
        report.violation_digest(8),
        work_dir.display()
    );
    assert_eq!(report.statuses.len(), ORDERS);
    let _ = std::fs::remove_dir_all(work_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_link_frozen_past_the_call_bound_within_the_lease() {
    run(Backend::Postgres, &SHORTER_THAN_THE_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_link_frozen_past_the_call_bound_within_the_lease() {
    run(Backend::Mysql, &SHORTER_THAN_THE_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_link_frozen_past_the_lease_with_one_coordinator() {
    run(Backend::Postgres, &LONGER_THAN_THE_LEASE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_link_frozen_past_the_lease_with_one_coordinator() {
    run(Backend::Mysql, &LONGER_THAN_THE_LEASE).await;
}

/// SQLite: the write lock held by another process past the busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_write_lock_held_past_the_busy_timeout() {
    run(Backend::Sqlite, &SQLITE_LOCK_PAST_THE_BUSY_TIMEOUT).await;
}

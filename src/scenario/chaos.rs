//! The chaos run: many orders, random faults on a share of the participant calls,
//! coordinators killed with SIGKILL along the way, and the invariants checked at the end.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use super::{Expect, Order, OrderBranch, Participant, Scenario, Settings};
use crate::core::Kind;
use crate::faults::{Fault, FaultPlan, FaultRule, Match, Side};

/// The size and shape of a chaos run.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub orders: usize,
    pub concurrency: usize,
    /// Share of participant calls that meet a fault (spread over the fault kinds).
    pub fault_rate: f64,
    pub coordinators: usize,
    pub kills: u32,
    pub kill_every_ms: u64,
    pub seed: u64,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            orders: 1_000,
            concurrency: 16,
            fault_rate: 0.25,
            coordinators: 2,
            kills: 3,
            kill_every_ms: 5_000,
            seed: 42,
        }
    }
}

const SKUS: usize = 12;
const ACCOUNTS: usize = 30;
const CAMPAIGNS: usize = 4;

/// Builds the chaos scenario: half TCC orders (inventory + payment), half sagas
/// (inventory + coupon); some ask for more stock than exists, some use a campaign that does
/// not exist, some are aborted by the client, so every path is taken.
pub fn scenario(config: &ChaosConfig) -> Scenario {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let stock: BTreeMap<String, i64> = (0..SKUS).map(|i| (format!("sku-{i}"), 200)).collect();
    let accounts: BTreeMap<String, i64> = (0..ACCOUNTS)
        .map(|i| (format!("acct-{i}"), 5_000))
        .collect();
    let campaigns: BTreeMap<String, i64> =
        (0..CAMPAIGNS).map(|i| (format!("CAMP{i}"), 400)).collect();
    let mut orders = Vec::with_capacity(config.orders);
    for n in 0..config.orders {
        let sku = format!("sku-{}", rng.random_range(0..SKUS));
        // One order in twenty wants more than the whole stock: its Try (or action) fails.
        let quantity = if rng.random_bool(0.05) {
            1_000
        } else {
            rng.random_range(1..=3)
        };
        let inventory = OrderBranch {
            participant: Participant::Inventory,
            payload: json!({"sku": sku, "quantity": quantity}),
        };
        if rng.random_bool(0.5) {
            let account = format!("acct-{}", rng.random_range(0..ACCOUNTS));
            orders.push(Order {
                gid: format!("chaos-tcc-{n:05}"),
                kind: Kind::Tcc,
                branches: vec![
                    inventory,
                    OrderBranch {
                        participant: Participant::Payment,
                        payload: json!({"account": account, "amount": rng.random_range(5..=50)}),
                    },
                ],
                abort: rng.random_bool(0.05),
                late_try: false,
                retry_if_stalled: true,
            });
        } else {
            let campaign = if rng.random_bool(0.1) {
                "NO-SUCH-CAMPAIGN".to_owned()
            } else {
                format!("CAMP{}", rng.random_range(0..CAMPAIGNS))
            };
            orders.push(Order {
                gid: format!("chaos-saga-{n:05}"),
                kind: Kind::Saga,
                branches: vec![
                    inventory,
                    OrderBranch {
                        participant: Participant::Coupon,
                        payload: json!({"user": format!("user-{n}"), "coupon": campaign}),
                    },
                ],
                abort: false,
                late_try: false,
                retry_if_stalled: true,
            });
        }
    }
    Scenario {
        name: format!("chaos-{}-orders-seed-{}", config.orders, config.seed),
        description: "random orders under random faults and coordinator kills".into(),
        plan: plan(config.fault_rate, config.seed),
        coordinators: config.coordinators,
        concurrency: config.concurrency,
        settings: Settings {
            max_attempts: 30,
            retry_interval_ms: 20,
            max_retry_interval_ms: 500,
            request_timeout_ms: 1_000,
            lease_ms: 2_000,
            prepared_timeout_ms: 60_000,
            try_timeout_ms: 3_000,
            kill_every_ms: (config.kills > 0).then_some(config.kill_every_ms),
            kills: config.kills,
        },
        stock,
        accounts,
        campaigns,
        orders,
        expect: Expect::default(),
        backends: Vec::new(),
    }
}

/// Faults on `rate` of the calls, split over every kind: on the coordinator's side, lost
/// requests (500), lost answers after commit, timeouts (delay past the request timeout),
/// duplicates; on the participants' side, 503s, duplicates and lost Try answers.
fn plan(rate: f64, seed: u64) -> FaultPlan {
    let rule = |side, op: Option<&str>, share: f64, fault| FaultRule {
        matches: Match {
            op: op.map(str::to_owned),
            ..Match::default()
        },
        side,
        probability: Some((rate * share).min(1.0)),
        times: None,
        fault,
    };
    use Side::*;
    FaultPlan {
        name: "chaos".into(),
        seed,
        rules: vec![
            rule(Coordinator, None, 0.20, Fault::Status { status: 500 }),
            rule(Coordinator, None, 0.20, Fault::CommitThenDrop),
            rule(Coordinator, None, 0.10, Fault::Delay { ms: 1_500 }),
            rule(Coordinator, None, 0.15, Fault::Duplicate),
            rule(Participant, None, 0.15, Fault::Status { status: 503 }),
            rule(Participant, None, 0.15, Fault::Duplicate),
            rule(Participant, Some("try"), 0.20, Fault::CommitThenDrop),
        ],
        crashes: Vec::new(),
    }
}

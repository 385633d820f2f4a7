//! The chaos run: many orders, random faults on a share of the participant calls,
//! coordinators killed with SIGKILL along the way, long outages that outlast the retry
//! budget, database restarts, a coordinator with a skewed clock, and the invariants checked
//! at the end.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::json;

use super::chaos_links::DbLinkChaos;
use super::{Expect, Order, OrderBranch, Outage, Participant, RetryOptions, Scenario, Settings};
use crate::faults::{Fault, FaultPlan, FaultRule, Match, Side};
use idem::core::Kind;

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
    /// Long outages, each over its own run of consecutive orders, spread over the run.
    pub outages: usize,
    /// Orders each outage hits; 0: one in fifty of the orders, at least ten.
    pub outage_orders: usize,
    /// Restarts of the database server, spread over the orders.
    pub db_restarts: u32,
    /// The last coordinator's wall clock runs this many ms off.
    pub skewed_clock_ms: Option<i64>,
    /// Database-link faults, spread over the orders (see [`DbLinkChaos`]).
    pub db_link: DbLinkChaos,
    /// The coordinators' bound on one database call; with database-link faults and none
    /// given, [`DbLinkChaos::CALL_TIMEOUT_MS`].
    pub database_call_timeout_ms: Option<u64>,
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
            outages: 2,
            outage_orders: 0,
            db_restarts: 0,
            skewed_clock_ms: None,
            db_link: DbLinkChaos::default(),
            database_call_timeout_ms: None,
        }
    }
}

impl ChaosConfig {
    /// Orders each outage hits, after the default and the room there is.
    pub fn orders_per_outage(&self) -> usize {
        if self.outages == 0 {
            return 0;
        }
        let wanted = match self.outage_orders {
            0 => (self.orders / 50).max(10),
            n => n,
        };
        wanted.min(self.orders / self.outages)
    }
}

const SKUS: usize = 12;
const ACCOUNTS: usize = 30;
const CAMPAIGNS: usize = 4;

// The planned mix. Every refusal in a run is one of these, never a shortage: the supply
// grows with the number of orders.
const TCC_SHARE: f64 = 0.5;
/// Orders whose inventory branch asks for more than the SKU's whole stock.
const OVER_STOCK: f64 = 0.05;
/// Sagas whose coupon names a campaign that does not exist.
const UNKNOWN_CAMPAIGN: f64 = 0.10;
/// TCC orders the client aborts after every Try succeeded.
const CLIENT_ABORT: f64 = 0.05;
const QUANTITY: RangeInclusive<i64> = 1..=3;
const AMOUNT: RangeInclusive<i64> = 5..=50;
/// Supply over expected demand. The realized demand of a run spreads around the
/// expectation by a few per cent at a thousand orders; half again more keeps every SKU,
/// account and campaign clear of running out, at any size.
const HEADROOM: f64 = 1.5;

/// The retry budget of the orders a long outage hits: used up in a fraction of a second,
/// so they stall quickly while the outage lasts, rather than after the chaos settings'
/// 30 attempts of up to 500 ms.
const OUTAGE_BUDGET: RetryOptions = RetryOptions {
    max_attempts: Some(4),
    retry_interval_ms: Some(20),
    max_retry_interval_ms: Some(100),
};

/// What each SKU, account and campaign starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supply {
    pub stock_per_sku: i64,
    pub balance_per_account: i64,
    pub coupons_per_campaign: i64,
}

/// The supply for a run of `orders`: the expected demand of the orders meant to succeed,
/// times [`HEADROOM`], plus a floor for small runs, where the spread is wider.
pub fn supply(orders: usize) -> Supply {
    let n = orders as f64;
    let mean = |r: &RangeInclusive<i64>| (r.start() + r.end()) as f64 / 2.0;
    let units = n * (1.0 - OVER_STOCK) * mean(&QUANTITY) / SKUS as f64;
    let money = n * TCC_SHARE * mean(&AMOUNT) / ACCOUNTS as f64;
    let coupons = n * (1.0 - TCC_SHARE) * (1.0 - UNKNOWN_CAMPAIGN) / CAMPAIGNS as f64;
    let sized = |expected: f64, floor: i64| (expected * HEADROOM).ceil() as i64 + floor;
    Supply {
        stock_per_sku: sized(units, 30),
        balance_per_account: sized(money, 500),
        coupons_per_campaign: sized(coupons, 20),
    }
}

/// Builds the chaos scenario: half TCC orders (inventory + payment), half sagas
/// (inventory + coupon); some ask for more stock than exists, some use a campaign that does
/// not exist, some are aborted by the client, so every path is taken. During each long
/// outage, one participant refuses every Confirm, Cancel and compensation of a run of
/// orders until all of them have stalled or ended; then the runner heals it and retries.
pub fn scenario(config: &ChaosConfig) -> Scenario {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let supply = supply(config.orders);
    let stock: BTreeMap<String, i64> = (0..SKUS)
        .map(|i| (format!("sku-{i}"), supply.stock_per_sku))
        .collect();
    let accounts: BTreeMap<String, i64> = (0..ACCOUNTS)
        .map(|i| (format!("acct-{i}"), supply.balance_per_account))
        .collect();
    let campaigns: BTreeMap<String, i64> = (0..CAMPAIGNS)
        .map(|i| (format!("CAMP{i}"), supply.coupons_per_campaign))
        .collect();
    let windows = outage_windows(config);
    let mut orders = Vec::with_capacity(config.orders);
    for n in 0..config.orders {
        let sku = format!("sku-{}", rng.random_range(0..SKUS));
        let quantity = if rng.random_bool(OVER_STOCK) {
            supply.stock_per_sku + 1
        } else {
            rng.random_range(QUANTITY)
        };
        let inventory = OrderBranch {
            participant: Participant::Inventory,
            payload: json!({"sku": sku, "quantity": quantity}),
        };
        let window = windows.iter().position(|w| w.contains(&n));
        let prefix = match window {
            Some(k) => format!("chaos-out{k}-"),
            None => "chaos-".to_owned(),
        };
        let options = window.map(|_| OUTAGE_BUDGET);
        if rng.random_bool(TCC_SHARE) {
            let account = format!("acct-{}", rng.random_range(0..ACCOUNTS));
            orders.push(Order {
                gid: format!("{prefix}tcc-{n:05}"),
                kind: Kind::Tcc,
                branches: vec![
                    inventory,
                    OrderBranch {
                        participant: Participant::Payment,
                        payload: json!({"account": account, "amount": rng.random_range(AMOUNT)}),
                    },
                ],
                abort: rng.random_bool(CLIENT_ABORT),
                late_try: false,
                retry_if_stalled: true,
                options,
            });
        } else {
            let campaign = if rng.random_bool(UNKNOWN_CAMPAIGN) {
                "NO-SUCH-CAMPAIGN".to_owned()
            } else {
                format!("CAMP{}", rng.random_range(0..CAMPAIGNS))
            };
            orders.push(Order {
                gid: format!("{prefix}saga-{n:05}"),
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
                options,
            });
        }
    }
    // Inventory is every order's first branch, so its outage meets every TCC order (a
    // Confirm or a Cancel) and every saga that fails; payment's meets the TCC orders that
    // got past their inventory Try.
    let down = [Participant::Inventory, Participant::Payment];
    let outages = (0..windows.len())
        .map(|k| {
            Outage::new(
                &format!("out{k}"),
                &format!("chaos-out{k}-*"),
                down[k % down.len()],
            )
        })
        .collect();
    const LEASE_MS: u64 = 2_000;
    let call_timeout = match (config.database_call_timeout_ms, config.db_link.total()) {
        (Some(ms), _) => Some(ms),
        (None, 0) => None,
        (None, _) => Some(DbLinkChaos::CALL_TIMEOUT_MS),
    };
    let mut plan = plan(config.fault_rate, config.seed);
    plan.db_link = config.db_link.rules(
        config.orders,
        config.coordinators,
        call_timeout.unwrap_or(DbLinkChaos::CALL_TIMEOUT_MS),
        LEASE_MS,
    );
    Scenario {
        name: format!("chaos-{}-orders-seed-{}", config.orders, config.seed),
        description: "random orders under random faults, coordinator kills and long outages".into(),
        plan,
        coordinators: config.coordinators,
        concurrency: config.concurrency,
        settings: Settings {
            max_attempts: 30,
            retry_interval_ms: 20,
            max_retry_interval_ms: 500,
            request_timeout_ms: 1_000,
            lease_ms: LEASE_MS,
            prepared_timeout_ms: 60_000,
            try_timeout_ms: 3_000,
            kill_every_ms: (config.kills > 0).then_some(config.kill_every_ms),
            kills: config.kills,
            db_restarts: config.db_restarts,
            skewed_clock_ms: config.skewed_clock_ms,
            database_call_timeout_ms: call_timeout,
        },
        stock,
        accounts,
        campaigns,
        orders,
        outages,
        expect: Expect::default(),
        backends: Vec::new(),
    }
}

/// The orders each outage hits: runs of consecutive orders, evenly spread, so that each
/// outage starts and heals while other orders keep running.
fn outage_windows(config: &ChaosConfig) -> Vec<std::ops::Range<usize>> {
    let size = config.orders_per_outage();
    if size == 0 {
        return Vec::new();
    }
    (0..config.outages)
        .map(|k| {
            let centre = (k + 1) * config.orders / (config.outages + 1);
            let start = centre
                .saturating_sub(size / 2)
                .min(config.orders - size)
                .max(k * size);
            start..start + size
        })
        .collect()
}

/// Whether the order is refused by design, whatever the faults: it asks for more stock
/// than its SKU has, more money than its account has, a campaign that does not exist or
/// out of coupons, or its client aborts.
pub fn planned_to_fail(scenario: &Scenario, order: &Order) -> bool {
    let asks = |branch: &OrderBranch, name: &str, supply: &BTreeMap<String, i64>, n: &str| {
        let wanted = branch.payload.get(n).and_then(|v| v.as_i64()).unwrap_or(1);
        let name = branch.payload[name].as_str().unwrap_or_default();
        supply.get(name).is_none_or(|have| wanted > *have)
    };
    order.abort
        || order.branches.iter().any(|b| match b.participant {
            Participant::Inventory => asks(b, "sku", &scenario.stock, "quantity"),
            Participant::Payment => asks(b, "account", &scenario.accounts, "amount"),
            Participant::Coupon => asks(b, "coupon", &scenario.campaigns, "count"),
        })
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
        db_link: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::glob;

    fn config(orders: usize) -> ChaosConfig {
        ChaosConfig {
            orders,
            ..ChaosConfig::default()
        }
    }

    /// Everything the orders ask of one participant, if every one of them went through
    /// (the planned refusals left out: they take nothing).
    fn demand(
        scenario: &Scenario,
        participant: Participant,
        name: &str,
        n: &str,
    ) -> BTreeMap<String, i64> {
        let mut out = BTreeMap::new();
        for order in &scenario.orders {
            for b in order
                .branches
                .iter()
                .filter(|b| b.participant == participant)
            {
                let key = b.payload[name].as_str().unwrap_or_default().to_owned();
                let want = b.payload.get(n).and_then(|v| v.as_i64()).unwrap_or(1);
                let supply = match participant {
                    Participant::Inventory => &scenario.stock,
                    Participant::Payment => &scenario.accounts,
                    Participant::Coupon => &scenario.campaigns,
                };
                if supply.get(&key).is_some_and(|have| want <= *have) {
                    *out.entry(key).or_default() += want;
                }
            }
        }
        out
    }

    /// The planned share of failures, after checking that every SKU, account and campaign
    /// can serve all that is asked of it with a quarter to spare.
    fn planned_failures(orders: usize) -> f64 {
        let scenario = scenario(&config(orders));
        assert_eq!(scenario.orders.len(), orders);
        for (participant, name, n, supply) in [
            (Participant::Inventory, "sku", "quantity", &scenario.stock),
            (
                Participant::Payment,
                "account",
                "amount",
                &scenario.accounts,
            ),
            (Participant::Coupon, "coupon", "count", &scenario.campaigns),
        ] {
            for (key, total) in demand(&scenario, participant, name, n) {
                let have = supply[&key];
                assert!(
                    total as f64 <= 0.75 * have as f64,
                    "{orders} orders: {key} asked {total} of {have}"
                );
            }
        }
        let failing = scenario
            .orders
            .iter()
            .filter(|o| planned_to_fail(&scenario, o))
            .count();
        failing as f64 / orders as f64
    }

    #[test]
    fn supply_grows_with_the_orders_so_the_planned_mix_is_the_same_at_any_size() {
        let small = planned_failures(1_000);
        let large = planned_failures(10_000);
        // 1 - 0.95 × (0.5 × 0.95 + 0.5 × 0.9): over-stock, aborted, unknown campaign.
        let design = 1.0 - (1.0 - OVER_STOCK) * (1.0 - 0.5 * CLIENT_ABORT - 0.5 * UNKNOWN_CAMPAIGN);
        for share in [small, large] {
            assert!(
                (share - design).abs() < 0.025,
                "{share} planned, {design} designed"
            );
        }
        assert!(
            (small - large).abs() < 0.025,
            "{small} at 1,000, {large} at 10,000"
        );
        // The CI run's size too.
        planned_failures(150);
    }

    #[test]
    fn over_stock_orders_ask_for_more_than_the_whole_stock() {
        for orders in [150, 10_000] {
            let scenario = scenario(&config(orders));
            let stock = supply(orders).stock_per_sku;
            let over = scenario
                .orders
                .iter()
                .filter(|o| o.branches[0].payload["quantity"].as_i64() > Some(stock))
                .count();
            assert!(over > 0, "{orders} orders: none over stock");
        }
    }

    #[test]
    fn outages_hit_their_own_runs_of_orders_with_a_small_budget() {
        for (orders, outages) in [(150, 2), (1_000, 2), (10_000, 3)] {
            let config = ChaosConfig {
                outages,
                ..config(orders)
            };
            let scenario = scenario(&config);
            assert_eq!(scenario.outages.len(), outages);
            let mut hit = 0;
            for outage in &scenario.outages {
                let matching: Vec<&Order> = scenario
                    .orders
                    .iter()
                    .filter(|o| glob(&outage.gid, &o.gid))
                    .collect();
                assert_eq!(
                    matching.len(),
                    config.orders_per_outage(),
                    "{}",
                    outage.name
                );
                assert!(matching.iter().all(|o| o.options == Some(OUTAGE_BUDGET)));
                // Some of them are TCC orders, which meet the outage whatever they decide.
                assert!(matching.iter().any(|o| o.kind == Kind::Tcc));
                hit += matching.len();
            }
            let budgeted = scenario
                .orders
                .iter()
                .filter(|o| o.options.is_some())
                .count();
            assert_eq!(budgeted, hit, "outage windows overlap or leak");
        }
        let none = scenario(&ChaosConfig {
            outages: 0,
            ..config(100)
        });
        assert!(none.outages.is_empty());
        assert!(none.orders.iter().all(|o| o.options.is_none()));
    }
}

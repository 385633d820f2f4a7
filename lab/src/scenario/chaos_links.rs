//! The database-link faults of a chaos run: which, how long, and at which orders.

use crate::faults::{DbLinkFault, DbLinkRule};

/// The database-link faults of a chaos run: freezes, latency episodes and cuts of the
/// coordinators' links to their database, interleaved and spread evenly over the orders.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DbLinkChaos {
    pub freezes: u32,
    /// The freezes' lengths, used in turn; empty: one below the call timeout, one between
    /// it and the lease, one past the lease (see [`DbLinkChaos::freeze_lengths`]).
    pub freeze_ms: Vec<u64>,
    pub latencies: u32,
    /// Added per chunk, each way, during a latency episode (which lasts two leases).
    pub latency_ms: u64,
    pub cuts: u32,
}

impl DbLinkChaos {
    /// The call timeout a chaos run with database-link faults gives its coordinators when
    /// none is named: half the chaos lease, so a freeze can outlast the one without the
    /// other.
    pub const CALL_TIMEOUT_MS: u64 = 1_000;

    pub fn total(&self) -> u32 {
        self.freezes + self.latencies + self.cuts
    }

    /// The freezes' lengths, in turn: as given, or shorter than the call timeout, between
    /// the call timeout and the lease, and past the lease.
    pub fn freeze_lengths(&self, call_timeout_ms: u64, lease_ms: u64) -> Vec<u64> {
        if !self.freeze_ms.is_empty() {
            return self.freeze_ms.clone();
        }
        vec![
            call_timeout_ms / 2,
            (call_timeout_ms + lease_ms) / 2,
            2 * lease_ms,
        ]
    }

    /// The rules: the kinds interleaved (freeze, latency, cut, freeze, ...), fired at
    /// evenly spread orders; every other freeze hits one coordinator's link (in turn), the
    /// others every link at once.
    pub(super) fn rules(
        &self,
        orders: usize,
        coordinators: usize,
        call_timeout_ms: u64,
        lease_ms: u64,
    ) -> Vec<DbLinkRule> {
        let lengths = self.freeze_lengths(call_timeout_ms, lease_ms);
        let mut left = [self.freezes, self.latencies, self.cuts];
        let mut faults = Vec::new();
        let mut freezes = 0usize;
        while left.iter().any(|n| *n > 0) {
            for (kind, n) in left.iter_mut().enumerate() {
                if *n == 0 {
                    continue;
                }
                *n -= 1;
                let (fault, node) = match kind {
                    0 => {
                        let k = freezes;
                        freezes += 1;
                        let node =
                            (k % 2 == 1).then(|| format!("c{}", (k / 2) % coordinators.max(1)));
                        (
                            DbLinkFault::Freeze {
                                ms: lengths[k % lengths.len()].max(1),
                            },
                            node,
                        )
                    }
                    1 => (
                        DbLinkFault::Latency {
                            to_server_ms: self.latency_ms,
                            to_client_ms: self.latency_ms,
                            for_ms: 2 * lease_ms,
                        },
                        None,
                    ),
                    _ => (DbLinkFault::Cut, None),
                };
                faults.push((fault, node));
            }
        }
        let at = super::restarts::points(orders, faults.len() as u32);
        faults
            .into_iter()
            .zip(at)
            .map(|((fault, node), at_order)| DbLinkRule {
                at_order,
                after_ms: 0,
                node,
                fault,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{ChaosConfig, chaos_scenario as scenario};

    fn config(orders: usize) -> ChaosConfig {
        ChaosConfig {
            orders,
            ..ChaosConfig::default()
        }
    }

    #[test]
    fn database_link_faults_interleave_and_spread_over_the_orders() {
        let faulty = ChaosConfig {
            db_link: DbLinkChaos {
                freezes: 3,
                latencies: 1,
                cuts: 1,
                latency_ms: 20,
                ..DbLinkChaos::default()
            },
            coordinators: 3,
            ..config(600)
        };
        let chaos = scenario(&faulty);
        // The call timeout comes down so that freezes can outlast it, and not the lease.
        assert_eq!(
            chaos.settings.database_call_timeout_ms,
            Some(DbLinkChaos::CALL_TIMEOUT_MS)
        );
        let rules = &chaos.plan.db_link;
        let shown: Vec<(usize, Option<&str>, String)> = rules
            .iter()
            .map(|r| (r.at_order, r.node.as_deref(), r.fault.label()))
            .collect();
        assert_eq!(
            shown,
            [
                (100, None, "freeze 500 ms".to_owned()),
                (
                    200,
                    None,
                    "latency +20/+20 ms per chunk for 4000 ms".to_owned()
                ),
                (300, None, "cut (reset every connection)".to_owned()),
                (400, Some("c0"), "freeze 1500 ms".to_owned()),
                (500, None, "freeze 4000 ms".to_owned()),
            ]
        );
        // One below the call timeout, one between it and the lease, one past the lease.
        let lease = chaos.settings.lease_ms;
        assert!(500 < 1_000 && (1_000..lease).contains(&1_500) && 4_000 > lease);
        // Without database-link faults nothing changes.
        let plain = scenario(&config(600));
        assert!(plain.plan.db_link.is_empty());
        assert_eq!(plain.settings.database_call_timeout_ms, None);
    }
}

//! The demo's participant services (inventory, payment, coupon) served in this process: the
//! one way the benchmark and the scenarios start them, each on its own database, seeded,
//! on a loopback port, with whatever layer the caller puts in front (the scenarios' faults
//! and outages; nothing for the benchmark).

use std::collections::BTreeMap;

use axum::Router;
use idem_demo::{Service, coupon, inventory, payment};
use serde::{Deserialize, Serialize};
use sqlx::AnyPool;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// One of the demo's participant services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Participant {
    Inventory,
    Payment,
    Coupon,
}

/// Which services to start, where each keeps its rows, and what they hold at the start.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    /// The database URL of each service to start.
    pub databases: BTreeMap<Participant, String>,
    /// Inventory: SKU and units available.
    pub stock: Vec<(String, i64)>,
    /// Payment: account and balance.
    pub accounts: Vec<(String, i64)>,
    /// Coupon: campaign code and coupons left.
    pub campaigns: Vec<(String, i64)>,
}

/// The running services.
pub struct DemoParticipants {
    pools: BTreeMap<Participant, AnyPool>,
    services: Vec<Service>,
    urls: BTreeMap<Participant, String>,
}

impl DemoParticipants {
    /// Opens (and migrates) each service's database, seeds it, and serves each service's
    /// routes behind `wrap(participant, routes)` on a loopback port.
    pub async fn start(
        setup: &Setup,
        wrap: impl Fn(Participant, Router) -> Router,
    ) -> Result<DemoParticipants, Error> {
        let mut pools = BTreeMap::new();
        let mut services = Vec::new();
        let mut urls = BTreeMap::new();
        for (&participant, database) in &setup.databases {
            let (pool, routes, path) = match participant {
                Participant::Inventory => {
                    let pool = inventory::open(database).await?;
                    for (sku, n) in &setup.stock {
                        inventory::seed(&pool, sku, *n).await?;
                    }
                    let routes = inventory::router(pool.clone());
                    (pool, routes, inventory::RESERVE_PATH)
                }
                Participant::Payment => {
                    let pool = payment::open(database).await?;
                    for (account, n) in &setup.accounts {
                        payment::seed(&pool, account, *n).await?;
                    }
                    let routes = payment::router(pool.clone());
                    (pool, routes, payment::FREEZE_PATH)
                }
                Participant::Coupon => {
                    let pool = coupon::open(database).await?;
                    for (code, n) in &setup.campaigns {
                        coupon::seed(&pool, code, *n).await?;
                    }
                    let routes = coupon::router(pool.clone());
                    (pool, routes, coupon::ISSUE_PATH)
                }
            };
            let service = idem_demo::spawn(wrap(participant, routes), "127.0.0.1:0").await?;
            urls.insert(participant, service.url(path));
            pools.insert(participant, pool);
            services.push(service);
        }
        Ok(DemoParticipants {
            pools,
            services,
            urls,
        })
    }

    /// Each service's branch URL (the one a transaction's branches name).
    pub fn urls(&self) -> &BTreeMap<Participant, String> {
        &self.urls
    }

    /// A service's branch URL.
    pub fn url(&self, participant: Participant) -> Result<&str, Error> {
        self.urls
            .get(&participant)
            .map(String::as_str)
            .ok_or_else(|| format!("no {participant:?} service in this run").into())
    }

    /// A pool on a service's database, for reading what it did.
    pub fn pool(&self, participant: Participant) -> Result<&AnyPool, Error> {
        self.pools
            .get(&participant)
            .ok_or_else(|| format!("no {participant:?} service in this run").into())
    }

    /// Fresh pools for the caller's own reads: after a database restart the pools' idle
    /// connections may be dead (they do not ping before use), and the final state must
    /// not meet a stale socket. The services keep theirs (the old handles are theirs too,
    /// so they are dropped, not closed).
    pub async fn reconnect(&mut self, setup: &Setup) -> Result<(), Error> {
        for (participant, database) in &setup.databases {
            let fresh = idem_demo::connect(database).await?;
            self.pools.insert(*participant, fresh);
        }
        Ok(())
    }

    /// Stops the services and closes the pools.
    pub async fn stop(self) {
        for service in self.services {
            let _ = service.stop().await;
        }
        for pool in self.pools.into_values() {
            pool.close().await;
        }
    }
}

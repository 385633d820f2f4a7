//! The example participants, in this process, behind the participant-side fault layer
//! (and, in front of that, the long outages: a service that is down never gets to see a
//! call, however the network treats it).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Error, Participant, RunConfig, Scenario, outage::Outages};
use crate::faults::{ParticipantFaults, participant_faults};
use idem_demo::{coupon, inventory, payment};

/// The participant services of a run.
pub struct Participants {
    pub inventory: sqlx::AnyPool,
    pub payment: sqlx::AnyPool,
    pub coupon: sqlx::AnyPool,
    services: Vec<idem_demo::Service>,
    pub faults: Arc<ParticipantFaults>,
    pub urls: BTreeMap<Participant, String>,
}

impl Participants {
    pub(super) async fn start(
        scenario: &Scenario,
        config: &RunConfig,
        outages: &Arc<Outages>,
    ) -> Result<Participants, Error> {
        let faults = ParticipantFaults::new(Arc::new(scenario.plan.clone()));
        let inventory_db = inventory::open(&config.inventory_db).await?;
        let payment_db = payment::open(&config.payment_db).await?;
        let coupon_db = coupon::open(&config.coupon_db).await?;
        for (sku, n) in &scenario.stock {
            inventory::seed(&inventory_db, sku, *n).await?;
        }
        for (account, n) in &scenario.accounts {
            payment::seed(&payment_db, account, *n).await?;
        }
        for (code, n) in &scenario.campaigns {
            coupon::seed(&coupon_db, code, *n).await?;
        }
        let layer = |participant, router: axum::Router| {
            let router = router.layer(axum::middleware::from_fn_with_state(
                Arc::clone(&faults),
                participant_faults,
            ));
            outages.layer(participant, router)
        };
        let inv = idem_demo::spawn(
            layer(
                Participant::Inventory,
                inventory::router(inventory_db.clone()),
            ),
            "127.0.0.1:0",
        )
        .await?;
        let pay = idem_demo::spawn(
            layer(Participant::Payment, payment::router(payment_db.clone())),
            "127.0.0.1:0",
        )
        .await?;
        let cou = idem_demo::spawn(
            layer(Participant::Coupon, coupon::router(coupon_db.clone())),
            "127.0.0.1:0",
        )
        .await?;
        let urls = BTreeMap::from([
            (Participant::Inventory, inv.url(inventory::RESERVE_PATH)),
            (Participant::Payment, pay.url(payment::FREEZE_PATH)),
            (Participant::Coupon, cou.url(coupon::ISSUE_PATH)),
        ]);
        Ok(Participants {
            inventory: inventory_db,
            payment: payment_db,
            coupon: coupon_db,
            services: vec![inv, pay, cou],
            faults,
            urls,
        })
    }

    /// Fresh pools for the runner's own reads: after a database restart the pools' idle
    /// connections may be dead (the participants' pools do not ping before use), and the
    /// checks must read the final state, not meet a stale socket. The services keep theirs.
    pub(super) async fn reconnect(&mut self, config: &RunConfig) -> Result<(), Error> {
        self.inventory = idem_demo::connect(&config.inventory_db).await?;
        self.payment = idem_demo::connect(&config.payment_db).await?;
        self.coupon = idem_demo::connect(&config.coupon_db).await?;
        Ok(())
    }

    pub async fn stop(self) {
        for s in self.services {
            let _ = s.stop().await;
        }
        self.inventory.close().await;
        self.payment.close().await;
        self.coupon.close().await;
    }
}

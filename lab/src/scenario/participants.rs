//! The scenario's participants: the demo services ([`crate::participants`]) behind the
//! participant-side fault layer, and in front of that the long outages (a service that is
//! down never gets to see a call, however the network treats it).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Error, RunConfig, Scenario, outage::Outages};
use crate::faults::ParticipantFaults;
use crate::participants::{DemoParticipants, Participant, Setup};

/// The participant services of a run, and what their fault layer saw.
pub struct Participants {
    demo: DemoParticipants,
    setup: Setup,
    pub faults: Arc<ParticipantFaults>,
}

impl Participants {
    pub(super) async fn start(
        scenario: &Scenario,
        config: &RunConfig,
        outages: &Arc<Outages>,
    ) -> Result<Participants, Error> {
        let faults = ParticipantFaults::new(Arc::new(scenario.plan.clone()));
        let setup = Setup {
            databases: BTreeMap::from([
                (Participant::Inventory, config.inventory_db.clone()),
                (Participant::Payment, config.payment_db.clone()),
                (Participant::Coupon, config.coupon_db.clone()),
            ]),
            stock: scenario.stock.clone().into_iter().collect(),
            accounts: scenario.accounts.clone().into_iter().collect(),
            campaigns: scenario.campaigns.clone().into_iter().collect(),
        };
        let demo = DemoParticipants::start(&setup, |participant, routes| {
            outages.layer(participant, faults.layer(routes))
        })
        .await?;
        Ok(Participants {
            demo,
            setup,
            faults,
        })
    }

    /// Each service's branch URL.
    pub fn urls(&self) -> &BTreeMap<Participant, String> {
        self.demo.urls()
    }

    /// A pool on a service's database, for the checks.
    pub fn pool(&self, participant: Participant) -> Result<&sqlx::AnyPool, Error> {
        self.demo.pool(participant)
    }

    /// Fresh pools for the checks after a database restart (see
    /// [`DemoParticipants::reconnect`]).
    pub(super) async fn reconnect(&mut self) -> Result<(), Error> {
        self.demo.reconnect(&self.setup).await
    }

    pub async fn stop(self) {
        self.demo.stop().await;
    }
}

//! Failure replay in a participant's own test suite.
//!
//! A [`Harness`] is a real coordinator in the test's process (the same engine as `idem
//! serve`, over real HTTP on loopback) whose calls meet the coordinator-side rules of a
//! fault plan (answers lost, calls delayed past their timeout, duplicates), and a layer
//! that puts the participant-side rules (duplicates delivered, a call held until another
//! has arrived, refusals) in front of the service under test. The test runs its orders
//! through the harness and checks its own invariants on its own database afterwards.
//!
//! A whole example with a service of its own, the SDK's barrier and the checks:
//! `lab/examples/own_service.rs` (`cargo run -p idem-lab --example own_service`).
//!
//! ```no_run
//! # async fn example(my_router: axum::Router) -> Result<(), idem::cli::BoxError> {
//! use idem_lab::faults::FaultPlan;
//! use idem_lab::harness::{Harness, Step};
//!
//! // Every action is sent twice, and every answer to a compensation is lost.
//! let plan = FaultPlan::parse(
//!     r#"{"rules": [
//!         {"match": {"op": "action"}, "fault": {"type": "duplicate"}},
//!         {"match": {"op": "compensate"}, "fault": {"type": "commit_then_drop"}, "times": 1}
//!     ]}"#,
//!     false,
//! )?;
//! let harness = Harness::start("sqlite::memory:", plan).await?;
//! let service = harness.serve(my_router).await?;
//! let outcome = harness
//!     .saga("order-1", &[Step::new(service.url("/points/add"), service.url("/points/undo"), serde_json::json!({}))])
//!     .await?;
//! assert_eq!(outcome.status, idem_client::Status::Succeeded);
//! // ... then check the service's own tables: applied once, whatever the plan did.
//! # Ok(()) }
//! ```
//!
//! Crash points are not applied here: they stop the process, which is the test. The
//! scenario runner ([`crate::scenario`]) runs coordinators as child processes for those.

use std::sync::Arc;
use std::time::Duration;

use idem::cli::BoxError;
use idem::server::{RunningServer, ServerConfig};
use idem::transport::Transport;
use idem_client::{Client, Status, TxView};
use serde_json::Value;

use crate::faults::{Delivery, FaultPlan, FaultyTransport, ParticipantFaults};

/// One saga step: the action, its compensation and the JSON payload both receive as
/// their body.
#[derive(Clone, Debug)]
pub struct Step {
    pub action: String,
    pub compensate: String,
    pub payload: Value,
}

impl Step {
    pub fn new(action: impl Into<String>, compensate: impl Into<String>, payload: Value) -> Step {
        Step {
            action: action.into(),
            compensate: compensate.into(),
            payload,
        }
    }
}

/// How a transaction ended, as the coordinator reports it.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Succeeded, failed or stalled.
    pub status: Status,
    /// The coordinator's whole view of the transaction.
    pub view: TxView,
}

/// A coordinator in this process with a fault plan, and the layer for the service under
/// test.
pub struct Harness {
    server: RunningServer,
    faults: Arc<ParticipantFaults>,
    client: Client,
}

impl Harness {
    /// Starts a coordinator on `database_url` (e.g. `sqlite::memory:`, or a fresh
    /// PostgreSQL or MariaDB database) with `plan`'s call rules applied to its calls.
    /// Retries are quick (20 ms, doubling to 200 ms) so that a test's faults resolve fast.
    pub async fn start(database_url: &str, plan: FaultPlan) -> Result<Harness, BoxError> {
        if !plan.crashes.is_empty() {
            return Err(
                "crash points stop the process: run them with the scenario runner, \
                        whose coordinators are child processes"
                    .into(),
            );
        }
        let plan = Arc::new(plan);
        let mut config = ServerConfig::new(database_url, "127.0.0.1:0".parse()?);
        config.engine.node = format!(
            "harness-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        config.engine.defaults.retry_interval_ms = 20;
        config.engine.defaults.max_retry_interval_ms = 200;
        config.engine.defaults.request_timeout_ms = 2_000;
        config.engine.recovery_interval = Duration::from_millis(50);
        let real: Arc<dyn Transport> = Arc::new(config.transport()?);
        let transport = Arc::new(FaultyTransport::new(real, Arc::clone(&plan)));
        let server = idem::server::start_with(config, transport, Vec::new()).await?;
        let client = Client::new(&server.url())?;
        Ok(Harness {
            server,
            faults: ParticipantFaults::new(plan),
            client,
        })
    }

    /// The coordinator's API base URL, for requests of the test's own.
    pub fn api(&self) -> String {
        self.server.url()
    }

    /// A client of the coordinator, for the test's own transactions (TCC, messages) and
    /// for reading what became of them.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// `router` with the plan's participant-side rules in front of it.
    pub fn wrap(&self, router: axum::Router) -> axum::Router {
        self.faults.layer(router)
    }

    /// Serves `router`, wrapped, on a loopback port.
    pub async fn serve(&self, router: axum::Router) -> Result<idem_demo::Service, BoxError> {
        Ok(idem_demo::spawn(self.wrap(router), "127.0.0.1:0").await?)
    }

    /// Runs a saga and waits until it is finished or stalled.
    pub async fn saga(&self, gid: &str, steps: &[Step]) -> Result<Outcome, BoxError> {
        let saga = steps.iter().fold(self.client.saga(gid), |saga, s| {
            saga.step(&s.action, &s.compensate, &s.payload)
        });
        let view = saga
            .wait_result(true)
            .create()
            .await
            .map_err(|e| format!("create {gid}: {e}"))?;
        self.settle(gid, view).await
    }

    /// A `wait_result` answer may come before the end (the wait is bounded); reads again
    /// until the transaction is finished or stalled.
    async fn settle(&self, gid: &str, mut view: TxView) -> Result<Outcome, BoxError> {
        let settled = |v: &TxView| v.status.is_terminal() || v.status == Status::Stalled;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !settled(&view) {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("{gid} did not settle in 60 s: {view:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            view = self.client.get(gid).await?;
        }
        Ok(Outcome {
            status: view.status,
            view,
        })
    }

    /// Every call the service under test received, with the fault applied to it.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.faults.deliveries()
    }

    /// Stops the coordinator.
    pub async fn stop(self) -> std::io::Result<()> {
        self.server.stop().await
    }
}

//! What lease mode hands the service and asks it: the step a fact source is asked about,
//! the fact source's answer, the claim's ticket, and what became of a claim or a
//! completion.

use std::future::Future;

use super::Outcome;
use crate::kit::{Op, TransType};
use crate::tenant::DEFAULT_TENANT;

/// The step a [`FactSource`] is asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRef {
    /// The transaction kind.
    pub trans_type: TransType,
    /// The tenant of the global transaction.
    pub tenant: String,
    /// The global transaction's id (unique within its tenant).
    pub gid: String,
    /// The branch within it.
    pub branch_id: String,
    /// The forward op (`try` or `action`).
    pub op: Op,
    /// The step component of the barrier key (`01`, ...).
    pub barrier_id: String,
}

impl StepRef {
    /// A key that is the same for every attempt and every owner of this step, and differs
    /// between tenants: give it to the external service as its idempotency key (and look the
    /// effect up by it in the fact source).
    ///
    /// `<gid>:<branch>:<op>:<step>` in the default tenant (the key steps had before tenants,
    /// so a claim made by an older SDK is still found), `<tenant>/<gid>:...` in any other: the
    /// coordinator allows no `/` in a gid, so the two forms never meet.
    pub fn external_key(&self) -> String {
        let key = format!(
            "{}:{}:{}:{}",
            self.gid, self.branch_id, self.op, self.barrier_id
        );
        if self.tenant == DEFAULT_TENANT {
            key
        } else {
            format!("{}/{key}", self.tenant)
        }
    }
}

/// What the service's source of truth says about a step whose claim expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact<T> {
    /// The external effect happened; this is the step's result. Recorded, not redone.
    Happened(T),
    /// It did not happen and no longer can: the step may run again under a new owner.
    NotHappened,
    /// Cannot tell yet (the provider is down, the payment is pending): stay in progress.
    Unknown,
}

/// The service's hook that answers, from the external system, whether a step's effect
/// happened. Asked only after a claim's lease expired, never inside a transaction.
pub trait FactSource<T>: Send + Sync {
    /// Looks the step's effect up (typically by [`StepRef::external_key`]).
    fn check(&self, step: &StepRef) -> impl Future<Output = Fact<T>> + Send;
}

/// A committed claim on a step: who holds it and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTicket {
    /// The step claimed.
    pub step: StepRef,
    /// This holder's token; every later write names it.
    pub owner_token: String,
    /// The lease's end, Unix milliseconds on the step's clock.
    pub lease_until_ms: i64,
    /// True when the claim was taken over from an expired one (the fact source said the
    /// effect had not happened).
    pub taken_over: bool,
}

/// What [`LeasedStep::claim`](super::LeasedStep::claim) got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed<T> {
    /// The step is this caller's to run: make the external call, then
    /// [`LeasedStep::complete`](super::LeasedStep::complete).
    Acquired(LeaseTicket),
    /// The step is settled; this is its outcome (a duplicate, a rejected late Try, or one
    /// the fact source answered).
    Settled(Outcome<T>),
}

/// What became of [`LeasedStep::complete`](super::LeasedStep::complete).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion<T> {
    /// The result is recorded; it is the step's result.
    Recorded,
    /// The claim had been taken over or settled by someone else; the write was refused.
    /// `current` is the step's settled outcome, or `None` while a newer owner holds it. A
    /// `Some(Outcome::Rejected)` means the step was settled as not happened while this call's
    /// external effect was landing: the service must undo that effect.
    Stale {
        /// What the row says now.
        current: Option<Outcome<T>>,
    },
}

//! What the engine reports as it works: calls, status changes, named points, and the
//! events an operator watches (creations and their repeats, operator requests, claims and
//! leases). Metrics, the event log, recording and fault injection hang off [`Observer`].

use std::sync::Arc;
use std::time::Duration;

use crate::core::{Kind, Millis, Status, Transaction};
use crate::transport::{CallRequest, CallResult};

/// Named points in the driver, reported to the [`Observer`]. Fault plans crash the
/// process at them to test recovery from exactly there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Point {
    /// A commit or abort decision is about to be stored.
    BeforeDecisionStored,
    /// The decision is stored; no branch has been called yet.
    AfterDecisionStored,
    /// A round of calls came back but is not stored yet.
    AfterCallsBeforeRecord,
    /// A round's answers are stored.
    AfterRoundStored,
}

impl Point {
    pub fn as_str(self) -> &'static str {
        match self {
            Point::BeforeDecisionStored => "before_decision_stored",
            Point::AfterDecisionStored => "after_decision_stored",
            Point::AfterCallsBeforeRecord => "after_calls_before_record",
            Point::AfterRoundStored => "after_round_stored",
        }
    }
}

/// The phases of a driver's round, as [`Observer::round_phase`] times them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoundPhase {
    /// Waiting for call slots.
    Slots,
    /// The round's calls, concurrent.
    Calls,
    /// From the end of one round's calls to the start of the next round's: the store
    /// write and scheduling.
    Gap,
}

impl RoundPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RoundPhase::Slots => "slots",
            RoundPhase::Calls => "calls",
            RoundPhase::Gap => "gap",
        }
    }
}

/// What a create request found under its gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creation {
    /// The gid was free: a new transaction.
    Created,
    /// The same gid with the same request: absorbed, the first result returned.
    Repeat,
    /// The same gid with another request: refused.
    Conflict,
}

/// An operator's request that changed a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OperatorAction {
    Retry,
    ForceStop,
}

impl OperatorAction {
    pub fn as_str(self) -> &'static str {
        match self {
            OperatorAction::Retry => "retry",
            OperatorAction::ForceStop => "force_stop",
        }
    }
}

/// Watches the engine. Every method has an empty default, so an observer implements only
/// what it needs.
pub trait Observer: Send + Sync + 'static {
    fn call(&self, _request: &CallRequest, _result: &CallResult, _started_at: Millis) {}
    fn status(&self, _gid: &str, _from: Status, _to: Status, _at: Millis) {}
    /// A stored status change, with both states (kind, reason, last error).
    fn changed(&self, _before: &Transaction, _after: &Transaction) {}
    fn point(&self, _point: Point, _gid: &str) {}
    /// This process tried to write progress but another coordinator owns the
    /// transaction now: the write was refused and the driver stops.
    fn fenced(&self, _gid: &str) {}
    /// A create request, and what it found under its gid.
    fn create(&self, _kind: Kind, _creation: Creation) {}
    /// An operator's retry or force-stop was stored; `after` is the new state.
    fn operator(&self, _action: OperatorAction, _after: &Transaction) {}
    /// The recovery loop claimed `tx`; `previous_owner` is the token the row had, and
    /// `takeover` says whether it was another process's (its lease ran out or was handed
    /// back).
    fn claimed(&self, _tx: &Transaction, _previous_owner: Option<&str>, _takeover: bool) {}
    /// A driver extended its lease.
    fn renewed(&self, _gid: &str) {}
    /// A driver found its lease taken at a renewal and stopped.
    fn lease_lost(&self, _gid: &str) {}
    /// One phase of a driver's round took `took`.
    fn round_phase(&self, _phase: RoundPhase, _took: Duration) {}
}

/// The observer that watches nothing.
pub struct NoObserver;

impl Observer for NoObserver {}

/// Several observers as one.
pub struct Observers(pub Vec<Arc<dyn Observer>>);

impl Observer for Observers {
    fn call(&self, request: &CallRequest, result: &CallResult, started_at: Millis) {
        self.0
            .iter()
            .for_each(|o| o.call(request, result, started_at));
    }
    fn status(&self, gid: &str, from: Status, to: Status, at: Millis) {
        self.0.iter().for_each(|o| o.status(gid, from, to, at));
    }
    fn changed(&self, before: &Transaction, after: &Transaction) {
        self.0.iter().for_each(|o| o.changed(before, after));
    }
    fn point(&self, point: Point, gid: &str) {
        self.0.iter().for_each(|o| o.point(point, gid));
    }
    fn fenced(&self, gid: &str) {
        self.0.iter().for_each(|o| o.fenced(gid));
    }
    fn create(&self, kind: Kind, creation: Creation) {
        self.0.iter().for_each(|o| o.create(kind, creation));
    }
    fn operator(&self, action: OperatorAction, after: &Transaction) {
        self.0.iter().for_each(|o| o.operator(action, after));
    }
    fn claimed(&self, tx: &Transaction, previous_owner: Option<&str>, takeover: bool) {
        self.0
            .iter()
            .for_each(|o| o.claimed(tx, previous_owner, takeover));
    }
    fn renewed(&self, gid: &str) {
        self.0.iter().for_each(|o| o.renewed(gid));
    }
    fn lease_lost(&self, gid: &str) {
        self.0.iter().for_each(|o| o.lease_lost(gid));
    }
    fn round_phase(&self, phase: RoundPhase, took: Duration) {
        self.0.iter().for_each(|o| o.round_phase(phase, took));
    }
}

/// Logs, at the default level and with the gid, kind, status and reason as fields, what an
/// operator on call must see without asking: a transaction that failed, stalled, was
/// force-stopped, or was taken over from another process.
pub struct EventLog;

impl Observer for EventLog {
    fn changed(&self, before: &Transaction, after: &Transaction) {
        let (gid, kind, status) = (after.gid.as_str(), after.kind.as_str(), after.status);
        let why = why(after);
        let reason = why.as_ref();
        let from = before.status.as_str();
        macro_rules! line {
            ($level:ident, $message:literal) => {
                tracing::$level!(gid, kind, status = status.as_str(), from, reason, $message)
            };
        }
        match after.status {
            Status::Stalled => line!(
                warn,
                "transaction stalled: nothing more is called until an operator retries"
            ),
            // A failed saga or an aborted TCC is often the business's answer, not trouble.
            Status::Failed => line!(info, "transaction failed"),
            _ => {}
        }
    }

    fn operator(&self, action: OperatorAction, after: &Transaction) {
        if action == OperatorAction::ForceStop {
            tracing::warn!(
                gid = after.gid,
                kind = after.kind.as_str(),
                status = after.status.as_str(),
                reason = why(after).as_ref(),
                "transaction force-stopped by an operator"
            );
        }
    }

    fn claimed(&self, tx: &Transaction, previous_owner: Option<&str>, takeover: bool) {
        if takeover {
            tracing::warn!(
                gid = tx.gid,
                kind = tx.kind.as_str(),
                status = tx.status.as_str(),
                previous_owner,
                reason = "the previous owner's lease ran out or was handed back",
                "taking over a transaction from another coordinator"
            );
        }
    }
}

/// Redacted: a reason or an error can quote a URL with its userinfo.
fn why(tx: &Transaction) -> std::borrow::Cow<'_, str> {
    let text = tx
        .reason
        .as_deref()
        .or(tx.last_error.as_deref())
        .unwrap_or("");
    crate::outbound::redact_userinfo(text)
}

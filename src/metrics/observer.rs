//! The engine's events as counters.

use std::time::Duration;

use crate::core::{Millis, Status, Transaction};
use crate::engine::{Creation, Observer, OperatorAction, RoundPhase};
use crate::transport::{CallRequest, CallResult};

/// Counts engine events into metrics.
pub struct MetricsObserver;

impl Observer for MetricsObserver {
    fn call(&self, request: &CallRequest, result: &CallResult, _started_at: Millis) {
        let op = request.action.op();
        metrics::counter!(
            "idem_branch_calls_total",
            "op" => op,
            "outcome" => result.outcome.label()
        )
        .increment(1);
        if request.attempt > 1 {
            metrics::counter!("idem_branch_retries_total", "op" => op).increment(1);
        }
        metrics::histogram!("idem_branch_call_seconds", "op" => op)
            .record(result.duration.as_secs_f64());
    }

    fn status(&self, _gid: &str, _from: Status, to: Status, _at: Millis) {
        metrics::counter!("idem_transactions_total", "status" => to.as_str()).increment(1);
    }

    fn changed(&self, _before: &Transaction, after: &Transaction) {
        if after.status == Status::Stalled {
            metrics::counter!("idem_stalls_total", "kind" => after.kind.as_str()).increment(1);
        }
    }

    fn fenced(&self, _gid: &str) {
        metrics::counter!("idem_stale_writes_refused_total").increment(1);
    }

    fn create(&self, kind: crate::core::Kind, creation: Creation) {
        let name = match creation {
            Creation::Created => "idem_transactions_created_total",
            Creation::Repeat => "idem_create_repeats_total",
            Creation::Conflict => "idem_gid_conflicts_total",
        };
        metrics::counter!(name, "kind" => kind.as_str()).increment(1);
    }

    fn operator(&self, action: OperatorAction, _after: &Transaction) {
        metrics::counter!("idem_operator_actions_total", "action" => action.as_str()).increment(1);
    }

    fn claimed(&self, _tx: &Transaction, _previous_owner: Option<&str>, takeover: bool) {
        metrics::counter!("idem_claims_total").increment(1);
        if takeover {
            metrics::counter!("idem_takeovers_total").increment(1);
        }
    }

    fn renewed(&self, _gid: &str) {
        metrics::counter!("idem_lease_renewals_total").increment(1);
    }

    fn lease_lost(&self, _gid: &str) {
        metrics::counter!("idem_leases_lost_total").increment(1);
    }

    fn round_phase(&self, phase: RoundPhase, took: Duration) {
        metrics::histogram!("idem_round_seconds", "phase" => phase.as_str())
            .record(took.as_secs_f64());
    }
}

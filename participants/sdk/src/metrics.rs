//! What the barrier records through the [`metrics`] facade, so that the participant's own
//! exporter (Prometheus or any other `metrics` recorder the service installs) shows it. With
//! no recorder installed, recording costs next to nothing.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idem_participant_barrier_outcomes_total` | counter | `op`, `outcome` | guarded steps by what became of them: `executed`, `duplicate`, `empty_rollback`, `rejected` (a Try or action after its compensation: anti-suspension), `confirm_without_try` (a Confirm refused, retryable), `error` (the step or the database failed) |
//! | `idem_participant_lock_conflict_retries_total` | counter | `op` | local transactions re-run after losing a lock conflict (deadlock, serialization failure, busy database) |
//! | `idem_participant_step_seconds` | histogram | `op` | duration of [`Barrier::run`](crate::Barrier::run) and [`Barrier::run_in`](crate::Barrier::run_in), retries included |
//!
//! Labels never carry a gid or a branch id. Call [`describe_metrics`] once after installing
//! the recorder to give them their HELP text; give the histogram explicit buckets in the
//! exporter (e.g. `PrometheusBuilder::set_buckets_for_metric`), such as [`STEP_BUCKETS`].

use std::time::Instant;

use crate::barrier::{Op, Outcome};
use crate::error::ParticipantError;

/// Guarded steps by operation and outcome.
pub const BARRIER_OUTCOMES: &str = "idem_participant_barrier_outcomes_total";
/// Local transactions re-run after a lost lock conflict, by operation.
pub const LOCK_CONFLICT_RETRIES: &str = "idem_participant_lock_conflict_retries_total";
/// Duration of a guarded step, retries included, by operation.
pub const STEP_SECONDS: &str = "idem_participant_step_seconds";

/// Buckets that suit [`STEP_SECONDS`]: a local transaction's milliseconds up to a lock
/// wait's seconds.
pub const STEP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Gives the SDK's metrics their HELP text in the installed recorder.
pub fn describe_metrics() {
    metrics::describe_counter!(
        BARRIER_OUTCOMES,
        "Guarded branch steps by operation and outcome: executed, duplicate, empty_rollback, rejected, confirm_without_try, error."
    );
    metrics::describe_counter!(
        LOCK_CONFLICT_RETRIES,
        "Barrier transactions re-run after losing a lock conflict, by operation."
    );
    metrics::describe_histogram!(
        STEP_SECONDS,
        metrics::Unit::Seconds,
        "Duration of a guarded branch step, retries included, by operation."
    );
}

pub(crate) fn conflict_retry(op: Op) {
    metrics::counter!(LOCK_CONFLICT_RETRIES, "op" => op.as_str()).increment(1);
}

/// Records a finished step: its outcome and how long it took since `started`.
pub(crate) fn step<T>(op: Op, result: &Result<Outcome<T>, ParticipantError>, started: Instant) {
    let outcome = match result {
        Ok(outcome) => outcome.kind(),
        Err(ParticipantError::ConfirmWithoutTry(_)) => "confirm_without_try",
        Err(_) => "error",
    };
    metrics::counter!(BARRIER_OUTCOMES, "op" => op.as_str(), "outcome" => outcome).increment(1);
    metrics::histogram!(STEP_SECONDS, "op" => op.as_str()).record(started.elapsed().as_secs_f64());
}

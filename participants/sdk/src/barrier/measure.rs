//! What the barrier records through the `metrics` facade: every guarded step's outcome and
//! duration, and the lock conflicts it re-ran. The table of all the SDK's metrics is in
//! [`crate::metrics`].

use std::time::Instant;

use super::Outcome;
use crate::error::ParticipantError;
use crate::kit::Op;

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

/// Gives the barrier's metrics (lease mode's included) their HELP text.
pub(crate) fn describe() {
    super::lease::describe();
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

pub(super) fn conflict_retry(op: Op) {
    metrics::counter!(LOCK_CONFLICT_RETRIES, "op" => op.as_str()).increment(1);
}

/// Records a finished step: its outcome and how long it took since `started`.
pub(super) fn step<T>(op: Op, result: &Result<Outcome<T>, ParticipantError>, started: Instant) {
    let outcome = match result {
        Ok(outcome) => outcome.kind(),
        Err(ParticipantError::ConfirmWithoutTry(_)) => "confirm_without_try",
        Err(_) => "error",
    };
    metrics::counter!(BARRIER_OUTCOMES, "op" => op.as_str(), "outcome" => outcome).increment(1);
    metrics::histogram!(STEP_SECONDS, "op" => op.as_str()).record(started.elapsed().as_secs_f64());
}

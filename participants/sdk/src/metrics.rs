//! What the barrier and the kit's tools record through the [`metrics`] facade, so that the participant's own
//! exporter (Prometheus or any other `metrics` recorder the service installs) shows it. With
//! no recorder installed, recording costs next to nothing.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `idem_participant_barrier_outcomes_total` | counter | `op`, `outcome` | guarded steps by what became of them: `executed`, `duplicate`, `empty_rollback`, `rejected` (a Try or action after its compensation: anti-suspension), `confirm_without_try` (a Confirm refused, retryable), `error` (the step or the database failed) |
//! | `idem_participant_lock_conflict_retries_total` | counter | `op` | local transactions re-run after losing a lock conflict (deadlock, serialization failure, busy database) |
//! | `idem_participant_step_seconds` | histogram | `op` | duration of [`Barrier::run`](crate::Barrier::run) and [`Barrier::run_in`](crate::Barrier::run_in), retries included |
//! | `idem_participant_barrier_lease_total` | counter | `outcome` | lease-mode steps ([`crate::barrier::lease`]): `first`, `executed`, `replay`, `rejected`, `in_progress`, `recovered` (the fact source said it happened), `reclaimed` (it did not), `unknown`, `stale`, `released`, `compensation_wait` |
//! | `idem_participant_idempotency_total` | counter | `operation`, `outcome` | Idempotency-Key requests ([`crate::idempotency`]): `first`, `replay`, `conflict`, `in_progress`, `expired`, `recovered`, `unknown`, `retry`, `failed`, `failed_final`, `ended_unknown`, `settled`, `lease_lost`, `stale_owner` |
//! | `idem_participant_idempotency_purged_total` | counter | — | idempotency records deleted by retention |
//! | `idem_participant_idempotency_processing` | gauge | — | idempotency records in `PROCESSING` (set by [`IdempotencyStore::backlog`](crate::IdempotencyStore::backlog), which the [`Settler`](crate::idempotency::Settler) calls every pass) |
//! | `idem_participant_idempotency_processing_oldest_seconds` | gauge | — | how long ago the oldest `PROCESSING` record was claimed (0 when none): a stuck handler or a dead owner nobody recovers |
//! | `idem_participant_idempotency_unknown` | gauge | — | idempotency records whose outcome is `UNKNOWN`, waiting for the fact source or an operator |
//! | `idem_participant_callback_total` | counter | `provider`, `outcome` | payment callbacks ([`crate::callback`]): `credited`, `duplicate`, `conflict`, `bad_signature`, `mismatch`, `unknown_order`, `invalid`, `error` |
//! | `idem_participant_consumer_total` | counter | `group`, `outcome` | events under the consumer log ([`crate::consumer`]): `processed`, `duplicate`, `failed` |
//! | `idem_participant_consumer_purged_total` | counter | — | consumer-log rows deleted by retention |
//! | `idem_participant_job_units_total` | counter | `job`, `outcome` | job units ([`crate::jobs`]): `done`, `skipped`, `busy`, `failed`, `lost` |
//! | `idem_participant_job_units_purged_total` | counter | — | job units deleted by retention |
//!
//! Labels never carry a gid, a branch id, a key or an event id: `operation`, `provider`,
//! `group` and `job` are names the service configures, so their number is bounded. Call
//! [`describe_metrics`] once after installing the recorder to give them their HELP text; give
//! the histogram explicit buckets in the exporter (e.g. `PrometheusBuilder::set_buckets_for_metric`), such as [`STEP_BUCKETS`].

/// The barrier's own metric names, and buckets for its step histogram.
pub use crate::barrier::{BARRIER_OUTCOMES, LOCK_CONFLICT_RETRIES, STEP_BUCKETS, STEP_SECONDS};

/// Gives the SDK's metrics (the barrier's and every kit tool's) their HELP text in the
/// installed recorder.
pub fn describe_metrics() {
    crate::barrier::describe();
    crate::idempotency::describe();
    crate::callback::describe();
    crate::consumer::describe();
    crate::jobs::describe();
}

//! The participant SDK's integration tests, as one binary: each module is the tests of one
//! part of the SDK (the barrier and its lease mode, callbacks, the Idempotency-Key layer,
//! jobs, the consumer log), sharing `common` (the barrier's) and `kit_support` (the
//! tools').
//!
//! Its tests share one process: a test that reads the process-wide metrics recorder runs
//! itself again alone in a child process (`idem_participant::testing::in_own_process`), as
//! the crash tests run their child roles.

mod common;
mod kit_support {
    pub mod keys;
    pub mod ledger;
    pub mod recorder;
}

mod barrier;
mod barrier_lease;
mod barrier_more;
mod barrier_upgrade;
mod callback;
mod confirm;
mod consumer;
mod floors;
mod http;
mod idempotency;
mod idempotency_http;
mod idempotency_layer;
mod idempotency_storage;
mod idempotency_unknown;
mod jobs;
mod jobs_crash;
mod kit_local;
mod lease_callback_metrics;
mod metrics;
mod pool;
mod purge;
mod tenants;

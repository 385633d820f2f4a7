//! The store's own metrics: their names, and the calls that record them through the
//! `metrics` facade. The coordinator's exporter (`idem::metrics`) describes them, gives the
//! histograms their buckets and renders them; the store only counts and times.

use std::time::Duration;

/// Failed database calls, by kind ([`ERROR_KINDS`]).
pub const ERRORS_TOTAL: &str = "idem_store_errors_total";
/// A create, a save or a lease renewal as the engine waits for it, by op.
pub const WRITE_SECONDS: &str = "idem_store_write_seconds";
/// How long a write waited for a writer to take it into a batch.
pub const QUEUE_SECONDS: &str = "idem_store_queue_seconds";
/// Writes per batch.
pub const BATCH_WRITES: &str = "idem_store_batch_writes";
/// How long the database took to write one batch, its commit included.
pub const BATCH_SECONDS: &str = "idem_store_batch_seconds";

/// The values `StoreError::kind` gives [`ERRORS_TOTAL`].
pub const ERROR_KINDS: &[&str] = &[
    "timeout",
    "connection",
    "pool_timeout",
    "transient",
    "refused",
    "corrupt",
    "writer_stopped",
    "other",
];

/// Counts one failed database call (see `StoreError::kind`).
pub(crate) fn error(kind: &'static str) {
    metrics::counter!(ERRORS_TOTAL, "kind" => kind).increment(1);
}

/// One create or save as the engine waited for it: queued, batched, written, answered.
pub(crate) fn write(op: &'static str, took: Duration) {
    metrics::histogram!(WRITE_SECONDS, "op" => op).record(took.as_secs_f64());
}

/// How long one write waited in the queue before a writer took it into a batch.
pub(crate) fn queued(waited: Duration) {
    metrics::histogram!(QUEUE_SECONDS).record(waited.as_secs_f64());
}

/// One batch of writes: how many, and how long the database took with them (statements
/// and commit).
pub(crate) fn batch(writes: usize, took: Duration) {
    metrics::histogram!(BATCH_WRITES).record(writes as f64);
    metrics::histogram!(BATCH_SECONDS).record(took.as_secs_f64());
}

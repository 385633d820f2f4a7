//! Prometheus metrics (`GET /metrics`): what the engine counts ([`MetricsObserver`]), what
//! the database shows ([`sampler`]), the HTTP requests (`api::http_metrics`), and the SQL
//! statement counter of the benchmark ([`sql`]).
//!
//! Labels are low-cardinality on purpose: kinds, statuses, ops, outcomes, route templates,
//! never a gid, a branch id, a URL or a tenant. Latencies are histograms with fixed
//! buckets, so that they add up across coordinators. The names, types and labels are
//! listed in `docs/metrics.md`; [`DESCRIPTIONS`] is the one table they come from.

mod observer;
pub mod sampler;
mod sql;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::core::{Kind, Status};
use crate::store::metrics as store;

pub use observer::MetricsObserver;
pub use sql::{
    CountingFilter, SqlCountingLayer, SqlCounts, counting_filter, set_sql_counting, sql_counting,
    sql_counts,
};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The type of a metric, for its description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric idem records: name, type, labels and the HELP text.
pub const DESCRIPTIONS: &[(&str, Type, &str, &str)] = &[
    (
        "idem_transactions_created_total",
        Type::Counter,
        "kind",
        "Transactions created (a new gid), by kind.",
    ),
    (
        "idem_create_repeats_total",
        Type::Counter,
        "kind",
        "Create requests absorbed as repeats: same gid, same request; the first result was returned.",
    ),
    (
        "idem_gid_conflicts_total",
        Type::Counter,
        "kind",
        "Create requests refused because their gid holds another request (409 gid_conflict).",
    ),
    (
        "idem_transactions_total",
        Type::Counter,
        "status",
        "Stored status changes, by the status entered.",
    ),
    (
        "idem_branch_calls_total",
        Type::Counter,
        "op,outcome",
        "Calls to participants, by operation and outcome.",
    ),
    (
        "idem_branch_call_seconds",
        Type::Histogram,
        "op",
        "Duration of calls to participants, by operation.",
    ),
    (
        "idem_branch_retries_total",
        Type::Counter,
        "op",
        "Calls to participants that were not a branch operation's first attempt.",
    ),
    (
        "idem_stalls_total",
        Type::Counter,
        "kind",
        "Transactions that stalled (waiting for an operator's retry), by kind.",
    ),
    (
        "idem_operator_actions_total",
        Type::Counter,
        "action",
        "Operator requests that changed a transaction: retry, force_stop.",
    ),
    (
        "idem_claims_total",
        Type::Counter,
        "",
        "Transactions the recovery loop claimed (due, and their lease expired or absent).",
    ),
    (
        "idem_takeovers_total",
        Type::Counter,
        "",
        "Claims of a transaction another coordinator process had owned.",
    ),
    (
        "idem_lease_renewals_total",
        Type::Counter,
        "",
        "Leases a driver extended.",
    ),
    (
        "idem_leases_lost_total",
        Type::Counter,
        "",
        "Renewals that found the lease taken by another coordinator: the driver stopped.",
    ),
    (
        "idem_stale_writes_refused_total",
        Type::Counter,
        "",
        "Writes of progress refused because another coordinator owns the transaction now.",
    ),
    (
        store::ERRORS_TOTAL,
        Type::Counter,
        "kind",
        "Failed database calls, by kind: timeout, connection, pool_timeout, transient, refused, corrupt, writer_stopped, other.",
    ),
    (
        "idem_http_requests_total",
        Type::Counter,
        "method,route,status",
        "API requests answered, by method, route template and status code.",
    ),
    (
        "idem_rate_limited_total",
        Type::Counter,
        "",
        "API requests refused with 429 rate_limited: their tenant was over --rate-limit-per-second.",
    ),
    (
        "idem_overloaded_total",
        Type::Counter,
        "limit",
        "API requests refused with 503 overloaded, by the cap they were past: requests (--max-requests-in-flight) or body_bytes (--max-body-bytes-in-flight).",
    ),
    (
        "idem_http_request_seconds",
        Type::Histogram,
        "method,route",
        "Duration of API requests, by method and route template.",
    ),
    (
        store::WRITE_SECONDS,
        Type::Histogram,
        "op",
        "A create, a save or a lease renewal as the engine waits for it (queued, batched, written, answered), by op (create, save, renew).",
    ),
    (
        store::QUEUE_SECONDS,
        Type::Histogram,
        "",
        "How long a create or save waited for a writer to take it into a batch.",
    ),
    (
        store::BATCH_WRITES,
        Type::Histogram,
        "",
        "Creates and saves written together in one batch (one commit; on PostgreSQL one statement).",
    ),
    (
        store::BATCH_SECONDS,
        Type::Histogram,
        "",
        "How long the database took to write one batch, its commit included.",
    ),
    (
        "idem_round_seconds",
        Type::Histogram,
        "phase",
        "A driver's round by phase: slots (waiting for call slots), calls (the round's calls, concurrent), gap (from the end of one round's calls to the start of the next round's, the store write and scheduling included).",
    ),
    (
        "idem_transactions_active",
        Type::Gauge,
        "status",
        "Non-terminal transactions in the database, by status (sampled; the same on every coordinator of one database).",
    ),
    (
        "idem_transactions_stalled",
        Type::Gauge,
        "",
        "Stalled transactions in the database (sampled).",
    ),
    (
        "idem_oldest_active_age_seconds",
        Type::Gauge,
        "",
        "Age of the oldest non-terminal transaction in the database, stalled included; 0 when there is none (sampled).",
    ),
    (
        "idem_transactions_driving",
        Type::Gauge,
        "",
        "Transactions this coordinator process is driving now.",
    ),
    (
        "idem_recovery_lag_seconds",
        Type::Gauge,
        "",
        "How late the recovery loop is: time since its last pass began beyond its interval (0 while on time).",
    ),
    (
        "idem_ready",
        Type::Gauge,
        "",
        "1 while the database answers the check of GET /health/ready, 0 while it does not (sampled).",
    ),
    (
        "idem_metrics_sampled_at_seconds",
        Type::Gauge,
        "",
        "When the database-derived gauges were last sampled successfully (Unix time).",
    ),
];

/// Buckets of participant calls: from a local service's milliseconds to the longest
/// request timeout that is common (a minute).
pub const CALL_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Buckets of the phases of one transaction's work inside the coordinator (store writes,
/// their queue and batches, a round's phases): from tens of microseconds up.
pub const PHASE_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// Writes per batch.
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Buckets of API requests: most take a database round trip; a `wait_result` waits for
/// the whole transaction.
pub const HTTP_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

fn builder() -> PrometheusBuilder {
    let with = |b: PrometheusBuilder, name: &str, buckets: &[f64]| {
        b.set_buckets_for_metric(Matcher::Full(name.into()), buckets)
            .expect("the bucket lists are not empty")
    };
    // Default buckets too, so that no histogram is ever rendered as a summary (which
    // cannot be aggregated across coordinators).
    let b = PrometheusBuilder::new()
        .set_buckets(HTTP_BUCKETS)
        .expect("the bucket list is not empty");
    let b = with(b, "idem_branch_call_seconds", CALL_BUCKETS);
    let b = with(b, store::BATCH_WRITES, BATCH_BUCKETS);
    let b = [
        store::WRITE_SECONDS,
        store::QUEUE_SECONDS,
        store::BATCH_SECONDS,
        "idem_round_seconds",
    ]
    .into_iter()
    .fold(b, |b, name| with(b, name, PHASE_BUCKETS));
    with(b, "idem_http_request_seconds", HTTP_BUCKETS)
}

/// Installs the process-wide recorder once and returns the handle that renders it.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let handle = builder().install_recorder().unwrap_or_else(|_| {
            // Another recorder is installed (an embedding application's): render an
            // empty one rather than fail.
            builder().build_recorder().handle()
        });
        describe();
        // The recorder keeps every histogram sample until upkeep folds them in; only a
        // scrape does that otherwise, so an unscraped coordinator grew by each call's
        // sample (about 30 bytes a saga in the soak run) for as long as it ran.
        let kept = handle.clone();
        std::thread::Builder::new()
            .name("idem-metrics-upkeep".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    kept.run_upkeep();
                }
            })
            .expect("a thread for metrics upkeep");
        handle
    })
}

/// The HELP lines, and a zero for every counter without labels and for the fixed label
/// values of the rest, so that a series exists (and `rate()` works) before its first event.
fn describe() {
    for &(name, kind, _, help) in DESCRIPTIONS {
        match kind {
            Type::Counter => metrics::describe_counter!(name, help),
            Type::Gauge => metrics::describe_gauge!(name, help),
            Type::Histogram => metrics::describe_histogram!(name, help),
        }
    }
    for (name, _, labels, _) in DESCRIPTIONS.iter().filter(|d| d.1 == Type::Counter) {
        match *labels {
            "" => metrics::counter!(*name).increment(0),
            "kind" if *name == store::ERRORS_TOTAL => {
                for kind in store::ERROR_KINDS {
                    metrics::counter!(*name, "kind" => *kind).increment(0);
                }
            }
            "kind" => {
                for kind in [Kind::Tcc, Kind::Saga, Kind::Msg] {
                    metrics::counter!(*name, "kind" => kind.as_str()).increment(0);
                }
            }
            "status" => {
                for status in Status::ALL {
                    metrics::counter!(*name, "status" => status.as_str()).increment(0);
                }
            }
            "action" => {
                for action in ["retry", "force_stop"] {
                    metrics::counter!(*name, "action" => action).increment(0);
                }
            }
            "limit" => {
                for limit in ["requests", "body_bytes"] {
                    metrics::counter!(*name, "limit" => limit).increment(0);
                }
            }
            _ => {}
        }
    }
}

/// The Prometheus text exposition of every metric, SQL counts included.
pub fn render() -> String {
    let mut text = install().render();
    if let Some(counts) = sql::render_counts() {
        text.push_str(&counts);
    }
    text
}

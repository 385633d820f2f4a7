//! The gauges that come from the database (non-terminal transactions by status, stalled,
//! the oldest one's age) and from the engine (transactions driven here, the recovery
//! loop's lag), set every few seconds by one task rather than per request: one grouped
//! read of the status index per interval, whatever the traffic.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::core::Status;
use crate::engine::Engine;

/// How often the gauges are sampled unless told otherwise (`ServerConfig`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// The statuses `idem_transactions_active` reports, each every time (0 when none).
const NON_TERMINAL: [Status; 5] = [
    Status::Prepared,
    Status::Running,
    Status::Committing,
    Status::Aborting,
    Status::Stalled,
];

/// Samples every `interval` until `stop`.
pub async fn run(engine: Arc<Engine>, interval: Duration, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        sample(&engine).await;
    }
}

/// One sample. A failed read leaves the database's gauges as they were (the error is
/// counted in `idem_store_errors_total`, and `idem_metrics_sampled_at_seconds` stops).
pub async fn sample(engine: &Engine) {
    metrics::gauge!("idem_transactions_driving").set(engine.driving() as f64);
    if let Some(lag) = engine.recovery_lag() {
        metrics::gauge!("idem_recovery_lag_seconds").set(lag.as_secs_f64());
    }
    // The check of `/health/ready`, so that an alert on readiness needs no prober.
    let ready = engine
        .reads()
        .ping_database(crate::engine::READY_TIMEOUT)
        .await
        .is_ok();
    metrics::gauge!("idem_ready").set(if ready { 1.0 } else { 0.0 });
    if !ready {
        return;
    }
    let summary = match engine.reads().active_summary().await {
        Ok(summary) => summary,
        Err(e) => {
            tracing::debug!(error = %e, "cannot sample the transaction gauges");
            return;
        }
    };
    let now = engine.now();
    for status in NON_TERMINAL {
        let count = summary
            .iter()
            .find(|s| s.status == status)
            .map_or(0, |s| s.count);
        metrics::gauge!("idem_transactions_active", "status" => status.as_str()).set(count as f64);
        if status == Status::Stalled {
            metrics::gauge!("idem_transactions_stalled").set(count as f64);
        }
    }
    let oldest = summary.iter().map(|s| s.oldest_created_at).min();
    let age_ms = oldest.map_or(0, |created| (now - created).max(0));
    metrics::gauge!("idem_oldest_active_age_seconds").set(age_ms as f64 / 1000.0);
    metrics::gauge!("idem_metrics_sampled_at_seconds").set(now as f64 / 1000.0);
}

//! Retention: finished transactions, with their branch and attempt rows, deleted once they
//! finished longer ago than a window, by a periodic task of `idem serve`.
//!
//! Only terminal transactions (succeeded, failed) go; a stalled one waits for an operator
//! and stays however old it is. Each pass reads the database's clock, so coordinators with
//! skewed hosts agree on the cutoff, and deletes in batches of [`RetentionConfig::batch`]
//! gids, each its own short database transaction ([`Store::purge_finished`]), until a
//! batch comes back short. Every coordinator may run it at once: the batches skip each
//! other's rows, and a deleted row is deleted once.
//!
//! A gid is the idempotency key of a client's request only for as long as its row is kept:
//! a client repeating a request after the window creates a new transaction and its steps
//! run again. So the window may not be shorter than the longest time a client keeps
//! repeating a request, which the operator states (`--client-retry-period-ms`):
//! [`check_window`] refuses such a configuration at start.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{Purged, Store, StoreError};

/// Seven days.
pub const DEFAULT_RETENTION_MS: u64 = 7 * 86_400_000;
/// How often a pass runs unless told otherwise.
pub const DEFAULT_RETENTION_INTERVAL_MS: u64 = 60_000;
/// Gids per batch unless told otherwise.
pub const DEFAULT_RETENTION_BATCH: u32 = 500;

/// One day: how long clients are taken to keep repeating a request unless the operator
/// says otherwise.
pub const DEFAULT_CLIENT_RETRY_PERIOD_MS: u64 = 86_400_000;

/// The counter of rows removed, by table (`global`, `branch`, `attempt`).
pub const ROWS_DELETED: &str = "idem_retention_rows_deleted_total";

/// A pause between two batches of one pass, so that a large backlog does not keep the
/// database's writers waiting batch after batch.
const BETWEEN_BATCHES: Duration = Duration::from_millis(10);

/// What `--retention-ms`, `--retention-interval-ms` and `--retention-batch` say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionConfig {
    /// How long a finished transaction is kept after it finished; `None` keeps it for ever.
    pub window: Option<Duration>,
    /// How often a pass runs.
    pub interval: Duration,
    /// Gids deleted per database transaction, at most.
    pub batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig::from_flags(
            DEFAULT_RETENTION_MS,
            DEFAULT_RETENTION_INTERVAL_MS,
            DEFAULT_RETENTION_BATCH,
        )
    }
}

impl RetentionConfig {
    /// From the flags' milliseconds: a window of 0 keeps everything.
    pub fn from_flags(window_ms: u64, interval_ms: u64, batch: u32) -> RetentionConfig {
        RetentionConfig {
            window: (window_ms > 0).then(|| Duration::from_millis(window_ms)),
            interval: Duration::from_millis(interval_ms.max(10)),
            batch: batch.max(1),
        }
    }
}

/// Refuses a retention window (`--retention-ms`; 0: none, every transaction is kept) shorter
/// than the longest time a client keeps repeating a request (`--client-retry-period-ms`):
/// a repeat arriving after its transaction was deleted would create it again and run its
/// steps a second time. The message names both settings, as flags and as keys of the
/// configuration file, and both values.
pub fn check_window(retention_ms: u64, client_retry_period_ms: u64) -> Result<(), String> {
    if retention_ms == 0 || retention_ms >= client_retry_period_ms {
        return Ok(());
    }
    Err(format!(
        "--retention-ms (retention_ms) is {retention_ms} ms, shorter than \
         --client-retry-period-ms (client_retry_period_ms), {client_retry_period_ms} ms: a \
         client repeating a request after its transaction was deleted would create it again \
         and run its steps twice. Keep finished transactions at least as long as clients \
         retry (retention_ms >= {client_retry_period_ms}, or 0 to keep them for ever), or \
         state the shorter period your clients really retry for"
    ))
}

/// One pass: every batch of transactions that finished more than `window` ago on the
/// database's clock, until a batch comes back short or `stop` is cancelled. Returns the
/// rows removed; they are counted in [`ROWS_DELETED`] as each batch commits.
pub async fn run_pass(
    store: &dyn Store,
    window: Duration,
    batch: u32,
    stop: &CancellationToken,
) -> Result<Purged, StoreError> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let cutoff = store.db_now().await?.saturating_sub(window_ms);
    let mut total = Purged::default();
    while !stop.is_cancelled() {
        let done = store.purge_finished(cutoff, batch).await?;
        count(done);
        total.add(done);
        if done.global < u64::from(batch) {
            break;
        }
        tokio::time::sleep(BETWEEN_BATCHES).await;
    }
    Ok(total)
}

fn count(done: Purged) {
    for (table, rows) in [
        ("global", done.global),
        ("branch", done.branch),
        ("attempt", done.attempt),
    ] {
        metrics::counter!(ROWS_DELETED, "table" => table).increment(rows);
    }
}

/// Runs a pass every `config.interval` until `stop`; nothing if the window is 0. The
/// first pass waits one interval, so a fleet restarting together does not start with a
/// burst of deletes.
pub fn spawn(
    store: Arc<dyn Store>,
    config: RetentionConfig,
    stop: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let window = config.window?;
    metrics::describe_counter!(
        ROWS_DELETED,
        "Rows deleted by retention (finished transactions past --retention-ms), by table"
    );
    // Each table's series exists from the start, at 0, so a rate over it is defined.
    count(Purged::default());
    Some(tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(config.interval) => {}
                _ = stop.cancelled() => return,
            }
            match run_pass(store.as_ref(), window, config.batch, &stop).await {
                Ok(done) if done.global > 0 => tracing::info!(
                    transactions = done.global,
                    branches = done.branch,
                    attempts = done.attempt,
                    "retention deleted finished transactions"
                ),
                Ok(_) => {}
                // The next pass tries again; what was committed stays deleted.
                Err(e) => tracing::warn!(error = %e, "retention pass failed"),
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_shorter_than_the_clients_retries_is_refused() {
        let day = DEFAULT_CLIENT_RETRY_PERIOD_MS;
        assert_eq!(check_window(DEFAULT_RETENTION_MS, day), Ok(()));
        assert_eq!(check_window(day, day), Ok(()));
        assert_eq!(check_window(0, day), Ok(()), "0 keeps everything");
        assert_eq!(check_window(0, u64::MAX), Ok(()));
        assert_eq!(check_window(1, 0), Ok(()));
        let refused = check_window(day - 1, day).unwrap_err();
        for named in [
            "--retention-ms",
            "retention_ms",
            "86399999 ms",
            "--client-retry-period-ms",
            "client_retry_period_ms",
            "86400000 ms",
        ] {
            assert!(refused.contains(named), "{named}: {refused}");
        }
    }

    #[test]
    fn a_zero_window_keeps_everything_and_values_are_floored() {
        assert_eq!(RetentionConfig::from_flags(0, 1_000, 500).window, None);
        let c = RetentionConfig::from_flags(5, 0, 0);
        assert_eq!(c.window, Some(Duration::from_millis(5)));
        assert_eq!(c.interval, Duration::from_millis(10));
        assert_eq!(c.batch, 1);
        assert_eq!(
            RetentionConfig::default().window,
            Some(Duration::from_secs(7 * 86_400))
        );
    }
}

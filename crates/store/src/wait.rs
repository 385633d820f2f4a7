//! Opening the store at start-up, waiting for a database that is not there yet.
//!
//! A coordinator often starts beside its database (a container, a machine booting) and
//! would otherwise exit because the server is still starting. [`open_when_ready`] retries
//! what waiting can cure (connection refused or timed out, the server starting up or
//! shutting down) with backoff, up to a bound, logging each attempt; what waiting cannot
//! cure (a bad URL, a wrong password, an unknown database, a schema another version
//! changed) fails at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{ConnectOptions, Store, StoreError, connect};

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot use the database ({}): {error}; waiting would not help", error.reason())]
    Refused { error: StoreError },
    #[error(
        "the database was not reachable within {} ms (see --database-wait-ms); giving up. Last error ({}): {last}",
        waited.as_millis(),
        last.reason()
    )]
    GaveUp { waited: Duration, last: StoreError },
}

/// First pause between attempts; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(200);
const MAX_PAUSE: Duration = Duration::from_secs(5);

/// Connects and migrates, retrying for up to `wait` while the database is unreachable.
/// `wait` zero tries once.
pub async fn open_when_ready(
    url: &str,
    options: &ConnectOptions,
    wait: Duration,
) -> Result<Arc<dyn Store>, OpenError> {
    let deadline = Instant::now() + wait;
    let mut pause = FIRST_PAUSE;
    let mut attempt = 1u32;
    loop {
        let error = match open(url, options).await {
            Ok(store) => {
                if attempt > 1 {
                    tracing::info!(attempt, "the database answers; starting");
                }
                return Ok(store);
            }
            Err(error) if !error.retryable_at_start() => return Err(OpenError::Refused { error }),
            Err(error) => error,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(OpenError::GaveUp {
                waited: wait,
                last: error,
            });
        }
        let next = pause.min(left);
        tracing::warn!(
            attempt,
            reason = error.reason(),
            error = %error,
            retry_in_ms = next.as_millis() as u64,
            left_ms = left.as_millis() as u64,
            "waiting for the database"
        );
        // Backoff between attempts is the point here, not a wait for a condition.
        tokio::time::sleep(next).await;
        pause = (pause * 2).min(MAX_PAUSE);
        attempt += 1;
    }
}

async fn open(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Store>, StoreError> {
    let store = connect(url, options).await?;
    store.migrate().await?;
    Ok(store)
}

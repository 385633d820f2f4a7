//! The engine's clock, and keeping it on the database's time.
//!
//! Leases and timeouts are timestamps one coordinator writes and another compares with its
//! own "now". If each used its own wall clock, a coordinator whose clock runs ahead would
//! take over live transactions and abort prepared ones early. So every coordinator reads
//! time as its wall clock plus an offset to the database's clock, measured at start and
//! re-measured periodically: all of them agree within the round trip of that measurement.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::core::Millis;
use crate::store::{Store, StoreError};

/// A source of the current time, so tests can control it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        system_now()
    }
}

fn system_now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// The wall clock, shifted onto the database's clock.
pub struct SyncedClock {
    /// Added to the wall clock to get the database's time.
    offset: AtomicI64,
    /// A deliberate error in this process's wall clock (tests of skewed hosts).
    skew: Millis,
}

/// An offset above this is logged: the host's clock needs attention even though idem
/// works around it.
const NOTABLE_OFFSET_MS: Millis = 1_000;

impl SyncedClock {
    pub fn new(skew: Millis) -> Arc<SyncedClock> {
        Arc::new(SyncedClock {
            offset: AtomicI64::new(0),
            skew,
        })
    }

    fn wall(&self) -> Millis {
        system_now() + self.skew
    }

    /// The offset in use.
    pub fn offset(&self) -> Millis {
        self.offset.load(Ordering::Relaxed)
    }

    /// Measures the offset to the database's clock: the database's time against the middle
    /// of the round trip that read it.
    pub async fn sync(&self, store: &dyn Store) -> Result<Millis, StoreError> {
        let before = self.wall();
        let db = store.db_now().await?;
        let after = self.wall();
        let offset = db - (before + (after - before) / 2);
        let previous = self.offset.swap(offset, Ordering::Relaxed);
        if offset.abs() > NOTABLE_OFFSET_MS && (offset - previous).abs() > NOTABLE_OFFSET_MS / 2 {
            tracing::warn!(
                offset_ms = offset,
                "this host's clock differs from the database's; idem uses the database's time"
            );
        }
        Ok(offset)
    }

    /// Re-measures every `interval` until `stop`.
    pub async fn keep_in_sync(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        interval: Duration,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.cancelled() => return,
            }
            if let Err(e) = self.sync(store.as_ref()).await {
                tracing::warn!(error = %e, "cannot read the database's clock; keeping the last offset");
            }
        }
    }
}

impl Clock for SyncedClock {
    fn now(&self) -> Millis {
        self.wall() + self.offset()
    }
}

//! The background task that settles the records nobody runs any more, so an `UNKNOWN`
//! ending or a crashed owner's expired lease is resolved from the fact source even when
//! the client never comes back, and that keeps the backlog gauges current.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::{IdempotencyError, IdempotencyStore, RecoveryHook, Settled};
use crate::backend::BarrierDatabase;

/// Settles expired `PROCESSING` and `UNKNOWN` records through the service's
/// [`RecoveryHook`] on a schedule, and sets the backlog gauges
/// ([`IdempotencyStore::backlog`]) on every pass. Started by the service:
///
/// ```no_run
/// # use idem_participant::idempotency::{IdempotencyStore, RecoveryHook, Settler};
/// # async fn run(store: IdempotencyStore<sqlx::Any>, hook: impl RecoveryHook) {
/// let settler = Settler::new(store).recovery(hook).spawn();
/// // ... at shutdown:
/// settler.stop().await;
/// # }
/// ```
///
/// Bounded: a pass asks the hook about at most [`batch`](Self::batch) records, one at a
/// time, each answer bounded by the store's recovery timeout; the next pass goes on after
/// the last record asked (so records the hook cannot settle yet never starve the others),
/// and wraps around at the end. Verdicts are written as by [`IdempotencyStore::settle`]:
/// "not happened" leaves a record `FAILED_RETRYABLE`, run by its next repeat, never by the
/// settler. Without a hook it only sets the gauges.
pub struct Settler<DB: BarrierDatabase> {
    store: IdempotencyStore<DB>,
    hook: Option<Arc<dyn RecoveryHook>>,
    every: Duration,
    batch: u32,
}

/// A running [`Settler`]. [`stop`](Self::stop) ends it after the record it is settling;
/// dropping the handle ends it too.
#[must_use = "dropping the handle stops the settler"]
pub struct SettlerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl SettlerHandle {
    /// Stops the task and waits until it has (at most one hook call, bounded by the
    /// store's recovery timeout, plus the write of its verdict).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }

    /// Whether the task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<DB: BarrierDatabase> Settler<DB> {
    /// A settler on `store`: a pass every 5 s, at most 100 records each, no hook yet.
    pub fn new(store: IdempotencyStore<DB>) -> Self {
        Settler {
            store,
            hook: None,
            every: Duration::from_secs(5),
            batch: 100,
        }
    }

    /// Settles through `hook` (pass an `Arc` to share one hook with the layer).
    pub fn recovery(mut self, hook: impl RecoveryHook) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// The time between passes (at least 10 ms).
    pub fn every(mut self, every: Duration) -> Self {
        self.every = every.max(Duration::from_millis(10));
        self
    }

    /// The most records one pass asks the hook about (at least 1).
    pub fn batch(mut self, records: u32) -> Self {
        self.batch = records.max(1);
        self
    }

    /// Starts the task on the current tokio runtime.
    pub fn spawn(self) -> SettlerHandle {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(self.every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut cursor = 0;
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    // A stop, or the handle dropped.
                    _ = stopped.changed() => return,
                }
                if let Err(e) = self.pass(&mut cursor, &mut stopped).await {
                    tracing::warn!(error = %e, "an idempotency settler pass failed; trying again next time");
                }
                if *stopped.borrow() {
                    return;
                }
            }
        });
        SettlerHandle { stop, task }
    }

    /// One pass: the gauges, then at most `batch` records after `cursor`.
    async fn pass(
        &self,
        cursor: &mut i64,
        stopped: &mut watch::Receiver<bool>,
    ) -> Result<(), IdempotencyError> {
        self.store.backlog().await?;
        let Some(hook) = &self.hook else {
            return Ok(());
        };
        let records = self.store.unsettled_after(*cursor, self.batch).await?;
        let last_page = records.len() < self.batch as usize;
        for (id, record) in records {
            let recovery = tokio::select! {
                recovery = self.store.ask(hook.as_ref(), &record) => recovery,
                _ = stopped.changed() => return Ok(()),
            };
            // One record's failure (the database, a verdict the record cannot hold) does
            // not stop the pass: the others are still settled, this one again next time.
            match self.store.settle(&record, recovery).await {
                Ok(Settled::Recorded(status)) => tracing::info!(scope = %record.scope,
                    status = status.as_str(), "the settler recorded the fact source's verdict"),
                Ok(Settled::StillUnknown) => tracing::debug!(scope = %record.scope,
                    "the fact source cannot tell yet; the record stays unsettled"),
                Ok(Settled::Moved) => {}
                Err(e) => tracing::warn!(scope = %record.scope, error = %e,
                    "the settler could not record the fact source's verdict"),
            }
            *cursor = id;
        }
        if last_page {
            *cursor = 0;
        }
        Ok(())
    }
}

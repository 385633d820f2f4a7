//! The recovery loop and shutdown.

use std::sync::Arc;

use super::*;

impl Engine {
    // ---- recovery --------------------------------------------------------------------

    /// Claims due transactions nobody drives and drives them. Returns how many it took.
    pub async fn recover_once(self: &Arc<Self>) -> Result<usize, StoreError> {
        let now = self.clock.now();
        let lease = self.new_lease(now);
        let claimed = self
            .store
            .claim_due(&lease, now, self.config.claim_batch)
            .await?;
        let n = claimed.len();
        for stored in claimed {
            match core::apply(&stored.tx, &Event::Wake, self.ctx()) {
                Ok(t) => Arc::clone(self).start(stored, lease.clone(), t),
                Err(e) => tracing::error!(gid = stored.tx.gid, error = %e, "cannot resume"),
            }
        }
        Ok(n)
    }

    /// Runs the recovery loop until [`Engine::shutdown`].
    pub async fn run_recovery(self: Arc<Self>) {
        loop {
            match self.recover_once().await {
                // A full batch: there may be more due right now.
                Ok(n) if n as u32 >= self.config.claim_batch => continue,
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "recovery scan failed"),
            }
            let jitter = rand::random::<f64>() * 0.2 + 0.9;
            let pause = self.config.recovery_interval.mul_f64(jitter);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.shutdown.notified() => return,
            }
        }
    }

    /// Stops the recovery loop and the drivers' waits, and hands every transaction this
    /// process drives back (its lease lapses now), so another coordinator can continue at
    /// once instead of after the lease.
    pub async fn shutdown(&self) {
        self.shutdown.notify_waiters();
        let driving: Vec<(String, String)> =
            self.driving.lock().expect("poisoned").drain().collect();
        let now = self.clock.now();
        for (gid, token) in driving {
            let _ = self.store.renew(&gid, &token, now).await;
        }
    }
}

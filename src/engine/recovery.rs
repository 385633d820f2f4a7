//! The recovery loop and shutdown.
//!
//! The loop claims as many due, unowned rows as this process has room to drive, passing
//! over its own drivers' rows and over tenants whose share of the drivers is full, and
//! taking of the others no more than their room. It wakes when a quarter of the room is
//! free again (one claim batch at most), and writes this node's row of `idem_coordinator`
//! (the console's coordinators seen) every 5 s. A graceful stop stops claiming and
//! starting rounds, lets the rounds in flight finish within the grace (then aborts them and
//! waits for their tasks), and only then hands every lease back in one write.

use std::sync::Arc;

use super::*;

impl Engine {
    // ---- recovery --------------------------------------------------------------------

    /// Claims due transactions nobody drives, as many as this process has room to drive
    /// (see [`EngineConfig::max_driving`]), and drives them. Returns how many it took.
    pub async fn recover_once(self: &Arc<Self>) -> Result<usize, StoreError> {
        Ok(self.claim_pass().await?.0)
    }

    /// [`Engine::recover_once`], and whether the pass was cut short by the room left.
    async fn claim_pass(self: &Arc<Self>) -> Result<(usize, bool), StoreError> {
        if self.stopping.is_cancelled() {
            return Ok((0, false));
        }
        let Some(mut room) = self.admission.reserve(self.config.claim_batch as usize) else {
            return Ok((0, true));
        };
        let limit = room.left();
        let now = self.clock.now();
        let lease = self.new_lease(now);
        // Never a second driver beside one of this process's own: after the database
        // stalled past its leases, a driver still holds answers it has not stored yet.
        let held: Vec<String> = self
            .driving
            .lock()
            .expect("poisoned")
            .keys()
            .cloned()
            .collect();
        let claimed = self.claim_fairly(&lease, now, limit, &held).await?;
        let n = claimed.len();
        let ours = identity::instance_prefix(&self.config.node, &self.instance);
        for Claimed {
            stored,
            previous_owner,
        } in claimed
        {
            // A token of this process's own is a row it handed back itself (a long
            // backoff); anyone else's is a takeover.
            let takeover = previous_owner
                .as_deref()
                .is_some_and(|t| !t.starts_with(&ours));
            self.observer
                .claimed(&stored.tx, previous_owner.as_deref(), takeover);
            let Some(admission) = self.admission.assign(&mut room, tenant_of(&stored.tx.gid))
            else {
                // Its tenant filled its share since the claim was scoped (a create took
                // the last place): handed back, for a later pass.
                self.release(&stored.tx.gid, &lease.token).await;
                continue;
            };
            match core::apply(&stored.tx, &Event::Wake, self.ctx()) {
                Ok(t) => Arc::clone(self).start(stored, lease.clone(), t, admission),
                Err(e) => tracing::error!(gid = stored.tx.gid, error = %e, "cannot resume"),
            }
        }
        // A pass that filled what room there was may have left due rows behind.
        let cut_short = n == limit && limit < self.config.claim_batch as usize;
        Ok((n, cut_short))
    }

    /// Claims up to `limit` due rows, none of a tenant past what its share of the drivers
    /// leaves it: tenants with no room are left out; those with less than `limit` are
    /// claimed on their own, up to their room, after the rest. So a tenant with a backlog
    /// of old due rows, whose share is full, never stands in front of the others' rows,
    /// and no row is claimed only to be handed back. A tenant that drives nothing has its
    /// whole share; the bulk claim takes at most that many, so it fits whoever's they are.
    async fn claim_fairly(
        &self,
        lease: &Lease,
        now: Millis,
        limit: usize,
        held: &[String],
    ) -> Result<Vec<Claimed>, StoreError> {
        let (full, partial) = self.admission.short_of(limit);
        let mut skip = full;
        skip.extend(partial.iter().map(|(tenant, _)| tenant.clone()));
        let bulk = limit.min(self.admission.per_tenant());
        let scope = crate::store::TenantScope {
            skip: &skip,
            only: None,
        };
        let mut claimed = self
            .store
            .claim_due_of(lease, now, bulk as u32, held, scope)
            .await?;
        for (tenant, free) in partial {
            let left = limit - claimed.len();
            if left == 0 {
                break;
            }
            let scope = crate::store::TenantScope {
                skip: &[],
                only: Some(&tenant),
            };
            let take = free.min(left) as u32;
            claimed.extend(
                self.store
                    .claim_due_of(lease, now, take, held, scope)
                    .await?,
            );
        }
        Ok(claimed)
    }

    /// Wakes a recovery loop that waits for room, once a good share of it is free: one
    /// claim for many places rather than one per finished driver.
    pub(super) fn driver_ended(&self) {
        use std::sync::atomic::Ordering;
        let enough = (self.config.max_driving / 4).clamp(1, self.config.claim_batch as usize);
        if self.backlog.load(Ordering::Acquire) && self.admission.available() >= enough {
            self.capacity_freed.notify_one();
        }
    }

    /// Runs the recovery loop until [`Engine::shutdown`].
    pub async fn run_recovery(self: Arc<Self>) {
        use std::sync::atomic::Ordering;
        let mut seen = Seen::default();
        loop {
            *self.recovery_pass.lock().expect("poisoned") = Some(std::time::Instant::now());
            let pass = self.claim_pass().await;
            if let Ok((n, _)) = pass
                && n > 0
            {
                seen.claimed_at = Some(self.now());
            }
            self.note_seen(&mut seen).await;
            let waits_for_room = match pass {
                // A full batch: there may be more due right now.
                Ok((n, _)) if n as u32 >= self.config.claim_batch => continue,
                Ok((_, cut_short)) => cut_short,
                Err(e) => {
                    tracing::warn!(error = %e, "recovery scan failed");
                    false
                }
            };
            // Out of room with rows left due: new work queues behind them in the database
            // until finishing drivers make room, so the oldest go first.
            self.backlog.store(waits_for_room, Ordering::Release);
            let jitter = rand::random::<f64>() * 0.2 + 0.9;
            let pause = self.config.recovery_interval.mul_f64(jitter);
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.capacity_freed.notified(), if waits_for_room => {}
                _ = self.stopping.cancelled() => return,
            }
        }
    }

    /// Writes this node's row of the coordinators seen, at most every [`SEEN_EVERY`]: what
    /// the console's overview shows. Recovery goes on whether or not the write succeeds.
    async fn note_seen(&self, seen: &mut Seen) {
        if seen.written.is_some_and(|at| at.elapsed() < SEEN_EVERY) {
            return;
        }
        seen.written = Some(std::time::Instant::now());
        let claimed_at = seen.claimed_at.take();
        if let Err(e) = self
            .store
            .coordinator_seen(&self.config.node, self.now(), claimed_at)
            .await
        {
            // Kept for the next write, which may succeed.
            seen.claimed_at = seen.claimed_at.or(claimed_at);
            tracing::warn!(error = %e, "could not record this coordinator as seen");
        }
    }

    /// How late the recovery loop is: the time since its last pass began, beyond its
    /// interval and jitter. Zero while it keeps time; it grows while a pass hangs or the
    /// runtime is starved. `None` before the first pass (or without a loop).
    pub fn recovery_lag(&self) -> Option<Duration> {
        let started = (*self.recovery_pass.lock().expect("poisoned"))?;
        let due = self.config.recovery_interval.mul_f64(1.1);
        Some(started.elapsed().saturating_sub(due))
    }

    /// The first step of a graceful stop: no more claims, no new rounds of calls (a driver
    /// finishes the round in flight, stores it and hands its lease back), and every
    /// `wait_result` answers at once with the status it has.
    pub fn begin_shutdown(&self) {
        self.stopping.cancel();
    }

    /// The last step: waits up to `grace` for the drivers to finish their rounds in flight,
    /// stops those still calling, and only then hands their leases back, so that no call
    /// of this process can overlap the next owner's.
    pub async fn finish_shutdown(&self, grace: Duration) {
        self.begin_shutdown();
        self.tasks.close();
        if tokio::time::timeout(grace, self.tasks.wait())
            .await
            .is_err()
        {
            let stuck: Vec<String> = {
                let driving = self.driving.lock().expect("poisoned");
                driving.values().for_each(|d| d.abort.abort());
                driving.keys().cloned().collect()
            };
            tracing::warn!(
                transactions = stuck.len(),
                "calls still in flight after the shutdown grace; stopping them"
            );
            // An aborted driver makes no further call once its task has ended.
            self.tasks.wait().await;
        }
        let left = {
            let mut driving = self.driving.lock().expect("poisoned");
            let left = driving.len();
            driving.clear();
            left
        };
        if left == 0 {
            return;
        }
        // No driver of this process runs any more: every lease it holds goes back in one
        // write, not one per transaction (a process driving thousands took minutes).
        let ours = identity::instance_prefix(&self.config.node, &self.instance);
        if let Err(e) = self.store.release_node(&ours).await {
            tracing::warn!(error = %e, "cannot hand the leases back; they lapse on their own");
        }
    }

    /// Stops at once (no grace): for in-process servers in tests and tools.
    pub async fn shutdown(&self) {
        self.finish_shutdown(Duration::ZERO).await;
    }
}

/// How often a recovery loop writes its node's row of the coordinators seen.
const SEEN_EVERY: Duration = Duration::from_secs(5);

/// The recovery loop's record of its writes to the coordinators seen.
#[derive(Default)]
struct Seen {
    written: Option<std::time::Instant>,
    /// The last claim not yet written.
    claimed_at: Option<crate::core::Millis>,
}

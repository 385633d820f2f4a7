//! Driving a transaction: each transition performed in its order (store, then call, wait
//! or stop), so a round is stored before the calls it makes due; leases.

use std::sync::Arc;

use tracing::Instrument;

use super::*;
use crate::transport::CallResult;

impl Engine {
    // ---- driving ---------------------------------------------------------------------

    /// Drives `tx` (as stored, owned under `lease`) from the effects of `t` in a new task,
    /// which holds `admission` until it ends.
    pub(super) fn start(
        self: Arc<Self>,
        stored: StoredTx,
        lease: Lease,
        t: Transition,
        admission: Admission,
    ) {
        let gid = stored.tx.gid.clone();
        let token = lease.token.clone();
        let mut driving = self.driving.lock().expect("poisoned");
        if self.stopping.is_cancelled() {
            // Taken over a moment before the stop: hand it straight back.
            drop(driving);
            let engine = Arc::clone(&self);
            self.tasks
                .spawn(async move { engine.release(&gid, &token).await });
            return;
        }
        let engine = Arc::clone(&self);
        let span = crate::trace::transaction_span(&stored.tx);
        let task = self.tasks.spawn(async move {
            let gid = stored.tx.gid.clone();
            let token = lease.token.clone();
            engine.drive(stored, lease, t).instrument(span).await;
            let mut driving = engine.driving.lock().expect("poisoned");
            if driving.get(&gid).is_some_and(|d| d.token == token) {
                driving.remove(&gid);
            }
            drop(driving);
            drop(admission);
            engine.notify(&gid);
            engine.driver_ended();
        });
        let abort = task.abort_handle();
        driving.insert(gid, Driver { token, abort });
    }

    /// Lets this process's lease on `gid` lapse now: another coordinator may continue at
    /// once.
    pub(super) async fn release(&self, gid: &str, token: &str) {
        let now = self.clock.now();
        if let Err(e) = self.store.release(gid, token, now).await {
            tracing::warn!(gid, error = %e, "cannot hand the lease back; it lapses on its own");
        }
    }

    pub(super) fn is_driving(&self, gid: &str) -> bool {
        self.driving.lock().expect("poisoned").contains_key(gid)
    }

    /// Performs `t` and every transition that follows from it, each in the one order a
    /// transition has: store its state if it changed, then its next step (a round of
    /// calls, a wait, or the end), until there is nothing more to do here.
    pub(super) async fn drive(&self, mut stored: StoredTx, mut lease: Lease, mut t: Transition) {
        let gid = stored.tx.gid.clone();
        let mut current = stored.tx.clone();
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        let mut after_round = false;
        let mut last_calls_ended = None;
        loop {
            if t.persist {
                let decision = is_decision(&current, &t.tx);
                if decision {
                    self.observer.point(Point::BeforeDecisionStored, &gid);
                }
                let now = self.clock.now();
                let next_lease = self.lease_for(&t, now, &lease.token);
                let save = Save {
                    before: &current,
                    after: &t.tx,
                    guard: Guard::Owner(&lease.token, stored.version),
                    lease: next_lease.as_ref(),
                    attempts: &attempts,
                };
                match self.save_with_retries(save).await {
                    Ok(true) => {}
                    Ok(false) => match self.still_ours(&gid, &lease).await {
                        // A request changed the row and left it ours (a branch registered,
                        // a Try's answer recorded): go on from what is stored.
                        Some((fresh, next)) => {
                            attempts.clear();
                            current = fresh.tx.clone();
                            stored = fresh;
                            t = next;
                            continue;
                        }
                        None => {
                            tracing::info!(
                                gid,
                                "another coordinator owns this transaction now; stopping"
                            );
                            self.observer.fenced(&gid);
                            return;
                        }
                    },
                    Err(e) if e.is_permanent() => {
                        // Resuming would send this round's calls again, forever.
                        let reason = format!("cannot store progress: {e}");
                        self.stall(&current, &mut stored, &lease, reason).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(gid, error = %e, "cannot store progress; leaving it to recovery");
                        return;
                    }
                }
                attempts.clear();
                stored.tx = t.tx.clone();
                stored.version += 1;
                stored.owner_token = next_lease.as_ref().map(|l| l.token.clone());
                stored.lease_until = next_lease.as_ref().map(|l| l.until);
                self.recent.put(stored.clone());
                self.observe_status(&current, &t.tx);
                if decision {
                    self.observer.point(Point::AfterDecisionStored, &gid);
                } else if after_round {
                    self.observer.point(Point::AfterRoundStored, &gid);
                }
                after_round = false;
                current = t.tx.clone();
                match next_lease {
                    Some(l) => lease = l,
                    None => return,
                }
            }
            let followed = match &t.next {
                Next::Call(calls) => {
                    let round = self
                        .call_round(
                            &mut stored,
                            &current,
                            lease,
                            calls,
                            &mut attempts,
                            &mut last_calls_ended,
                        )
                        .await;
                    after_round = true;
                    round
                }
                Next::WakeAt(at) => self.wait_until(&current, lease, *at).await,
                Next::Done(_) => return,
            };
            let Some((next, renewed)) = followed else {
                return;
            };
            t = next;
            lease = renewed;
        }
    }

    /// One round: waits for call slots, sends `calls` concurrently and applies all their
    /// answers at once; the misses go to `attempts`, to be stored with the round's state.
    /// `None`: the driver stops (shutting down, lease lost, or stalled). Its phases are
    /// timed (`idem_round_seconds`), the gap since `last_calls_ended` included.
    async fn call_round(
        &self,
        stored: &mut StoredTx,
        current: &Transaction,
        lease: Lease,
        calls: &[BranchKey],
        attempts: &mut Vec<AttemptRecord>,
        last_calls_ended: &mut Option<std::time::Instant>,
    ) -> Option<(Transition, Lease)> {
        let gid = current.gid.as_str();
        if self.stopping.is_cancelled() {
            self.release(gid, &lease.token).await;
            return None;
        }
        let waiting = std::time::Instant::now();
        let (slots, lease) = self.call_slots(gid, lease, current, calls.len()).await?;
        let calling = std::time::Instant::now();
        crate::metrics::round_phase("slots", calling - waiting);
        if let Some(ended) = last_calls_ended.take() {
            crate::metrics::round_phase("gap", calling - ended);
        }
        let answers = self.round(current, calls, slots.num_permits()).await;
        drop(slots);
        let ended = std::time::Instant::now();
        crate::metrics::round_phase("calls", ended - calling);
        *last_calls_ended = Some(ended);
        self.observer.point(Point::AfterCallsBeforeRecord, gid);
        let mut events = Vec::with_capacity(answers.len());
        for (key, result, started_at) in answers {
            if result.outcome != core::CallOutcome::Success {
                let attempt = current.branch(&key).map_or(1, |b| b.attempts + 1);
                attempts.push(AttemptRecord {
                    branch_id: key.branch_id.clone(),
                    action: key.action,
                    attempt,
                    started_at,
                    duration_ms: result.duration.as_millis() as i64,
                    outcome: result.outcome.label().to_owned(),
                    detail: result.outcome.detail().map(str::to_owned),
                });
            }
            events.push(Event::Outcome {
                key,
                outcome: result.outcome,
            });
        }
        match core::apply_all(current, &events, self.ctx()) {
            Ok(t) => Some((t, lease)),
            Err(e) => {
                // A bug, not a condition: recovery would meet it again and again.
                let reason = format!("the answers of a round do not fit the state: {e}");
                self.stall(current, stored, &lease, reason).await;
                None
            }
        }
    }

    /// Sleeps until `at` under the lease, then wakes the transaction up. A longer wait than
    /// the hold, or a stop, hands the row back instead: the lease lapses now and the
    /// recovery loop of any coordinator picks it up when it is due. `None`: the driver
    /// stops.
    async fn wait_until(
        &self,
        current: &Transaction,
        lease: Lease,
        at: Millis,
    ) -> Option<(Transition, Lease)> {
        let gid = current.gid.as_str();
        let wait = at - self.clock.now();
        if wait > self.config.hold_ms || self.stopping.is_cancelled() {
            self.release(gid, &lease.token).await;
            return None;
        }
        let lease = self.cover(gid, &lease, wait.max(0)).await?;
        if wait > 0 {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
                _ = self.stopping.cancelled() => {
                    self.release(gid, &lease.token).await;
                    return None;
                }
            }
        }
        let t = core::apply(current, &Event::Wake, self.ctx()).ok()?;
        Some((t, lease))
    }

    /// Stalls a transaction this driver owns, with the reason, after a failure that
    /// recovery would only repeat. The write holds the global row alone, so it succeeds
    /// where the round's write did not, unless the database is gone altogether.
    pub(super) async fn stall(
        &self,
        current: &Transaction,
        stored: &mut StoredTx,
        lease: &Lease,
        reason: String,
    ) {
        let gid = current.gid.as_str();
        // The stall is logged once stored, by the observers (`EventLog`), as every stall is.
        let event = Event::Stall {
            reason: reason.clone(),
        };
        let Ok(t) = core::apply(current, &event, self.ctx()) else {
            return;
        };
        let save = Save {
            before: current,
            after: &t.tx,
            guard: Guard::Owner(&lease.token, stored.version),
            lease: None,
            attempts: &[],
        };
        match self.save_with_retries(save).await {
            Ok(true) => {
                stored.tx = t.tx.clone();
                stored.version += 1;
                stored.owner_token = None;
                stored.lease_until = None;
                self.recent.put(stored.clone());
                self.observe_status(current, &t.tx);
            }
            Ok(false) => self.observer.fenced(gid),
            Err(e) => {
                tracing::error!(gid, reason, error = %e, "cannot store the stall either; leaving it to recovery")
            }
        }
    }

    /// The lease to write with a new state: none once there is nothing more to do here,
    /// otherwise long enough to cover the next wait.
    pub(super) fn lease_for(&self, t: &Transition, now: Millis, token: &str) -> Option<Lease> {
        let until = match &t.next {
            Next::Done(_) => return None,
            Next::WakeAt(at) if at - now > self.config.hold_ms => return None,
            Next::WakeAt(at) => *at.max(&now) + self.config.lease_ms,
            Next::Call(_) => now + self.config.lease_ms,
        };
        Some(Lease {
            token: token.to_owned(),
            until,
        })
    }

    pub(super) fn longest_call(&self, tx: &Transaction) -> Millis {
        tx.options.request_timeout_ms as Millis
    }

    /// Makes sure the lease lasts `needed` ms more (plus margin), renewing it if not.
    pub(super) async fn cover(&self, gid: &str, lease: &Lease, needed: Millis) -> Option<Lease> {
        let now = self.clock.now();
        let margin = self.config.lease_ms / 3;
        if lease.until - now >= needed + margin {
            return Some(lease.clone());
        }
        let until = now + needed + self.config.lease_ms;
        match self.store.renew(gid, &lease.token, until).await {
            Ok(true) => {
                self.observer.renewed(gid);
                Some(Lease {
                    token: lease.token.clone(),
                    until,
                })
            }
            Ok(false) => {
                tracing::info!(gid, "lease lost; stopping");
                self.observer.lease_lost(gid);
                None
            }
            Err(e) => {
                tracing::warn!(gid, error = %e, "cannot renew lease; leaving it to recovery");
                None
            }
        }
    }

    /// Stores a state, retrying transient database errors for as long as they last: the
    /// driver holds answers nobody else has, and giving up would leave recovery to send
    /// those calls again. Its own recovery loop leaves the transaction alone meanwhile
    /// (it skips what this process drives); another coordinator may take it once the
    /// lease lapses, and then the save is lost, as it must be. Ok(false): the row is not
    /// ours. Gives up only when the process stops, or on an error no retry can cure.
    pub(super) async fn save_with_retries(&self, save: Save<'_>) -> Result<bool, StoreError> {
        let gid = save.after.gid.as_str();
        let mut delay = Duration::from_millis(50);
        let mut failed = false;
        loop {
            let error = match self.store.save(save.clone()).await {
                Ok(Saved::Saved) => return Ok(true),
                // A retry after an error whose commit did land looks like a lost race:
                // ask the stored row whether it is exactly what we wrote.
                Ok(Saved::Lost) if failed => match self.store.load(gid).await {
                    Ok(stored) => return Ok(stored.is_some_and(|s| is_our_save(&s, &save))),
                    Err(e) => e,
                },
                Ok(Saved::Lost) => return Ok(false),
                Err(e) => e,
            };
            if error.is_permanent() || self.stopping.is_cancelled() {
                return Err(error);
            }
            tracing::warn!(gid, error = %error, "store write failed; retrying");
            failed = true;
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.stopping.cancelled() => return Err(error),
            }
            delay = (delay * 2).min(SAVE_RETRY_CAP);
        }
    }

    /// After a save of this driver's was lost: the row as stored, and the transition from
    /// it, if the lease is still this driver's (a request moved its version without
    /// taking it over). `None`: someone else owns it now, or it cannot be read.
    async fn still_ours(&self, gid: &str, lease: &Lease) -> Option<(StoredTx, Transition)> {
        let stored = self.store.load(gid).await.ok()??;
        if stored.owner_token.as_deref() != Some(lease.token.as_str()) {
            return None;
        }
        let t = core::apply(&stored.tx, &Event::Wake, self.ctx()).ok()?;
        self.recent.put(stored.clone());
        Some((stored, t))
    }

    /// Waits for the call slots of a round (at most `max_concurrent_calls` in flight over
    /// all transactions), renewing the lease while queued so that under overload no other
    /// driver, this node's recovery loop included, takes the transaction over; then makes
    /// the lease cover the whole round. `None`: the lease is lost, or the process stops
    /// (the lease is handed back).
    pub(super) async fn call_slots(
        &self,
        gid: &str,
        mut lease: Lease,
        tx: &Transaction,
        calls: usize,
    ) -> Option<(tokio::sync::SemaphorePermit<'_>, Lease)> {
        let width = calls.clamp(1, self.config.max_concurrent_calls.max(1));
        let waves = calls.div_ceil(width) as Millis;
        let round_time = waves * self.longest_call(tx);
        let tick = Duration::from_millis((self.config.lease_ms / 3).max(1) as u64);
        let acquire = self.calls.acquire_many(width as u32);
        tokio::pin!(acquire);
        let slots = loop {
            lease = self.cover(gid, &lease, round_time).await?;
            tokio::select! {
                slots = &mut acquire => break slots.expect("the call semaphore is never closed"),
                _ = tokio::time::sleep(tick) => {}
                _ = self.stopping.cancelled() => {
                    self.release(gid, &lease.token).await;
                    return None;
                }
            }
        };
        let lease = self.cover(gid, &lease, round_time).await?;
        Some((slots, lease))
    }

    /// Performs a round's calls, `width` at a time; returns each answer with the time it
    /// started.
    pub(super) async fn round(
        &self,
        tx: &Transaction,
        calls: &[BranchKey],
        width: usize,
    ) -> Vec<(BranchKey, crate::transport::CallResult, Millis)> {
        use futures::StreamExt;
        // Boxed into a list first: a lazily mapped stream of borrowing futures trips the
        // compiler's higher-ranked Send check inside the spawned driver.
        let calls: Vec<futures::future::BoxFuture<'_, _>> = calls
            .iter()
            .map(|key| {
                let branch = tx.branch(key).expect("planned calls name stored branches");
                Box::pin(async move {
                    let (result, started_at) = self.call_branch(tx, branch, false).await;
                    (key.clone(), result, started_at)
                }) as futures::future::BoxFuture<'_, _>
            })
            .collect();
        futures::stream::iter(calls)
            .buffered(width.max(1))
            .collect()
            .await
    }

    /// One branch call in its own span, with the transaction's trace context, reported to
    /// the observer; returns the answer and when the call started. `detached`: not inside
    /// a drive (see [`crate::trace::call_span`]).
    pub(super) async fn call_branch(
        &self,
        tx: &Transaction,
        branch: &Branch,
        detached: bool,
    ) -> (CallResult, Millis) {
        let mut request = self.call_request(tx, branch);
        let span = crate::trace::call_span(tx, &branch.branch_id, branch.action.op(), detached);
        if let Some(context) = &tx.trace
            && let Some(parent) = crate::trace::call_traceparent(context, &span)
        {
            request.headers.insert("traceparent".into(), parent);
            if let Some(state) = &context.tracestate {
                request.headers.insert("tracestate".into(), state.clone());
            }
        }
        async {
            let started_at = self.clock.now();
            let result = self.transport.call(&request).await;
            self.observer.call(&request, &result, started_at);
            (result, started_at)
        }
        .instrument(span)
        .await
    }

    /// The transaction's `branch_headers`, plus a User-Agent naming this node unless the
    /// transaction sets its own: a participant's logs then say which coordinator called.
    /// The trace context comes from the transaction's own, never from `branch_headers`;
    /// so does `Idem-Tenant`, set for a tenant other than the default: a participant that
    /// several tenants call can keep their gids apart in its barrier.
    fn call_headers(&self, tx: &Transaction) -> std::collections::BTreeMap<String, String> {
        let mut headers = tx.options.branch_headers.clone();
        headers.retain(|name, _| !name.eq_ignore_ascii_case(TENANT_HEADER));
        let (tenant, _) = crate::tenant::split_key(&tx.gid);
        if tenant != crate::tenant::DEFAULT_TENANT {
            headers.insert(TENANT_HEADER.into(), tenant.to_owned());
        }
        if tx.trace.is_some() {
            headers.retain(|name, _| {
                !name.eq_ignore_ascii_case("traceparent")
                    && !name.eq_ignore_ascii_case("tracestate")
            });
        }
        if !headers.keys().any(|k| k.eq_ignore_ascii_case("user-agent")) {
            let node: String = self
                .config
                .node
                .chars()
                .filter(|c| (' '..='~').contains(c))
                .collect();
            let agent = format!("idem/{} ({node})", env!("CARGO_PKG_VERSION"));
            headers.insert("user-agent".into(), agent);
        }
        headers
    }

    pub(super) fn call_request(&self, tx: &Transaction, branch: &Branch) -> CallRequest {
        let (tenant, gid) = crate::tenant::split_key(&tx.gid);
        CallRequest {
            gid: gid.to_owned(),
            tenant: tenant.to_owned(),
            kind: tx.kind,
            branch_id: branch.branch_id.to_string(),
            action: branch.action,
            url: branch.url.to_string(),
            payload: branch.payload.to_string(),
            timeout: Duration::from_millis(tx.options.request_timeout_ms.max(1)),
            headers: self.call_headers(tx),
            protocol: tx.options.protocol,
            attempt: (branch.attempts + 1).max(1) as u32,
        }
    }
}

/// The longest pause between two tries of a save the database failed.
const SAVE_RETRY_CAP: Duration = Duration::from_secs(2);

/// Whether the stored row is exactly what `save` wrote: its state, its owner, and the
/// version right after the one it expected.
fn is_our_save(stored: &StoredTx, save: &Save<'_>) -> bool {
    let expected = match save.guard {
        Guard::Owner(_, version) | Guard::Version(version) => version,
    };
    stored.owner_token.as_deref() == save.lease.map(|l| l.token.as_str())
        && stored.version == expected + 1
        && stored.tx == *save.after
}

/// The header naming a call's tenant.
pub const TENANT_HEADER: &str = "idem-tenant";

/// A move into a phase whose calls must not go out before it is stored.
pub(super) fn is_decision(before: &Transaction, after: &Transaction) -> bool {
    before.status != after.status && matches!(after.status, Status::Committing | Status::Aborting)
}

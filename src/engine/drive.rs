//! Driving a transaction: each transition performed in its order (store, then call, wait
//! or stop), so a round is stored before the calls it makes due; leases.

use std::sync::Arc;

use tracing::Instrument;

use super::save::{Change, OnError, is_decision, lease_of};
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
                let keep = self.config.max_history_per_transaction;
                super::history::number(&current, &mut t.tx, &mut attempts, keep);
                let change = Change {
                    stored: &stored,
                    after: &t.tx,
                    owner: Some(&lease.token),
                    attempts: &attempts,
                };
                let next_lease = || self.lease_for(&t, self.clock.now(), &lease.token);
                match self.save_state(change, next_lease, OnError::Retry).await {
                    Ok(Some(fresh)) => stored = fresh,
                    Ok(None) => match self.still_ours(&gid, &lease).await {
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
                        self.stall(&mut stored, &lease, reason).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(gid, error = %e, "cannot store progress; leaving it to recovery");
                        return;
                    }
                }
                attempts.clear();
                if after_round && !is_decision(&current, &t.tx) {
                    self.observer.point(Point::AfterRoundStored, &gid);
                }
                after_round = false;
                current = t.tx.clone();
                match lease_of(&stored) {
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
        self.observer
            .round_phase(RoundPhase::Slots, calling - waiting);
        if let Some(ended) = last_calls_ended.take() {
            self.observer.round_phase(RoundPhase::Gap, calling - ended);
        }
        let answers = self.round(current, calls, slots.count()).await;
        drop(slots);
        let ended = std::time::Instant::now();
        self.observer
            .round_phase(RoundPhase::Calls, ended - calling);
        *last_calls_ended = Some(ended);
        self.observer.point(Point::AfterCallsBeforeRecord, gid);
        let mut events = Vec::with_capacity(answers.len());
        for (key, result, started_at) in answers {
            if result.outcome != core::CallOutcome::Success {
                let attempt = current.branch(&key).map_or(1, |b| b.attempts + 1);
                attempts.push(AttemptRecord {
                    // Given when the round is saved: see `history::number`.
                    number: 0,
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
                self.stall(stored, &lease, reason).await;
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
    pub(super) async fn stall(&self, stored: &mut StoredTx, lease: &Lease, reason: String) {
        let gid = stored.tx.gid.clone();
        // The stall is logged once stored, by the observers (`EventLog`), as every stall is.
        let event = Event::Stall {
            reason: reason.clone(),
        };
        let Ok(t) = core::apply(&stored.tx, &event, self.ctx()) else {
            return;
        };
        let change = Change {
            stored,
            after: &t.tx,
            owner: Some(&lease.token),
            attempts: &[],
        };
        match self.save_state(change, || None, OnError::Retry).await {
            Ok(Some(fresh)) => *stored = fresh,
            Ok(None) => self.observer.fenced(&gid),
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
    /// all transactions, and the tenant's share of them), renewing the lease while queued
    /// so that under overload no other driver, this node's recovery loop included, takes
    /// the transaction over; then makes the lease cover the whole round. `None`: the lease
    /// is lost, or the process stops (the lease is handed back).
    pub(super) async fn call_slots(
        &self,
        gid: &str,
        mut lease: Lease,
        tx: &Transaction,
        calls: usize,
    ) -> Option<(Slot, Lease)> {
        let width = calls.clamp(1, self.calls.per_tenant());
        let waves = calls.div_ceil(width) as Millis;
        let round_time = waves * self.longest_call(tx);
        let tick = Duration::from_millis((self.config.lease_ms / 3).max(1) as u64);
        let acquire = self.calls.acquire(tenant_of(gid), width);
        tokio::pin!(acquire);
        let slots = loop {
            lease = self.cover(gid, &lease, round_time).await?;
            tokio::select! {
                slots = &mut acquire => break slots,
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
    /// so does `Idem-Tenant`, set always (the default tenant included): a participant that
    /// several tenants call keeps their gids apart in its barrier, and a signature covers
    /// it (the transport sets it again from the request's tenant, over anything else).
    fn call_headers(&self, tx: &Transaction) -> std::collections::BTreeMap<String, String> {
        let mut headers = tx.options.branch_headers.clone();
        headers.retain(|name, _| !name.eq_ignore_ascii_case(TENANT_HEADER));
        let (tenant, _) = crate::tenant::split_key(&tx.gid);
        headers.insert(TENANT_HEADER.into(), tenant.to_owned());
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
            payload: branch.payload.clone(),
            timeout: Duration::from_millis(tx.options.request_timeout_ms.max(1)),
            headers: self.call_headers(tx),
            protocol: tx.options.protocol,
            attempt: (branch.attempts + 1).max(1) as u32,
        }
    }
}

/// The header naming a call's tenant.
pub const TENANT_HEADER: &str = idem_signing::TENANT_HEADER;

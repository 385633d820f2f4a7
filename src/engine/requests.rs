//! Client and operator requests: create, register, submit, abort, retry, force-stop.
//!
//! Each runs detached from its client's connection, so a client that hangs up after the
//! write still leaves its transaction with a driver (not undriven until its lease ends).

use std::sync::Arc;

use super::save::{self, Change, OnError};
use super::*;
use crate::tenant::client_gid;

impl Engine {
    // ---- client requests -------------------------------------------------------------

    /// Creates and starts a saga. A repeat with the same gid and request returns the
    /// stored transaction; another request under the same gid is a conflict.
    pub async fn create_saga(self: &Arc<Self>, new: NewSaga) -> Result<CreateOutcome, EngineError> {
        let engine = Arc::clone(self);
        detached(async move { engine.create_and_start(new).await }).await
    }

    async fn create_and_start(
        self: &Arc<Self>,
        new: NewSaga,
    ) -> Result<CreateOutcome, EngineError> {
        let now = self.clock.now();
        let mut tx = Transaction::saga(new.gid, new.steps, new.options, now);
        tx.trace = Some(new.trace.unwrap_or_else(crate::trace::start));
        tx.tokenless = new.tokenless;
        // The creator drives the saga; if it dies, the lease lapses and recovery resumes.
        // A creator that drives as many as it may stores it unowned and due: the recovery
        // loop of a coordinator with room claims it.
        let admission = self.admit(&tx.gid);
        let lease = admission.as_ref().map(|_| self.new_lease(now));
        let outcome = self
            .create(tx.clone(), new.request.as_ref(), lease.as_ref())
            .await?;
        if let (true, Some(lease), Some(admission)) = (outcome.created, lease, admission) {
            let t =
                core::apply(&tx, &Event::Wake, self.ctx()).map_err(EngineError::InvalidState)?;
            Arc::clone(self).start(outcome.stored.clone(), lease, t, admission);
        }
        Ok(outcome)
    }

    /// Creates a prepared TCC or msg transaction.
    pub async fn create_prepared(&self, new: NewPrepared) -> Result<CreateOutcome, EngineError> {
        let now = self.clock.now();
        let mut options = new.options;
        if options.timeout_ms.is_none() {
            options.timeout_ms = Some(self.config.prepared_timeout_ms);
        }
        let mut tx = Transaction::prepared(new.gid, new.kind, options, now);
        tx.trace = Some(new.trace.unwrap_or_else(crate::trace::start));
        tx.tokenless = new.tokenless;
        if new.kind == Kind::Msg {
            let mut branches = Vec::new();
            if let Some(url) = new.query_prepared {
                branches.push(Branch::new("00", Action::QueryPrepared, -1, url, "", now));
            }
            for (i, (url, payload)) in new.msg_steps.into_iter().enumerate() {
                let id = core::step_branch_id(i);
                branches.push(Branch::new(id, Action::Action, i as i32, url, payload, now));
            }
            tx.add_branches(branches);
        }
        if new.kind == Kind::Tcc {
            tx.add_branches(new.branches);
        }
        self.create(tx, new.request.as_ref(), None).await
    }

    pub(super) async fn create(
        &self,
        tx: Transaction,
        request: &dyn CanonicalRequest,
        lease: Option<&Lease>,
    ) -> Result<CreateOutcome, EngineError> {
        let hash = request.hash();
        let kind = tx.kind;
        match self.store.create(&tx, &hash, lease).await? {
            Created::Inserted => {
                self.observer.create(kind, Creation::Created);
                let stored = self.record_saved(tx, hash, 0, lease);
                Ok(CreateOutcome {
                    stored,
                    created: true,
                })
            }
            // A token-less caller's repeat is one only of what it may see: the gid of a
            // transaction it may not is taken, as by a different request.
            Created::Exists(existing)
                if request.repeats(&existing.request_hash, &existing.tx.options)
                    && existing.tx.admits(access_of(&tx)) =>
            {
                self.observer.create(kind, Creation::Repeat);
                Ok(CreateOutcome {
                    stored: *existing,
                    created: false,
                })
            }
            Created::Exists(existing) => {
                self.observer.create(kind, Creation::Conflict);
                Err(EngineError::GidConflict(
                    client_gid(&existing.tx.gid).to_owned(),
                ))
            }
        }
    }

    /// Registers TCC branch operations while the transaction is prepared and `access`
    /// admits it.
    pub async fn register(
        &self,
        gid: &str,
        branches: Vec<Branch>,
        access: Access,
    ) -> Result<(), EngineError> {
        // The registration changes the row's version; a cached copy would only lose a race.
        self.recent.remove(gid);
        match self
            .store
            .register(gid, &branches, self.clock.now(), access)
            .await?
        {
            Registered::Stored => Ok(()),
            Registered::NotFound => Err(EngineError::NotFound(client_gid(gid).to_owned())),
            Registered::NotPrepared(status) => Err(EngineError::NotPrepared(status)),
            Registered::Conflict(key) => Err(EngineError::BranchConflict(key)),
        }
    }

    /// Calls a registered Try on the caller's behalf and records its answer.
    pub async fn call_try(
        self: &Arc<Self>,
        gid: &str,
        branch_id: &str,
    ) -> Result<(core::CallOutcome, StoredTx), EngineError> {
        let stored = self.reads.load(gid).await?;
        let key = BranchKey {
            branch_id: branch_id.to_owned(),
            action: Action::Try,
        };
        let branch = stored
            .tx
            .branch(&key)
            .ok_or_else(|| EngineError::InvalidState(CoreError::UnknownBranch(key.clone())))?
            .clone();
        let (result, _) = self.call_branch(&stored.tx, &branch, true).await;
        let outcome = result.outcome.clone();
        let event = Event::Outcome {
            key,
            outcome: outcome.clone(),
        };
        let (stored, _) = self.update(gid, &event, false, Access::Tenant).await?;
        Ok((outcome, stored))
    }

    /// Commits a prepared TCC or msg transaction that `access` admits.
    pub async fn submit(
        self: &Arc<Self>,
        gid: &str,
        access: Access,
    ) -> Result<StoredTx, EngineError> {
        self.take_over(gid, Event::Submit, access)
            .await
            .map(|(s, _)| s)
    }

    /// Rolls back a prepared TCC (Cancels) or msg (fails it) that `access` admits; also
    /// says whether this request changed it (`false`: it was aborting or over already,
    /// which DTM's door answers as DTM does).
    pub async fn abort(
        self: &Arc<Self>,
        gid: &str,
        reason: &str,
        access: Access,
    ) -> Result<(StoredTx, bool), EngineError> {
        let event = Event::Abort {
            reason: reason.to_owned(),
        };
        self.take_over(gid, event, access).await
    }

    /// Resumes a stalled transaction, or makes a backing-off one due now.
    pub async fn retry(self: &Arc<Self>, gid: &str) -> Result<StoredTx, EngineError> {
        let (stored, changed) = self.take_over(gid, Event::Retry, Access::Tenant).await?;
        if changed {
            self.observer.operator(OperatorAction::Retry, &stored.tx);
        }
        Ok(stored)
    }

    /// Fails the transaction at once; nothing more is called.
    pub async fn force_stop(
        self: &Arc<Self>,
        gid: &str,
        reason: &str,
    ) -> Result<StoredTx, EngineError> {
        let event = Event::ForceStop {
            reason: reason.to_owned(),
        };
        let (stored, changed) = self.take_over(gid, event, Access::Tenant).await?;
        if changed {
            self.observer
                .operator(OperatorAction::ForceStop, &stored.tx);
        }
        self.notify(gid);
        Ok(stored)
    }

    /// [`Engine::update`] of a request that takes the transaction over, run to its end
    /// whether or not the caller still waits.
    async fn take_over(
        self: &Arc<Self>,
        gid: &str,
        event: Event,
        access: Access,
    ) -> Result<(StoredTx, bool), EngineError> {
        let (engine, gid) = (Arc::clone(self), gid.to_owned());
        detached(async move { engine.update(&gid, &event, true, access).await }).await
    }

    /// Applies a client or operator event: read, apply, write conditionally on the
    /// version read, and start driving when there is work. Lost races re-read and apply
    /// again, so a repeated request sees the outcome of the first. A transaction `access`
    /// does not admit is not found; checked on the copy the write is conditional on.
    pub(super) async fn update(
        self: &Arc<Self>,
        gid: &str,
        event: &Event,
        take_over: bool,
        access: Access,
    ) -> Result<(StoredTx, bool), EngineError> {
        let mut cached = self.recent.get(gid);
        for _ in 0..CONTENTION_RETRIES {
            // A copy this process wrote is as good as a read: the write below is
            // conditional on its version, and a stale copy only loses the race.
            let (stored, from_cache) = match cached.take() {
                Some(stored) => (stored, true),
                None => (self.reads.load(gid).await?, false),
            };
            if !stored.tx.admits(access) {
                return Err(EngineError::NotFound(client_gid(gid).to_owned()));
            }
            let applied = core::apply(&stored.tx, event, self.ctx());
            // Only the database may say "refused" or "nothing to do": another node may have
            // moved the transaction since this copy was made (stalled it, finished it).
            if from_cache && applied.as_ref().map_or(true, |t| !t.persist) {
                self.recent.remove(gid);
                continue;
            }
            let t = applied.map_err(EngineError::InvalidState)?;
            if !t.persist {
                return Ok((stored, false));
            }
            let now = self.clock.now();
            let has_calls = !t.calls().is_empty();
            // Without room to drive it here, the row is released to the recovery loops.
            let admission = (take_over && has_calls).then(|| self.admit(gid)).flatten();
            let lease = admission.as_ref().map(|_| self.new_lease(now));
            // Work to do: this process takes it. Otherwise, a client request releases the
            // row (the recovery loop of any server continues it), while recording a Try
            // answer leaves the owner as it was.
            let written = match (&lease, take_over) {
                (Some(lease), _) => Some(lease.clone()),
                (None, true) => None,
                (None, false) => save::lease_of(&stored),
            };
            let change = Change {
                stored: &stored,
                after: &t.tx,
                owner: None,
                attempts: &[],
            };
            let Some(result) = self.save_state(change, || written, OnError::Fail).await? else {
                self.recent.remove(gid);
                continue;
            };
            if let (Some(lease), Some(admission)) = (lease, admission) {
                // Stored above: the driver starts at the transition's next step.
                let stored_already = Transition {
                    persist: false,
                    ..t
                };
                Arc::clone(self).start(result.clone(), lease, stored_already, admission);
            } else if t.tx.status.is_terminal() || t.tx.status == Status::Stalled {
                self.notify(gid);
            }
            return Ok((result, true));
        }
        Err(EngineError::Contention)
    }
}

/// Runs a request's work in a task of its own and waits for it. A client that hangs up
/// drops its request, and with it whatever the request was awaiting: dropped between its
/// write and the start of the driver, a transaction would be stored with this process's
/// lease and driven by nobody until the lease ran out. Detached, the work finishes.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, EngineError>> + Send + 'static,
) -> Result<T, EngineError> {
    match tokio::spawn(work).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime that is shutting down cancels a task.
        Err(_) => Err(EngineError::Store(StoreError::Batch(
            "the coordinator is stopping".into(),
        ))),
    }
}

/// What a create's creator may see of what it finds under its gid: a token-less create
/// sees only token-less transactions.
fn access_of(new: &Transaction) -> Access {
    if new.tokenless {
        Access::Tokenless
    } else {
        Access::Tenant
    }
}

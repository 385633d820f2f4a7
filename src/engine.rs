//! The engine: drives global transactions by performing the core's effects.
//!
//! A transaction is driven by at most one coordinator at a time: the one whose owner token
//! is on the row and whose lease has not expired. Client requests (submit, abort, retry,
//! force-stop) take a transaction over with a write conditional on the status and version
//! they read; the recovery loop takes over transactions whose lease expired (a crashed or
//! paused coordinator) with a conditional claim. Every later write of the driver carries
//! its token, so a coordinator that lost the row cannot overwrite the new owner's progress.
//!
//! Driving is a loop of rounds: perform the due calls concurrently, feed all their answers
//! to the core at once, store the new state (one database transaction), repeat. A round's
//! answers are stored before the calls they make due are sent; that is what lets recovery
//! tell which saga steps may have reached a participant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::{Notify, Semaphore};

use crate::canonical::request_hash;
use crate::core::{
    self, Action, Branch, BranchKey, CoreError, Ctx, Effect, Event, Kind, Millis, SagaStep, Status,
    Transaction, Transition, TxOptions,
};
use crate::store::{
    AttemptRecord, Created, Guard, Lease, Registered, Save, Saved, Store, StoreError, StoredTx,
};
use crate::transport::{CallRequest, CallResult, Transport};

/// Engine settings; the server's defaults for transaction options are among them.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Names this coordinator in owner tokens and logs.
    pub node: String,
    /// How long a claim or a write keeps the transaction ours without a further write.
    pub lease_ms: Millis,
    /// How often the recovery loop looks for due transactions nobody drives.
    pub recovery_interval: Duration,
    /// Transactions claimed per recovery query.
    pub claim_batch: u32,
    /// A driver sleeps through a retry delay up to this long, keeping its lease; a longer
    /// delay releases the transaction to the recovery loop.
    pub hold_ms: Millis,
    /// Options of transactions that do not set their own.
    pub defaults: TxOptions,
    /// Default global timeout of a prepared TCC or msg transaction.
    pub prepared_timeout_ms: u64,
    /// Calls to participants in flight at once, over all transactions.
    pub max_concurrent_calls: usize,
    /// Whether this process drives transactions. An operator's command-line tool does
    /// not: its retry or force-stop releases the transaction to the servers instead.
    pub drive: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            node: "idem".into(),
            lease_ms: 15_000,
            recovery_interval: Duration::from_secs(1),
            claim_batch: 200,
            hold_ms: 5_000,
            defaults: TxOptions::default(),
            prepared_timeout_ms: 60_000,
            max_concurrent_calls: 1_024,
            drive: true,
        }
    }
}

/// Named points in the driver, reported to the [`Observer`]. Fault plans crash the
/// process at them to test recovery from exactly there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Point {
    /// A commit or abort decision is about to be stored.
    BeforeDecisionStored,
    /// The decision is stored; no branch has been called yet.
    AfterDecisionStored,
    /// A round of calls came back but is not stored yet.
    AfterCallsBeforeRecord,
    /// A round's answers are stored.
    AfterRoundStored,
}

impl Point {
    pub fn as_str(self) -> &'static str {
        match self {
            Point::BeforeDecisionStored => "before_decision_stored",
            Point::AfterDecisionStored => "after_decision_stored",
            Point::AfterCallsBeforeRecord => "after_calls_before_record",
            Point::AfterRoundStored => "after_round_stored",
        }
    }
}

/// Watches the engine: every call and its result, every stored status change, every named
/// point. Recording and fault injection hang off this; the default does nothing.
pub trait Observer: Send + Sync + 'static {
    fn call(&self, _request: &CallRequest, _result: &CallResult, _started_at: Millis) {}
    fn status(&self, _gid: &str, _from: Status, _to: Status, _at: Millis) {}
    fn point(&self, _point: Point, _gid: &str) {}
    /// This process tried to write progress but another coordinator owns the
    /// transaction now: the write was refused and the driver stops.
    fn fenced(&self, _gid: &str) {}
}

/// The observer that watches nothing.
pub struct NoObserver;

impl Observer for NoObserver {}

/// A source of the current time, so tests can control it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

/// Why a client or operator request failed. Each maps to one API error code.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("no transaction with gid {0:?}")]
    NotFound(String),
    #[error("gid {0:?} is already used by a different request")]
    GidConflict(String),
    #[error("branch {0} is already registered with a different URL or payload")]
    BranchConflict(BranchKey),
    #[error("{0}")]
    InvalidState(CoreError),
    #[error("the transaction is {0}; branches can only be registered while it is prepared")]
    NotPrepared(Status),
    #[error("the transaction kept changing under this request; try again")]
    Contention,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A new saga, as the API receives it.
#[derive(Clone, Debug)]
pub struct NewSaga {
    pub gid: String,
    pub steps: Vec<SagaStep>,
    pub options: TxOptions,
    /// The canonical request, hashed to recognise a repeat.
    pub request: serde_json::Value,
}

/// A new prepared transaction (TCC, or msg with its steps and back-check URL).
#[derive(Clone, Debug)]
pub struct NewPrepared {
    pub gid: String,
    pub kind: Kind,
    pub options: TxOptions,
    /// Msg: the actions, in order.
    pub msg_steps: Vec<(String, String)>,
    /// Msg: where to ask whether the application's local transaction committed.
    pub query_prepared: Option<String>,
    /// TCC: branches registered with the transaction, in the same database write.
    pub branches: Vec<Branch>,
    pub request: serde_json::Value,
}

/// The result of a create: the transaction as stored and whether this request created it.
#[derive(Clone, Debug)]
pub struct CreateOutcome {
    pub stored: StoredTx,
    pub created: bool,
}

pub struct Engine {
    store: Arc<dyn Store>,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    config: EngineConfig,
    calls: Semaphore,
    /// Transactions this process drives, with the token it drives them under.
    driving: Mutex<HashMap<String, String>>,
    recent: Recent,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    shutdown: Notify,
}

/// How often a client request retries after losing a race with another writer.
const CONTENTION_RETRIES: usize = 50;

impl Engine {
    pub fn new(
        store: Arc<dyn Store>,
        transport: Arc<dyn Transport>,
        clock: Arc<dyn Clock>,
        config: EngineConfig,
    ) -> Arc<Engine> {
        let calls = Semaphore::new(config.max_concurrent_calls.max(1));
        Arc::new(Engine {
            store,
            transport,
            clock,
            observer: Arc::new(NoObserver),
            config,
            calls,
            driving: Mutex::new(HashMap::new()),
            recent: Recent::default(),
            waiters: Mutex::new(HashMap::new()),
            shutdown: Notify::new(),
        })
    }

    /// Replaces the observer (before any work starts).
    pub fn with_observer(self: Arc<Self>, observer: Arc<dyn Observer>) -> Arc<Engine> {
        let mut engine =
            Arc::into_inner(self).expect("with_observer is called before the engine is shared");
        engine.observer = observer;
        Arc::new(engine)
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            now: self.clock.now(),
            jitter: rand::random::<f64>(),
        }
    }

    fn new_lease(&self, now: Millis) -> Lease {
        Lease {
            token: format!("{}{}", self.token_prefix(), uuid::Uuid::new_v4().simple()),
            until: now + self.config.lease_ms,
        }
    }

    /// Every owner token of this node starts with this.
    fn token_prefix(&self) -> String {
        let node: String = self.config.node.chars().take(24).collect();
        format!("{node}:")
    }

    /// At start-up: transactions a previous process of this node owned are resumed now,
    /// not after their leases run out (that process is gone: one process per node name).
    pub async fn release_own_leases(&self) -> Result<u64, StoreError> {
        let released = self.store.release_node(&self.token_prefix()).await?;
        if released > 0 {
            tracing::info!(
                released,
                "resuming transactions a previous process of this node owned"
            );
        }
        Ok(released)
    }

    /// Number of transactions this process is driving now.
    pub fn driving(&self) -> usize {
        self.driving.lock().expect("poisoned").len()
    }

    // ---- client requests -------------------------------------------------------------

    /// Creates and starts a saga. A repeat with the same gid and request returns the
    /// stored transaction; another request under the same gid is a conflict.
    pub async fn create_saga(self: &Arc<Self>, new: NewSaga) -> Result<CreateOutcome, EngineError> {
        let now = self.clock.now();
        let tx = Transaction::saga(new.gid, new.steps, new.options, now);
        // The creator drives the saga; if it dies, the lease lapses and recovery resumes.
        let lease = self.config.drive.then(|| self.new_lease(now));
        let outcome = self
            .create(tx.clone(), &new.request, lease.as_ref())
            .await?;
        if let (true, Some(lease)) = (outcome.created, lease) {
            let t =
                core::apply(&tx, &Event::Wake, self.ctx()).map_err(EngineError::InvalidState)?;
            Arc::clone(self).start(outcome.stored.clone(), lease, t);
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
        self.create(tx, &new.request, None).await
    }

    async fn create(
        &self,
        tx: Transaction,
        request: &serde_json::Value,
        lease: Option<&Lease>,
    ) -> Result<CreateOutcome, EngineError> {
        let hash = request_hash(request);
        match self.store.create(&tx, &hash, lease).await? {
            Created::Inserted => {
                let stored = StoredTx {
                    tx,
                    request_hash: hash,
                    owner_token: lease.map(|l| l.token.clone()),
                    lease_until: lease.map(|l| l.until),
                    version: 0,
                };
                self.recent.put(stored.clone());
                Ok(CreateOutcome {
                    stored,
                    created: true,
                })
            }
            Created::Exists(existing) if existing.request_hash == hash => Ok(CreateOutcome {
                stored: *existing,
                created: false,
            }),
            Created::Exists(existing) => Err(EngineError::GidConflict(existing.tx.gid)),
        }
    }

    /// Registers TCC branch operations while the transaction is prepared.
    pub async fn register(&self, gid: &str, branches: Vec<Branch>) -> Result<(), EngineError> {
        // The registration changes the row's version; a cached copy would only lose a race.
        self.recent.remove(gid);
        match self
            .store
            .register(gid, &branches, self.clock.now())
            .await?
        {
            Registered::Stored => Ok(()),
            Registered::NotFound => Err(EngineError::NotFound(gid.to_owned())),
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
        let stored = self.load(gid).await?;
        let key = BranchKey {
            branch_id: branch_id.to_owned(),
            action: Action::Try,
        };
        let branch = stored
            .tx
            .branch(&key)
            .ok_or_else(|| EngineError::InvalidState(CoreError::UnknownBranch(key.clone())))?
            .clone();
        let request = self.call_request(&stored.tx, &branch);
        let started_at = self.clock.now();
        let result = self.transport.call(&request).await;
        self.observer.call(&request, &result, started_at);
        let outcome = result.outcome.clone();
        let event = Event::Outcome {
            key,
            outcome: outcome.clone(),
        };
        let (stored, _) = self.update(gid, &event, false).await?;
        Ok((outcome, stored))
    }

    /// Commits a prepared TCC or msg transaction.
    pub async fn submit(self: &Arc<Self>, gid: &str) -> Result<StoredTx, EngineError> {
        self.update(gid, &Event::Submit, true).await.map(|(s, _)| s)
    }

    /// Rolls back a prepared TCC (Cancels) or msg (fails it).
    pub async fn abort(self: &Arc<Self>, gid: &str, reason: &str) -> Result<StoredTx, EngineError> {
        let event = Event::Abort {
            reason: reason.to_owned(),
        };
        self.update(gid, &event, true).await.map(|(s, _)| s)
    }

    /// Resumes a stalled transaction, or makes a backing-off one due now.
    pub async fn retry(self: &Arc<Self>, gid: &str) -> Result<StoredTx, EngineError> {
        self.update(gid, &Event::Retry, true).await.map(|(s, _)| s)
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
        let (stored, _) = self.update(gid, &event, true).await?;
        self.notify(gid);
        Ok(stored)
    }

    pub async fn load(&self, gid: &str) -> Result<StoredTx, EngineError> {
        self.store
            .load(gid)
            .await?
            .ok_or_else(|| EngineError::NotFound(gid.to_owned()))
    }

    /// Applies a client or operator event: read, apply, write conditionally on the
    /// version read, and start driving when there is work. Lost races re-read and apply
    /// again, so a repeated request sees the outcome of the first.
    async fn update(
        self: &Arc<Self>,
        gid: &str,
        event: &Event,
        take_over: bool,
    ) -> Result<(StoredTx, bool), EngineError> {
        let mut cached = self.recent.get(gid);
        for _ in 0..CONTENTION_RETRIES {
            // A copy this process wrote is as good as a read: the write below is
            // conditional on its version, and a stale copy only loses the race.
            let stored = match cached.take() {
                Some(stored) => stored,
                None => self.load(gid).await?,
            };
            let t =
                core::apply(&stored.tx, event, self.ctx()).map_err(EngineError::InvalidState)?;
            if !t.persists() {
                return Ok((stored, false));
            }
            let now = self.clock.now();
            let has_calls = t.calls().next().is_some();
            let lease = (take_over && has_calls && self.config.drive).then(|| self.new_lease(now));
            let keep_owner = stored
                .owner_token
                .clone()
                .zip(stored.lease_until)
                .map(|(token, until)| Lease { token, until });
            // Work to do: this process takes it. Otherwise, a client request releases the
            // row (the recovery loop of any server continues it), while recording a Try
            // answer leaves the owner as it was.
            let written = match (&lease, take_over) {
                (Some(lease), _) => Some(lease.clone()),
                (None, true) => None,
                (None, false) => keep_owner,
            };
            let decision = is_decision(&stored.tx, &t.tx);
            if decision {
                self.observer.point(Point::BeforeDecisionStored, gid);
            }
            let saved = self
                .store
                .save(Save {
                    before: &stored.tx,
                    after: &t.tx,
                    guard: Guard::Version(stored.version),
                    lease: written.as_ref(),
                    attempts: &[],
                })
                .await?;
            if saved == Saved::Lost {
                self.recent.remove(gid);
                continue;
            }
            self.observe_status(&stored.tx, &t.tx);
            if decision {
                self.observer.point(Point::AfterDecisionStored, gid);
            }
            let result = StoredTx {
                tx: t.tx.clone(),
                version: stored.version + 1,
                owner_token: written.as_ref().map(|l| l.token.clone()),
                lease_until: written.as_ref().map(|l| l.until),
                ..stored
            };
            self.recent.put(result.clone());
            if let Some(lease) = lease {
                let effects = Transition {
                    tx: t.tx.clone(),
                    effects: t
                        .effects
                        .into_iter()
                        .filter(|e| *e != Effect::Persist)
                        .collect(),
                };
                Arc::clone(self).start(result.clone(), lease, effects);
            } else if t.tx.status.is_terminal() || t.tx.status == Status::Stalled {
                self.notify(gid);
            }
            return Ok((result, true));
        }
        Err(EngineError::Contention)
    }

    fn observe_status(&self, before: &Transaction, after: &Transaction) {
        if before.status != after.status {
            self.observer
                .status(&after.gid, before.status, after.status, after.updated_at);
        }
    }

    // ---- waiting ---------------------------------------------------------------------

    /// Waits until the transaction is terminal or stalled, or until `timeout`; returns the
    /// state it then has.
    pub async fn wait_settled(
        &self,
        gid: &str,
        timeout: Duration,
    ) -> Result<StoredTx, EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notify = {
                let mut waiters = self.waiters.lock().expect("poisoned");
                Arc::clone(waiters.entry(gid.to_owned()).or_default())
            };
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let settled =
                |s: &StoredTx| s.tx.status.is_terminal() || s.tx.status == Status::Stalled;
            let expired = tokio::time::Instant::now() >= deadline;
            // This process's driver keeps its copy current and notifies when it settles;
            // the database is read only for a transaction this process does not drive.
            let stored = match self.recent.get(gid) {
                Some(s) if settled(&s) => Some(s),
                Some(_) if self.is_driving(gid) && !expired => None,
                _ => Some(self.load(gid).await?),
            };
            if let Some(stored) = stored
                && (settled(&stored) || expired)
            {
                return Ok(stored);
            }
            // The notification comes from this process's driver; a transaction driven by
            // another coordinator is noticed by re-reading now and then.
            let poll = tokio::time::Instant::now() + Duration::from_millis(500);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(poll.min(deadline)) => {}
            }
        }
    }

    fn notify(&self, gid: &str) {
        let notify = self.waiters.lock().expect("poisoned").remove(gid);
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }

    // ---- driving ---------------------------------------------------------------------

    /// Drives `tx` (as stored, owned under `lease`) from the effects of `t` in a new task.
    fn start(self: Arc<Self>, stored: StoredTx, lease: Lease, t: Transition) {
        self.driving
            .lock()
            .expect("poisoned")
            .insert(stored.tx.gid.clone(), lease.token.clone());
        tokio::spawn(async move {
            let gid = stored.tx.gid.clone();
            let token = lease.token.clone();
            self.drive(stored, lease, t).await;
            let mut driving = self.driving.lock().expect("poisoned");
            if driving.get(&gid) == Some(&token) {
                driving.remove(&gid);
            }
            drop(driving);
            self.notify(&gid);
        });
    }

    fn is_driving(&self, gid: &str) -> bool {
        self.driving.lock().expect("poisoned").contains_key(gid)
    }

    async fn drive(&self, mut stored: StoredTx, mut lease: Lease, mut t: Transition) {
        let gid = stored.tx.gid.clone();
        let mut current = stored.tx.clone();
        let mut attempts: Vec<AttemptRecord> = Vec::new();
        let mut after_round = false;
        loop {
            if t.persists() {
                let decision = is_decision(&current, &t.tx);
                if decision {
                    self.observer.point(Point::BeforeDecisionStored, &gid);
                }
                let now = self.clock.now();
                let next_lease = self.lease_for(&t, now, &lease.token);
                let save = Save {
                    before: &current,
                    after: &t.tx,
                    guard: Guard::Owner(&lease.token),
                    lease: next_lease.as_ref(),
                    attempts: &attempts,
                };
                match self.save_with_retries(save).await {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::info!(
                            gid,
                            "another coordinator owns this transaction now; stopping"
                        );
                        self.observer.fenced(&gid);
                        return;
                    }
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
            let calls: Vec<BranchKey> = t.calls().cloned().collect();
            if !calls.is_empty() {
                let Some(renewed) = self.cover(&gid, &lease, self.longest_call(&current)).await
                else {
                    return;
                };
                lease = renewed;
                let answers = self.round(&current, &calls).await;
                self.observer.point(Point::AfterCallsBeforeRecord, &gid);
                after_round = true;
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
                t = match core::apply_all(&current, &events, self.ctx()) {
                    Ok(t) => t,
                    Err(e) => {
                        // A bug, not a condition: recovery would meet it again and again.
                        let reason = format!("the answers of a round do not fit the state: {e}");
                        self.stall(&current, &mut stored, &lease, reason).await;
                        return;
                    }
                };
                continue;
            }
            match t.effects.iter().find(|e| !matches!(e, Effect::Persist)) {
                Some(Effect::WakeAt(at)) => {
                    let wait = at - self.clock.now();
                    if wait > self.config.hold_ms {
                        // Hand the row back: the lease lapses now and the recovery loop of
                        // any coordinator picks it up when it is due.
                        let now = self.clock.now();
                        let _ = self.store.renew(&gid, &lease.token, now).await;
                        return;
                    }
                    let Some(renewed) = self.cover(&gid, &lease, wait.max(0)).await else {
                        return;
                    };
                    lease = renewed;
                    if wait > 0 {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_millis(wait as u64)) => {}
                            _ = self.shutdown.notified() => return,
                        }
                    }
                    t = match core::apply(&current, &Event::Wake, self.ctx()) {
                        Ok(t) => t,
                        Err(_) => return,
                    };
                }
                _ => return,
            }
        }
    }

    /// Stalls a transaction this driver owns, with the reason, after a failure that
    /// recovery would only repeat. The write holds the global row alone, so it succeeds
    /// where the round's write did not, unless the database is gone altogether.
    async fn stall(
        &self,
        current: &Transaction,
        stored: &mut StoredTx,
        lease: &Lease,
        reason: String,
    ) {
        let gid = current.gid.as_str();
        tracing::error!(
            gid,
            reason,
            "stalling: nothing more is called until an operator retries"
        );
        let event = Event::Stall { reason };
        let Ok(t) = core::apply(current, &event, self.ctx()) else {
            return;
        };
        let save = Save {
            before: current,
            after: &t.tx,
            guard: Guard::Owner(&lease.token),
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
                tracing::error!(gid, error = %e, "cannot store the stall either; leaving it to recovery")
            }
        }
    }

    /// The lease to write with a new state: none once there is nothing more to do here,
    /// otherwise long enough to cover the next wait.
    fn lease_for(&self, t: &Transition, now: Millis, token: &str) -> Option<Lease> {
        let until = match t.effects.iter().find(|e| !matches!(e, Effect::Persist)) {
            Some(Effect::Done(_)) | None => return None,
            Some(Effect::WakeAt(at)) if at - now > self.config.hold_ms => return None,
            Some(Effect::WakeAt(at)) => *at.max(&now) + self.config.lease_ms,
            Some(_) => now + self.config.lease_ms,
        };
        Some(Lease {
            token: token.to_owned(),
            until,
        })
    }

    fn longest_call(&self, tx: &Transaction) -> Millis {
        tx.options.request_timeout_ms as Millis
    }

    /// Makes sure the lease lasts `needed` ms more (plus margin), renewing it if not.
    async fn cover(&self, gid: &str, lease: &Lease, needed: Millis) -> Option<Lease> {
        let now = self.clock.now();
        let margin = self.config.lease_ms / 3;
        if lease.until - now >= needed + margin {
            return Some(lease.clone());
        }
        let until = now + needed + self.config.lease_ms;
        match self.store.renew(gid, &lease.token, until).await {
            Ok(true) => Some(Lease {
                token: lease.token.clone(),
                until,
            }),
            Ok(false) => {
                tracing::info!(gid, "lease lost; stopping");
                None
            }
            Err(e) => {
                tracing::warn!(gid, error = %e, "cannot renew lease; leaving it to recovery");
                None
            }
        }
    }

    /// Stores a state, retrying transient database errors. Ok(false): the row is not ours.
    async fn save_with_retries(&self, save: Save<'_>) -> Result<bool, StoreError> {
        let mut delay = Duration::from_millis(50);
        let mut last = None;
        for _ in 0..5 {
            match self.store.save(save.clone()).await {
                Ok(Saved::Saved) => return Ok(true),
                Ok(Saved::Lost) => {
                    // A retry after an error whose commit did land looks like a lost race:
                    // check whether the stored row is exactly what we wrote.
                    if last.is_some()
                        && let Ok(Some(stored)) = self.store.load(&save.after.gid).await
                    {
                        let ours =
                            stored.owner_token.as_deref() == save.lease.map(|l| l.token.as_str());
                        if ours && stored.tx == *save.after {
                            return Ok(true);
                        }
                    }
                    return Ok(false);
                }
                Err(e) => {
                    tracing::warn!(gid = save.after.gid, error = %e, "store write failed; retrying");
                    last = Some(e);
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        Err(last.expect("at least one error"))
    }

    /// Performs calls concurrently; returns each answer with the time it started.
    async fn round(
        &self,
        tx: &Transaction,
        calls: &[BranchKey],
    ) -> Vec<(BranchKey, crate::transport::CallResult, Millis)> {
        let futures = calls.iter().map(|key| async move {
            let branch = tx.branch(key).expect("planned calls name stored branches");
            let request = self.call_request(tx, branch);
            let _permit = self
                .calls
                .acquire()
                .await
                .expect("semaphore is never closed");
            let started_at = self.clock.now();
            let result = self.transport.call(&request).await;
            self.observer.call(&request, &result, started_at);
            (key.clone(), result, started_at)
        });
        join_all(futures).await
    }

    fn call_request(&self, tx: &Transaction, branch: &Branch) -> CallRequest {
        CallRequest {
            gid: tx.gid.clone(),
            kind: tx.kind,
            branch_id: branch.branch_id.clone(),
            action: branch.action,
            url: branch.url.clone(),
            payload: branch.payload.clone(),
            timeout: Duration::from_millis(tx.options.request_timeout_ms.max(1)),
            headers: tx.options.branch_headers.clone(),
            protocol: tx.options.protocol,
            attempt: (branch.attempts + 1).max(1) as u32,
        }
    }

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

/// A move into a phase whose calls must not go out before it is stored.
fn is_decision(before: &Transaction, after: &Transaction) -> bool {
    before.status != after.status && matches!(after.status, Status::Committing | Status::Aborting)
}

/// Recent states of transactions this process created, changed or drives, so that a
/// submit after a create, and a wait after a submit, need no read. Bounded: past the cap,
/// finished ones go first.
#[derive(Default)]
struct Recent {
    map: Mutex<HashMap<String, StoredTx>>,
}

const RECENT_CAP: usize = 50_000;

impl Recent {
    fn get(&self, gid: &str) -> Option<StoredTx> {
        self.map.lock().expect("poisoned").get(gid).cloned()
    }

    fn put(&self, stored: StoredTx) {
        let mut map = self.map.lock().expect("poisoned");
        if map.len() >= RECENT_CAP && !map.contains_key(&stored.tx.gid) {
            map.retain(|_, s| !s.tx.status.is_terminal());
            if map.len() >= RECENT_CAP {
                map.clear();
            }
        }
        map.insert(stored.tx.gid.clone(), stored);
    }

    fn remove(&self, gid: &str) {
        self.map.lock().expect("poisoned").remove(gid);
    }
}

//! The engine: drives global transactions by performing the core's transitions (store the
//! new state, then call, wait or stop).
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
//!
//! Here: the engine, its settings and admission (at most `max_driving` transactions
//! driven at once, a tenant at most its share). Beside it: `drive` (the driver loop: each
//! transition stored, then its round of calls, wait or end; leases, stalls), `requests`
//! (client and operator operations), `save` (the one way a new state is stored, with what
//! surrounds the write), `reads` (the handle every read goes through), `views` (how the
//! native door shows what it reads), `recovery` (the recovery loop and the graceful stop),
//! `waiting` (`wait_result`, recent states), `slots` (call and driver slots shared fairly
//! between tenants), `history` (a save's bounded call history), `clock` (time on the
//! database's clock), `identity` (owner tokens) and `observe` (the [`Observer`] hooks
//! metrics, logs and the lab hang off).

mod bulk;
mod clock;
mod drive;
mod history;
mod identity;
mod observe;
mod reads;
mod recovery;
mod requests;
mod save;
mod slots;
pub mod views;
mod waiting;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::canonical::CanonicalRequest;
use crate::core::{
    self, Access, Action, Branch, BranchKey, CoreError, Ctx, Event, Kind, Millis, Next, Payload,
    SagaStep, Status, TraceContext, Transaction, Transition, TxOptions,
};
use crate::store::{Claimed, Created, Guard, Lease, Registered, Save, Saved, Store, StoreError};
use crate::transport::{CallRequest, Transport};

pub use bulk::{BulkOperation, BulkOutcome, BulkReport, BulkRequest, MAX_BULK};
pub use clock::{Clock, SyncedClock, SystemClock};
pub use observe::{
    Creation, EventLog, NoObserver, Observer, Observers, OperatorAction, Point, RoundPhase,
};
pub use reads::{
    AttemptRecord, CoordinatorSeen, ListFilter, Overview, Page, Reads, StatusSummary, StoredTx,
};
use slots::{Slot, Slots};
use waiting::Recent;

/// How long a readiness check (`/health/ready`, the `idem_ready` gauge) waits for the
/// database's answer ([`Engine::ping_database`]).
pub const READY_TIMEOUT: Duration = Duration::from_millis(1_500);

/// Engine settings; the server's defaults for transaction options are among them.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Names this coordinator in owner tokens and logs.
    pub node: String,
    /// The operator vouches that no other live process uses `node` (an explicit `--node`,
    /// such as a StatefulSet's pod name): a restart may take back that node's leases.
    pub node_is_unique: bool,
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
    /// Transactions driven in this process at once. Past it, new and due transactions wait
    /// in the database, unowned (no lease to renew, nothing in memory), and the recovery
    /// loop claims them in order as drivers finish: memory and lease writes are bounded by
    /// the work under way, not by the work in flight.
    pub max_driving: usize,
    /// The share, in per cent, of `max_concurrent_calls` and of `max_driving` that one
    /// tenant may hold: a tenant whose participants hang holds at most this much, and the
    /// others keep the rest (see `slots`). 100: no share, one tenant may take all.
    pub tenant_share_percent: u8,
    /// The call budget: calls one transaction may make by itself (every call but a Try)
    /// before it stalls, counted from its creation or the operator's last retry. Checked
    /// before each round, whatever the transaction's own options say.
    pub max_calls_per_transaction: u64,
    /// Records of calls that did not simply succeed kept per transaction: the newest;
    /// older ones are deleted with the save that passes the bound, and counted.
    pub max_history_per_transaction: u32,
    /// Whether this process drives transactions. An operator's command-line tool does
    /// not: its retry or force-stop releases the transaction to the servers instead.
    pub drive: bool,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            node: "idem".into(),
            node_is_unique: false,
            lease_ms: 15_000,
            recovery_interval: Duration::from_secs(1),
            claim_batch: 200,
            hold_ms: 5_000,
            defaults: TxOptions::default(),
            prepared_timeout_ms: 60_000,
            max_concurrent_calls: 1_024,
            max_driving: 2_048,
            tenant_share_percent: DEFAULT_TENANT_SHARE_PERCENT,
            max_calls_per_transaction: DEFAULT_MAX_CALLS_PER_TRANSACTION,
            max_history_per_transaction: DEFAULT_MAX_HISTORY_PER_TRANSACTION,
            drive: true,
        }
    }
}

/// One tenant's share of the call and driver slots unless the operator says otherwise
/// (`--tenant-share-percent`): half, so that one tenant whose participants hang leaves
/// the other half to everyone else.
pub const DEFAULT_TENANT_SHARE_PERCENT: u8 = 50;

/// The call budget unless the operator says otherwise (`--max-calls-per-transaction`).
/// A transaction that needs more is an outlier worth a look: with the default options a
/// 100-step saga that fails at every step and compensates makes 2,400 calls, and one
/// step polled "in progress" every second for the default hour makes 3,600.
pub const DEFAULT_MAX_CALLS_PER_TRANSACTION: u64 = 10_000;

/// History records kept per transaction unless the operator says otherwise
/// (`--max-history-per-transaction`). Per transaction rather than per branch, so that a
/// transaction's rows and its view are bounded whatever its number of branches; each
/// branch's own row keeps its attempt count and last error. 100 records of at most
/// 2,000 bytes of detail each: about 200 KB per transaction at most.
pub const DEFAULT_MAX_HISTORY_PER_TRANSACTION: u32 = 100;

/// Why a client or operator request failed. Each maps to one API error code.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The client's gid (never the tenant-scoped key: see `crate::tenant`).
    #[error("no transaction with gid {0:?}")]
    NotFound(String),
    /// The client's gid.
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
    pub request: Arc<dyn CanonicalRequest>,
    /// The client's trace context; `None` starts a trace for the transaction.
    pub trace: Option<TraceContext>,
    /// Created through DTM's door without a token (see [`Transaction::tokenless`]).
    pub tokenless: bool,
}

/// A new prepared transaction (TCC, or msg with its steps and back-check URL).
#[derive(Clone, Debug)]
pub struct NewPrepared {
    pub gid: String,
    pub kind: Kind,
    pub options: TxOptions,
    /// Msg: the actions, in order.
    pub msg_steps: Vec<(String, Payload)>,
    /// Msg: where to ask whether the application's local transaction committed.
    pub query_prepared: Option<String>,
    /// TCC: branches registered with the transaction, in the same database write.
    pub branches: Vec<Branch>,
    pub request: Arc<dyn CanonicalRequest>,
    /// The client's trace context; `None` starts a trace for the transaction.
    pub trace: Option<TraceContext>,
    /// Created through DTM's door without a token (see [`Transaction::tokenless`]).
    pub tokenless: bool,
}

/// The result of a create: the transaction as stored and whether this request created it.
#[derive(Clone, Debug)]
pub struct CreateOutcome {
    pub stored: StoredTx,
    pub created: bool,
}

pub struct Engine {
    /// For the engine's writes; reads go through `reads`, which shares it.
    store: Arc<dyn Store>,
    reads: Reads,
    transport: Arc<dyn Transport>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    config: EngineConfig,
    /// Calls in flight, per tenant and in all (see [`EngineConfig::tenant_share_percent`]).
    calls: Slots,
    /// One per transaction driven (see [`EngineConfig::max_driving`]), per tenant and in
    /// all.
    admission: Slots,
    /// Set while the recovery loop waits for drivers to finish before it claims more; a
    /// finishing driver then wakes it through `capacity_freed`. Creates and take-overs
    /// leave their transactions to it meanwhile, so the oldest due ones go first.
    backlog: std::sync::atomic::AtomicBool,
    capacity_freed: Notify,
    /// Drawn at start: makes this process's owner tokens its own (see `identity`).
    instance: String,
    /// Transactions this process drives: the token, and how to stop the driver.
    driving: Mutex<HashMap<String, Driver>>,
    recent: Recent,
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
    /// Cancelled when the process begins to stop: no claims, no new rounds, waits end.
    stopping: CancellationToken,
    /// Every driver task, so that shutdown can wait for them.
    tasks: TaskTracker,
    /// When the recovery loop's last pass began (see [`Engine::recovery_lag`]).
    recovery_pass: Mutex<Option<std::time::Instant>>,
}

/// The right to drive one more transaction in this process (see
/// [`EngineConfig::max_driving`]); handed back when its driver ends.
pub(super) type Admission = Slot;

/// A driver task of this process.
struct Driver {
    token: String,
    abort: tokio::task::AbortHandle,
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
        let calls = Slots::new(config.max_concurrent_calls, config.tenant_share_percent);
        let admission = Slots::new(config.max_driving, config.tenant_share_percent);
        Arc::new(Engine {
            admission,
            backlog: std::sync::atomic::AtomicBool::new(false),
            capacity_freed: Notify::new(),
            reads: Reads::new(Arc::clone(&store)),
            store,
            transport,
            clock,
            observer: Arc::new(NoObserver),
            config,
            calls,
            instance: identity::new_instance(),
            driving: Mutex::new(HashMap::new()),
            recent: Recent::default(),
            waiters: Mutex::new(HashMap::new()),
            stopping: CancellationToken::new(),
            tasks: TaskTracker::new(),
            recovery_pass: Mutex::new(None),
        })
    }

    /// Replaces the observer (before any work starts).
    pub fn with_observer(self: Arc<Self>, observer: Arc<dyn Observer>) -> Arc<Engine> {
        let mut engine =
            Arc::into_inner(self).expect("with_observer is called before the engine is shared");
        engine.observer = observer;
        Arc::new(engine)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn now(&self) -> Millis {
        self.clock.now()
    }

    pub(super) fn ctx(&self) -> Ctx {
        Ctx {
            now: self.clock.now(),
            jitter: rand::random::<f64>(),
            max_calls: self.config.max_calls_per_transaction,
        }
    }

    pub(super) fn new_lease(&self, now: Millis) -> Lease {
        Lease {
            token: identity::new_token(&self.config.node, &self.instance),
            until: now + self.config.lease_ms,
        }
    }

    /// At start-up, with a node name the operator vouches for (`--node`): transactions an
    /// earlier process of this node owned are resumed now, not after their leases run out
    /// (that process is gone: one process per such name). A default name may be shared by
    /// live peers, so then nothing is released and the leases lapse on their own.
    pub async fn release_own_leases(&self) -> Result<u64, StoreError> {
        if !self.config.node_is_unique {
            return Ok(0);
        }
        let prefix = identity::node_prefix(&self.config.node);
        let released = self.store.release_node(&prefix).await?;
        if released > 0 {
            tracing::info!(
                released,
                "resuming transactions a previous process of this node owned"
            );
        }
        Ok(released)
    }

    /// A permit to drive `gid` now, unless this process drives as many as it may (in all,
    /// or of its tenant), or older due transactions wait in the database for the next
    /// free places.
    pub(super) fn admit(&self, gid: &str) -> Option<Admission> {
        if !self.config.drive || self.backlog.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        self.admission.try_acquire(tenant_of(gid))
    }

    /// Number of transactions this process is driving now.
    pub fn driving(&self) -> usize {
        self.driving.lock().expect("poisoned").len()
    }
}

/// The tenant a transaction's key belongs to: whose share of the slots it uses.
fn tenant_of(gid: &str) -> &str {
    crate::tenant::split_key(gid).0
}

//! The barrier: runs a branch step's business closure at most once per (gid, branch, op),
//! whatever order, repetition or concurrency the coordinator's calls arrive in.
//!
//! # How it works
//!
//! Everything happens inside the participant's own local transaction, so the barrier rows
//! and the business change commit or roll back together.
//!
//! 1. Every op inserts-if-absent its own row (gid, branch_id, op, step), `reason` = the op.
//! 2. If the row existed, the closure does not run: the row says whether this is a
//!    duplicate (return the stored first result), a repeated empty rollback, or a forward call
//!    arriving after its compensation (the row was inserted by the compensation: *rejected*).
//! 3. A compensating op (Cancel, compensate) then inserts-if-absent the row of the op it
//!    undoes (Try, action), with `reason` = its own name. If that insert succeeds, the forward
//!    step never ran: this is an *empty rollback* (recorded, closure not run), and the row
//!    just inserted is the guard that turns the late forward call away, now and on every
//!    retry.
//! 4. Otherwise the closure runs, and its result is stored in the op's row as JSON.
//!
//! A Cancel racing its Try is serialised by the unique index on the Try row: whichever
//! inserts it first holds it until commit, and the other one waits on the index and then
//! sees it. Either the Try committed first and the Cancel undoes it (both ran, net zero), or
//! the Cancel committed first and the Try is rejected (neither ran). The rows are never
//! read with `SELECT ... FOR UPDATE` before they exist: that locks gaps on InnoDB and
//! deadlocks two callers that both find nothing.
//!
//! # Insert-if-absent per database
//!
//! * PostgreSQL: `INSERT ... ON CONFLICT (key) DO NOTHING`. Catching a unique violation
//!   instead would abort the whole PostgreSQL transaction.
//! * MySQL/MariaDB: a plain `INSERT`, treating only error 1062 (duplicate key) as "already
//!   there"; a duplicate-key error rolls back only the statement. `INSERT IGNORE` is not used
//!   because it also turns truncation and NULL errors into warnings.
//! * SQLite: `INSERT ... ON CONFLICT (key) DO NOTHING` in a transaction opened with
//!   `BEGIN IMMEDIATE`, which serialises writers from the start. (`INSERT OR IGNORE` would
//!   also ignore NOT NULL and CHECK violations.)
//!
//! Deadlocks, serialization failures and busy errors roll the local transaction back;
//! [`Barrier::run`] then runs the whole transaction again (bounded by [`RetryPolicy`]), so
//! they do not reach the caller. This is also why the closure must keep every effect inside
//! the transaction it is given: it may run more than once, and only the last attempt counts.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Database, Pool, Transaction};

use crate::backend::{Arg, BarrierDatabase};
use crate::dialect::Dialect;
use crate::error::{DbErrorKind, ParticipantError, classify};
use crate::pool::{LeanPool, Leased};

/// The table the barrier uses unless told otherwise.
pub const DEFAULT_TABLE: &str = "idem_barrier";

/// Longest gid and branch id accepted, in characters; the barrier table's columns are this
/// wide, and so are the coordinator's.
pub const MAX_ID_LEN: usize = 128;

/// The protocol of the global transaction a call belongs to (`trans_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransType {
    Tcc,
    Saga,
    Msg,
}

impl TransType {
    pub fn as_str(self) -> &'static str {
        match self {
            TransType::Tcc => "tcc",
            TransType::Saga => "saga",
            TransType::Msg => "msg",
        }
    }

    pub fn parse(s: &str) -> Option<TransType> {
        match s {
            "tcc" => Some(TransType::Tcc),
            "saga" => Some(TransType::Saga),
            "msg" => Some(TransType::Msg),
            _ => None,
        }
    }

    /// Whether `op` belongs to this protocol: a `cancel` in a saga is a caller bug, and
    /// guarding it would write barrier rows no real call ever matches.
    pub fn allows(self, op: Op) -> bool {
        matches!(
            (self, op),
            (TransType::Tcc, Op::Try | Op::Confirm | Op::Cancel)
                | (TransType::Saga, Op::Action | Op::Compensate)
                | (TransType::Msg, Op::Action | Op::Msg)
        )
    }
}

impl fmt::Display for TransType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation the coordinator asks for (`op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Try,
    Confirm,
    Cancel,
    Action,
    Compensate,
    /// DTM's name for the local transaction of a two-phase message, and for the
    /// coordinator's check whether it committed (see [`crate::query_prepared`]).
    Msg,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Try,
        Op::Confirm,
        Op::Cancel,
        Op::Action,
        Op::Compensate,
        Op::Msg,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Try => "try",
            Op::Confirm => "confirm",
            Op::Cancel => "cancel",
            Op::Action => "action",
            Op::Compensate => "compensate",
            Op::Msg => "msg",
        }
    }

    pub fn parse(s: &str) -> Option<Op> {
        Op::ALL.into_iter().find(|op| op.as_str() == s)
    }

    /// The forward op this op undoes: Cancel undoes Try, compensate undoes action.
    pub fn origin(self) -> Option<Op> {
        match self {
            Op::Cancel => Some(Op::Try),
            Op::Compensate => Some(Op::Action),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A callback that cannot name a barrier: a parameter is missing, unknown or too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCall {
    #[error("missing query parameter `{0}`")]
    Missing(&'static str),
    #[error("invalid query parameter `{param}`: {reason}")]
    Invalid { param: &'static str, reason: String },
}

/// What happened to a guarded step. Every variant but [`Outcome::Rejected`] is a success
/// for the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<T> {
    /// The closure ran in this call; its result is stored and committed with it.
    Executed(T),
    /// An earlier call already ran this step; this is its stored result. The closure did
    /// not run.
    Duplicate(T),
    /// A Cancel or compensate whose Try or action never ran (or a repeat of one). Nothing
    /// to undo; recorded so that the late forward call is rejected. The closure did not run.
    EmptyRollback,
    /// A Try or action (or msg) arriving after its Cancel or compensate already ran. The
    /// closure did not run, and the marker stays, so a retried late call is rejected
    /// again. Answered with 409 so the coordinator does not retry it.
    Rejected,
}

impl<T> Outcome<T> {
    /// True unless the call was rejected.
    pub fn is_success(&self) -> bool {
        !matches!(self, Outcome::Rejected)
    }

    /// The step's result, first-time or stored.
    pub fn result(&self) -> Option<&T> {
        match self {
            Outcome::Executed(t) | Outcome::Duplicate(t) => Some(t),
            Outcome::EmptyRollback | Outcome::Rejected => None,
        }
    }

    pub fn into_result(self) -> Option<T> {
        match self {
            Outcome::Executed(t) | Outcome::Duplicate(t) => Some(t),
            Outcome::EmptyRollback | Outcome::Rejected => None,
        }
    }

    /// A stable name for logs and response bodies.
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Executed(_) => "executed",
            Outcome::Duplicate(_) => "duplicate",
            Outcome::EmptyRollback => "empty_rollback",
            Outcome::Rejected => "rejected",
        }
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Executed(t) => Outcome::Executed(f(t)),
            Outcome::Duplicate(t) => Outcome::Duplicate(f(t)),
            Outcome::EmptyRollback => Outcome::EmptyRollback,
            Outcome::Rejected => Outcome::Rejected,
        }
    }
}

/// How often [`Barrier::run`] re-runs a local transaction that lost a lock conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each time, up to `max_delay`, with jitter.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 20,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt number `attempt` (1-based). `unit` in [0, 1) picks the
    /// point in the upper half of the exponential window: the jitter keeps two transactions
    /// that deadlocked each other from colliding again in lockstep.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let capped = exp.min(self.max_delay);
        capped.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// A random number in [0, 1) without a dependency: the standard library seeds each
/// `RandomState` from the OS.
fn jitter_unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Where the step's connection lives: a transaction the barrier opened and will commit
/// ([`Barrier::run`], on a `sqlx::Pool` or on a [`LeanPool`] connection), or the caller's
/// ([`Barrier::run_in`]).
enum Slot<'t, DB: Database> {
    Owned(Transaction<'static, DB>),
    /// A leased connection on which the barrier began a transaction.
    Leased(Leased<DB>),
    Borrowed(&'t mut DB::Connection),
}

impl<DB: Database> Slot<'_, DB> {
    fn conn(&mut self) -> &mut DB::Connection {
        match self {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

/// A local transaction [`Barrier::run`] opened for one attempt of a step.
pub struct OpenedStep<DB: Database>(Slot<'static, DB>);

impl<DB: BarrierDatabase> OpenedStep<DB> {
    async fn finish(self, commit: bool) -> Result<(), sqlx::Error> {
        match self.0 {
            Slot::Owned(tx) if commit => tx.commit().await,
            Slot::Owned(tx) => tx.rollback().await,
            Slot::Leased(mut conn) => {
                let end = if commit { "COMMIT" } else { "ROLLBACK" };
                let done = DB::exec_unprepared(&mut conn, end).await;
                // Back to the pool only when the transaction ended cleanly.
                conn.keep_if_ok(done)
            }
            Slot::Borrowed(_) => unreachable!("run owns its transaction"),
        }
    }
}

/// Where [`Barrier::run`] opens each step's local transaction: a `sqlx::Pool`, or a
/// [`LeanPool`] (no round trip to hand the connection back).
pub trait StepConnections: Sync {
    type Database: BarrierDatabase;

    /// The SQL dialect of the database behind it.
    fn dialect(&self) -> Dialect;

    /// Takes a connection and begins a transaction on it (with `begin`, if given, instead of
    /// the backend's default statement).
    fn open(
        &self,
        begin: Option<&'static str>,
    ) -> impl Future<Output = Result<OpenedStep<Self::Database>, sqlx::Error>> + Send;
}

impl<DB: BarrierDatabase> StepConnections for Pool<DB> {
    type Database = DB;

    fn dialect(&self) -> Dialect {
        DB::pool_dialect(self)
    }

    async fn open(&self, begin: Option<&'static str>) -> Result<OpenedStep<DB>, sqlx::Error> {
        let tx = match begin {
            Some(statement) => self.begin_with(statement).await?,
            None => self.begin().await?,
        };
        Ok(OpenedStep(Slot::Owned(tx)))
    }
}

impl<DB: BarrierDatabase> StepConnections for LeanPool<DB> {
    type Database = DB;

    fn dialect(&self) -> Dialect {
        DB::options_dialect(self.connect_options())
    }

    async fn open(&self, begin: Option<&'static str>) -> Result<OpenedStep<DB>, sqlx::Error> {
        let mut conn = self.get().await?;
        // Dropped on failure: the pool closes a connection nobody vouched for.
        DB::exec_unprepared(&mut conn, begin.unwrap_or("BEGIN")).await?;
        Ok(OpenedStep(Slot::Leased(conn)))
    }
}

type Shared<'t, DB> = Arc<tokio::sync::Mutex<Slot<'t, DB>>>;

/// The local transaction a guarded closure works in, plus what it needs to write its own
/// statements for whichever backend this is.
///
/// The closure receives it by value (`|tx| async move { ... }`): an owned handle keeps the
/// closure's future free of higher-ranked lifetimes, which is what lets it borrow the
/// request payload and still be `Send` for axum. Do not keep it beyond the closure's
/// future; the barrier needs the transaction back to commit it.
pub struct StepTx<'t, DB: Database> {
    slot: Shared<'t, DB>,
    dialect: Dialect,
    barrier: Arc<Barrier>,
}

/// The connection of a [`StepTx`], borrowed: dereferences to the backend's connection, so
/// `.execute(&mut *tx.conn())` runs a statement in the step's transaction.
pub struct StepConn<'g, 't, DB: Database> {
    guard: tokio::sync::MutexGuard<'g, Slot<'t, DB>>,
}

impl<DB: Database> std::ops::Deref for StepConn<'_, '_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &*self.guard {
            Slot::Owned(tx) => tx,
            Slot::Leased(conn) => conn,
            Slot::Borrowed(conn) => conn,
        }
    }
}

impl<DB: Database> std::ops::DerefMut for StepConn<'_, '_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.guard.conn()
    }
}

impl<'t, DB: Database> StepTx<'t, DB> {
    /// The connection, inside the barrier's transaction. Execute business statements on
    /// `&mut *tx.conn()`.
    ///
    /// # Panics
    /// If an earlier `conn()` guard of this step is still alive (two statements at once on
    /// one connection is a bug; waiting would hang forever).
    pub fn conn(&self) -> StepConn<'_, 't, DB> {
        StepConn {
            guard: self.slot.try_lock().expect(
                "StepTx::conn: the connection is already borrowed; drop the previous guard first",
            ),
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// `text` (with `?` placeholders) in this backend's placeholder syntax.
    pub fn sql(&self, text: &str) -> AssertSqlSafe<String> {
        self.dialect.sql(text)
    }

    /// The gid of the call being guarded; handy as a ledger key.
    pub fn gid(&self) -> &str {
        &self.barrier.gid
    }

    pub fn branch_id(&self) -> &str {
        &self.barrier.branch_id
    }

    pub fn op(&self) -> Op {
        self.barrier.op
    }

    pub fn trans_type(&self) -> TransType {
        self.barrier.trans_type
    }
}

/// The barrier for one guarded step of one branch call.
///
/// Build it from the callback parameters ([`Barrier::new`], or `BranchCall::barrier` with the
/// `axum` feature), then wrap the business change in [`Barrier::run`].
#[derive(Clone, Debug)]
pub struct Barrier {
    trans_type: TransType,
    gid: String,
    branch_id: String,
    op: Op,
    step: u32,
    table: Cow<'static, str>,
    retry: RetryPolicy,
}

/// The values of the `outcome` column.
mod outcome_col {
    /// Only ever visible inside the transaction that inserted the row: it is overwritten
    /// with `executed` before commit, or rolled back with the failing step.
    pub const RUNNING: &str = "running";
    pub const EXECUTED: &str = "executed";
    pub const EMPTY_ROLLBACK: &str = "empty_rollback";
    /// A forward op's row inserted by its compensation, to reject the late forward call.
    pub const GUARD: &str = "guard";
}

/// What an existing row of this op means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Existing {
    Rejected,
    EmptyRollback,
    /// The stored first result, JSON.
    Duplicate(String),
    Corrupt(String),
}

/// Reads the row that blocked this op's insert. Pure, so every case is unit-tested.
pub(crate) fn interpret_existing(
    op: Op,
    reason: &str,
    outcome: &str,
    result: Option<&str>,
) -> Existing {
    if reason != op.as_str() {
        // Someone else's call wrote this op's row: the compensation's guard.
        return match op {
            Op::Try | Op::Action | Op::Msg => Existing::Rejected,
            _ => Existing::Corrupt(format!(
                "the {op} row was inserted by a `{reason}` call, which only happens for forward ops"
            )),
        };
    }
    match (outcome, result) {
        (outcome_col::EXECUTED, Some(json)) => Existing::Duplicate(json.to_owned()),
        (outcome_col::EXECUTED, None) => Existing::Corrupt("executed step without a stored result".into()),
        (outcome_col::EMPTY_ROLLBACK, _) => Existing::EmptyRollback,
        (outcome_col::RUNNING, _) => Existing::Corrupt(
            "a committed barrier row is still `running`: a transaction whose step failed was committed \
             (with `run_in`, roll back when it returns an error)"
                .into(),
        ),
        (other, _) => Existing::Corrupt(format!("unknown barrier outcome `{other}`")),
    }
}

/// Checks a gid or branch id: non-empty, at most [`MAX_ID_LEN`] characters, no control
/// characters (they would end up in logs and URLs).
pub(crate) fn check_id(param: &'static str, value: &str) -> Result<(), InvalidCall> {
    if value.is_empty() {
        return Err(InvalidCall::Missing(param));
    }
    if value.chars().count() > MAX_ID_LEN {
        return Err(InvalidCall::Invalid {
            param,
            reason: format!("longer than {MAX_ID_LEN} characters"),
        });
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidCall::Invalid {
            param,
            reason: "contains control characters".into(),
        });
    }
    Ok(())
}

/// Checks a barrier table name: a plain SQL identifier, because it is spliced into SQL text.
pub fn check_table_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || name.len() > 48 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "barrier table name `{name}` must be a plain identifier: [A-Za-z_][A-Za-z0-9_]*, at most 48 characters"
        ));
    }
    Ok(())
}

impl Barrier {
    /// The barrier for the first guarded step of a branch call.
    pub fn new(
        trans_type: TransType,
        gid: impl Into<String>,
        branch_id: impl Into<String>,
        op: Op,
    ) -> Result<Barrier, InvalidCall> {
        let gid = gid.into();
        let branch_id = branch_id.into();
        check_id("gid", &gid)?;
        check_id("branch_id", &branch_id)?;
        if !trans_type.allows(op) {
            return Err(InvalidCall::Invalid {
                param: "op",
                reason: format!("`{op}` is not an operation of a {trans_type} transaction"),
            });
        }
        Ok(Barrier {
            trans_type,
            gid,
            branch_id,
            op,
            step: 1,
            table: Cow::Borrowed(DEFAULT_TABLE),
            retry: RetryPolicy::default(),
        })
    }

    /// The barrier a two-phase message's local transaction runs in, and which
    /// [`crate::query_prepared`] looks for: branch `00`, op `msg`.
    pub fn msg(gid: impl Into<String>) -> Result<Barrier, InvalidCall> {
        Barrier::new(TransType::Msg, gid, MSG_BRANCH_ID, Op::Msg)
    }

    /// Selects the `n`-th guarded step of the same call (1 is the default). Only needed when
    /// one request runs several independently guarded steps; each gets its own row.
    ///
    /// # Panics
    /// If `n` is 0 or above 99.
    pub fn step(mut self, n: u32) -> Barrier {
        assert!((1..=99).contains(&n), "barrier step must be 1..=99");
        self.step = n;
        self
    }

    /// Uses another barrier table (created with [`crate::create_barrier_table_named`]).
    pub fn with_table(mut self, table: impl Into<Cow<'static, str>>) -> Result<Barrier, String> {
        let table = table.into();
        check_table_name(&table)?;
        self.table = table;
        Ok(self)
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Barrier {
        self.retry = retry;
        self
    }

    pub fn trans_type(&self) -> TransType {
        self.trans_type
    }

    pub fn gid(&self) -> &str {
        &self.gid
    }

    pub fn branch_id(&self) -> &str {
        &self.branch_id
    }

    pub fn op(&self) -> Op {
        self.op
    }

    /// The step component of the key, as stored: `01`, `02`, ...
    pub fn barrier_id(&self) -> String {
        format!("{:02}", self.step)
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Runs `step` at most once for this (gid, branch, op), in a local transaction of its
    /// own on `pool`, and commits.
    ///
    /// The closure gets the transaction (`|tx| async move { ... }`); it must make every
    /// business change through it and nothing outside it (no HTTP calls, no messages): a lost
    /// lock conflict re-runs the whole transaction, closure included. An `Err` from the
    /// closure rolls everything back, barrier row included, so a later retry runs the step
    /// afresh.
    ///
    /// Committing can fail after the database has committed (a dropped connection). The
    /// caller then sees an error and the coordinator retries; the retry finds the row and
    /// returns the stored result, so even that case stays exactly-once.
    pub async fn run<S, T, F, Fut>(
        &self,
        pool: &S,
        mut step: F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let dialect = pool.dialect();
        let barrier = Arc::new(self.clone());
        let mut attempt = 1;
        loop {
            let result = Barrier::attempt(&barrier, pool, dialect, &mut step).await;
            match result {
                Err(e) if e.is_retryable_conflict(dialect) && attempt < self.retry.max_attempts => {
                    tracing::debug!(
                        gid = %self.gid, branch_id = %self.branch_id, op = %self.op, attempt,
                        error = %e, "barrier transaction lost a lock conflict; retrying"
                    );
                    tokio::time::sleep(self.retry.delay(attempt, jitter_unit())).await;
                    attempt += 1;
                }
                Err(e) if e.is_retryable_conflict(dialect) => {
                    tracing::warn!(
                        gid = %self.gid, branch_id = %self.branch_id, op = %self.op, attempt,
                        error = %e, "barrier transaction kept losing lock conflicts; giving up"
                    );
                    return Err(ParticipantError::transient(format!(
                        "lock conflict persisted after {attempt} attempts: {e}"
                    )));
                }
                other => return other,
            }
        }
    }

    async fn attempt<S, T, F, Fut>(
        barrier: &Arc<Barrier>,
        pool: &S,
        dialect: Dialect,
        step: &mut F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let opened = pool.open(dialect.begin_statement()).await?;
        let slot: Shared<'static, S::Database> = Arc::new(tokio::sync::Mutex::new(opened.0));
        let result = Barrier::guarded(barrier, &slot, dialect, step).await;
        let tx = match Arc::try_unwrap(slot).map(tokio::sync::Mutex::into_inner) {
            Ok(slot) => OpenedStep(slot),
            Err(_) => {
                // The closure kept its StepTx alive (spawned it, stored it). The transaction
                // rolls back when the last handle drops.
                return Err(ParticipantError::internal(
                    "the step's StepTx outlived its closure; the transaction was abandoned",
                ));
            }
        };
        match result {
            Ok(outcome) => {
                tx.finish(true).await?;
                Ok(outcome)
            }
            Err(e) => {
                if let Err(rollback) = tx.finish(false).await {
                    tracing::debug!(error = %rollback, "rollback after a failed step failed; the connection is discarded");
                }
                Err(e)
            }
        }
    }

    /// Runs the barrier inside a transaction the caller opened and will commit (or roll
    /// back, on `Err`): `barrier.run_in(&mut tx, |tx| async move { ... })`. Use this when
    /// the step must share a transaction with other work.
    ///
    /// Unlike [`Barrier::run`] it cannot retry lost lock conflicts (the transaction is the
    /// caller's); those come back as [`ParticipantError::Database`]. On SQLite the
    /// transaction must have been opened with `BEGIN IMMEDIATE`
    /// (`pool.begin_with("BEGIN IMMEDIATE")`).
    pub async fn run_in<'t, DB, T, F, Fut>(
        &self,
        tx: &'t mut Transaction<'_, DB>,
        mut step: F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        DB: BarrierDatabase,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'t, DB>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let conn: &'t mut DB::Connection = tx;
        let dialect = DB::conn_dialect(conn);
        let slot: Shared<'t, DB> = Arc::new(tokio::sync::Mutex::new(Slot::Borrowed(conn)));
        let barrier = Arc::new(self.clone());
        let result = Barrier::guarded(&barrier, &slot, dialect, &mut step).await;
        if Arc::strong_count(&slot) != 1 {
            return Err(ParticipantError::internal(
                "the step's StepTx outlived its closure; roll the transaction back",
            ));
        }
        result
    }

    /// The barrier algorithm proper (see the module documentation).
    async fn guarded<'t, DB, T, F, Fut>(
        this: &Arc<Barrier>,
        slot: &Shared<'t, DB>,
        dialect: Dialect,
        step: &mut F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        DB: BarrierDatabase,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'t, DB>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let barrier = this;
        let this: &Barrier = this;
        let mut guard = slot.lock().await;
        let conn = guard.conn();
        // The op's own row first. A duplicate stops here, and a compensation that inserts
        // its own row before the guard never needs a gap lock in front of a forward call
        // that is already waiting on the guard: on InnoDB, `cancel` sorts before `try` in the
        // unique index, and inserting the guard first then the Cancel row into the gap in
        // front of it deadlocked against every Try queued on the guard.
        let inserted = insert_if_absent::<DB>(
            conn,
            dialect,
            this,
            this.op,
            this.op.as_str(),
            outcome_col::RUNNING,
        )
        .await?;

        if inserted {
            if let Some(origin) = this.op.origin() {
                let origin_inserted = insert_if_absent::<DB>(
                    conn,
                    dialect,
                    this,
                    origin,
                    this.op.as_str(),
                    outcome_col::GUARD,
                )
                .await?;
                if origin_inserted {
                    set_outcome::<DB>(conn, dialect, this, outcome_col::EMPTY_ROLLBACK, None)
                        .await?;
                    tracing::info!(gid = %this.gid, branch_id = %this.branch_id, op = %this.op,
                        "empty rollback: the step it undoes never ran");
                    return Ok(Outcome::EmptyRollback);
                }
            }
            // Hand the connection to the closure: release the lock, give it a handle.
            drop(guard);
            let handle = StepTx {
                slot: Arc::clone(slot),
                dialect,
                barrier: Arc::clone(barrier),
            };
            let value = step(handle).await?;
            let mut guard = slot.lock().await;
            let conn = guard.conn();
            let json = serde_json::to_string(&value).map_err(|e| {
                ParticipantError::internal(format!("cannot store the step's result: {e}"))
            })?;
            set_outcome::<DB>(conn, dialect, this, outcome_col::EXECUTED, Some(json)).await?;
            return Ok(Outcome::Executed(value));
        }

        let row = fetch_row::<DB>(conn, dialect, this, this.op).await?;
        let Some((reason, outcome, result)) = row else {
            // The insert saw a row that is gone now: only a purge racing this call does
            // that. Another attempt sorts it out.
            return Err(ParticipantError::transient(
                "the barrier row that blocked this call disappeared; retry",
            ));
        };
        match interpret_existing(this.op, &reason, &outcome, result.as_deref()) {
            Existing::Rejected => {
                tracing::info!(gid = %this.gid, branch_id = %this.branch_id, op = %this.op,
                    "rejected: the compensation already ran");
                Ok(Outcome::Rejected)
            }
            Existing::EmptyRollback => Ok(Outcome::EmptyRollback),
            Existing::Duplicate(json) => {
                let value = serde_json::from_str(&json).map_err(|e| {
                    ParticipantError::internal(format!(
                        "the stored result of {}/{}/{} does not decode as this step's result type: {e}",
                        this.gid, this.branch_id, this.op
                    ))
                })?;
                Ok(Outcome::Duplicate(value))
            }
            Existing::Corrupt(why) => Err(ParticipantError::internal(why)),
        }
    }
}

/// The branch id of a two-phase message's local transaction (DTM's convention).
pub const MSG_BRANCH_ID: &str = "00";

/// Inserts the barrier row of `op` unless it exists; true when this call inserted it.
async fn insert_if_absent<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    barrier: &Barrier,
    op: Op,
    reason: &str,
    outcome: &str,
) -> Result<bool, ParticipantError> {
    let columns = "(trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)";
    let sql = match dialect {
        Dialect::Postgres | Dialect::Sqlite => format!(
            "INSERT INTO {} {columns} ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING",
            barrier.table
        ),
        Dialect::Mysql => format!("INSERT INTO {} {columns}", barrier.table),
    };
    let args = vec![
        Arg::Text(barrier.trans_type.as_str().into()),
        Arg::Text(barrier.gid.clone()),
        Arg::Text(barrier.branch_id.clone()),
        Arg::Text(op.as_str().into()),
        Arg::Text(barrier.barrier_id()),
        Arg::Text(reason.into()),
        Arg::Text(outcome.into()),
    ];
    match DB::exec(conn, dialect.rewrite(&sql), args).await {
        Ok(n) => Ok(n == 1),
        Err(e)
            if dialect == Dialect::Mysql
                && classify(dialect, &e) == DbErrorKind::UniqueViolation =>
        {
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// Records how this call's own row ended (it was inserted as `running`).
async fn set_outcome<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    barrier: &Barrier,
    outcome: &str,
    result: Option<String>,
) -> Result<(), ParticipantError> {
    let sql = format!(
        "UPDATE {} SET outcome = ?, result = ? WHERE gid = ? AND branch_id = ? AND op = ? AND barrier_id = ?",
        barrier.table
    );
    let updated = DB::exec(
        conn,
        dialect.rewrite(&sql),
        vec![
            Arg::Text(outcome.into()),
            Arg::OptText(result),
            Arg::Text(barrier.gid.clone()),
            Arg::Text(barrier.branch_id.clone()),
            Arg::Text(barrier.op.as_str().into()),
            Arg::Text(barrier.barrier_id()),
        ],
    )
    .await?;
    if updated != 1 {
        return Err(ParticipantError::internal(format!(
            "recording the outcome updated {updated} barrier rows, expected 1"
        )));
    }
    Ok(())
}

/// Reads (reason, outcome, result) of the barrier row of `op`.
async fn fetch_row<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Dialect,
    barrier: &Barrier,
    op: Op,
) -> Result<Option<(String, String, Option<String>)>, ParticipantError> {
    // On InnoDB a plain SELECT reads the transaction's snapshot, which can predate the
    // commit of the row that just blocked the insert (when the caller read something
    // earlier in the transaction). A locking read sees the latest committed row; the row
    // exists (the insert just collided with it) and the duplicate-key check already holds a
    // shared lock on it, so this locks nothing new.
    let lock = match dialect {
        Dialect::Mysql => " LOCK IN SHARE MODE",
        _ => "",
    };
    let sql = format!(
        "SELECT reason, outcome, result FROM {} WHERE gid = ? AND branch_id = ? AND op = ? AND barrier_id = ?{lock}",
        barrier.table
    );
    let rows = DB::fetch_texts(
        conn,
        dialect.rewrite(&sql),
        vec![
            Arg::Text(barrier.gid.clone()),
            Arg::Text(barrier.branch_id.clone()),
            Arg::Text(op.as_str().into()),
            Arg::Text(barrier.barrier_id()),
        ],
        3,
    )
    .await?;
    Ok(rows.into_iter().next().map(|mut cols| {
        let result = cols.pop().flatten();
        let outcome = cols.pop().flatten().unwrap_or_default();
        let reason = cols.pop().flatten().unwrap_or_default();
        (reason, outcome, result)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_know_their_origin() {
        for op in Op::ALL {
            assert_eq!(Op::parse(op.as_str()), Some(op));
        }
        assert_eq!(Op::parse("rollback"), None);
        assert_eq!(Op::Cancel.origin(), Some(Op::Try));
        assert_eq!(Op::Compensate.origin(), Some(Op::Action));
        assert_eq!(Op::Try.origin(), None);
        assert_eq!(Op::Confirm.origin(), None);
        assert_eq!(Op::Msg.origin(), None);
    }

    #[test]
    fn trans_types_allow_their_own_ops_only() {
        assert!(TransType::Tcc.allows(Op::Try));
        assert!(TransType::Tcc.allows(Op::Cancel));
        assert!(!TransType::Tcc.allows(Op::Action));
        assert!(TransType::Saga.allows(Op::Compensate));
        assert!(!TransType::Saga.allows(Op::Confirm));
        assert!(TransType::Msg.allows(Op::Msg));
        assert!(TransType::Msg.allows(Op::Action));
        assert!(!TransType::Msg.allows(Op::Compensate));
        assert_eq!(TransType::parse("saga"), Some(TransType::Saga));
        assert_eq!(TransType::parse("xa"), None);
    }

    #[test]
    fn barrier_validates_its_key() {
        assert!(Barrier::new(TransType::Tcc, "g1", "01", Op::Try).is_ok());
        assert_eq!(
            Barrier::new(TransType::Tcc, "", "01", Op::Try).unwrap_err(),
            InvalidCall::Missing("gid")
        );
        assert!(matches!(
            Barrier::new(TransType::Tcc, "g".repeat(129), "01", Op::Try),
            Err(InvalidCall::Invalid { param: "gid", .. })
        ));
        assert!(Barrier::new(TransType::Tcc, "g".repeat(128), "01", Op::Try).is_ok());
        assert!(matches!(
            Barrier::new(TransType::Tcc, "g1", "0\n1", Op::Try),
            Err(InvalidCall::Invalid {
                param: "branch_id",
                ..
            })
        ));
        assert!(matches!(
            Barrier::new(TransType::Saga, "g1", "01", Op::Cancel),
            Err(InvalidCall::Invalid { param: "op", .. })
        ));
    }

    #[test]
    fn barrier_ids_are_two_digit_steps() {
        let b = Barrier::new(TransType::Tcc, "g", "01", Op::Try).unwrap();
        assert_eq!(b.barrier_id(), "01");
        assert_eq!(b.step(12).barrier_id(), "12");
    }

    #[test]
    fn table_names_are_plain_identifiers() {
        assert!(check_table_name("idem_barrier").is_ok());
        assert!(check_table_name("_b2").is_ok());
        assert!(check_table_name("").is_err());
        assert!(check_table_name("2b").is_err());
        assert!(check_table_name("dtm.barrier").is_err());
        assert!(check_table_name("b; DROP TABLE x").is_err());
        assert!(check_table_name(&"b".repeat(49)).is_err());
    }

    #[test]
    fn existing_rows_are_interpreted() {
        use Existing::*;
        // A late Try finds the guard its Cancel left.
        assert_eq!(
            interpret_existing(Op::Try, "cancel", "guard", None),
            Rejected
        );
        assert_eq!(
            interpret_existing(Op::Action, "compensate", "guard", None),
            Rejected
        );
        assert_eq!(
            interpret_existing(Op::Msg, "rollback", "guard", None),
            Rejected
        );
        // Duplicates get the first result back.
        assert_eq!(
            interpret_existing(Op::Try, "try", "executed", Some("{\"n\":1}")),
            Duplicate("{\"n\":1}".into())
        );
        assert_eq!(
            interpret_existing(Op::Cancel, "cancel", "executed", Some("null")),
            Duplicate("null".into())
        );
        assert_eq!(
            interpret_existing(Op::Cancel, "cancel", "empty_rollback", None),
            EmptyRollback
        );
        // States that a correct run never commits.
        assert!(matches!(
            interpret_existing(Op::Try, "try", "running", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Try, "try", "executed", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Cancel, "try", "guard", None),
            Corrupt(_)
        ));
        assert!(matches!(
            interpret_existing(Op::Try, "try", "weird", Some("1")),
            Corrupt(_)
        ));
    }

    #[test]
    fn outcome_accessors() {
        assert_eq!(Outcome::Executed(3).result(), Some(&3));
        assert_eq!(Outcome::Duplicate(3).into_result(), Some(3));
        assert_eq!(Outcome::<i32>::EmptyRollback.result(), None);
        assert!(Outcome::<i32>::EmptyRollback.is_success());
        assert!(!Outcome::<i32>::Rejected.is_success());
        assert_eq!(Outcome::Executed(2).map(|x| x * 2), Outcome::Executed(4));
        assert_eq!(Outcome::<i32>::Rejected.kind(), "rejected");
    }

    #[test]
    fn retry_delay_grows_caps_and_jitters() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(50),
        };
        assert!(p.delay(1, 0.999_999).as_micros() >= 1999);
        assert!(p.delay(1, 1.0) <= Duration::from_millis(2));
        assert_eq!(p.delay(1, 0.0), Duration::from_millis(1));
        assert_eq!(p.delay(3, 0.0), Duration::from_millis(4));
        assert_eq!(p.delay(30, 0.0), Duration::from_millis(25));
        assert!(p.delay(30, 1.0) <= Duration::from_millis(50));
        let u = jitter_unit();
        assert!((0.0..1.0).contains(&u));
    }
}

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
//! 3. A TCC Confirm then reads its Try's row (same gid, branch and step). Unless that row is
//!    an executed Try, committed, the Confirm is refused with
//!    [`ParticipantError::ConfirmWithoutTry`] (503, retried by the coordinator): the
//!    closure does not run, and the whole local transaction rolls back, the Confirm's own
//!    row included, so the retry after the Try has committed runs normally. This covers a
//!    Try that has not run, one still in flight, and one turned away by a Cancel's guard
//!    (step 4); that last Confirm is refused on every retry, and its branch stalls in the
//!    coordinator, visibly. Without it, a Confirm would "confirm" a Try that never ran, and a
//!    Try arriving after its Confirm would reserve what nobody ever releases.
//! 4. A compensating op (Cancel, compensate) then inserts-if-absent the row of the op it
//!    undoes (Try, action), with `reason` = its own name. If that insert succeeds, the forward
//!    step never ran: this is an *empty rollback* (recorded, closure not run), and the row
//!    just inserted is the guard that turns the late forward call away, now and on every
//!    retry.
//! 5. Otherwise the closure runs, and its result is stored in the op's row as JSON.
//!
//! Only a TCC Confirm has a step 3 ([`Op::prerequisite`]): a compensation whose forward op
//! never ran is already handled by the empty rollback of step 4 (saga compensate included),
//! a saga action and a two-phase message's `msg` have nothing that must run before them,
//! and a msg transaction has no Try.
//!
//! A Cancel racing its Try is serialised by the unique index on the Try row: whichever
//! inserts it first holds it until commit, and the other one waits on the index and then
//! sees it. Either the Try committed first and the Cancel undoes it (both ran, net zero), or
//! the Cancel committed first and the Try is rejected (neither ran). The rows are never
//! read with `SELECT ... FOR UPDATE` before they exist: that locks gaps on InnoDB and
//! deadlocks two callers that both find nothing.
//!
//! A Confirm racing its Try needs no lock, so step 3 is a plain read. An executed Try row,
//! once committed, is never updated, and deleted only by [`crate::purge_barriers`] (a
//! Cancel's insert of it finds it and leaves it alone). So a read that finds it stays true
//! for the rest of the Confirm's transaction, and a read that misses it (no Try yet, or one
//! whose row is not committed: a plain read neither waits for nor sees it) only refuses this
//! attempt. Per database:
//!
//! * PostgreSQL, READ COMMITTED: the read sees every Try committed before it started.
//! * MySQL/MariaDB: at REPEATABLE READ (the default) InnoDB takes the transaction's snapshot
//!   at its first plain read, and the Confirm's insert before it takes none; at READ
//!   COMMITTED every read takes a fresh one. Either way the read sees every Try committed
//!   before it. A locking read would wait for a Try in flight instead of missing it, but on
//!   a missing row it locks the gap: the trap above.
//! * SQLite, `BEGIN IMMEDIATE`: the Try and the Confirm run one after the other, so the Try
//!   committed entirely before the Confirm began or starts after it ended.
//!
//! An older snapshot (a stricter isolation level, or a caller's read before
//! [`Barrier::run_in`]) can only hide a committed Try, never show one that is not there: one
//! refusal more, never a Confirm without its Try.
//!
//! Purging: [`crate::purge_barriers`] deletes rows by age, so a branch's Try row goes before
//! its Confirm's. Once a Confirm has committed, its duplicates are answered from its own row
//! (step 2) and never look at the Try's. But a Confirm that arrives, or first succeeds, only
//! after its Try row was purged is refused on every retry: nothing is confirmed twice, but
//! the branch is stuck. The retention that keeps late Tries out (longer than the coordinator
//! may still deliver any call of the transaction) keeps this window closed too. A purge
//! that deletes the Try row just after the Confirm read it changes nothing: the Try did run.
//!
//! A step with an external side effect (a Try that calls a payment provider) cannot keep
//! its effect inside the transaction: [`Barrier::with_lease`] runs it in lease mode
//! ([`lease`]), which commits a `processing` claim before the call. A compensation whose
//! forward row is such a claim answers [`ParticipantError::InProgress`] and writes nothing.
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

pub mod lease;
mod rows;
pub(crate) mod step;
mod types;

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Transaction;

use crate::backend::BarrierDatabase;
use crate::error::ParticipantError;
use crate::metrics;
use idem_sql::Backend;
pub use lease::{
    Claimed, Completion, Fact, FactSource, LeaseTicket, LeasedStep, StepRef,
    upgrade_barrier_table_for_lease,
};
use rows::{
    Existing, Prerequisite, Read, fetch_row, insert_if_absent, interpret_existing,
    interpret_prerequisite, outcome_col, set_outcome,
};
pub use step::{OpenedStep, StepConn, StepConnections, StepTx};
use step::{Shared, Slot};
pub(crate) use types::check_id;
pub(crate) use types::jitter_unit;
pub use types::{
    DEFAULT_TABLE, InvalidCall, MAX_ID_LEN, MSG_BRANCH_ID, Op, Outcome, RetryPolicy, TransType,
    check_table_name,
};

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

    /// Retries lock conflicts by `retry` instead of the default.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Barrier {
        self.retry = retry;
        self
    }

    /// The transaction kind named by the call.
    pub fn trans_type(&self) -> TransType {
        self.trans_type
    }

    /// The global transaction's id.
    pub fn gid(&self) -> &str {
        &self.gid
    }

    /// The branch within it.
    pub fn branch_id(&self) -> &str {
        &self.branch_id
    }

    /// The operation this call performs.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The step component of the key, as stored: `01`, `02`, ...
    pub fn barrier_id(&self) -> String {
        format!("{:02}", self.step)
    }

    /// The barrier table's name.
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
    /// A TCC Confirm whose Try has not committed never runs `step`: it comes back as
    /// [`ParticipantError::ConfirmWithoutTry`] (503), with nothing written.
    ///
    /// Committing can fail after the database has committed (a dropped connection). The
    /// caller then sees an error and the coordinator retries; the retry finds the row and
    /// returns the stored result, so even that case stays exactly-once.
    pub async fn run<S, T, F, Fut>(&self, pool: &S, step: F) -> Result<Outcome<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let started = Instant::now();
        let result = self.run_retrying(pool, step).await;
        metrics::step(self.op, &result, started);
        result
    }

    async fn run_retrying<S, T, F, Fut>(
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
                    metrics::conflict_retry(self.op);
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
        dialect: Backend,
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
    ///
    /// Roll back on every `Err`, [`ParticipantError::ConfirmWithoutTry`] included: a
    /// commit would keep this op's `running` row, and every later call of it would then
    /// fail as corrupt.
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
        let started = Instant::now();
        let conn: &'t mut DB::Connection = tx;
        let dialect = DB::conn_dialect(conn);
        let slot: Shared<'t, DB> = Arc::new(tokio::sync::Mutex::new(Slot::Borrowed(conn)));
        let barrier = Arc::new(self.clone());
        let mut result = Barrier::guarded(&barrier, &slot, dialect, &mut step).await;
        if Arc::strong_count(&slot) != 1 {
            result = Err(ParticipantError::internal(
                "the step's StepTx outlived its closure; roll the transaction back",
            ));
        }
        metrics::step(self.op, &result, started);
        result
    }

    /// The barrier algorithm proper (see the module documentation).
    async fn guarded<'t, DB, T, F, Fut>(
        this: &Arc<Barrier>,
        slot: &Shared<'t, DB>,
        dialect: Backend,
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
            // Only after the own row: a duplicate of a Confirm that committed is answered
            // from that row, even once a purge has taken the (older) Try row away.
            if let Some(prerequisite) = this.op.prerequisite() {
                check_prerequisite::<DB>(conn, dialect, this, prerequisite).await?;
            }
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
                // A lease-mode forward step still holds its claim: undoing now would race
                // its external call. Refused, all rolled back; see `lease.rs`.
                let origin_row =
                    fetch_row::<DB>(conn, dialect, this, origin, Read::Collided).await?;
                if origin_row.is_some_and(|(_, outcome, _)| outcome == outcome_col::PROCESSING) {
                    return Err(lease::origin_in_progress(this, origin));
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

        let row = fetch_row::<DB>(conn, dialect, this, this.op, Read::Collided).await?;
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
            Existing::Processing => Err(ParticipantError::in_progress(format!(
                "{} of {}/{} is claimed by a lease-mode call still in progress",
                this.op, this.gid, this.branch_id
            ))),
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

/// Refuses `barrier`'s op (a TCC Confirm) unless the row of its `prerequisite` (the Try)
/// is an executed one, committed. The caller's `Err` path rolls the whole transaction
/// back, this op's own row included, so a retry starts afresh. Why a plain read is enough
/// is in the module documentation.
async fn check_prerequisite<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Backend,
    barrier: &Barrier,
    prerequisite: Op,
) -> Result<(), ParticipantError> {
    let row = fetch_row::<DB>(conn, dialect, barrier, prerequisite, Read::Plain).await?;
    let found = row
        .as_ref()
        .map(|(reason, outcome, _)| (reason.as_str(), outcome.as_str()));
    let (gid, branch_id, op) = (&barrier.gid, &barrier.branch_id, barrier.op);
    let step = barrier.barrier_id();
    let why = match interpret_prerequisite(prerequisite, found) {
        Prerequisite::Ran => return Ok(()),
        Prerequisite::Missing => {
            // Usually a Confirm that overtook its Try's commit; a retry goes through.
            tracing::info!(%gid, %branch_id, %op, barrier_id = %step,
                kind = "confirm_without_try", found = "absent",
                "{op} refused: its {prerequisite} has not committed; retryable");
            format!("no committed {prerequisite} row; retry once the {prerequisite} has committed")
        }
        Prerequisite::Guarded => {
            // Never resolves by itself: the branch stalls in the coordinator, visibly.
            tracing::warn!(%gid, %branch_id, %op, barrier_id = %step,
                kind = "confirm_without_try", found = "guard",
                "{op} refused: its cancel ran first, so its {prerequisite} never will");
            format!("its cancel ran first (empty rollback), so its {prerequisite} never will")
        }
        Prerequisite::Unexpected(what) => {
            tracing::warn!(%gid, %branch_id, %op, barrier_id = %step,
                kind = "confirm_without_try", found = %what,
                "{op} refused: its {prerequisite} row is not an executed one");
            what
        }
    };
    Err(ParticipantError::ConfirmWithoutTry(format!(
        "{op} of {gid}/{branch_id} step {step} refused: {why}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

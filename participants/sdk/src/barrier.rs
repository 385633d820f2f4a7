//! The barrier: runs a branch step's business closure at most once per (tenant, gid,
//! branch, op), whatever order, repetition or concurrency the coordinator's calls arrive in.
//!
//! The tenant is part of every key (see [`crate::tenant`]): a gid is unique only within
//! its tenant, so two tenants' `order-1` at one shared participant are two transactions
//! with rows of their own. Below, "gid" always means the gid within the call's tenant.
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
mod measure;
pub(crate) mod rows;
pub mod schema;
mod types;

use std::borrow::Cow;
use std::future::Future;
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::Transaction;

use crate::backend::BarrierDatabase;
use crate::error::{InvalidCall, ParticipantError};
use crate::kit::check_table_name;
use crate::kit::local::{Attempt, Retrying};
use crate::kit::{BranchCall, LocalTx, Op, RetryPolicy, StepConnections, StepTx, TransType};
pub use lease::{
    Claimed, Completion, Fact, FactSource, LeaseTicket, LeasedStep, StepRef,
    upgrade_barrier_table_for_lease,
};
pub(crate) use measure::describe;
pub use measure::{BARRIER_OUTCOMES, LOCK_CONFLICT_RETRIES, STEP_BUCKETS, STEP_SECONDS};
use rows::{
    Existing, Prerequisite, Read, fetch_row, insert_if_absent, interpret_existing,
    interpret_prerequisite, outcome_col, set_outcome,
};
pub use types::{DEFAULT_TABLE, Outcome};

/// The barrier for one guarded step of one branch call.
///
/// Build it from the callback parameters ([`Barrier::new`], or [`BranchCall::barrier`]),
/// then wrap the business change in [`Barrier::run`].
#[derive(Clone, Debug)]
pub struct Barrier {
    call: BranchCall,
    step: u32,
    table: Cow<'static, str>,
    retry: RetryPolicy,
}

impl BranchCall {
    /// The barrier of this call's (first) guarded step, in the call's tenant.
    pub fn barrier(&self) -> Barrier {
        Barrier::for_call(self.clone())
    }
}

impl Barrier {
    /// The barrier for the first guarded step of a branch call, in the default tenant
    /// (a coordinator call's own tenant with [`Barrier::with_tenant`]; [`BranchCall::barrier`]
    /// takes it from the call).
    pub fn new(
        trans_type: TransType,
        gid: impl Into<String>,
        branch_id: impl Into<String>,
        op: Op,
    ) -> Result<Barrier, InvalidCall> {
        BranchCall::new(trans_type, gid, branch_id, op).map(Barrier::for_call)
    }

    /// The barrier for the first guarded step of `call`.
    pub fn for_call(call: BranchCall) -> Barrier {
        Barrier {
            call,
            step: 1,
            table: Cow::Borrowed(DEFAULT_TABLE),
            retry: RetryPolicy::default(),
        }
    }

    /// The barrier a two-phase message's local transaction runs in, and which
    /// [`crate::query_prepared`] looks for: branch `00`, op `msg`.
    pub fn msg(gid: impl Into<String>) -> Result<Barrier, InvalidCall> {
        BranchCall::msg(gid).map(Barrier::for_call)
    }

    /// The same barrier in `tenant`'s rows ([`BranchCall::with_tenant`]).
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Result<Barrier, InvalidCall> {
        self.call = self.call.with_tenant(tenant)?;
        Ok(self)
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

    /// The call this barrier guards a step of: its tenant, gid, branch and op key the rows.
    pub fn call(&self) -> &BranchCall {
        &self.call
    }

    /// The step component of the key, as stored: `01`, `02`, ...
    pub fn barrier_id(&self) -> String {
        format!("{:02}", self.step)
    }

    /// The barrier table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Runs `step` at most once for this (tenant, gid, branch, op), in a local transaction of its
    /// own on `pool`, and commits.
    ///
    /// The closure gets the transaction (`|tx| async move { ... }`), which also names the
    /// call ([`StepTx::call`](crate::StepTx::call)); it must make every business change
    /// through it and nothing outside it (no HTTP calls, no messages): a lost lock conflict
    /// re-runs the whole transaction, closure included. An `Err` from the closure rolls
    /// everything back, barrier row included, so a later retry runs the step afresh.
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
        let op = self.call.op();
        let retrying = Retrying {
            retry: self.retry,
            what: "barrier",
            call: Some(&self.call),
        };
        let result = retrying
            .run(
                pool,
                || measure::conflict_retry(op),
                step,
                |tx, mut step| async move { (self.guarded(tx, &mut step).await, step) },
            )
            .await;
        measure::step(op, &result, started);
        result
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
        let attempt = Attempt::borrowed(&mut **tx);
        let result = self.guarded(attempt.tx(), &mut step).await;
        let result = attempt.end(result).await;
        measure::step(self.call.op(), &result, started);
        result
    }

    /// The barrier algorithm proper (see the module documentation).
    async fn guarded<'t, DB, T, F, Fut>(
        &self,
        tx: LocalTx<'t, DB>,
        step: &mut F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        DB: BarrierDatabase,
        T: Serialize + DeserializeOwned,
        F: FnMut(StepTx<'t, DB>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let call = &self.call;
        let op = call.op();
        // The op's own row first. A duplicate stops here, and a compensation that inserts
        // its own row before the guard never needs a gap lock in front of a forward call
        // that is already waiting on the guard: on InnoDB, `cancel` sorts before `try` in the
        // unique index, and inserting the guard first then the Cancel row into the gap in
        // front of it deadlocked against every Try queued on the guard.
        let inserted = insert_if_absent(&tx, self, op, op.as_str(), outcome_col::RUNNING).await?;

        if inserted {
            // Only after the own row: a duplicate of a Confirm that committed is answered
            // from that row, even once a purge has taken the (older) Try row away.
            if let Some(prerequisite) = op.prerequisite() {
                check_prerequisite(&tx, self, prerequisite).await?;
            }
            if let Some(origin) = op.origin() {
                let origin_inserted =
                    insert_if_absent(&tx, self, origin, op.as_str(), outcome_col::GUARD).await?;
                if origin_inserted {
                    set_outcome(&tx, self, outcome_col::EMPTY_ROLLBACK, None).await?;
                    tracing::info!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), %op,
                        "empty rollback: the step it undoes never ran");
                    return Ok(Outcome::EmptyRollback);
                }
                // A lease-mode forward step still holds its claim: undoing now would race
                // its external call. Refused, all rolled back; see `lease.rs`.
                let origin_row = fetch_row(&tx, self, origin, Read::Collided).await?;
                if origin_row.is_some_and(|(_, outcome, _)| outcome == outcome_col::PROCESSING) {
                    return Err(lease::origin_in_progress(self, origin));
                }
            }
            let value = step(tx.for_call(call.clone())).await?;
            let json = serde_json::to_string(&value).map_err(|e| {
                ParticipantError::internal(format!("cannot store the step's result: {e}"))
            })?;
            set_outcome(&tx, self, outcome_col::EXECUTED, Some(json)).await?;
            return Ok(Outcome::Executed(value));
        }

        let row = fetch_row(&tx, self, op, Read::Collided).await?;
        let Some((reason, outcome, result)) = row else {
            // The insert saw a row that is gone now: only a purge racing this call does
            // that. Another attempt sorts it out.
            return Err(ParticipantError::transient(
                "the barrier row that blocked this call disappeared; retry",
            ));
        };
        match interpret_existing(op, &reason, &outcome, result.as_deref()) {
            Existing::Rejected => {
                tracing::info!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), %op,
                    "rejected: the compensation already ran");
                Ok(Outcome::Rejected)
            }
            Existing::EmptyRollback => Ok(Outcome::EmptyRollback),
            Existing::Processing => Err(ParticipantError::in_progress(format!(
                "{op} of {}/{} is claimed by a lease-mode call still in progress",
                call.gid(),
                call.branch_id()
            ))),
            Existing::Duplicate(json) => {
                let value = serde_json::from_str(&json).map_err(|e| {
                    ParticipantError::internal(format!(
                        "the stored result of {}/{}/{op} does not decode as this step's result type: {e}",
                        call.gid(),
                        call.branch_id()
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
    tx: &LocalTx<'_, DB>,
    barrier: &Barrier,
    prerequisite: Op,
) -> Result<(), ParticipantError> {
    let row = fetch_row(tx, barrier, prerequisite, Read::Plain).await?;
    let found = row
        .as_ref()
        .map(|(reason, outcome, _)| (reason.as_str(), outcome.as_str()));
    let call = barrier.call();
    let (tenant, gid, branch_id, op) = (call.tenant(), call.gid(), call.branch_id(), call.op());
    let step = barrier.barrier_id();
    let why = match interpret_prerequisite(prerequisite, found) {
        Prerequisite::Ran => return Ok(()),
        Prerequisite::Missing => {
            // Usually a Confirm that overtook its Try's commit; a retry goes through.
            tracing::info!(%tenant, %gid, %branch_id, %op, barrier_id = %step,
                kind = "confirm_without_try", found = "absent",
                "{op} refused: its {prerequisite} has not committed; retryable");
            format!("no committed {prerequisite} row; retry once the {prerequisite} has committed")
        }
        Prerequisite::Guarded => {
            // Never resolves by itself: the branch stalls in the coordinator, visibly.
            tracing::warn!(%tenant, %gid, %branch_id, %op, barrier_id = %step,
                kind = "confirm_without_try", found = "guard",
                "{op} refused: its cancel ran first, so its {prerequisite} never will");
            format!("its cancel ran first (empty rollback), so its {prerequisite} never will")
        }
        Prerequisite::Unexpected(what) => {
            tracing::warn!(%tenant, %gid, %branch_id, %op, barrier_id = %step,
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
    use crate::tenant::DEFAULT_TENANT;

    #[test]
    fn a_barrier_is_its_calls_first_step_in_the_calls_tenant() {
        let call = BranchCall::new(TransType::Tcc, "g1", "01", Op::Try).unwrap();
        assert_eq!(call.barrier().call().tenant(), DEFAULT_TENANT);
        let acme = call.with_tenant("acme").unwrap().barrier();
        assert_eq!((acme.call().tenant(), acme.call().gid()), ("acme", "g1"));
        assert_eq!(acme.barrier_id(), "01");
        let b = Barrier::new(TransType::Tcc, "g1", "01", Op::Try).unwrap();
        assert!(b.clone().with_tenant("acme/x").is_err());
        assert_eq!(b.with_tenant("beta").unwrap().call().tenant(), "beta");
        assert!(Barrier::new(TransType::Saga, "g1", "01", Op::Cancel).is_err());
    }

    #[test]
    fn barrier_ids_are_two_digit_steps() {
        let b = Barrier::new(TransType::Tcc, "g", "01", Op::Try).unwrap();
        assert_eq!(b.barrier_id(), "01");
        assert_eq!(b.step(12).barrier_id(), "12");
    }
}

//! The barrier's second mode, for a branch step with an external side effect (a Try that
//! charges a card through a payment provider): the seed's mode 2 (§12) applied to the
//! (tenant, gid, branch, op) key of §23, answering repeats as §13 says and failures as §27 says.
//!
//! The ordinary barrier runs the step inside one local transaction, which is right only
//! when the whole effect is local: an HTTP call inside it may happen and then be rolled
//! back with the row, and a retry would call again. In lease mode:
//!
//! 1. **Claim.** The step's own row is inserted-if-absent as `processing` with a fresh owner
//!    token and `lease_until_ms` = now + lease, and that transaction **commits** before the
//!    external call starts.
//! 2. **Call.** The closure makes the external call outside any database transaction. It
//!    gets a [`LeaseTicket`]; [`StepRef::external_key`] is the same for every attempt of the
//!    step, so pass it to the provider as *its* idempotency key: that is what keeps a stale
//!    owner (paused past its lease) from charging twice if the step was re-claimed.
//! 3. **Record.** `executed` and the result are written by a conditional `UPDATE` whose
//!    `WHERE` names `outcome = 'processing'` and this owner token; the row is then read to
//!    learn what happened (affected-row counts differ by driver). A stale owner's write
//!    matches nothing and is refused ([`Completion::Stale`]).
//!
//! A repeat finds the row. `executed` → the stored result ([`Outcome::Duplicate`]); a
//! compensation's guard → [`Outcome::Rejected`]; `processing` with a live lease →
//! [`ParticipantError::InProgress`] (425: the coordinator asks again later, the step is
//! never run twice at once); `processing` with an expired lease → the service's
//! [`FactSource`] is asked, outside any transaction, whether the effect happened:
//!
//! * [`Fact::Happened`]`(result)`: recorded as executed with that result (conditional on the
//!   expired owner's token), the external call is **not** made again.
//! * [`Fact::NotHappened`]: the row is re-claimed under a new owner token (conditional on the
//!   old token and on the lease still being expired) and the closure runs once, in this call.
//! * [`Fact::Unknown`]: in progress (425); the row stays `processing`. Never a blind re-run.
//!
//! When the closure fails: [`ParticipantError::Refused`] means the provider said no for
//! good, so nothing happened: the claim is deleted (conditional on the token) and the 409
//! goes back; the coordinator rolls back and the Cancel finds no Try row (empty rollback).
//! Any other error may hide an effect that did happen (a timeout): the claim stays until
//! its lease expires, and the fact source decides then.
//!
//! # A compensation racing a `processing` forward step
//!
//! Decided: a Cancel (or compensate) whose Try (action) row is `processing` is answered
//! with [`ParticipantError::InProgress`] (425) and writes nothing, its own row included;
//! the ordinary barrier does this for every compensation, so it holds whichever mode the
//! compensation runs in. Undoing now could run before the external call lands and leave
//! the charge with nobody to refund it. Once the Try is recorded, the ordinary rules apply:
//! executed → the compensation runs; a Try refused (claim deleted) → empty rollback, whose
//! guard then rejects a late Try (anti-suspension unchanged).
//!
//! A coordinator that has decided to roll back never calls the Try again, so nobody would
//! settle an expired claim: guard the compensation with
//! [`LeasedStep::run_compensation`] (the same lease settings, and the Try's fact source).
//! On an expired claim it asks the fact source about the Try: Happened → the Try is
//! recorded executed and the compensation runs; NotHappened → the Try row becomes the
//! compensation's guard and the compensation is recorded as an empty rollback, in one
//! transaction (a late completion of the stale Try is then refused and its call answers
//! [`Outcome::Rejected`]); Unknown → 425.
//!
//! # What it does not do
//!
//! A fact source that answers NotHappened while the stale owner's call can still land is
//! wrong, and no table can repair that: use a provider idempotency key
//! ([`StepRef::external_key`]) or a provider query that is authoritative. A Confirm has no
//! lease mode (it is local in every TCC service we know); an ordinary Confirm whose Try is
//! `processing` is refused as "no committed Try" (503, retried).
//!
//! Metrics: `idem_participant_barrier_lease_total{outcome}`, see [`describe`].

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

mod sql;
mod types;

pub(crate) use sql::add_lease_columns;
pub use sql::upgrade_barrier_table_for_lease;
use sql::{
    Decision, KEY_WHERE, RowView, claim_tx, conditional_tx, decide, guard_tx, is_executed_by,
    key_args, read_row, record_args, record_set, settled, to_json,
};
pub use types::{Claimed, Completion, Fact, FactSource, LeaseTicket, StepRef};

use super::rows::{Existing, outcome_col};
use super::{Barrier, Outcome};
use crate::backend::Arg;
use crate::error::ParticipantError;
use crate::kit::local::exec;
use crate::kit::{
    Op, SharedClock, StepConnections, StepTx, new_owner_token, run_local, system_clock,
};

/// Lease-mode claims by outcome.
pub const BARRIER_LEASE: &str = "idem_participant_barrier_lease_total";

/// Gives [`BARRIER_LEASE`] its HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        BARRIER_LEASE,
        "Lease-mode barrier steps by outcome: first, executed, replay, rejected, in_progress, \
         recovered (fact source: happened), reclaimed (not happened), unknown, stale, released, \
         compensation_wait."
    );
}

fn count(outcome: &'static str) {
    metrics::counter!(BARRIER_LEASE, "outcome" => outcome).increment(1);
}

/// A [`Barrier`] in lease mode: build it with [`Barrier::with_lease`].
#[derive(Clone)]
pub struct LeasedStep {
    barrier: Barrier,
    lease_ms: i64,
    clock: SharedClock,
}

impl std::fmt::Debug for LeasedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedStep")
            .field("barrier", &self.barrier)
            .field("lease_ms", &self.lease_ms)
            .finish_non_exhaustive()
    }
}

impl Barrier {
    /// This barrier in lease mode, for a step whose effect is outside the database: the
    /// claim commits before the external call and lasts `lease` (longer than the call's
    /// timeout, so that a live holder is never taken over). See the module documentation
    /// of `barrier::lease`.
    pub fn with_lease(self, lease: Duration) -> LeasedStep {
        LeasedStep {
            barrier: self,
            lease_ms: i64::try_from(lease.as_millis()).unwrap_or(i64::MAX).max(1),
            clock: system_clock(),
        }
    }
}

/// The error a compensation gets while its forward step's lease-mode claim is open.
pub(super) fn origin_in_progress(barrier: &Barrier, origin: Op) -> ParticipantError {
    count("compensation_wait");
    let call = barrier.call();
    tracing::info!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), op = %call.op(),
        "{} waits: its {origin} holds a lease-mode claim", call.op());
    ParticipantError::in_progress(format!(
        "{} of {}/{} waits: its {origin} is still in progress",
        call.op(),
        call.gid(),
        call.branch_id()
    ))
}

impl LeasedStep {
    /// Measures leases on `clock` instead of the system clock (tests: a `ManualClock`).
    pub fn with_clock(mut self, clock: SharedClock) -> LeasedStep {
        self.clock = clock;
        self
    }

    /// The barrier underneath.
    pub fn barrier(&self) -> &Barrier {
        &self.barrier
    }

    /// The step a fact source is asked about (this barrier's key, with `op`).
    fn step_ref(&self, op: Op) -> StepRef {
        let call = self.barrier.call();
        StepRef {
            trans_type: call.trans_type(),
            tenant: call.tenant().to_string(),
            gid: call.gid().to_owned(),
            branch_id: call.branch_id().to_owned(),
            op,
            barrier_id: self.barrier.barrier_id(),
        }
    }

    fn what(&self, op: Op) -> String {
        let call = self.barrier.call();
        format!("{op} of {}/{}", call.gid(), call.branch_id())
    }

    fn forward_only(&self) -> Result<(), ParticipantError> {
        match self.barrier.call().op() {
            Op::Try | Op::Action => Ok(()),
            op => Err(ParticipantError::internal(format!(
                "lease mode runs forward steps (try, action), not `{op}`; guard a compensation \
                 with run_compensation"
            ))),
        }
    }

    /// Runs `external` (the external call) at most once per effect for this step: claim,
    /// call outside any transaction, record (module documentation). `facts` is asked only
    /// about a claim whose lease expired.
    pub async fn run<S, T, F, Fut, FS>(
        &self,
        pool: &S,
        facts: &FS,
        external: F,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        F: FnOnce(LeaseTicket) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
        FS: FactSource<T>,
    {
        let ticket = match self.claim(pool, facts).await? {
            Claimed::Settled(outcome) => return Ok(outcome),
            Claimed::Acquired(ticket) => ticket,
        };
        let call = self.barrier.call();
        match external(ticket.clone()).await {
            Ok(value) => match self.complete(pool, &ticket, &value).await? {
                Completion::Recorded => Ok(Outcome::Executed(value)),
                Completion::Stale {
                    current: Some(outcome),
                } => Ok(outcome),
                Completion::Stale { current: None } => Err(ParticipantError::in_progress(format!(
                    "{} was taken over by a newer claim",
                    self.what(call.op())
                ))),
            },
            Err(e) if e.is_refusal() => {
                self.release(pool, &ticket).await?;
                Err(e)
            }
            Err(e) => {
                tracing::warn!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(),
                    op = %call.op(), error = %e,
                    "lease-mode step failed without a verdict; the claim stays until its lease expires");
                Err(e)
            }
        }
    }

    /// Claims the step (step 1), or settles a repeat: see the module documentation. Live
    /// claims and an unknown fact come back as [`ParticipantError::InProgress`].
    pub async fn claim<S, T, FS>(
        &self,
        pool: &S,
        facts: &FS,
    ) -> Result<Claimed<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        FS: FactSource<T>,
    {
        self.forward_only()?;
        let b = &self.barrier;
        let call = b.call();
        let token = new_owner_token();
        let now = self.clock.now_ms();
        let until = now.saturating_add(self.lease_ms);
        let found = run_local(pool, b.retry, "barrier lease claim", |tx| {
            claim_tx(tx, b, &token, until)
        })
        .await?;
        let Some(row) = found else {
            count("first");
            return Ok(Claimed::Acquired(LeaseTicket {
                step: self.step_ref(call.op()),
                owner_token: token,
                lease_until_ms: until,
                taken_over: false,
            }));
        };
        let old = match decide(call.op(), &row, now) {
            Decision::Settled(existing) => return self.settled_repeat(existing),
            Decision::Live => {
                count("in_progress");
                return Err(ParticipantError::in_progress(format!(
                    "{} is claimed by a call still in progress",
                    self.what(call.op())
                )));
            }
            Decision::Expired { token } => token,
        };
        match facts.check(&self.step_ref(call.op())).await {
            Fact::Happened(value) => {
                let json = to_json(&value)?;
                let mine = new_owner_token();
                let row = run_local(pool, b.retry, "barrier lease recover", |tx| {
                    conditional_tx(
                        tx,
                        b,
                        call.op(),
                        record_set(),
                        record_args(json.clone(), &mine),
                        &old,
                        None,
                    )
                })
                .await?;
                if is_executed_by(&row, &mine) {
                    count("recovered");
                    tracing::info!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), op = %call.op(),
                        "expired claim recovered: the fact source says the effect happened");
                    return Ok(Claimed::Settled(Outcome::Duplicate(value)));
                }
                self.after_race(row)
            }
            Fact::NotHappened => {
                let mine = new_owner_token();
                let until = self.clock.now_ms().saturating_add(self.lease_ms);
                let set = "owner_token = ?, lease_until_ms = ?";
                let args = || vec![Arg::Text(mine.clone()), Arg::Int(until)];
                let row = run_local(pool, b.retry, "barrier lease reclaim", |tx| {
                    conditional_tx(tx, b, call.op(), set, args(), &old, Some(now))
                })
                .await?;
                let ours = row.as_ref().is_some_and(|r| {
                    r.outcome == outcome_col::PROCESSING && r.owner_token.as_deref() == Some(&*mine)
                });
                if ours {
                    count("reclaimed");
                    tracing::info!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), op = %call.op(),
                        "expired claim taken over: the fact source says the effect did not happen");
                    return Ok(Claimed::Acquired(LeaseTicket {
                        step: self.step_ref(call.op()),
                        owner_token: mine,
                        lease_until_ms: until,
                        taken_over: true,
                    }));
                }
                self.after_race(row)
            }
            Fact::Unknown => {
                count("unknown");
                tracing::warn!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), op = %call.op(),
                    "expired claim, and the fact source cannot tell whether the effect happened");
                Err(ParticipantError::in_progress(format!(
                    "{}: the claim expired and the fact source cannot tell yet",
                    self.what(call.op())
                )))
            }
        }
    }

    fn settled_repeat<T: DeserializeOwned>(
        &self,
        existing: Existing,
    ) -> Result<Claimed<T>, ParticipantError> {
        count(match existing {
            Existing::Rejected => "rejected",
            _ => "replay",
        });
        settled(existing, &self.what(self.barrier.call().op())).map(Claimed::Settled)
    }

    /// Someone else moved the row between our read and our conditional write.
    fn after_race<T: DeserializeOwned>(
        &self,
        row: Option<RowView>,
    ) -> Result<Claimed<T>, ParticipantError> {
        let op = self.barrier.call().op();
        let what = self.what(op);
        match row {
            None => Err(ParticipantError::transient(format!(
                "the row of {what} disappeared; retry"
            ))),
            Some(row) => match decide(op, &row, i64::MIN) {
                Decision::Settled(existing) => self.settled_repeat(existing),
                _ => {
                    count("in_progress");
                    Err(ParticipantError::in_progress(format!(
                        "{what} was claimed by another call"
                    )))
                }
            },
        }
    }

    /// Records the external call's result under `ticket` (step 3). A stale ticket's write
    /// is refused and answered with what the row says now.
    pub async fn complete<S, T>(
        &self,
        pool: &S,
        ticket: &LeaseTicket,
        value: &T,
    ) -> Result<Completion<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
    {
        let b = &self.barrier;
        let call = b.call();
        let json = to_json(value)?;
        let token = ticket.owner_token.as_str();
        let row = run_local(pool, b.retry, "barrier lease complete", |tx| {
            conditional_tx(
                tx,
                b,
                call.op(),
                record_set(),
                record_args(json.clone(), token),
                token,
                None,
            )
        })
        .await?;
        if is_executed_by(&row, token) {
            count("executed");
            return Ok(Completion::Recorded);
        }
        count("stale");
        let current = match row.map(|r| decide(call.op(), &r, i64::MIN)) {
            Some(Decision::Settled(existing)) => Some(settled(existing, &self.what(call.op()))?),
            _ => None,
        };
        tracing::warn!(tenant = %call.tenant(), gid = %call.gid(), branch_id = %call.branch_id(), op = %call.op(),
            now = ?current.as_ref().map(Outcome::kind),
            "a stale owner's completion was refused: its claim had been taken over or settled");
        Ok(Completion::Stale { current })
    }

    /// Gives the claim up after a definitive failure (nothing happened): deletes the row if
    /// `ticket` still holds it, so that a compensation sees an empty rollback and a retry
    /// claims afresh.
    pub async fn release<S: StepConnections>(
        &self,
        pool: &S,
        ticket: &LeaseTicket,
    ) -> Result<(), ParticipantError> {
        let b = &self.barrier;
        let call = b.call();
        let sql = format!(
            "DELETE FROM {} WHERE {KEY_WHERE} AND outcome = ? AND owner_token = ?",
            b.table
        );
        let token = ticket.owner_token.as_str();
        run_local(pool, b.retry, "barrier lease release", |tx| {
            let mut args = key_args(b, call.op());
            args.push(Arg::Text(outcome_col::PROCESSING.into()));
            args.push(Arg::Text(token.into()));
            let sql = sql.clone();
            async move { exec(&tx, &sql, args).await.map_err(ParticipantError::from) }
        })
        .await?;
        count("released");
        Ok(())
    }

    /// Runs a compensation (this barrier's op: `cancel` or `compensate`) as the ordinary
    /// barrier does, settling first an expired lease-mode claim of the forward step it undoes
    /// through `facts` (the forward step's fact source, result type `F`): see the module
    /// documentation. A live claim answers [`ParticipantError::InProgress`].
    pub async fn run_compensation<S, T, U, St, Fut, FS>(
        &self,
        pool: &S,
        facts: &FS,
        mut step: St,
    ) -> Result<Outcome<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize + DeserializeOwned,
        U: Serialize + DeserializeOwned,
        St: FnMut(StepTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
        FS: FactSource<U>,
    {
        let b = &self.barrier;
        let call = b.call();
        let Some(origin) = call.op().origin() else {
            return Err(ParticipantError::internal(format!(
                "run_compensation guards a cancel or compensate, not `{}`",
                call.op()
            )));
        };
        let first = b.run(pool, &mut step).await;
        if !matches!(first, Err(ParticipantError::InProgress(_))) {
            return first;
        }
        let now = self.clock.now_ms();
        let row = run_local(pool, b.retry, "barrier lease origin", |tx| async move {
            read_row(&tx, b, origin).await
        })
        .await?;
        let Some(Decision::Expired { token: old }) = row.map(|r| decide(origin, &r, now)) else {
            return first;
        };
        match facts.check(&self.step_ref(origin)).await {
            Fact::Happened(value) => {
                let json = to_json(&value)?;
                let mine = new_owner_token();
                run_local(pool, b.retry, "barrier lease recover", |tx| {
                    conditional_tx(
                        tx,
                        b,
                        origin,
                        record_set(),
                        record_args(json.clone(), &mine),
                        &old,
                        None,
                    )
                })
                .await?;
                count("recovered");
            }
            Fact::NotHappened => {
                let guarded = run_local(pool, b.retry, "barrier lease guard", |tx| {
                    guard_tx(tx, b, origin, &old, now)
                })
                .await;
                match guarded {
                    Ok(()) => count("reclaimed"),
                    // The stale owner recorded first; the rerun compensates what happened.
                    Err(ParticipantError::InProgress(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            Fact::Unknown => {
                count("unknown");
                return first;
            }
        }
        // Whatever won the race (us or the stale owner), the row is settled now and the
        // ordinary rules answer.
        b.run(pool, &mut step).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kit::TransType;

    #[test]
    fn the_external_key_is_the_same_for_every_owner() {
        let b = Barrier::new(TransType::Tcc, "g1", "01", Op::Try).unwrap();
        let a = b
            .clone()
            .with_lease(Duration::from_secs(5))
            .step_ref(Op::Try);
        let c = b.with_lease(Duration::from_secs(9)).step_ref(Op::Try);
        assert_eq!(a.external_key(), "g1:01:try:01");
        assert_eq!(a, c);
        let beta = Barrier::new(TransType::Tcc, "g1", "01", Op::Try)
            .unwrap()
            .with_tenant("beta")
            .unwrap()
            .with_lease(Duration::from_secs(5))
            .step_ref(Op::Try);
        assert_eq!(beta.tenant, "beta");
        assert_eq!(beta.external_key(), "beta/g1:01:try:01");
    }
}

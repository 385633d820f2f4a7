//! The barrier's second mode, for a branch step with an external side effect (a Try that
//! charges a card through a payment provider): the seed's mode 2 (§12) applied to the
//! (gid, branch, op) key of §23, answering repeats as §13 says and failures as §27 says.
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
use sqlx::Pool;

use super::rows::{Existing, insert_if_absent, interpret_existing, outcome_col};
use super::step::StepConnections;
use super::{Barrier, Op, Outcome, TransType};
use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::{DbErrorKind, ParticipantError, classify};
use crate::kit::local::{LocalTx, exec, fetch, run_local};
use crate::kit::{SharedClock, new_owner_token, system_clock};
use idem_sql::Backend;

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

/// The step a [`FactSource`] is asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRef {
    /// The transaction kind.
    pub trans_type: TransType,
    /// The global transaction's id.
    pub gid: String,
    /// The branch within it.
    pub branch_id: String,
    /// The forward op (`try` or `action`).
    pub op: Op,
    /// The step component of the barrier key (`01`, ...).
    pub barrier_id: String,
}

impl StepRef {
    /// A key that is the same for every attempt and every owner of this step: give it to
    /// the external service as its idempotency key (and look the effect up by it in the
    /// fact source).
    pub fn external_key(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.gid, self.branch_id, self.op, self.barrier_id
        )
    }
}

/// What the service's source of truth says about a step whose claim expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact<T> {
    /// The external effect happened; this is the step's result. Recorded, not redone.
    Happened(T),
    /// It did not happen and no longer can: the step may run again under a new owner.
    NotHappened,
    /// Cannot tell yet (the provider is down, the payment is pending): stay in progress.
    Unknown,
}

/// The service's hook that answers, from the external system, whether a step's effect
/// happened. Asked only after a claim's lease expired, never inside a transaction.
pub trait FactSource<T>: Send + Sync {
    /// Looks the step's effect up (typically by [`StepRef::external_key`]).
    fn check(&self, step: &StepRef) -> impl Future<Output = Fact<T>> + Send;
}

/// A committed claim on a step: who holds it and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTicket {
    /// The step claimed.
    pub step: StepRef,
    /// This holder's token; every later write names it.
    pub owner_token: String,
    /// The lease's end, Unix milliseconds on the step's clock.
    pub lease_until_ms: i64,
    /// True when the claim was taken over from an expired one (the fact source said the
    /// effect had not happened).
    pub taken_over: bool,
}

/// What [`LeasedStep::claim`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claimed<T> {
    /// The step is this caller's to run: make the external call, then
    /// [`LeasedStep::complete`].
    Acquired(LeaseTicket),
    /// The step is settled; this is its outcome (a duplicate, a rejected late Try, or one
    /// the fact source answered).
    Settled(Outcome<T>),
}

/// What became of [`LeasedStep::complete`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion<T> {
    /// The result is recorded; it is the step's result.
    Recorded,
    /// The claim had been taken over or settled by someone else; the write was refused.
    /// `current` is the step's settled outcome, or `None` while a newer owner holds it. A
    /// `Some(Outcome::Rejected)` means the step was settled as not happened while this call's
    /// external effect was landing: the service must undo that effect.
    Stale {
        /// What the row says now.
        current: Option<Outcome<T>>,
    },
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

/// The row as lease mode reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RowView {
    reason: String,
    outcome: String,
    result: Option<String>,
    owner_token: Option<String>,
    lease_until_ms: Option<i64>,
}

/// What a row found by a claim means, before any fact source is asked.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Settled(Existing),
    Live,
    Expired { token: String },
}

/// Pure, so that every case is unit-tested.
fn decide(op: Op, row: &RowView, now_ms: i64) -> Decision {
    match interpret_existing(op, &row.reason, &row.outcome, row.result.as_deref()) {
        Existing::Processing => match (&row.owner_token, row.lease_until_ms) {
            (Some(token), Some(until)) if until <= now_ms => Decision::Expired {
                token: token.clone(),
            },
            (Some(_), Some(_)) => Decision::Live,
            _ => Decision::Settled(Existing::Corrupt(
                "a processing barrier row without an owner token or lease".into(),
            )),
        },
        other => Decision::Settled(other),
    }
}

fn settled<T: DeserializeOwned>(
    existing: Existing,
    what: &str,
) -> Result<Outcome<T>, ParticipantError> {
    match existing {
        Existing::Rejected => Ok(Outcome::Rejected),
        Existing::EmptyRollback => Ok(Outcome::EmptyRollback),
        Existing::Duplicate(json) => serde_json::from_str(&json).map(Outcome::Duplicate).map_err(
            |e| {
                ParticipantError::internal(format!(
                    "the stored result of {what} does not decode as this step's result type: {e}"
                ))
            },
        ),
        Existing::Processing => Err(ParticipantError::in_progress(format!(
            "{what} is claimed by a call still in progress"
        ))),
        Existing::Corrupt(why) => Err(ParticipantError::internal(why)),
    }
}

/// The error a compensation gets while its forward step's lease-mode claim is open.
pub(super) fn origin_in_progress(barrier: &Barrier, origin: Op) -> ParticipantError {
    count("compensation_wait");
    tracing::info!(gid = %barrier.gid, branch_id = %barrier.branch_id, op = %barrier.op,
        "{} waits: its {origin} holds a lease-mode claim", barrier.op);
    ParticipantError::in_progress(format!(
        "{} of {}/{} waits: its {origin} is still in progress",
        barrier.op, barrier.gid, barrier.branch_id
    ))
}

const ROW_KINDS: &[CellKind] = &[
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Int,
];

fn key_where() -> &'static str {
    "gid = ? AND branch_id = ? AND op = ? AND barrier_id = ?"
}

fn key_args(b: &Barrier, op: Op) -> Vec<Arg> {
    vec![
        Arg::Text(b.gid.clone()),
        Arg::Text(b.branch_id.clone()),
        Arg::Text(op.as_str().into()),
        Arg::Text(b.barrier_id()),
    ]
}

/// Reads the row of `op`. Always the first read of its transaction, and every row it can
/// find is committed (an insert that collided waited for the other writer), so a plain read
/// sees the latest state on every backend: no locking read, which on InnoDB would lock a gap
/// when the row is gone.
async fn read_row<DB: BarrierDatabase>(
    tx: &LocalTx<'_, DB>,
    b: &Barrier,
    op: Op,
) -> Result<Option<RowView>, ParticipantError> {
    let sql = format!(
        "SELECT reason, outcome, result, owner_token, lease_until_ms FROM {} WHERE {}",
        b.table,
        key_where()
    );
    let rows = fetch(tx, &sql, key_args(b, op), ROW_KINDS).await?;
    Ok(rows.into_iter().next().map(|cells| {
        let text = |i: usize| cells.get(i).and_then(Cell::text).map(str::to_owned);
        RowView {
            reason: text(0).unwrap_or_default(),
            outcome: text(1).unwrap_or_default(),
            result: text(2),
            owner_token: text(3),
            lease_until_ms: cells.get(4).and_then(Cell::int),
        }
    }))
}

/// Inserts the claim unless the row exists; `None` when this call inserted it, else the row.
async fn claim_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    token: &str,
    until: i64,
) -> Result<Option<RowView>, ParticipantError> {
    let columns = "(trans_type, gid, branch_id, op, barrier_id, reason, outcome, owner_token, lease_until_ms) \
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
    let sql = match tx.dialect() {
        Backend::Postgres | Backend::Sqlite => format!(
            "INSERT INTO {} {columns} ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING",
            b.table
        ),
        Backend::Mysql => format!("INSERT INTO {} {columns}", b.table),
    };
    let args = vec![
        Arg::Text(b.trans_type.as_str().into()),
        Arg::Text(b.gid.clone()),
        Arg::Text(b.branch_id.clone()),
        Arg::Text(b.op.as_str().into()),
        Arg::Text(b.barrier_id()),
        Arg::Text(b.op.as_str().into()),
        Arg::Text(outcome_col::PROCESSING.into()),
        Arg::Text(token.into()),
        Arg::Int(until),
    ];
    let inserted = match exec(&tx, &sql, args).await {
        Ok(n) => n == 1,
        Err(e)
            if tx.dialect() == Backend::Mysql
                && classify(tx.dialect(), &e) == DbErrorKind::UniqueViolation =>
        {
            false
        }
        Err(e) => return Err(e.into()),
    };
    if inserted {
        return Ok(None);
    }
    match read_row(&tx, b, b.op).await? {
        Some(row) => Ok(Some(row)),
        None => Err(ParticipantError::transient(
            "the barrier row that blocked this claim disappeared; retry",
        )),
    }
}

/// `UPDATE <table> SET <set> WHERE <key of op> AND outcome = 'processing' AND owner_token =
/// expected <extra>`, then reads the row: the read, not the count, says what happened.
async fn conditional_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    op: Op,
    set: &str,
    mut args: Vec<Arg>,
    expected: &str,
    expired_at: Option<i64>,
) -> Result<Option<RowView>, ParticipantError> {
    let extra = if expired_at.is_some() {
        " AND lease_until_ms <= ?"
    } else {
        ""
    };
    let sql = format!(
        "UPDATE {} SET {set} WHERE {} AND outcome = ? AND owner_token = ?{extra}",
        b.table,
        key_where()
    );
    args.extend(key_args(b, op));
    args.push(Arg::Text(outcome_col::PROCESSING.into()));
    args.push(Arg::Text(expected.into()));
    if let Some(now) = expired_at {
        args.push(Arg::Int(now));
    }
    exec(&tx, &sql, args).await?;
    read_row(&tx, b, op).await
}

fn record_set() -> &'static str {
    "outcome = ?, result = ?, owner_token = ?, lease_until_ms = NULL"
}

fn record_args(json: String, token: &str) -> Vec<Arg> {
    vec![
        Arg::Text(outcome_col::EXECUTED.into()),
        Arg::OptText(Some(json)),
        Arg::Text(token.into()),
    ]
}

fn to_json<T: Serialize>(value: &T) -> Result<String, ParticipantError> {
    serde_json::to_string(value)
        .map_err(|e| ParticipantError::internal(format!("cannot store the step's result: {e}")))
}

fn is_executed_by(row: &Option<RowView>, token: &str) -> bool {
    row.as_ref().is_some_and(|r| {
        r.outcome == outcome_col::EXECUTED && r.owner_token.as_deref() == Some(token)
    })
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
        StepRef {
            trans_type: self.barrier.trans_type,
            gid: self.barrier.gid.clone(),
            branch_id: self.barrier.branch_id.clone(),
            op,
            barrier_id: self.barrier.barrier_id(),
        }
    }

    fn what(&self, op: Op) -> String {
        format!("{op} of {}/{}", self.barrier.gid, self.barrier.branch_id)
    }

    fn forward_only(&self) -> Result<(), ParticipantError> {
        match self.barrier.op {
            Op::Try | Op::Action => Ok(()),
            op => Err(ParticipantError::internal(format!(
                "lease mode runs forward steps (try, action), not `{op}`; guard a compensation \
                 with run_compensation"
            ))),
        }
    }

    /// Runs `call` (the external call) at most once per effect for this step: claim,
    /// call outside any transaction, record (module documentation). `facts` is asked only
    /// about a claim whose lease expired.
    pub async fn run<S, T, F, Fut, FS>(
        &self,
        pool: &S,
        facts: &FS,
        call: F,
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
        match call(ticket.clone()).await {
            Ok(value) => match self.complete(pool, &ticket, &value).await? {
                Completion::Recorded => Ok(Outcome::Executed(value)),
                Completion::Stale {
                    current: Some(outcome),
                } => Ok(outcome),
                Completion::Stale { current: None } => Err(ParticipantError::in_progress(format!(
                    "{} was taken over by a newer claim",
                    self.what(self.barrier.op)
                ))),
            },
            Err(e) if e.is_refusal() => {
                self.release(pool, &ticket).await?;
                Err(e)
            }
            Err(e) => {
                tracing::warn!(gid = %self.barrier.gid, branch_id = %self.barrier.branch_id,
                    op = %self.barrier.op, error = %e,
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
                step: self.step_ref(b.op),
                owner_token: token,
                lease_until_ms: until,
                taken_over: false,
            }));
        };
        let old = match decide(b.op, &row, now) {
            Decision::Settled(existing) => return self.settled_repeat(existing),
            Decision::Live => {
                count("in_progress");
                return Err(ParticipantError::in_progress(format!(
                    "{} is claimed by a call still in progress",
                    self.what(b.op)
                )));
            }
            Decision::Expired { token } => token,
        };
        match facts.check(&self.step_ref(b.op)).await {
            Fact::Happened(value) => {
                let json = to_json(&value)?;
                let mine = new_owner_token();
                let row = run_local(pool, b.retry, "barrier lease recover", |tx| {
                    conditional_tx(
                        tx,
                        b,
                        b.op,
                        record_set(),
                        record_args(json.clone(), &mine),
                        &old,
                        None,
                    )
                })
                .await?;
                if is_executed_by(&row, &mine) {
                    count("recovered");
                    tracing::info!(gid = %b.gid, branch_id = %b.branch_id, op = %b.op,
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
                    conditional_tx(tx, b, b.op, set, args(), &old, Some(now))
                })
                .await?;
                let ours = row.as_ref().is_some_and(|r| {
                    r.outcome == outcome_col::PROCESSING && r.owner_token.as_deref() == Some(&*mine)
                });
                if ours {
                    count("reclaimed");
                    tracing::info!(gid = %b.gid, branch_id = %b.branch_id, op = %b.op,
                        "expired claim taken over: the fact source says the effect did not happen");
                    return Ok(Claimed::Acquired(LeaseTicket {
                        step: self.step_ref(b.op),
                        owner_token: mine,
                        lease_until_ms: until,
                        taken_over: true,
                    }));
                }
                self.after_race(row)
            }
            Fact::Unknown => {
                count("unknown");
                tracing::warn!(gid = %b.gid, branch_id = %b.branch_id, op = %b.op,
                    "expired claim, and the fact source cannot tell whether the effect happened");
                Err(ParticipantError::in_progress(format!(
                    "{}: the claim expired and the fact source cannot tell yet",
                    self.what(b.op)
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
        settled(existing, &self.what(self.barrier.op)).map(Claimed::Settled)
    }

    /// Someone else moved the row between our read and our conditional write.
    fn after_race<T: DeserializeOwned>(
        &self,
        row: Option<RowView>,
    ) -> Result<Claimed<T>, ParticipantError> {
        let what = self.what(self.barrier.op);
        match row {
            None => Err(ParticipantError::transient(format!(
                "the row of {what} disappeared; retry"
            ))),
            Some(row) => match decide(self.barrier.op, &row, i64::MIN) {
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
        let json = to_json(value)?;
        let token = ticket.owner_token.as_str();
        let row = run_local(pool, b.retry, "barrier lease complete", |tx| {
            conditional_tx(
                tx,
                b,
                b.op,
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
        let current = match row.map(|r| decide(b.op, &r, i64::MIN)) {
            Some(Decision::Settled(existing)) => Some(settled(existing, &self.what(b.op))?),
            _ => None,
        };
        tracing::warn!(gid = %b.gid, branch_id = %b.branch_id, op = %b.op,
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
        let sql = format!(
            "DELETE FROM {} WHERE {} AND outcome = ? AND owner_token = ?",
            b.table,
            key_where()
        );
        let token = ticket.owner_token.as_str();
        run_local(pool, b.retry, "barrier lease release", |tx| {
            let mut args = key_args(b, b.op);
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
        St: FnMut(super::StepTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
        FS: FactSource<U>,
    {
        let b = &self.barrier;
        let Some(origin) = b.op.origin() else {
            return Err(ParticipantError::internal(format!(
                "run_compensation guards a cancel or compensate, not `{}`",
                b.op
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

/// The empty rollback of a compensation whose forward step's expired claim did not happen:
/// the compensation's own row first (the order the ordinary barrier inserts in, so that
/// InnoDB locks are taken in one order), then the forward row turned into its guard.
async fn guard_tx<DB: BarrierDatabase>(
    tx: LocalTx<'static, DB>,
    b: &Barrier,
    origin: Op,
    old: &str,
    now: i64,
) -> Result<(), ParticipantError> {
    let dialect = tx.dialect();
    {
        let mut conn = tx.conn();
        insert_if_absent::<DB>(
            &mut *conn,
            dialect,
            b,
            b.op,
            b.op.as_str(),
            outcome_col::EMPTY_ROLLBACK,
        )
        .await?;
    }
    let set = "reason = ?, outcome = ?, result = NULL, owner_token = NULL, lease_until_ms = NULL";
    let args = vec![
        Arg::Text(b.op.as_str().into()),
        Arg::Text(outcome_col::GUARD.into()),
    ];
    let row = conditional_tx(tx.clone(), b, origin, set, args, old, Some(now)).await?;
    let guarded = row
        .as_ref()
        .is_some_and(|r| r.outcome == outcome_col::GUARD && r.reason == b.op.as_str());
    if guarded {
        tracing::info!(gid = %b.gid, branch_id = %b.branch_id, op = %b.op,
            "empty rollback: the fact source says the expired {origin} never took effect");
        Ok(())
    } else {
        // The stale owner recorded its result first: roll our row back, let the rerun
        // compensate what did happen.
        Err(ParticipantError::in_progress(format!(
            "the {origin} of {}/{} settled while its compensation was deciding",
            b.gid, b.branch_id
        )))
    }
}

/// Adds the lease columns to a barrier table created before them (the scripts
/// `sql/barrier_lease.*.sql`). Safe to run again: an existing column is skipped.
pub async fn upgrade_barrier_table_for_lease<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    super::check_table_name(table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let dialect = DB::pool_dialect(pool);
    let text = match dialect {
        Backend::Sqlite => include_str!("../../sql/barrier_lease.sqlite.sql"),
        Backend::Postgres => include_str!("../../sql/barrier_lease.postgres.sql"),
        Backend::Mysql => include_str!("../../sql/barrier_lease.mysql.sql"),
    };
    let mut conn = pool.acquire().await?;
    for statement in crate::schema::split_sql_script(text) {
        let statement = statement.replace(super::DEFAULT_TABLE, table);
        match DB::exec(&mut conn, statement, Vec::new()).await {
            Ok(_) => {}
            // MySQL 1060 and SQLite both say "Duplicate column name".
            Err(sqlx::Error::Database(e))
                if e.message()
                    .to_ascii_lowercase()
                    .contains("duplicate column") => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(reason: &str, outcome: &str, token: Option<&str>, until: Option<i64>) -> RowView {
        RowView {
            reason: reason.into(),
            outcome: outcome.into(),
            result: (outcome == "executed").then(|| "7".to_owned()),
            owner_token: token.map(str::to_owned),
            lease_until_ms: until,
        }
    }

    #[test]
    fn a_claim_is_live_until_its_lease_ends_then_expired() {
        let r = row("try", "processing", Some("t1"), Some(1_000));
        assert_eq!(decide(Op::Try, &r, 999), Decision::Live);
        assert_eq!(
            decide(Op::Try, &r, 1_000),
            Decision::Expired { token: "t1".into() }
        );
        assert!(matches!(
            decide(Op::Try, &row("try", "processing", None, Some(1)), 5),
            Decision::Settled(Existing::Corrupt(_))
        ));
        assert_eq!(
            decide(Op::Try, &row("try", "executed", Some("t1"), None), 5),
            Decision::Settled(Existing::Duplicate("7".into()))
        );
        assert_eq!(
            decide(Op::Try, &row("cancel", "guard", None, None), 5),
            Decision::Settled(Existing::Rejected)
        );
    }

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
    }
}

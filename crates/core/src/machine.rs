//! The global-transaction state machine: `(state, events, now) -> (state, store?, next)`.
//!
//! Everything here is a pure function of its arguments. The engine feeds it events (a
//! client's submit, a participant's answer, a timer) and performs the [`Transition`] it
//! returns: store the new state when it changed, then exactly one of call a round of
//! branch operations, sleep until a time, or stop (see `effects.rs` for why it is typed
//! that way). Each transition goes through three stages: `step` applies each event to the
//! branches it names, `settle` derives the status changes from the branches and the clock
//! once for all the events, and `plan` finds what is due.
//!
//! The transition table (kind, status, event -> status, effects). "store" means the
//! transition changes the stored state; "call" lists what becomes due, sent as one round
//! after the store; a branch still backing off makes it "wake at" its next attempt instead.
//!
//! | kind      | status     | event                                    | next status          | effects                                   |
//! |-----------|------------|------------------------------------------|----------------------|-------------------------------------------|
//! | tcc       | prepared   | `register` (not an event)                | prepared             | the new branches are inserted             |
//! | tcc       | prepared   | a Try's answer before the timeout        | prepared             | store, wake at the timeout                |
//! | tcc       | prepared   | submit, every Try succeeded              | committing (succeeded without branches) | store, call every Confirm (done) |
//! | tcc       | prepared   | submit, a Try refused or unsettled       | (error)              | none                                      |
//! | tcc       | prepared   | abort; wake or a Try's answer after the timeout | aborting      | store, call every Cancel                  |
//! | tcc, msg  | prepared   | wake before the timeout                  | prepared             | wake at the timeout                       |
//! | tcc, msg  | prepared   | submit after the timeout                 | (error)              | none                                      |
//! | msg       | prepared   | submit                                   | committing           | store, call every action                  |
//! | msg       | prepared   | abort                                    | failed               | store, done                               |
//! | msg       | prepared   | wake after the timeout, no back-check    | failed               | store, done                               |
//! | msg       | prepared   | wake after the timeout                   | prepared             | call the back-check                       |
//! | msg       | prepared   | back-check success / failure             | committing / failed  | store, call every action / done           |
//! | saga      | running    | wake (created, or resumed)               | running              | call the steps whose orders are met       |
//! | saga      | running    | an action succeeded, not the last        | running              | store, call the steps it unblocks         |
//! | saga      | running    | last action succeeded                    | succeeded            | store, done                               |
//! | saga      | running    | an action refused, out of attempts, or in progress past its cap | aborting | store, call (in reverse order) the compensations of the steps that may have run; the others are skipped |
//! | saga      | running    | wake after the timeout                   | aborting             | as the row above                          |
//! | tcc, msg  | committing | a Confirm/action succeeded, not the last | committing           | store, call or wake at what is left       |
//! | tcc, msg  | committing | last Confirm/action succeeded            | succeeded            | store, done                               |
//! | tcc, saga | aborting   | a Cancel/compensation done, not the last | aborting             | store, call or wake at what is left       |
//! | tcc, saga | aborting   | last Cancel/compensation done            | failed               | store, done                               |
//! | tcc       | aborting   | a late Try's answer                      | aborting             | store (recorded only), call or wake at what is left |
//! | any       | running, committing, aborting, msg prepared | a retryable miss (unknown, a 409 from a must-succeed call, in progress) | unchanged | store, wake at its next attempt (or call what else is due) |
//! | any       | committing, aborting, msg prepared | a must-succeed call (or the back-check) out of attempts, or in progress past its cap | stalled | store, done |
//! | any       | not final  | stall (progress cannot be stored)        | stalled              | store, done                               |
//! | any       | running, committing, aborting, msg prepared | its next round would take its calls past the call budget (`Ctx::max_calls`) | stalled | store, done |
//! | any       | stalled    | retry                                    | the status it stalled in | store, call every pending operation, the stalled ones with fresh attempts, with a fresh call budget |
//! | any       | running, committing, aborting | retry                 | unchanged            | store, call what is pending now           |
//! | any       | not final  | force-stop                               | failed               | store, done                               |
//! | any       | final, stalled | wake                                 | unchanged            | done                                      |
//!
//! A "store" is there exactly when the state changed; it is always performed first.
//! "Done" means nothing more happens without an outside event; a prepared transaction
//! without a timeout is done too where the table says "wake at the timeout".
//!
//! Repeats are harmless (no store, the same next step): submit of a committing/succeeded
//! transaction (or one stalled while committing) or of a saga, abort of an aborting/failed
//! one (or one stalled while aborting), stall of a stalled one, force-stop of a failed one,
//! and a second answer for a branch that already has its final answer (or is stalled, or
//! whose transaction is final). Anything else that the table does not list is an error.

use super::answers::{CallOutcome, record_outcome};
use super::effects::{Next, Transition};
use super::model::*;
use super::plan::{next_attempt_at, plan};
use super::settle::settle;

/// Something that happened to a global transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The client commits (TCC, msg).
    Submit,
    /// The client rolls back (TCC, msg).
    Abort { reason: String },
    /// A timer fired or a coordinator took the transaction over (after a lease expired or
    /// at start-up): check the timeout and find what is due.
    Wake,
    /// A participant answered a call (or the call failed).
    Outcome {
        key: BranchKey,
        outcome: CallOutcome,
    },
    /// An operator resumes a stalled transaction, or makes a backing-off one due now.
    Retry,
    /// An operator gives up on the transaction: it becomes failed and nothing more is called.
    ForceStop { reason: String },
    /// The coordinator cannot go on by itself (its progress cannot be stored, for a reason
    /// a retry will not cure): it stalls, visibly, until an operator retries.
    Stall { reason: String },
}

impl Event {
    fn name(&self) -> &'static str {
        match self {
            Event::Submit => "submit",
            Event::Abort { .. } => "abort",
            Event::Wake => "wake",
            Event::Outcome { .. } => "record an answer for",
            Event::Retry => "retry",
            Event::ForceStop { .. } => "force-stop",
            Event::Stall { .. } => "stall",
        }
    }
}

/// The inputs the core takes from outside besides the state and the event.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub now: Millis,
    /// A number in [0, 1) that spreads retries out; the adapter draws it at random, tests
    /// fix it.
    pub jitter: f64,
    /// The call budget: the most calls a transaction may make by itself
    /// ([`Transaction::calls`]) before it stalls. The server's setting, not the
    /// transaction's, so no request can raise it and an operator's change applies to
    /// every transaction at its next round.
    pub max_calls: u64,
}

impl Ctx {
    /// At `now`, without jitter or a call budget.
    pub fn at(now: Millis) -> Ctx {
        Ctx {
            now,
            jitter: 0.0,
            max_calls: u64::MAX,
        }
    }
}

/// Why an event cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error("cannot {event} a {kind} transaction that is {status}")]
    IllegalTransition {
        kind: Kind,
        status: Status,
        event: &'static str,
    },
    #[error("the global timeout of this transaction has passed; it is being aborted")]
    TimedOut,
    #[error("transaction has no branch {0}")]
    UnknownBranch(BranchKey),
    #[error("branch {0} is already registered with a different URL or payload")]
    BranchConflict(BranchKey),
    #[error("cannot commit: the Try of {0} was refused; abort the transaction")]
    TryFailed(BranchKey),
    #[error(
        "cannot commit: the Try of {0} has not succeeded (its answer is unknown or still          in progress); call it again by registering the branch again, or abort"
    )]
    TryNotSucceeded(BranchKey),
}

/// Applies one event.
pub fn apply(tx: &Transaction, event: &Event, ctx: Ctx) -> Result<Transition, CoreError> {
    apply_all(tx, std::slice::from_ref(event), ctx)
}

/// Applies several events in order (typically the answers of one round of concurrent
/// calls) and plans once from the resulting state. All or nothing: if one event is
/// illegal, the error is returned and no state is produced.
pub fn apply_all(tx: &Transaction, events: &[Event], ctx: Ctx) -> Result<Transition, CoreError> {
    let mut next = tx.clone();
    for event in events {
        step(&mut next, event, ctx)?;
    }
    settle(&mut next, tx, ctx);
    let mut then = plan(&next, ctx.now);
    if let Next::Call(due) = &then
        && over_budget(&next, due.len(), ctx.max_calls)
    {
        let reason = budget_spent(&next, ctx.max_calls);
        stall(&mut next, reason);
        then = Next::Done(Status::Stalled);
    }
    next.next_attempt_at = next_attempt_at(&then, tx.next_attempt_at, ctx.now);
    let persist = next != *tx;
    if persist {
        next.updated_at = ctx.now;
    }
    Ok(Transition {
        tx: next,
        persist,
        next: then,
    })
}

/// Whether a round of `round` more calls would take the transaction past its budget.
/// Checked before the round, whole: a round is never cut, so the transaction stops with
/// at most `max_calls` made, and a round that would pass it is not sent at all.
fn over_budget(tx: &Transaction, round: usize, max_calls: u64) -> bool {
    let made = u64::try_from(tx.calls).unwrap_or(0);
    made.saturating_add(round as u64) > max_calls
}

fn budget_spent(tx: &Transaction, max_calls: u64) -> String {
    format!(
        "stopped calling after {} calls: its next round would pass the server's budget of \
         {max_calls} calls per transaction; an operator's retry gives it a new budget",
        tx.calls
    )
}

pub(super) fn illegal(tx: &Transaction, event: &'static str) -> CoreError {
    CoreError::IllegalTransition {
        kind: tx.kind,
        status: tx.status,
        event,
    }
}

pub(super) fn timed_out(tx: &Transaction, now: Millis) -> bool {
    tx.timeout_at.is_some_and(|at| at <= now)
}

/// The status whose operations are under way: the stalled phase for a stalled
/// transaction, else its status.
pub(super) fn phase_status(tx: &Transaction) -> Status {
    match tx.status {
        Status::Stalled => tx.stalled_from.unwrap_or(Status::Aborting),
        status => status,
    }
}

/// One event's change of state. Status changes that follow from the branches (a phase
/// finished, a step failed, a call stalled, a timeout passed) are left to `settle`,
/// which runs once after all the events: so the answers of a round give the same result
/// in any order and any grouping.
fn step(tx: &mut Transaction, event: &Event, ctx: Ctx) -> Result<(), CoreError> {
    use Kind::*;
    use Status::*;
    let now = ctx.now;
    match event {
        Event::Submit => match (tx.kind, tx.status) {
            (Tcc | Msg, Prepared) if timed_out(tx, now) => Err(CoreError::TimedOut),
            (Tcc, Prepared) => {
                check_tries(tx)?;
                tx.status = Committing;
                Ok(())
            }
            (Msg, Prepared) => {
                tx.status = Committing;
                Ok(())
            }
            (Tcc | Msg, Committing | Succeeded) => Ok(()),
            (Tcc | Msg, Stalled) if tx.stalled_from == Some(Committing) => Ok(()),
            // A saga is submitted when it is created; a repeat changes nothing.
            (Saga, _) => Ok(()),
            _ => Err(illegal(tx, event.name())),
        },
        Event::Abort { reason } => match (tx.kind, tx.status) {
            (Tcc, Prepared) => {
                start_abort(tx, reason.clone());
                Ok(())
            }
            (Msg, Prepared) => {
                finish_failed(tx, reason.clone());
                Ok(())
            }
            (Tcc, Aborting | Failed) | (Msg, Failed) => Ok(()),
            (Tcc, Stalled) if tx.stalled_from == Some(Aborting) => Ok(()),
            _ => Err(illegal(tx, event.name())),
        },
        // Timers only make `settle` look at the clock.
        Event::Wake => Ok(()),
        Event::Outcome { key, outcome } => record_outcome(tx, key, outcome, ctx),
        Event::Retry => match tx.status {
            Stalled => {
                tx.status = tx.stalled_from.take().unwrap_or(Aborting);
                // The operator's retry authorises calls anew: a fresh budget.
                tx.calls = 0;
                make_pending_due(tx, true);
                Ok(())
            }
            Running | Committing | Aborting => {
                make_pending_due(tx, false);
                Ok(())
            }
            _ => Err(illegal(tx, event.name())),
        },
        Event::Stall { reason } => match tx.status {
            Stalled => Ok(()),
            status if status.is_terminal() => Err(illegal(tx, event.name())),
            _ => {
                stall(tx, reason.clone());
                Ok(())
            }
        },
        Event::ForceStop { reason } => match tx.status {
            Failed => Ok(()),
            Succeeded => Err(illegal(tx, event.name())),
            _ => {
                tx.status = Failed;
                tx.stalled_from = None;
                tx.reason = Some(reason.clone());
                Ok(())
            }
        },
    }
}

/// TCC: a commit needs every Try idem called to have succeeded. A refused Try means the
/// participant reserved nothing, so its Confirm would confirm nothing (or worse); a Try
/// whose answer is unknown or still in progress may yet reserve, so it is refused too:
/// the client calls the Try again (registering the branch again does) or aborts.
fn check_tries(tx: &Transaction) -> Result<(), CoreError> {
    let tries = || tx.branches_with(Action::Try);
    if let Some(failed) = tries().find(|b| b.status == BranchStatus::Failed) {
        return Err(CoreError::TryFailed(failed.key()));
    }
    if let Some(pending) = tries().find(|b| b.status != BranchStatus::Succeeded) {
        return Err(CoreError::TryNotSucceeded(pending.key()));
    }
    Ok(())
}

pub(super) fn start_abort(tx: &mut Transaction, reason: String) {
    tx.status = Status::Aborting;
    tx.reason.get_or_insert(reason);
}

pub(super) fn finish_failed(tx: &mut Transaction, reason: String) {
    tx.status = Status::Failed;
    tx.reason.get_or_insert(reason);
}

fn make_pending_due(tx: &mut Transaction, reset_attempts: bool) {
    for branch in &mut tx.branches {
        if branch.action == Action::Try {
            continue;
        }
        if reset_attempts && branch.status == BranchStatus::Stalled {
            branch.status = BranchStatus::Pending;
        }
        if branch.status == BranchStatus::Pending {
            branch.next_attempt_at = None;
            if reset_attempts {
                branch.attempts = 0;
                branch.in_progress_since = None;
            }
        }
    }
}

pub(super) fn stall(tx: &mut Transaction, error: String) {
    if tx.status != Status::Stalled {
        tx.stalled_from = Some(tx.status);
        tx.status = Status::Stalled;
    }
    tx.last_error = Some(error);
}

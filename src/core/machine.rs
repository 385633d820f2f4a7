//! The global-transaction state machine: `(state, event, now) -> (state, effects)`.
//!
//! Everything here is a pure function of its arguments. The engine feeds it events
//! (a client's submit, a participant's answer, a timer) and performs the effects it
//! returns, in order: persist the new state, then call branches, or sleep until a time.
//!
//! The transition table (kind, status, event -> status):
//!
//! | kind     | status     | event                         | next status                  |
//! |----------|------------|-------------------------------|------------------------------|
//! | tcc      | prepared   | submit (before the timeout)   | committing                   |
//! | tcc      | prepared   | abort, or wake after timeout  | aborting                     |
//! | msg      | prepared   | submit (before the timeout)   | committing                   |
//! | msg      | prepared   | abort                         | failed                       |
//! | msg      | prepared   | wake after timeout            | prepared (back-check called) |
//! | msg      | prepared   | back-check success / failure  | committing / failed          |
//! | saga     | running    | action failure or exhausted   | aborting                     |
//! | saga     | running    | wake after timeout            | aborting                     |
//! | saga     | running    | last action succeeded         | succeeded                    |
//! | tcc, msg | committing | last confirm/action succeeded  | succeeded                    |
//! | any      | aborting   | last cancel/compensation done | failed                       |
//! | any      | committing, aborting | must-succeed call exhausted | stalled              |
//! | any      | not final  | stall (progress cannot be stored) | stalled                  |
//! | any      | stalled    | retry                         | the status it stalled in     |
//! | any      | not final  | force-stop                    | failed                       |
//!
//! Repeats are harmless: submit of a committing/succeeded transaction, abort of an
//! aborting/failed one and a second answer for a branch that already has its final answer
//! change nothing. Anything else that the table does not list is an error.

use std::collections::BTreeSet;

use super::model::*;

/// A participant's answer to one call, as the transport classified it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
pub enum CallOutcome {
    /// 2xx: the step is done.
    Success,
    /// 409: a final business refusal.
    Failure(String),
    /// 425: the participant is still working on it; ask again later.
    InProgress(String),
    /// Anything else: other status, timeout, connection error. The step may or may not
    /// have happened; it is retried.
    Unknown(String),
}

impl CallOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            CallOutcome::Success => "success",
            CallOutcome::Failure(_) => "failure",
            CallOutcome::InProgress(_) => "in_progress",
            CallOutcome::Unknown(_) => "unknown",
        }
    }

    pub fn detail(&self) -> Option<&str> {
        match self {
            CallOutcome::Success => None,
            CallOutcome::Failure(d) | CallOutcome::InProgress(d) | CallOutcome::Unknown(d) => {
                Some(d)
            }
        }
    }
}

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

/// What the adapters must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Store the new state, conditionally on the previous status and the owner token,
    /// before performing any effect that follows. This is what makes a decision durable
    /// before the first Confirm or Cancel goes out.
    Persist,
    /// Call this branch operation now.
    Call(BranchKey),
    /// Nothing is due before this time.
    WakeAt(Millis),
    /// Nothing more will happen without an outside event: the transaction is terminal,
    /// stalled, or prepared without a timeout. Waiters can be told.
    Done(Status),
}

/// The inputs the core takes from outside besides the state and the event.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    pub now: Millis,
    /// A number in [0, 1) that spreads retries out; the adapter draws it at random, tests
    /// fix it.
    pub jitter: f64,
}

impl Ctx {
    pub fn at(now: Millis) -> Ctx {
        Ctx { now, jitter: 0.0 }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub tx: Transaction,
    pub effects: Vec<Effect>,
}

impl Transition {
    pub fn calls(&self) -> impl Iterator<Item = &BranchKey> {
        self.effects.iter().filter_map(|e| match e {
            Effect::Call(key) => Some(key),
            _ => None,
        })
    }

    pub fn persists(&self) -> bool {
        self.effects.contains(&Effect::Persist)
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
    let mut effects = plan(&next, ctx.now);
    next.next_attempt_at = next_attempt_at(&effects, tx.next_attempt_at, ctx.now);
    if next != *tx {
        next.updated_at = ctx.now;
        effects.insert(0, Effect::Persist);
    }
    Ok(Transition { tx: next, effects })
}

/// Result of a branch registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// These operations are new and must be stored.
    New(Vec<Branch>),
    /// Every operation is already registered with the same URL and payload.
    AlreadyRegistered,
}

/// Registers TCC branch operations (Confirm and Cancel, optionally Try) on a prepared
/// transaction. Registering the same operation again with the same URL and payload is a
/// harmless repeat; with a different URL or payload it is a conflict.
pub fn register(
    tx: &Transaction,
    branches: Vec<Branch>,
    _now: Millis,
) -> Result<Registration, CoreError> {
    if tx.kind != Kind::Tcc || tx.status != Status::Prepared {
        return Err(illegal(tx, "register a branch on"));
    }
    let mut new = Vec::new();
    for branch in branches {
        match tx.branch(&branch.key()) {
            Some(existing) if existing.url == branch.url && existing.payload == branch.payload => {}
            Some(_) => return Err(CoreError::BranchConflict(branch.key())),
            None => new.push(branch),
        }
    }
    Ok(if new.is_empty() {
        Registration::AlreadyRegistered
    } else {
        Registration::New(new)
    })
}

/// The delay before retry number `attempts` (1 = the first retry): doubled each time from
/// the base interval, capped, then spread over [delay/2, delay) by the jitter so that many
/// transactions failing together do not retry together.
pub fn retry_delay(options: &TxOptions, attempts: i32, jitter: f64) -> Millis {
    let base = options.retry_interval_ms.max(1);
    let exponent = attempts.saturating_sub(1).clamp(0, 32) as u32;
    let delay = base
        .saturating_mul(1u64 << exponent)
        .min(options.max_retry_interval_ms.max(base));
    let jitter = jitter.clamp(0.0, 1.0);
    let spread = (delay as f64 / 2.0) * jitter;
    (delay as f64 / 2.0 + spread).round().max(1.0) as Millis
}

fn illegal(tx: &Transaction, event: &'static str) -> CoreError {
    CoreError::IllegalTransition {
        kind: tx.kind,
        status: tx.status,
        event,
    }
}

fn timed_out(tx: &Transaction, now: Millis) -> bool {
    tx.timeout_at.is_some_and(|at| at <= now)
}

/// The status whose operations are under way: the stalled phase for a stalled
/// transaction, else its status.
fn phase_status(tx: &Transaction) -> Status {
    match tx.status {
        Status::Stalled => tx.stalled_from.unwrap_or(Status::Aborting),
        status => status,
    }
}

/// One event's change of state. Status changes that follow from the branches (a phase
/// finished, a step failed, a call stalled, a timeout passed) are left to [`settle`],
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

fn start_abort(tx: &mut Transaction, reason: String) {
    tx.status = Status::Aborting;
    tx.reason.get_or_insert(reason);
}

fn finish_failed(tx: &mut Transaction, reason: String) {
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

/// Whether a call of `action` can have been made while the transaction was in its
/// current phase (an answer to anything else is a caller's bug).
fn could_have_called(tx: &Transaction, action: Action) -> bool {
    use Status::*;
    let phase = phase_status(tx);
    match action {
        // Try is called on the caller's behalf and only recorded.
        Action::Try => true,
        Action::Confirm => phase == Committing,
        Action::Cancel | Action::Compensate => phase == Aborting,
        // A saga action may still answer after a sibling's failure started the abort.
        Action::Action => match tx.kind {
            Kind::Saga => matches!(phase, Running | Aborting),
            _ => phase == Committing,
        },
        Action::QueryPrepared => phase == Prepared,
    }
}

/// Records one answer on its branch operation. It never changes the transaction's
/// status (see [`step`]); it only counts, schedules the next attempt, or marks the
/// operation succeeded, failed or stalled.
fn record_outcome(
    tx: &mut Transaction,
    key: &BranchKey,
    outcome: &CallOutcome,
    ctx: Ctx,
) -> Result<(), CoreError> {
    let now = ctx.now;
    let Some(branch) = tx.branch(key) else {
        return Err(CoreError::UnknownBranch(key.clone()));
    };
    if branch.status != BranchStatus::Pending || tx.status.is_terminal() {
        // A repeated or late answer: the first final answer stands, a stalled operation
        // waits for the operator, and a finished transaction calls nothing more.
        return Ok(());
    }
    if !could_have_called(tx, key.action) {
        return Err(illegal(tx, "record an answer for"));
    }
    let kind = tx.kind;
    let options = tx.options.clone();
    // Try, saga action and msg back-check can fail for good; everything else must succeed.
    let failure_is_final = matches!(
        (kind, key.action),
        (_, Action::Try) | (Kind::Saga, Action::Action) | (_, Action::QueryPrepared)
    );
    let branch = tx.branch_mut(key).expect("checked above");
    branch.updated_at = now;
    let mut used_up = false;
    if let CallOutcome::InProgress(detail) = outcome {
        let since = *branch.in_progress_since.get_or_insert(now);
        let waited = now.saturating_sub(since);
        if waited < Millis::try_from(options.max_in_progress_ms).unwrap_or(Millis::MAX) {
            // Not counted against the attempt cap: the participant is working on it.
            // Asked again at the base interval, within the in-progress cap.
            branch.last_error = Some(format!("in progress: {detail}"));
            branch.next_attempt_at = Some(now.saturating_add(options.retry_interval_ms as Millis));
            tx.last_error = Some(format!("{key} in progress: {detail}"));
            return Ok(());
        }
        used_up = true;
    }
    branch.attempts += 1;

    let error = match outcome {
        CallOutcome::Success => {
            branch.status = BranchStatus::Succeeded;
            branch.finished_at = Some(now);
            branch.next_attempt_at = None;
            branch.in_progress_since = None;
            return Ok(());
        }
        CallOutcome::Failure(detail) if failure_is_final => {
            branch.status = BranchStatus::Failed;
            branch.finished_at = Some(now);
            branch.next_attempt_at = None;
            branch.in_progress_since = None;
            branch.last_error = Some(detail.clone());
            tx.attempts += 1;
            tx.last_error = Some(format!("{key} failed: {detail}"));
            return Ok(());
        }
        CallOutcome::InProgress(detail) => {
            let since = branch.in_progress_since.unwrap_or(now);
            let waited = now.saturating_sub(since);
            format!("still in progress after {waited} ms: {detail}")
        }
        CallOutcome::Failure(detail) => {
            // 409 from a call that must succeed: a participant bug or a transient
            // business state. Retried like any unknown result so that it ends in `stalled`.
            format!("refused a call that must succeed: {detail}")
        }
        CallOutcome::Unknown(detail) => detail.clone(),
    };

    // A retryable miss.
    branch.in_progress_since = None;
    branch.last_error = Some(error.clone());
    let attempts = branch.attempts;
    let exhausted = used_up || attempts >= options.max_attempts as i32;
    if !exhausted {
        branch.next_attempt_at =
            Some(now.saturating_add(retry_delay(&options, attempts, ctx.jitter)));
    } else {
        branch.next_attempt_at = None;
        match key.action {
            // The caller's Try stays pending: idem does not call it again by itself.
            Action::Try => {}
            // A saga action that never got a definite answer: give up on it and
            // compensate (its compensation is sent too, since it may have happened).
            Action::Action if kind == Kind::Saga => {
                branch.status = BranchStatus::Failed;
                branch.finished_at = Some(now);
                branch.last_error = Some(format!("exhausted {attempts} attempts: {error}"));
            }
            _ => branch.status = BranchStatus::Stalled,
        }
    }
    tx.attempts += 1;
    tx.last_error = Some(format!("{key}: {error}"));
    Ok(())
}

fn stall(tx: &mut Transaction, error: String) {
    if tx.status != Status::Stalled {
        tx.stalled_from = Some(tx.status);
        tx.status = Status::Stalled;
    }
    tx.last_error = Some(error);
}

/// Status changes that follow from the clock and the branches: timeouts, a failed saga
/// step or back-check, a stalled call, a finished phase, and skipping the compensations
/// of saga steps that were never sent. Everything here depends only on the stored state
/// the events were applied to (`before`) and the state they led to, not on the events'
/// order or grouping.
fn settle(tx: &mut Transaction, before: &Transaction, ctx: Ctx) {
    let now = ctx.now;
    if timed_out(tx, now) {
        match (tx.kind, tx.status) {
            (Kind::Tcc, Status::Prepared) => {
                start_abort(tx, "global timeout while prepared".into())
            }
            (Kind::Saga, Status::Running) => {
                start_abort(tx, "global timeout before every step succeeded".into())
            }
            // Without a back-check nobody can say whether the local transaction
            // committed; the message is not delivered.
            (Kind::Msg, Status::Prepared)
                if tx.branches_with(Action::QueryPrepared).next().is_none() =>
            {
                finish_failed(
                    tx,
                    "global timeout while prepared, and no query_prepared to ask whether \
                     the local transaction committed"
                        .into(),
                )
            }
            _ => {}
        }
    }
    match (tx.kind, tx.status) {
        (Kind::Saga, Status::Running) => {
            let failed = tx
                .branches_with(Action::Action)
                .find(|b| b.status == BranchStatus::Failed)
                .map(|b| {
                    format!(
                        "{} failed: {}",
                        b.key(),
                        b.last_error.as_deref().unwrap_or("")
                    )
                });
            if let Some(reason) = failed {
                start_abort(tx, reason);
            }
        }
        (Kind::Msg, Status::Prepared) => {
            let check = tx.branches_with(Action::QueryPrepared).next();
            match check.map(|b| (b.status, b.key(), b.last_error.clone())) {
                // The application's local transaction committed: deliver the message.
                Some((BranchStatus::Succeeded, _, _)) => tx.status = Status::Committing,
                Some((BranchStatus::Failed, key, error)) => {
                    finish_failed(tx, format!("{key} failed: {}", error.unwrap_or_default()))
                }
                _ => {}
            }
        }
        _ => {}
    }
    // Decided once, in the transition that starts the abort: later rounds only deliver.
    if (tx.kind, tx.status, before.status) == (Kind::Saga, Status::Aborting, Status::Running) {
        let sent = steps_possibly_sent(before, tx);
        for branch in &mut tx.branches {
            if branch.action == Action::Compensate
                && branch.status == BranchStatus::Pending
                && !sent.contains(&branch.seq)
            {
                branch.status = BranchStatus::Skipped;
                branch.updated_at = now;
            }
        }
    }
    // The operations that make up the current phase, and the status once all are done.
    // A stalled transaction keeps its phase: a late answer of a sibling is recorded, and
    // the stall's reason stays the first stalled operation's, in branch order.
    let phase = match (tx.kind, phase_status(tx)) {
        (Kind::Saga, Status::Running) => Some((Action::Action, Status::Succeeded)),
        (Kind::Saga, Status::Aborting) => Some((Action::Compensate, Status::Failed)),
        (Kind::Tcc, Status::Committing) => Some((Action::Confirm, Status::Succeeded)),
        (Kind::Tcc, Status::Aborting) => Some((Action::Cancel, Status::Failed)),
        (Kind::Msg, Status::Committing) => Some((Action::Action, Status::Succeeded)),
        (Kind::Msg, Status::Prepared) => Some((Action::QueryPrepared, Status::Prepared)),
        _ => None,
    };
    if let Some((action, next)) = phase {
        let stalled = tx
            .branches_with(action)
            .find(|b| b.status == BranchStatus::Stalled)
            .map(|b| {
                let error = b.last_error.as_deref().unwrap_or("");
                format!("{} exhausted {} attempts: {error}", b.key(), b.attempts)
            });
        if let Some(error) = stalled {
            stall(tx, error);
        } else if tx.status != Status::Stalled
            && next != tx.status
            && tx.branches_with(action).all(|b| b.status.is_done())
        {
            // A failed saga action has already turned the saga to aborting, so "done"
            // here means succeeded, or skipped for a compensation that is not needed.
            tx.status = next;
        }
    }
    if tx.status.is_terminal() {
        tx.finished_at.get_or_insert(now);
        tx.stalled_from = None;
    }
}

/// Saga steps whose action may have reached the participant, when the saga turns from
/// running to aborting: those with an answer, and those that were due in the stored state
/// the transition started from (every step they wait for had succeeded there). The engine
/// stores a state before it sends the calls it makes due, so a step that was not due in a
/// stored running state was never sent. These, and only these, are compensated.
fn steps_possibly_sent(before: &Transaction, after: &Transaction) -> BTreeSet<i32> {
    let succeeded_before = succeeded_steps(before);
    let answered: BTreeSet<i32> = after
        .branches_with(Action::Action)
        .filter(|b| b.status.is_done() || b.attempts > 0 || b.in_progress_since.is_some())
        .map(|b| b.seq)
        .collect();
    after
        .step_dependencies()
        .into_iter()
        .filter(|(seq, deps)| {
            answered.contains(seq) || deps.iter().all(|d| succeeded_before.contains(d))
        })
        .map(|(seq, _)| seq)
        .collect()
}

/// What is due now, or when to look again, for a settled state.
pub fn plan(tx: &Transaction, now: Millis) -> Vec<Effect> {
    use Status::*;
    let due: Vec<BranchKey> = match (tx.kind, tx.status) {
        (_, Succeeded | Failed | Stalled) => return vec![Effect::Done(tx.status)],
        (Kind::Msg, Prepared) if timed_out(tx, now) => tx
            .due(Action::QueryPrepared, now)
            .map(Branch::key)
            .collect(),
        (_, Prepared) => {
            return match tx.timeout_at {
                Some(at) => vec![Effect::WakeAt(at)],
                None => vec![Effect::Done(Prepared)],
            };
        }
        (Kind::Saga, Running) => {
            let succeeded = succeeded_steps(tx);
            let deps = tx.step_dependencies();
            tx.due(Action::Action, now)
                .filter(|b| {
                    deps.get(&b.seq)
                        .is_none_or(|d| d.iter().all(|s| succeeded.contains(s)))
                })
                .map(Branch::key)
                .collect()
        }
        (Kind::Saga, Aborting) => {
            let deps = tx.step_dependencies();
            let undone: BTreeSet<i32> = tx
                .branches_with(Action::Compensate)
                .filter(|b| !b.status.is_done())
                .map(|b| b.seq)
                .collect();
            // Reverse order: a step is compensated after every step that waited for it.
            tx.due(Action::Compensate, now)
                .filter(|b| {
                    !deps
                        .iter()
                        .any(|(later, d)| d.contains(&b.seq) && undone.contains(later))
                })
                .map(Branch::key)
                .collect()
        }
        (Kind::Tcc, Committing) => tx.due(Action::Confirm, now).map(Branch::key).collect(),
        (Kind::Tcc, Aborting) => tx.due(Action::Cancel, now).map(Branch::key).collect(),
        (Kind::Msg, Committing) => tx.due(Action::Action, now).map(Branch::key).collect(),
        (_, Running | Committing | Aborting) => Vec::new(),
    };
    if !due.is_empty() {
        return due.into_iter().map(Effect::Call).collect();
    }
    let waiting = tx
        .branches
        .iter()
        .filter(|b| b.status == BranchStatus::Pending && b.action != Action::Try)
        .filter_map(|b| b.next_attempt_at)
        .filter(|&at| at > now);
    let deadline = match tx.status {
        Running | Prepared => tx.timeout_at.filter(|&at| at > now),
        _ => None,
    };
    match waiting.chain(deadline).min() {
        Some(at) => vec![Effect::WakeAt(at)],
        // Nothing due and nothing scheduled cannot happen for a consistent state; waking
        // up soon again is the safe answer rather than sleeping forever.
        None => vec![Effect::WakeAt(now + tx.options.retry_interval_ms as Millis)],
    }
}

fn succeeded_steps(tx: &Transaction) -> BTreeSet<i32> {
    tx.branches_with(Action::Action)
        .filter(|b| b.status == BranchStatus::Succeeded)
        .map(|b| b.seq)
        .collect()
}

/// The time stored for the recovery scan. Calls due now keep an earlier due time if there
/// was one, so that repeating an event that changes nothing also stores nothing.
fn next_attempt_at(effects: &[Effect], before: Option<Millis>, now: Millis) -> Option<Millis> {
    effects.iter().find_map(|e| match e {
        Effect::Call(_) => Some(before.filter(|&at| at <= now).unwrap_or(now)),
        Effect::WakeAt(at) => Some(*at),
        _ => None,
    })
}

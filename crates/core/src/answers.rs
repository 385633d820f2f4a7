//! Participants' answers: how the transport's classification of a call is recorded on its
//! branch operation, and the backoff between attempts.

use super::machine::{CoreError, Ctx, illegal, phase_status};
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
/// status (see `step` in `machine.rs`); it only counts, schedules the next attempt, or marks the
/// operation succeeded, failed or stalled.
pub(super) fn record_outcome(
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
    // A Try is a client's request, one call each; every other call is idem's own doing,
    // which the call budget bounds.
    if key.action != Action::Try {
        tx.calls = tx.calls.saturating_add(1);
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

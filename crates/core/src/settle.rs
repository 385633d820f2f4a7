//! Settling a state after its events: the status changes that follow from the clock and
//! the branches, derived once per transition so that they do not depend on the order or
//! grouping of a round's answers.

use std::collections::BTreeSet;

use super::machine::{Ctx, finish_failed, phase_status, stall, start_abort, timed_out};
use super::model::*;
use super::plan::succeeded_steps;

/// Status changes that follow from the clock and the branches: timeouts, a failed saga
/// step or back-check, a stalled call, a finished phase, and skipping the compensations
/// of saga steps that were never sent. Everything here depends only on the stored state
/// the events were applied to (`before`) and the state they led to, not on the events'
/// order or grouping.
pub(super) fn settle(tx: &mut Transaction, before: &Transaction, ctx: Ctx) {
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

//! Planning: what a settled state makes due now, or when to look at it again.

use std::collections::BTreeSet;

use super::effects::Next;
use super::machine::timed_out;
use super::model::*;

/// What is due now, or when to look again, for a settled state.
pub fn plan(tx: &Transaction, now: Millis) -> Next {
    use Status::*;
    let due: Vec<BranchKey> = match (tx.kind, tx.status) {
        (_, Succeeded | Failed | Stalled) => return Next::Done(tx.status),
        (Kind::Msg, Prepared) if timed_out(tx, now) => tx
            .due(Action::QueryPrepared, now)
            .map(Branch::key)
            .collect(),
        (_, Prepared) => {
            return match tx.timeout_at {
                Some(at) => Next::WakeAt(at),
                None => Next::Done(Prepared),
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
        return Next::Call(due);
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
        Some(at) => Next::WakeAt(at),
        // Nothing due and nothing scheduled cannot happen for a consistent state; waking
        // up soon again is the safe answer rather than sleeping forever.
        None => Next::WakeAt(now + tx.options.retry_interval_ms as Millis),
    }
}

pub(super) fn succeeded_steps(tx: &Transaction) -> BTreeSet<i32> {
    tx.branches_with(Action::Action)
        .filter(|b| b.status == BranchStatus::Succeeded)
        .map(|b| b.seq)
        .collect()
}

/// The time stored for the recovery scan. Calls due now keep an earlier due time if there
/// was one, so that repeating an event that changes nothing also stores nothing.
pub(super) fn next_attempt_at(next: &Next, before: Option<Millis>, now: Millis) -> Option<Millis> {
    match next {
        Next::Call(_) => Some(before.filter(|&at| at <= now).unwrap_or(now)),
        Next::WakeAt(at) => Some(*at),
        Next::Done(_) => None,
    }
}

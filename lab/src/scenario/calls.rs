//! What the calls to participants must show, whatever happened to the database link: each
//! check is a pure function over what was recorded (the participants' record of calls and
//! answers, the coordinators' timeline, the coordinator processes' lifetimes).
//!
//! - a sequential saga's step k+1 never arrives before step k answered success;
//! - a coordinator process never calls again a step it saw succeed;
//! - no coordinator is fenced off, loses a lease or takes over while it runs alone;
//! - every action a participant executed in a failed saga was compensated;
//! - a transaction's history holds each failed call once.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{Order, branch_id};
use crate::faults::{Delivery, TimelineEvent};
use idem::core::{Kind, Millis, Status};

/// One coordinator process of a run: a restarted coordinator keeps its node name and gets
/// a new process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorProcess {
    pub node: String,
    pub pid: u32,
    pub started_at: Millis,
    /// When it was seen to exit; none while it ran at the end of the run.
    pub ended_at: Option<Millis>,
}

impl CoordinatorProcess {
    fn alive_during(&self, from: Millis, to: Millis) -> bool {
        self.started_at <= to && self.ended_at.is_none_or(|end| end >= from)
    }
}

/// Deliveries per (gid, branch id, op), in arrival order.
fn by_call(deliveries: &[Delivery]) -> HashMap<(&str, &str, &str), Vec<&Delivery>> {
    let mut out: HashMap<(&str, &str, &str), Vec<&Delivery>> = HashMap::new();
    for d in deliveries {
        let key = (
            d.call.gid.as_str(),
            d.call.branch_id.as_str(),
            d.call.op.as_str(),
        );
        out.entry(key).or_default().push(d);
    }
    for calls in out.values_mut() {
        calls.sort_by_key(|d| d.arrived);
    }
    out
}

/// Sagas run their steps one after the other: step k+1's action may reach its participant
/// only after step k's action answered success (the coordinator cannot know it succeeded
/// sooner). From the participants' record, so a coordinator that moved on without hearing
/// success is caught however it came to.
pub fn saga_order(orders: &[Order], deliveries: &[Delivery]) -> Vec<String> {
    let calls = by_call(deliveries);
    let mut v = Vec::new();
    for order in orders.iter().filter(|o| o.kind == Kind::Saga) {
        for k in 1..order.branches.len() {
            let (earlier, later) = (branch_id(k - 1), branch_id(k));
            let Some(first) = calls
                .get(&(order.gid.as_str(), later.as_str(), "action"))
                .and_then(|c| c.first())
            else {
                continue;
            };
            let success = calls
                .get(&(order.gid.as_str(), earlier.as_str(), "action"))
                .into_iter()
                .flatten()
                .filter(|d| d.answered_success())
                .min_by_key(|d| d.answered);
            match success {
                Some(s) if s.answered < first.arrived => {}
                Some(s) => v.push(format!(
                    "{}: step {later} was called (arrived at {}, #{}) before step {earlier} answered success (at #{}, HTTP {})",
                    order.gid, first.at, first.arrived, s.answered, s.status
                )),
                None => v.push(format!(
                    "{}: step {later} was called (arrived at {}, #{}) but step {earlier} never answered success",
                    order.gid, first.at, first.arrived
                )),
            }
        }
    }
    v
}

/// The operations whose success ends them: a coordinator that saw one succeed has no
/// reason to call it again.
fn ends_on_success(op: &str) -> bool {
    matches!(op, "action" | "compensate" | "confirm" | "cancel")
}

/// A coordinator process never calls again a branch operation it saw succeed: from the
/// coordinators' timeline (each call names its node and process), a call that started
/// after the same process's successful call of the same operation had ended.
pub fn recalled_after_success(timeline: &[TimelineEvent]) -> Vec<String> {
    type Key<'a> = (&'a str, u32, &'a str, &'a str, &'a str);
    let mut calls: BTreeMap<Key<'_>, Vec<(Millis, u64, u32, &str)>> = BTreeMap::new();
    for event in timeline {
        if let TimelineEvent::Call {
            at,
            gid,
            branch_id,
            op,
            attempt,
            outcome,
            duration_ms,
            node: Some(node),
            pid: Some(pid),
            ..
        } = event
            && ends_on_success(op)
        {
            let key = (
                node.as_str(),
                *pid,
                gid.as_str(),
                branch_id.as_str(),
                op.as_str(),
            );
            calls
                .entry(key)
                .or_default()
                .push((*at, *duration_ms, *attempt, outcome.as_str()));
        }
    }
    let mut v = Vec::new();
    for ((node, pid, gid, branch, op), mut list) in calls {
        list.sort_by_key(|c| c.0);
        let Some(&(at, duration, attempt, _)) = list.iter().find(|c| c.3 == "success") else {
            continue;
        };
        let ended = at + duration as Millis;
        let again: Vec<String> = list
            .iter()
            .filter(|c| c.0 > ended)
            .map(|c| format!("#{} at {} -> {}", c.2, c.0, c.3))
            .collect();
        if !again.is_empty() {
            v.push(format!(
                "{gid}: {branch}/{op} succeeded for {node} (pid {pid}, #{attempt} at {at}, answered by {ended}), which called it again: {}",
                again.join(", ")
            ));
        }
    }
    v
}

/// While a coordinator runs alone, nobody can take a transaction from it: a refused write
/// ("another coordinator owns this transaction now") or a lost lease in a process that no
/// other process ran beside since it started, or a takeover by the only process the run
/// ever had, is the process taking over from itself.
pub fn alone_yet_taken_over(
    timeline: &[TimelineEvent],
    processes: &[CoordinatorProcess],
) -> Vec<String> {
    let find = |node: &str, pid: u32| processes.iter().find(|p| p.node == node && p.pid == pid);
    let company = |me: &CoordinatorProcess, from: Millis, to: Millis| {
        processes
            .iter()
            .any(|p| p.pid != me.pid && p.alive_during(from, to))
    };
    let mut v = Vec::new();
    for event in timeline {
        let (what, at, gid, node, pid) = match event {
            TimelineEvent::Fenced {
                at,
                gid,
                node,
                pid: Some(pid),
            } => (
                "its write was refused: another coordinator owns it",
                at,
                gid,
                node,
                pid,
            ),
            TimelineEvent::LeaseLost { at, gid, node, pid } => {
                ("its driver found the lease taken", at, gid, node, pid)
            }
            TimelineEvent::Takeover {
                at, gid, node, pid, ..
            } => ("it took the transaction over", at, gid, node, pid),
            _ => continue,
        };
        let Some(me) = find(node, *pid) else {
            continue;
        };
        let alone = match event {
            // A predecessor that died holding transactions is taken over from, rightly.
            TimelineEvent::Takeover { .. } => !company(me, Millis::MIN, *at),
            _ => !company(me, me.started_at, *at),
        };
        if alone {
            v.push(format!(
                "{gid}: {what} at {at}, while {node} (pid {pid}) was the only coordinator running"
            ));
        }
    }
    v
}

/// A failed saga undoes what it did: every step whose action a participant executed
/// (its handler answered success, whether or not the answer got back) has a compensation
/// the participant executed too.
pub fn uncompensated(
    orders: &[Order],
    statuses: &BTreeMap<String, Status>,
    deliveries: &[Delivery],
) -> Vec<String> {
    let calls = by_call(deliveries);
    let mut v = Vec::new();
    for order in orders.iter().filter(|o| o.kind == Kind::Saga) {
        if statuses.get(&order.gid) != Some(&Status::Failed) {
            continue;
        }
        for k in 0..order.branches.len() {
            let id = branch_id(k);
            let of = |op| {
                calls
                    .get(&(order.gid.as_str(), id.as_str(), op))
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
            };
            let Some(done) = of("action").iter().find(|d| d.acted()) else {
                continue;
            };
            if !of("compensate").iter().any(|d| d.acted()) {
                let tried: Vec<String> = of("compensate")
                    .iter()
                    .map(|d| format!("HTTP {}", d.status))
                    .collect();
                v.push(format!(
                    "{}: failed, but step {id}'s action was executed (handler answered {} at {}) and never compensated (compensations: {})",
                    order.gid,
                    done.handled.unwrap_or_default(),
                    done.at,
                    if tried.is_empty() { "none".to_owned() } else { tried.join(", ") }
                ));
            }
        }
    }
    v
}

/// One failed call as a transaction's history shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    pub branch_id: String,
    pub action: String,
    pub attempt: i32,
    pub started_at: Millis,
}

/// A call is stored once: two history entries of one operation with the same attempt
/// number and start time are one call written twice (an operator's retry restarts the
/// attempt numbers, at another time).
pub fn history_repeats(gid: &str, history: &[HistoryEntry]) -> Vec<String> {
    let mut seen: BTreeMap<(&str, &str, i32, Millis), usize> = BTreeMap::new();
    for h in history {
        *seen
            .entry((&h.branch_id, &h.action, h.attempt, h.started_at))
            .or_default() += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((branch, action, attempt, at), n)| {
            format!("{gid}: the failed call {branch}/{action} #{attempt} started at {at} is in its history {n} times")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::CallKey;
    use crate::scenario::{OrderBranch, Participant};

    fn saga(gid: &str, steps: usize) -> Order {
        Order {
            gid: gid.into(),
            kind: Kind::Saga,
            branches: (0..steps)
                .map(|_| OrderBranch {
                    participant: Participant::Inventory,
                    payload: serde_json::json!({}),
                })
                .collect(),
            abort: false,
            late_try: false,
            retry_if_stalled: false,
            options: None,
        }
    }

    /// A delivery of `gid`'s step `k` op, arriving and answered at those sequence numbers.
    fn delivery(
        gid: &str,
        k: usize,
        op: &str,
        arrived: u64,
        answered: u64,
        status: u16,
    ) -> Delivery {
        Delivery {
            call: CallKey {
                gid: gid.into(),
                branch_id: branch_id(k),
                op: op.into(),
                attempt: 1,
            },
            status,
            handled: Some(status),
            arrived,
            answered,
            at: arrived as Millis * 10,
            ..Delivery::default()
        }
    }

    #[test]
    fn a_step_called_before_the_previous_one_succeeded_is_caught() {
        let orders = vec![saga("in-order", 3), saga("early", 2), saga("never", 2)];
        let deliveries = vec![
            // 500 once, then success, then the next step: fine.
            delivery("in-order", 0, "action", 1, 2, 500),
            delivery("in-order", 0, "action", 3, 4, 200),
            delivery("in-order", 1, "action", 5, 6, 200),
            delivery("in-order", 2, "action", 7, 8, 200),
            // Step 02 arrives while step 01's successful call is still being answered.
            delivery("early", 0, "action", 10, 13, 200),
            delivery("early", 1, "action", 12, 14, 200),
            // Step 01 only ever answered 500.
            delivery("never", 0, "action", 20, 21, 500),
            delivery("never", 1, "action", 22, 23, 200),
        ];
        let v = saga_order(&orders, &deliveries);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].starts_with("early: step 02 was called (arrived at 120, #12) before step 01 answered success (at #13"), "{}", v[0]);
        assert!(
            v[1].contains("never: step 02 was called") && v[1].contains("never answered success")
        );
    }

    fn call(node: &str, pid: u32, at: Millis, attempt: u32, outcome: &str) -> TimelineEvent {
        TimelineEvent::Call {
            at,
            gid: "g".into(),
            branch_id: "02".into(),
            op: "action".into(),
            attempt,
            outcome: outcome.into(),
            detail: None,
            fault: None,
            duration_ms: 10,
            node: Some(node.into()),
            pid: Some(pid),
        }
    }

    #[test]
    fn a_success_called_again_by_the_same_process_is_caught() {
        // Retried until success; then another process (after a restart, or a peer) calls
        // it again: both fine.
        let fine = vec![
            call("c0", 1, 0, 1, "unknown"),
            call("c0", 1, 50, 2, "success"),
            call("c0", 2, 500, 2, "success"),
            call("c1", 3, 600, 3, "success"),
        ];
        assert!(recalled_after_success(&fine).is_empty());
        // The same process again, well after its success had come back.
        let mut again = fine.clone();
        again.push(call("c0", 1, 900, 3, "success"));
        let v = recalled_after_success(&again);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("g: 02/action succeeded for c0 (pid 1, #2 at 50, answered by 60), which called it again: #3 at 900 -> success"), "{}", v[0]);
    }

    fn process(
        node: &str,
        pid: u32,
        started_at: Millis,
        ended_at: Option<Millis>,
    ) -> CoordinatorProcess {
        CoordinatorProcess {
            node: node.into(),
            pid,
            started_at,
            ended_at,
        }
    }

    #[test]
    fn a_coordinator_alone_that_is_fenced_or_takes_over_is_caught() {
        let fenced = |at, pid| TimelineEvent::Fenced {
            at,
            gid: "g".into(),
            node: "c0".into(),
            pid: Some(pid),
        };
        let takeover = |at, pid| TimelineEvent::Takeover {
            at,
            gid: "h".into(),
            node: "c0".into(),
            pid,
            previous_owner: Some("c0:1234abcd:x".into()),
        };
        let lost = TimelineEvent::LeaseLost {
            at: 300,
            gid: "k".into(),
            node: "c0".into(),
            pid: 1,
        };
        // One process, never a peer: everything is a violation.
        let alone = [process("c0", 1, 0, None)];
        let v = alone_yet_taken_over(&[fenced(100, 1), takeover(200, 1), lost.clone()], &alone);
        assert_eq!(v.len(), 3, "{v:?}");
        assert!(
            v[0].contains("g: its write was refused")
                && v[0].contains("c0 (pid 1) was the only coordinator running")
        );
        assert!(v[1].starts_with("h: it took the transaction over at 200"));
        assert!(v[2].starts_with("k: its driver found the lease taken"));
        // A restarted process takes over from its dead predecessor: fine. Being fenced
        // off is not (the predecessor was gone before it started).
        let restarted = [process("c0", 1, 0, Some(50)), process("c0", 2, 60, None)];
        let v = alone_yet_taken_over(&[takeover(200, 2), fenced(300, 2)], &restarted);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].starts_with("g: its write was refused: another coordinator owns it at 300"));
        // With a peer running, both can happen.
        let peers = [process("c0", 1, 0, None), process("c1", 7, 0, None)];
        assert!(alone_yet_taken_over(&[fenced(100, 1), takeover(200, 1), lost], &peers).is_empty());
    }

    #[test]
    fn an_executed_action_of_a_failed_saga_must_be_compensated() {
        let orders = vec![saga("undone", 2), saga("left", 2), saga("ok", 1)];
        let statuses = BTreeMap::from([
            ("undone".to_owned(), Status::Failed),
            ("left".to_owned(), Status::Failed),
            ("ok".to_owned(), Status::Succeeded),
        ]);
        let mut lost_answer = delivery("left", 1, "action", 7, 8, 502);
        lost_answer.handled = Some(200);
        let deliveries = vec![
            delivery("undone", 0, "action", 1, 2, 200),
            delivery("undone", 1, "action", 3, 4, 409),
            delivery("undone", 0, "compensate", 5, 6, 200),
            // Step 02 executed (its answer lost on the way), then never undone; step 01's
            // compensation only ever answered 503.
            delivery("left", 0, "action", 1, 2, 200),
            lost_answer,
            delivery("left", 0, "compensate", 9, 10, 503),
            delivery("ok", 0, "action", 1, 2, 200),
        ];
        let v = uncompensated(&orders, &statuses, &deliveries);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v[0].contains("left: failed, but step 01's action was executed")
                && v[0].contains("(compensations: HTTP 503)")
        );
        assert!(v[1].contains("step 02's action was executed (handler answered 200 at 70) and never compensated (compensations: none)"));
    }

    #[test]
    fn a_failed_call_stored_twice_is_caught() {
        let entry = |attempt, started_at| HistoryEntry {
            branch_id: "03".into(),
            action: "action".into(),
            attempt,
            started_at,
        };
        // After an operator's retry, attempt 1 again, at another time: fine.
        assert!(history_repeats("g", &[entry(1, 100), entry(2, 200), entry(1, 900)]).is_empty());
        let v = history_repeats("g", &[entry(1, 100), entry(1, 100), entry(1, 100)]);
        assert_eq!(
            v,
            ["g: the failed call 03/action #1 started at 100 is in its history 3 times"]
        );
    }
}

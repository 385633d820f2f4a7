//! The call budget (`Ctx::max_calls`): every call idem makes by itself counts, a round
//! that would pass the budget is not sent and the transaction stalls instead, and an
//! operator's retry gives it a new budget.

use super::*;

fn with_budget(tx: &Transaction, events: &[Event], now: Millis, max_calls: u64) -> Transition {
    let ctx = Ctx {
        max_calls,
        ..Ctx::at(now)
    };
    apply_all(tx, events, ctx).expect("legal transition")
}

fn miss(branch_id: &str, action: Action) -> Event {
    outcome(branch_id, action, CallOutcome::Unknown("HTTP 500".into()))
}

#[test]
fn every_answer_but_a_tries_counts_as_a_call() {
    let mut tx = tcc(&["a", "b"]);
    tx.branches
        .push(Branch::new("a", Action::Try, 0, "http://p/a/try", "{}", T0));
    tx.sort_branches();
    // A Try is the client's own request: not counted.
    let t = run(&tx, &[ok("a", Action::Try)], T0);
    assert_eq!(t.tx.calls, 0);
    let t = run(&t.tx, &[Event::Submit], T0);
    let t = run(
        &t.tx,
        &[ok("a", Action::Confirm), miss("b", Action::Confirm)],
        T0 + 1,
    );
    assert_eq!(t.tx.calls, 2);
    // In progress counts too: each one was a call.
    let t = run(
        &t.tx,
        &[outcome(
            "b",
            Action::Confirm,
            CallOutcome::InProgress("busy".into()),
        )],
        T0 + 1_000,
    );
    assert_eq!(t.tx.calls, 3);
}

#[test]
fn a_saga_that_keeps_failing_stalls_when_its_budget_is_spent() {
    let mut tx = saga(1);
    tx.options.max_attempts = 1_000;
    let mut now = T0;
    let mut t = with_budget(&tx, &[Event::Wake], now, 3);
    assert_eq!(calls(&t), ["01/action"]);
    for made in 1..=3 {
        now += 10_000;
        t = with_budget(&t.tx, &[miss("01", Action::Action)], now, 3);
        assert_eq!(t.tx.calls, made);
        if made < 3 {
            // Backing off: woken, the step is called again.
            assert_eq!(t.tx.status, Status::Running);
            t = with_budget(&t.tx, &[Event::Wake], now + 10_000, 3);
            assert_eq!(calls(&t), ["01/action"], "after {made} calls");
        }
    }
    // The third call spent the budget: waking finds a due call it may not make.
    let t = with_budget(&t.tx, &[Event::Wake], now + 10_000, 3);
    assert_eq!(t.tx.status, Status::Stalled);
    assert_eq!(t.tx.stalled_from, Some(Status::Running));
    assert!(t.persist);
    assert_eq!(t.next, Next::Done(Status::Stalled));
    assert_eq!(t.tx.next_attempt_at, None);
    let error = t.tx.last_error.as_deref().unwrap();
    assert!(error.contains("budget of 3 calls"), "{error}");

    // The operator's retry resumes it with a new budget.
    let resumed = with_budget(&t.tx, &[Event::Retry], now + 20_000, 3);
    assert_eq!(resumed.tx.status, Status::Running);
    assert_eq!(resumed.tx.calls, 0);
    assert_eq!(calls(&resumed), ["01/action"]);
}

#[test]
fn a_round_that_would_pass_the_budget_is_not_sent_at_all() {
    // Two Confirms due at once, one call left: neither goes out.
    let tx = run(&tcc(&["a", "b"]), &[Event::Submit], T0).tx;
    let mut spent = tx.clone();
    spent.calls = 9;
    let t = with_budget(&spent, &[Event::Wake], T0, 10);
    assert_eq!(t.tx.status, Status::Stalled);
    assert_eq!(t.tx.stalled_from, Some(Status::Committing));
    assert!(calls(&t).is_empty());
    // Room for the whole round: sent.
    let t = with_budget(&spent, &[Event::Wake], T0, 11);
    assert_eq!(calls(&t), ["a/confirm", "b/confirm"]);
    assert_eq!(t.tx.status, Status::Committing);
}

#[test]
fn a_transaction_that_needs_no_call_is_never_stalled_by_the_budget() {
    let mut tx = tcc(&["a"]);
    tx.calls = 50;
    // Prepared: waiting for the client, nothing to call.
    let t = with_budget(&tx, &[Event::Wake], T0, 1);
    assert_eq!(t.tx.status, Status::Prepared);
    // The last answer ends it: no further round, so no stall.
    let committing = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let t = with_budget(&committing, &[ok("a", Action::Confirm)], T0, 1);
    assert_eq!(t.tx.status, Status::Succeeded);
    assert_eq!(t.tx.calls, 1);
}

//! Sagas: steps in order and by their orders, failures and timeouts compensated in
//! reverse, compensations that keep failing.

use super::*;

#[test]
fn saga_runs_steps_in_order_and_succeeds() {
    let tx = saga(3);
    assert_eq!(tx.status, Status::Running);
    let t = run(&tx, &[Event::Wake], T0);
    assert_eq!(calls(&t), ["01/action"]);
    let t = run(&t.tx, &[ok("01", Action::Action)], T0 + 1);
    assert_eq!(calls(&t), ["02/action"]);
    let t = run(&t.tx, &[ok("02", Action::Action)], T0 + 2);
    assert_eq!(calls(&t), ["03/action"]);
    let t = run(&t.tx, &[ok("03", Action::Action)], T0 + 3);
    assert_eq!(t.tx.status, Status::Succeeded);
    assert!(
        t.tx.branches_with(Action::Compensate)
            .all(|b| b.status == BranchStatus::Pending),
        "compensations of a successful saga are never sent"
    );
}

#[test]
fn saga_failure_compensates_the_failed_step_and_earlier_ones_in_reverse() {
    let tx = saga(4);
    let t = run(&tx, &[ok("01", Action::Action)], T0);
    let t = run(&t.tx, &[ok("02", Action::Action)], T0 + 1);
    let t = run(
        &t.tx,
        &[outcome(
            "03",
            Action::Action,
            CallOutcome::Failure("out of stock".into()),
        )],
        T0 + 2,
    );
    assert_eq!(t.tx.status, Status::Aborting);
    assert!(t.persist);
    assert!(t.tx.reason.as_deref().unwrap().contains("03/action failed"));
    // Step 4 never ran: its compensation is skipped.
    assert_eq!(
        t.tx.branch(&key("04", Action::Compensate)).unwrap().status,
        BranchStatus::Skipped
    );
    assert_eq!(calls(&t), ["03/compensate"]);
    let t = run(&t.tx, &[ok("03", Action::Compensate)], T0 + 3);
    assert_eq!(calls(&t), ["02/compensate"]);
    let t = run(&t.tx, &[ok("02", Action::Compensate)], T0 + 4);
    assert_eq!(calls(&t), ["01/compensate"]);
    let t = run(&t.tx, &[ok("01", Action::Compensate)], T0 + 5);
    assert_eq!(t.tx.status, Status::Failed);
}

#[test]
fn saga_action_that_exhausts_attempts_is_compensated_too() {
    let tx = saga(2);
    let unknown = || outcome("01", Action::Action, CallOutcome::Unknown("timeout".into()));
    let t = run(&tx, &[unknown()], T0);
    let t = run(&t.tx, &[unknown()], T0 + 1_000);
    assert_eq!(t.tx.status, Status::Running);
    let t = run(&t.tx, &[unknown()], T0 + 2_000);
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(calls(&t), ["01/compensate"], "it may have happened");
    assert_eq!(
        t.tx.branch(&key("02", Action::Compensate)).unwrap().status,
        BranchStatus::Skipped
    );
}

#[test]
fn compensation_is_retried_then_stalls_and_never_gives_up_silently() {
    let tx = saga(1);
    let t = run(
        &tx,
        &[outcome(
            "01",
            Action::Action,
            CallOutcome::Failure("no".into()),
        )],
        T0,
    );
    let bad = || outcome("01", Action::Compensate, CallOutcome::Unknown("500".into()));
    let t = run(&t.tx, &[bad()], T0 + 1);
    let t = run(&t.tx, &[bad()], T0 + 2);
    assert_eq!(t.tx.status, Status::Aborting);
    let t = run(&t.tx, &[bad()], T0 + 3);
    assert_eq!(t.tx.status, Status::Stalled);
    assert_eq!(t.tx.stalled_from, Some(Status::Aborting));
    let t = run(&t.tx, &[Event::Retry], T0 + 4);
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(calls(&t), ["01/compensate"]);
}

#[test]
fn saga_timeout_aborts_and_compensates_what_may_have_run() {
    let mut options = opts();
    options.timeout_ms = Some(1_000);
    let tx = saga_with(options, 3);
    let t = run(&tx, &[ok("01", Action::Action)], T0 + 10);
    // Step 02 is due but stuck; the deadline passes.
    let t = run(&t.tx, &[Event::Wake], T0 + 1_000);
    assert_eq!(t.tx.status, Status::Aborting);
    // 02 may have been sent (its dependency had succeeded); 03 was not.
    assert_eq!(calls(&t), ["02/compensate"]);
    assert_eq!(
        t.tx.branch(&key("03", Action::Compensate)).unwrap().status,
        BranchStatus::Skipped
    );
}

#[test]
fn concurrent_saga_follows_orders_forward_and_backward() {
    // 0 and 1 run together; 2 waits for both.
    let mut options = opts();
    options.concurrent = true;
    options.orders.insert(2, vec![0, 1]);
    let tx = saga_with(options, 3);
    let t = run(&tx, &[Event::Wake], T0);
    assert_eq!(calls(&t), ["01/action", "02/action"]);
    let t = run(
        &t.tx,
        &[ok("01", Action::Action), ok("02", Action::Action)],
        T0 + 1,
    );
    assert_eq!(calls(&t), ["03/action"]);
    let t = run(
        &t.tx,
        &[outcome(
            "03",
            Action::Action,
            CallOutcome::Failure("x".into()),
        )],
        T0 + 2,
    );
    assert_eq!(
        calls(&t),
        ["03/compensate"],
        "the later step is undone first"
    );
    let t = run(&t.tx, &[ok("03", Action::Compensate)], T0 + 3);
    assert_eq!(calls(&t), ["01/compensate", "02/compensate"]);
}

#[test]
fn concurrent_saga_records_a_sibling_success_that_arrives_after_the_failure() {
    let mut options = opts();
    options.concurrent = true;
    let tx = saga_with(options, 2);
    let t = run(
        &tx,
        &[
            outcome("01", Action::Action, CallOutcome::Failure("x".into())),
            ok("02", Action::Action),
        ],
        T0,
    );
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(
        t.tx.branch(&key("02", Action::Action)).unwrap().status,
        BranchStatus::Succeeded
    );
    assert_eq!(calls(&t), ["01/compensate", "02/compensate"]);
}

#[test]
fn saga_cannot_be_aborted_by_the_client() {
    assert!(matches!(
        apply(&saga(1), &Event::Abort { reason: "x".into() }, Ctx::at(T0)),
        Err(CoreError::IllegalTransition { .. })
    ));
    // Submit of a saga is a repeat of its creation.
    assert!(!run(&saga(1), &[Event::Submit], T0).persist);
}

//! Transition tests: every row of the table in `machine.rs`, plus repeats and
//! out-of-order events.

use super::*;

const T0: Millis = 1_000_000;

fn opts() -> TxOptions {
    TxOptions {
        retry_interval_ms: 100,
        max_retry_interval_ms: 1_000,
        max_attempts: 3,
        ..TxOptions::default()
    }
}

fn key(branch_id: &str, action: Action) -> BranchKey {
    BranchKey {
        branch_id: branch_id.into(),
        action,
    }
}

fn tcc(branches: &[&str]) -> Transaction {
    let mut tx = Transaction::prepared("g1", Kind::Tcc, opts(), T0);
    for (i, id) in branches.iter().enumerate() {
        let seq = i as i32;
        let new = vec![
            Branch::new(
                *id,
                Action::Confirm,
                seq,
                format!("http://p/{id}/confirm"),
                "{}",
                T0,
            ),
            Branch::new(
                *id,
                Action::Cancel,
                seq,
                format!("http://p/{id}/cancel"),
                "{}",
                T0,
            ),
        ];
        match register(&tx, new, T0).unwrap() {
            Registration::New(b) => tx.add_branches(b),
            Registration::AlreadyRegistered => unreachable!(),
        }
    }
    tx
}

fn saga(n: usize) -> Transaction {
    let steps = (0..n)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/action"),
            compensate: format!("http://p/{i}/compensate"),
            payload: format!("{{\"step\":{i}}}"),
        })
        .collect();
    Transaction::saga("s1", steps, opts(), T0)
}

fn outcome(branch_id: &str, action: Action, outcome: CallOutcome) -> Event {
    Event::Outcome {
        key: key(branch_id, action),
        outcome,
    }
}

fn ok(branch_id: &str, action: Action) -> Event {
    outcome(branch_id, action, CallOutcome::Success)
}

fn calls(t: &Transition) -> Vec<String> {
    t.calls().iter().map(|k| k.to_string()).collect()
}

/// Whether `t` stores its state, and what follows.
fn effects(t: &Transition) -> (bool, Next) {
    (t.persist, t.next.clone())
}

fn run(tx: &Transaction, events: &[Event], now: Millis) -> Transition {
    apply_all(tx, events, Ctx::at(now)).expect("legal transition")
}

// ---- TCC -------------------------------------------------------------------------------

#[test]
fn tcc_submit_persists_the_decision_before_any_confirm() {
    let tx = tcc(&["a", "b"]);
    let t = run(&tx, &[Event::Submit], T0 + 1);
    assert_eq!(t.tx.status, Status::Committing);
    assert!(t.persist);
    assert_eq!(calls(&t), ["a/confirm", "b/confirm"]);
    assert_eq!(t.tx.next_attempt_at, Some(T0 + 1));
}

#[test]
fn tcc_all_confirms_done_succeeds() {
    let tx = run(&tcc(&["a", "b"]), &[Event::Submit], T0).tx;
    let t = run(&tx, &[ok("a", Action::Confirm)], T0 + 5);
    assert_eq!(t.tx.status, Status::Committing);
    // The core does not track calls in flight: the engine applies a whole round's answers
    // together, so a partial round plans the missing confirm again.
    assert_eq!(calls(&t), ["b/confirm"]);
    let t = run(&t.tx, &[ok("b", Action::Confirm)], T0 + 6);
    assert_eq!(t.tx.status, Status::Succeeded);
    assert_eq!(t.tx.finished_at, Some(T0 + 6));
    assert_eq!(effects(&t), (true, Next::Done(Status::Succeeded)));
    assert_eq!(t.tx.next_attempt_at, None);
}

#[test]
fn tcc_abort_cancels_every_registered_branch() {
    let tx = tcc(&["a", "b", "c"]);
    let t = run(
        &tx,
        &[Event::Abort {
            reason: "client".into(),
        }],
        T0 + 1,
    );
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(t.tx.reason.as_deref(), Some("client"));
    assert!(t.persist);
    assert_eq!(calls(&t), ["a/cancel", "b/cancel", "c/cancel"]);
    let t = run(
        &t.tx,
        &[
            ok("a", Action::Cancel),
            ok("b", Action::Cancel),
            ok("c", Action::Cancel),
        ],
        T0 + 2,
    );
    assert_eq!(t.tx.status, Status::Failed);
}

#[test]
fn tcc_timeout_while_prepared_aborts() {
    let mut options = opts();
    options.timeout_ms = Some(500);
    let mut tx = Transaction::prepared("g", Kind::Tcc, options, T0);
    tx.branches
        .push(Branch::new("a", Action::Cancel, 0, "http://p/c", "", T0));
    tx.branches
        .push(Branch::new("a", Action::Confirm, 0, "http://p/f", "", T0));
    assert_eq!(tx.next_attempt_at, Some(T0 + 500));

    let early = run(&tx, &[Event::Wake], T0 + 499);
    assert_eq!(early.tx.status, Status::Prepared);
    assert_eq!(effects(&early), (false, Next::WakeAt(T0 + 500)));

    let t = run(&tx, &[Event::Wake], T0 + 500);
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(calls(&t), ["a/cancel"]);
    assert!(t.tx.reason.unwrap().contains("timeout"));
}

#[test]
fn tcc_submit_after_the_timeout_is_refused() {
    let mut options = opts();
    options.timeout_ms = Some(500);
    let tx = Transaction::prepared("g", Kind::Tcc, options, T0);
    assert_eq!(
        apply(&tx, &Event::Submit, Ctx::at(T0 + 500)),
        Err(CoreError::TimedOut)
    );
}

#[test]
fn tcc_repeated_submit_and_abort_are_harmless() {
    let committing = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let again = run(&committing, &[Event::Submit], T0 + 1);
    assert!(!again.persist);
    assert_eq!(again.tx.status, Status::Committing);

    let aborting = run(&tcc(&["a"]), &[Event::Abort { reason: "x".into() }], T0).tx;
    let again = run(&aborting, &[Event::Abort { reason: "y".into() }], T0 + 1);
    assert_eq!(again.tx.status, Status::Aborting);
    assert_eq!(
        again.tx.reason.as_deref(),
        Some("x"),
        "the first reason stays"
    );
}

#[test]
fn tcc_submit_after_abort_and_abort_after_submit_are_errors() {
    let aborting = run(&tcc(&["a"]), &[Event::Abort { reason: "x".into() }], T0).tx;
    assert!(matches!(
        apply(&aborting, &Event::Submit, Ctx::at(T0)),
        Err(CoreError::IllegalTransition {
            status: Status::Aborting,
            ..
        })
    ));
    let committing = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    assert!(matches!(
        apply(
            &committing,
            &Event::Abort { reason: "x".into() },
            Ctx::at(T0)
        ),
        Err(CoreError::IllegalTransition {
            status: Status::Committing,
            ..
        })
    ));
}

#[test]
fn tcc_submit_with_no_branches_succeeds_at_once() {
    let tx = Transaction::prepared("g", Kind::Tcc, opts(), T0);
    let t = run(&tx, &[Event::Submit], T0);
    assert_eq!(t.tx.status, Status::Succeeded);
    assert_eq!(t.next, Next::Done(Status::Succeeded));
}

#[test]
fn register_is_idempotent_and_detects_conflicts() {
    let tx = tcc(&["a"]);
    let same = vec![Branch::new(
        "a",
        Action::Confirm,
        0,
        "http://p/a/confirm",
        "{}",
        T0,
    )];
    assert_eq!(register(&tx, same, T0), Ok(Registration::AlreadyRegistered));
    let changed = vec![Branch::new(
        "a",
        Action::Confirm,
        0,
        "http://p/a/confirm",
        "{\"n\":2}",
        T0,
    )];
    assert_eq!(
        register(&tx, changed, T0),
        Err(CoreError::BranchConflict(key("a", Action::Confirm)))
    );
    let committing = run(&tx, &[Event::Submit], T0).tx;
    let late = vec![Branch::new("b", Action::Confirm, 1, "http://p/b", "", T0)];
    assert!(matches!(
        register(&committing, late, T0),
        Err(CoreError::IllegalTransition { .. })
    ));
    let saga = saga(1);
    assert!(register(&saga, vec![], T0).is_err());
}

#[test]
fn confirm_unknown_result_is_retried_with_backoff_then_stalls() {
    let tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let fail = || {
        outcome(
            "a",
            Action::Confirm,
            CallOutcome::Unknown("HTTP 500".into()),
        )
    };

    let t1 = run(&tx, &[fail()], T0 + 10);
    assert_eq!(t1.tx.status, Status::Committing);
    let b = t1.tx.branch(&key("a", Action::Confirm)).unwrap();
    assert_eq!(b.attempts, 1);
    // First retry: base 100 ms, jitter 0 -> half of it.
    assert_eq!(b.next_attempt_at, Some(T0 + 10 + 50));
    assert_eq!(effects(&t1), (true, Next::WakeAt(T0 + 60)));
    assert_eq!(t1.tx.next_attempt_at, Some(T0 + 60));

    // Not due yet: waking early calls nothing.
    assert!(calls(&run(&t1.tx, &[Event::Wake], T0 + 59)).is_empty());
    assert_eq!(calls(&run(&t1.tx, &[Event::Wake], T0 + 60)), ["a/confirm"]);

    let t2 = run(&t1.tx, &[fail()], T0 + 100);
    assert_eq!(
        t2.tx
            .branch(&key("a", Action::Confirm))
            .unwrap()
            .next_attempt_at,
        Some(T0 + 100 + 100)
    );
    let t3 = run(&t2.tx, &[fail()], T0 + 300);
    assert_eq!(t3.tx.status, Status::Stalled);
    assert_eq!(t3.tx.stalled_from, Some(Status::Committing));
    assert_eq!(t3.tx.attempts, 3);
    assert!(
        t3.tx
            .last_error
            .as_deref()
            .unwrap()
            .contains("exhausted 3 attempts")
    );
    assert_eq!(effects(&t3), (true, Next::Done(Status::Stalled)));
    assert_eq!(t3.tx.next_attempt_at, None);

    // Stalled: nothing is called, whatever wakes it.
    assert!(calls(&run(&t3.tx, &[Event::Wake], T0 + 10_000)).is_empty());

    // Retry resumes the phase with fresh attempts.
    let resumed = run(&t3.tx, &[Event::Retry], T0 + 20_000);
    assert_eq!(resumed.tx.status, Status::Committing);
    assert_eq!(resumed.tx.stalled_from, None);
    assert_eq!(calls(&resumed), ["a/confirm"]);
    assert_eq!(
        resumed
            .tx
            .branch(&key("a", Action::Confirm))
            .unwrap()
            .attempts,
        0
    );
    let done = run(&resumed.tx, &[ok("a", Action::Confirm)], T0 + 20_001);
    assert_eq!(done.tx.status, Status::Succeeded);
}

#[test]
fn a_409_from_confirm_is_retried_not_final() {
    let tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let t = run(
        &tx,
        &[outcome(
            "a",
            Action::Confirm,
            CallOutcome::Failure("no".into()),
        )],
        T0,
    );
    assert_eq!(t.tx.status, Status::Committing);
    let b = t.tx.branch(&key("a", Action::Confirm)).unwrap();
    assert_eq!(b.status, BranchStatus::Pending);
    assert!(b.last_error.as_deref().unwrap().contains("must succeed"));
}

#[test]
fn in_progress_is_asked_again_at_the_base_interval_without_using_up_attempts() {
    let tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let mut t = run(&tx, &[], T0);
    for i in 0..10 {
        let now = T0 + i * 100;
        t = run(
            &t.tx,
            &[outcome(
                "a",
                Action::Confirm,
                CallOutcome::InProgress("busy".into()),
            )],
            now,
        );
        assert_eq!(
            t.tx.branch(&key("a", Action::Confirm))
                .unwrap()
                .next_attempt_at,
            Some(now + 100)
        );
    }
    assert_eq!(t.tx.status, Status::Committing);
    assert_eq!(t.tx.attempts, 0);
}

#[test]
fn repeated_and_late_answers_change_nothing() {
    let tx = run(&tcc(&["a", "b"]), &[Event::Submit], T0).tx;
    let once = run(&tx, &[ok("a", Action::Confirm)], T0 + 1).tx;
    let twice = run(&once, &[ok("a", Action::Confirm)], T0 + 2);
    assert!(!twice.persist);
    // A late failure after the success does not undo it.
    let late = run(
        &once,
        &[outcome(
            "a",
            Action::Confirm,
            CallOutcome::Unknown("timeout".into()),
        )],
        T0 + 3,
    );
    assert!(!late.persist);
    assert_eq!(
        late.tx.branch(&key("a", Action::Confirm)).unwrap().status,
        BranchStatus::Succeeded
    );
}

#[test]
fn out_of_order_answers_are_errors() {
    let committing = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    assert!(matches!(
        apply(&committing, &ok("a", Action::Cancel), Ctx::at(T0)),
        Err(CoreError::IllegalTransition { .. })
    ));
    assert_eq!(
        apply(&committing, &ok("zz", Action::Confirm), Ctx::at(T0)),
        Err(CoreError::UnknownBranch(key("zz", Action::Confirm)))
    );
    // An illegal event in a batch rejects the whole batch.
    assert!(
        apply_all(
            &committing,
            &[ok("a", Action::Confirm), ok("a", Action::Cancel)],
            Ctx::at(T0)
        )
        .is_err()
    );
}

#[test]
fn try_answers_are_recorded_while_prepared() {
    let mut tx = tcc(&["a"]);
    tx.branches
        .push(Branch::new("a", Action::Try, 0, "http://p/a/try", "{}", T0));
    let t = run(
        &tx,
        &[outcome(
            "a",
            Action::Try,
            CallOutcome::Failure("no stock".into()),
        )],
        T0,
    );
    assert_eq!(t.tx.status, Status::Prepared);
    assert_eq!(
        t.tx.branch(&key("a", Action::Try)).unwrap().status,
        BranchStatus::Failed
    );
    // A refused Try forbids the commit: nothing is confirmed, the state is unchanged.
    assert_eq!(
        apply(&t.tx, &Event::Submit, Ctx::at(T0)),
        Err(CoreError::TryFailed(key("a", Action::Try)))
    );
    // Abort is what the client does instead: every branch is cancelled.
    let c = run(
        &t.tx,
        &[Event::Abort {
            reason: "try".into(),
        }],
        T0,
    );
    assert_eq!(calls(&c), ["a/cancel"]);
}

#[test]
fn submit_waits_for_every_try_to_succeed() {
    let mut tx = tcc(&["a", "b"]);
    for id in ["a", "b"] {
        tx.branches
            .push(Branch::new(id, Action::Try, 0, "http://p/try", "{}", T0));
    }
    tx.sort_branches();
    // a's Try answered unknown, b's never answered: neither may be confirmed yet.
    let t = run(
        &tx,
        &[outcome(
            "a",
            Action::Try,
            CallOutcome::Unknown("timed out".into()),
        )],
        T0,
    );
    assert_eq!(
        apply(&t.tx, &Event::Submit, Ctx::at(T0)),
        Err(CoreError::TryNotSucceeded(key("a", Action::Try)))
    );
    let t = run(&t.tx, &[ok("a", Action::Try), ok("b", Action::Try)], T0 + 1);
    let c = run(&t.tx, &[Event::Submit], T0 + 2);
    assert_eq!(calls(&c), ["a/confirm", "b/confirm"]);
}

// ---- Saga ------------------------------------------------------------------------------

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
    let steps = (0..3)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/a"),
            compensate: format!("http://p/{i}/c"),
            payload: String::new(),
        })
        .collect();
    let tx = Transaction::saga("s", steps, options, T0);
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
    let steps = (0..3)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/a"),
            compensate: format!("http://p/{i}/c"),
            payload: String::new(),
        })
        .collect();
    let tx = Transaction::saga("s", steps, options, T0);
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
    let steps = (0..2)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/a"),
            compensate: format!("http://p/{i}/c"),
            payload: String::new(),
        })
        .collect();
    let tx = Transaction::saga("s", steps, options, T0);
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

// ---- Msg -------------------------------------------------------------------------------

fn msg(timeout_ms: u64) -> Transaction {
    let mut options = opts();
    options.timeout_ms = Some(timeout_ms);
    let mut tx = Transaction::prepared("m", Kind::Msg, options, T0);
    tx.branches.push(Branch::new(
        "00",
        Action::QueryPrepared,
        -1,
        "http://app/qp",
        "",
        T0,
    ));
    tx.branches
        .push(Branch::new("01", Action::Action, 0, "http://p/1", "{}", T0));
    tx.branches
        .push(Branch::new("02", Action::Action, 1, "http://p/2", "{}", T0));
    tx
}

#[test]
fn msg_submit_delivers_every_action() {
    let t = run(&msg(1_000), &[Event::Submit], T0);
    assert_eq!(t.tx.status, Status::Committing);
    assert_eq!(calls(&t), ["01/action", "02/action"]);
    let t = run(
        &t.tx,
        &[ok("01", Action::Action), ok("02", Action::Action)],
        T0 + 1,
    );
    assert_eq!(t.tx.status, Status::Succeeded);
}

#[test]
fn msg_abort_fails_it_without_calls() {
    let t = run(
        &msg(1_000),
        &[Event::Abort {
            reason: "app".into(),
        }],
        T0,
    );
    assert_eq!(t.tx.status, Status::Failed);
    assert_eq!(effects(&t), (true, Next::Done(Status::Failed)));
}

#[test]
fn msg_timeout_checks_back_and_follows_the_answer() {
    let tx = msg(1_000);
    assert_eq!(
        effects(&run(&tx, &[Event::Wake], T0 + 999)),
        (false, Next::WakeAt(T0 + 1_000))
    );
    let t = run(&tx, &[Event::Wake], T0 + 1_000);
    assert_eq!(t.tx.status, Status::Prepared);
    assert_eq!(calls(&t), ["00/query_prepared"]);

    let committed = run(&t.tx, &[ok("00", Action::QueryPrepared)], T0 + 1_001);
    assert_eq!(committed.tx.status, Status::Committing);
    assert_eq!(calls(&committed), ["01/action", "02/action"]);

    let rolled_back = run(
        &t.tx,
        &[outcome(
            "00",
            Action::QueryPrepared,
            CallOutcome::Failure("rollback".into()),
        )],
        T0 + 1_001,
    );
    assert_eq!(rolled_back.tx.status, Status::Failed);

    let unsure = run(
        &t.tx,
        &[outcome(
            "00",
            Action::QueryPrepared,
            CallOutcome::Unknown("500".into()),
        )],
        T0 + 1_001,
    );
    assert_eq!(unsure.tx.status, Status::Prepared);
    assert_eq!(effects(&unsure), (true, Next::WakeAt(T0 + 1_051)));
}

// ---- Operator --------------------------------------------------------------------------

#[test]
fn force_stop_fails_any_unfinished_transaction() {
    for tx in [
        tcc(&["a"]),
        run(&tcc(&["a"]), &[Event::Submit], T0).tx,
        saga(2),
    ] {
        let t = run(
            &tx,
            &[Event::ForceStop {
                reason: "ops".into(),
            }],
            T0 + 1,
        );
        assert_eq!(t.tx.status, Status::Failed);
        assert_eq!(t.tx.reason.as_deref(), Some("ops"));
        assert!(calls(&t).is_empty());
        // Repeating it is harmless.
        assert!(
            !run(
                &t.tx,
                &[Event::ForceStop {
                    reason: "again".into()
                }],
                T0 + 2
            )
            .persist
        );
    }
    let done = run(&tcc(&[]), &[Event::Submit], T0).tx;
    assert!(apply(&done, &Event::ForceStop { reason: "x".into() }, Ctx::at(T0)).is_err());
}

#[test]
fn retry_of_a_backing_off_transaction_makes_it_due_now() {
    let tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let t = run(
        &tx,
        &[outcome(
            "a",
            Action::Confirm,
            CallOutcome::Unknown("x".into()),
        )],
        T0,
    );
    assert!(calls(&t).is_empty());
    let t = run(&t.tx, &[Event::Retry], T0 + 1);
    assert_eq!(calls(&t), ["a/confirm"]);
    assert!(apply(&tcc(&["a"]), &Event::Retry, Ctx::at(T0)).is_err());
}

#[test]
fn terminal_transactions_accept_no_new_work() {
    let done = run(&tcc(&["a"]), &[Event::Submit, ok("a", Action::Confirm)], T0).tx;
    assert_eq!(done.status, Status::Succeeded);
    assert!(apply(&done, &Event::Abort { reason: "x".into() }, Ctx::at(T0)).is_err());
    assert!(apply(&done, &Event::Retry, Ctx::at(T0)).is_err());
    let wake = run(&done, &[Event::Wake], T0 + 1);
    assert_eq!(effects(&wake), (false, Next::Done(Status::Succeeded)));
}

#[test]
fn backoff_doubles_caps_and_spreads() {
    let o = TxOptions {
        retry_interval_ms: 100,
        max_retry_interval_ms: 1_000,
        ..TxOptions::default()
    };
    assert_eq!(retry_delay(&o, 1, 0.0), 50);
    assert_eq!(retry_delay(&o, 1, 1.0), 100);
    assert_eq!(retry_delay(&o, 2, 1.0), 200);
    assert_eq!(retry_delay(&o, 4, 1.0), 800);
    assert_eq!(retry_delay(&o, 5, 1.0), 1_000);
    assert_eq!(retry_delay(&o, 1_000, 1.0), 1_000);
    assert_eq!(retry_delay(&o, 1_000, 0.5), 750);
}

#[test]
fn names_round_trip() {
    for s in Status::ALL {
        assert_eq!(s.as_str().parse::<Status>().unwrap(), s);
    }
    for a in [
        Action::Try,
        Action::Confirm,
        Action::Cancel,
        Action::Action,
        Action::Compensate,
        Action::QueryPrepared,
    ] {
        assert_eq!(a.as_str().parse::<Action>().unwrap(), a);
    }
    assert!("nope".parse::<Kind>().is_err());
}

mod model;
mod rounds;

//! Answers to calls that must succeed: retries with backoff, a 409 retried, in-progress
//! answers, repeated and late answers, answers out of order.

use super::*;

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

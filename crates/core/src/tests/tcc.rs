//! TCC: the decision (submit, abort, the timeout) and its repeats, registration, and the
//! Try answers a commit waits for.

use super::*;

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

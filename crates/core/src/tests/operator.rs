//! The operator's events (force-stop, retry), terminal states, and the names on the wire.

use super::*;

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

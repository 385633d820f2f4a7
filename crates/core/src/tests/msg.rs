//! Msg: delivery on submit, failure on abort, the back-check at the timeout.

use super::*;

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

//! Rows of the transition table in `machine.rs` that the tests by topic do not reach.

use super::*;

#[test]
fn the_table_rows_no_other_test_reaches_hold() {
    // A saga woken at its creation calls its first step and stores nothing.
    let t = run(&saga(2), &[Event::Wake], T0);
    assert!(!t.persist);
    assert_eq!(calls(&t), ["01/action"]);
    // A Try answered after the timeout: the transaction aborts.
    let mut tx = tcc(&["a"]);
    tx.timeout_at = Some(T0 + 10);
    tx.add_branches(vec![Branch::new("a", Action::Try, 0, "u", "{}", T0)]);
    let t = run(&tx, &[ok("a", Action::Try)], T0 + 20);
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(calls(&t), ["a/cancel"]);
    // A late Try answer while aborting is only recorded.
    let tx = run(&tx, &[Event::Abort { reason: "x".into() }], T0 + 1).tx;
    let t = run(&tx, &[ok("a", Action::Try)], T0 + 2);
    assert!(t.persist);
    assert_eq!(t.tx.status, Status::Aborting);
    assert_eq!(calls(&t), ["a/cancel"]);
    // Prepared is not final: a stall stalls it.
    let t = run(&tcc(&["a"]), &[Event::Stall { reason: "x".into() }], T0);
    assert_eq!(effects(&t), (true, Next::Done(Status::Stalled)));
    // The back-check call at a msg's timeout stores nothing first: nothing changed.
    let t = run(&msg(1_000), &[Event::Wake], T0 + 1_000);
    assert!(!t.persist);
}

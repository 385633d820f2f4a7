//! The rules that must not depend on how a round's answers are ordered or grouped:
//! several branches using up their attempts together, in-progress answers past their cap,
//! and the timeouts that end a transaction nobody finishes.

use super::*;

fn unknown(branch_id: &str, action: Action) -> Event {
    outcome(
        branch_id,
        action,
        CallOutcome::Unknown("HTTP 500: down".into()),
    )
}

fn in_progress(branch_id: &str, action: Action) -> Event {
    outcome(
        branch_id,
        action,
        CallOutcome::InProgress("HTTP 425".into()),
    )
}

/// Feeds `round(calls)` answers to every planned call until nothing is due, sleeping to
/// each wake-up; applies each round's answers in the order and grouping `split` picks.
fn drive(
    mut tx: Transaction,
    mut now: Millis,
    answer: impl Fn(&BranchKey) -> CallOutcome,
    split: impl Fn(Vec<Event>) -> Vec<Vec<Event>>,
) -> (Transaction, usize) {
    let mut calls_made = 0;
    let mut t = run(&tx, &[Event::Wake], now);
    for _ in 0..200 {
        tx = t.tx.clone();
        let due: Vec<BranchKey> = t.calls().to_vec();
        if !due.is_empty() {
            calls_made += due.len();
            let events = due
                .iter()
                .map(|k| Event::Outcome {
                    key: k.clone(),
                    outcome: answer(k),
                })
                .collect();
            now += 1;
            for group in split(events) {
                tx = run(&tx, &group, now).tx;
            }
            t = run(&tx, &[Event::Wake], now);
            continue;
        }
        match t.next {
            Next::WakeAt(at) => {
                now = at.max(now + 1);
                t = run(&tx, &[Event::Wake], now);
            }
            _ => return (t.tx, calls_made),
        }
    }
    panic!("no end after 200 rounds: {tx:#?}");
}

/// How a round's answers are handed to the core: in which order, in which groups.
type Grouping = fn(Vec<Event>) -> Vec<Vec<Event>>;

fn groupings() -> Vec<(&'static str, Grouping)> {
    vec![
        ("together", |e| vec![e]),
        ("reversed", |mut e| {
            e.reverse();
            vec![e]
        }),
        ("one by one", |e| e.into_iter().map(|e| vec![e]).collect()),
        ("one by one, reversed", |e| {
            e.into_iter().rev().map(|e| vec![e]).collect()
        }),
    ]
}

#[test]
fn two_confirms_that_keep_failing_stall_together_in_any_order() {
    for (name, split) in groupings() {
        let tx = run(&tcc(&["a", "b"]), &[Event::Submit], T0).tx;
        let (end, sent) = drive(tx, T0, |_| CallOutcome::Unknown("HTTP 500".into()), split);
        assert_eq!(end.status, Status::Stalled, "{name}");
        assert_eq!(end.stalled_from, Some(Status::Committing), "{name}");
        assert_eq!(sent, 6, "{name}: 3 attempts for each of 2 Confirms");
        for b in end.branches_with(Action::Confirm) {
            assert_eq!((b.status, b.attempts), (BranchStatus::Stalled, 3), "{name}");
        }
        assert_eq!(end.attempts, 6, "{name}");
        assert!(end.next_attempt_at.is_none(), "{name}: nothing scheduled");
        assert!(
            end.last_error
                .as_deref()
                .unwrap()
                .contains("exhausted 3 attempts"),
            "{name}: {:?}",
            end.last_error
        );
    }
}

#[test]
fn three_cancels_that_keep_failing_stall_the_abort() {
    for (name, split) in groupings() {
        let tx = run(
            &tcc(&["a", "b", "c"]),
            &[Event::Abort {
                reason: "client".into(),
            }],
            T0,
        )
        .tx;
        let (end, sent) = drive(tx, T0, |_| CallOutcome::Unknown("reset".into()), split);
        assert_eq!(
            (end.status, end.stalled_from),
            (Status::Stalled, Some(Status::Aborting)),
            "{name}"
        );
        assert_eq!(sent, 9, "{name}");
    }
}

#[test]
fn one_branch_stalling_does_not_drop_a_siblings_success() {
    let tx = run(&tcc(&["a", "b"]), &[Event::Submit], T0).tx;
    let answer = |k: &BranchKey| match k.branch_id.as_str() {
        "a" => CallOutcome::Unknown("HTTP 500".into()),
        _ => CallOutcome::Success,
    };
    for (name, split) in groupings() {
        let (end, sent) = drive(tx.clone(), T0, answer, split);
        assert_eq!(end.status, Status::Stalled, "{name}");
        assert_eq!(sent, 4, "{name}: b once, a three times");
        let b = end.branch(&key("b", Action::Confirm)).unwrap();
        assert_eq!(b.status, BranchStatus::Succeeded, "{name}");
        // The operator's retry calls only the stalled Confirm again, with fresh attempts.
        let t = run(&end, &[Event::Retry], T0 + 10_000);
        assert_eq!(calls(&t), ["a/confirm"], "{name}");
        let a = t.tx.branch(&key("a", Action::Confirm)).unwrap();
        assert_eq!((a.status, a.attempts), (BranchStatus::Pending, 0), "{name}");
        let t = run(&t.tx, &[ok("a", Action::Confirm)], T0 + 10_001);
        assert_eq!(t.tx.status, Status::Succeeded, "{name}");
    }
}

#[test]
fn concurrent_saga_whose_two_compensations_keep_failing_stalls() {
    let mut tx = saga(3);
    tx.options.concurrent = true;
    // Steps 0 and 1 run together; step 2 waits for both and fails.
    tx.options.orders = [(2usize, vec![0usize, 1])].into_iter().collect();
    for (name, split) in groupings() {
        let answer = |k: &BranchKey| match (k.branch_id.as_str(), k.action) {
            ("03", Action::Action) => CallOutcome::Failure("no".into()),
            (_, Action::Action) => CallOutcome::Success,
            ("03", Action::Compensate) => CallOutcome::Success,
            _ => CallOutcome::Unknown("HTTP 503".into()),
        };
        let (end, sent) = drive(tx.clone(), T0, answer, split);
        assert_eq!(
            (end.status, end.stalled_from),
            (Status::Stalled, Some(Status::Aborting)),
            "{name}"
        );
        // 3 actions, step 3's compensation once, then 3 attempts of each of the others.
        assert_eq!(sent, 3 + 1 + 6, "{name}");
    }
}

#[test]
fn a_late_or_repeated_answer_for_a_stalled_call_is_ignored() {
    let tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    let (end, _) = drive(tx, T0, |_| CallOutcome::Unknown("x".into()), |e| vec![e]);
    assert_eq!(end.status, Status::Stalled);
    for again in [unknown("a", Action::Confirm), ok("a", Action::Confirm)] {
        let t = run(&end, &[again], T0 + 60_000);
        assert!(!t.persist, "a stalled call takes no answer until the retry");
    }
}

#[test]
fn in_progress_is_bounded_by_its_own_cap() {
    let mut tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    tx.options.max_in_progress_ms = 1_000;
    let t = run(&tx, &[in_progress("a", Action::Confirm)], T0 + 10);
    let a = t.tx.branch(&key("a", Action::Confirm)).unwrap();
    assert_eq!((a.status, a.attempts), (BranchStatus::Pending, 0));
    assert_eq!(a.in_progress_since, Some(T0 + 10));
    assert_eq!(a.next_attempt_at, Some(T0 + 10 + 100));
    // Still in progress just before the cap: asked again.
    let t = run(&t.tx, &[in_progress("a", Action::Confirm)], T0 + 1_009);
    assert_eq!(t.tx.status, Status::Committing);
    // At the cap the call counts as failed for good: a Confirm stalls, visibly.
    let t = run(&t.tx, &[in_progress("a", Action::Confirm)], T0 + 1_010);
    assert_eq!(t.tx.status, Status::Stalled);
    let a = t.tx.branch(&key("a", Action::Confirm)).unwrap();
    assert_eq!((a.status, a.attempts), (BranchStatus::Stalled, 1));
    assert!(
        a.last_error
            .as_deref()
            .unwrap()
            .contains("still in progress after 1000 ms"),
        "{:?}",
        a.last_error
    );
}

#[test]
fn another_answer_resets_the_in_progress_clock() {
    let mut tx = run(&tcc(&["a"]), &[Event::Submit], T0).tx;
    tx.options.max_in_progress_ms = 1_000;
    let t = run(&tx, &[in_progress("a", Action::Confirm)], T0);
    let t = run(&t.tx, &[unknown("a", Action::Confirm)], T0 + 500);
    let a = t.tx.branch(&key("a", Action::Confirm)).unwrap();
    assert_eq!(a.in_progress_since, None);
    let t = run(&t.tx, &[in_progress("a", Action::Confirm)], T0 + 1_200);
    assert_eq!(
        t.tx.status,
        Status::Committing,
        "a new run of in-progress answers"
    );
}

#[test]
fn a_saga_step_in_progress_past_its_cap_is_compensated() {
    let mut tx = saga(2);
    tx.options.max_in_progress_ms = 500;
    let (end, _) = drive(
        tx,
        T0,
        |k| match k.action {
            Action::Action => CallOutcome::InProgress("ONGOING".into()),
            _ => CallOutcome::Success,
        },
        |e| vec![e],
    );
    assert_eq!(end.status, Status::Failed);
    let step = end.branch(&key("01", Action::Compensate)).unwrap();
    assert_eq!(step.status, BranchStatus::Succeeded, "it may have run");
    let never = end.branch(&key("02", Action::Compensate)).unwrap();
    assert_eq!(never.status, BranchStatus::Skipped, "never sent");
    assert!(end.reason.as_deref().unwrap().contains("still in progress"));
}

#[test]
fn a_saga_step_in_progress_meets_the_global_timeout_first() {
    let mut tx = saga(1);
    tx.options.timeout_ms = Some(300);
    tx.timeout_at = Some(T0 + 300);
    let (end, _) = drive(
        tx,
        T0,
        |k| match k.action {
            Action::Action => CallOutcome::InProgress("ONGOING".into()),
            _ => CallOutcome::Success,
        },
        |e| vec![e],
    );
    assert_eq!(end.status, Status::Failed);
    assert_eq!(
        end.reason.as_deref(),
        Some("global timeout before every step succeeded")
    );
}

#[test]
fn a_msg_without_back_check_fails_at_its_timeout_and_stops_waking() {
    let mut tx = msg(2_000);
    tx.branches.retain(|b| b.action != Action::QueryPrepared);
    let t = run(&tx, &[Event::Wake], T0 + 1_999);
    assert_eq!(effects(&t), (false, Next::WakeAt(T0 + 2_000)));
    let t = run(&tx, &[Event::Wake], T0 + 2_000);
    assert_eq!(t.tx.status, Status::Failed);
    assert!(
        t.tx.reason
            .as_deref()
            .unwrap()
            .contains("no query_prepared")
    );
    assert_eq!(effects(&t), (true, Next::Done(Status::Failed)));
    assert_eq!(t.tx.next_attempt_at, None);
    // Nothing is written again.
    let again = run(&t.tx, &[Event::Wake], T0 + 60_000);
    assert!(!again.persist);
}

#[test]
fn a_msg_back_check_that_keeps_failing_stalls_and_resumes() {
    let (end, sent) = drive(
        msg(1_000),
        T0,
        |_| CallOutcome::Unknown("HTTP 502".into()),
        |e| vec![e],
    );
    assert_eq!(
        (end.status, end.stalled_from),
        (Status::Stalled, Some(Status::Prepared))
    );
    assert_eq!(sent, 3);
    let t = run(&end, &[Event::Retry], T0 + 100_000);
    assert_eq!(calls(&t), ["00/query_prepared"]);
}

#[test]
fn an_overlong_timeout_saturates_instead_of_wrapping() {
    let mut options = opts();
    options.timeout_ms = Some(u64::MAX);
    let tx = Transaction::prepared("g", Kind::Tcc, options, T0);
    assert_eq!(tx.timeout_at, Some(Millis::MAX));
    let t = run(&tx, &[Event::Wake], T0);
    assert_eq!(t.tx.status, Status::Prepared);
}

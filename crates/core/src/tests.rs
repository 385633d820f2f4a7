//! Transition tests: every row of the table in `machine.rs`, plus repeats and
//! out-of-order events. The fixtures they share are here; the tests, by topic, are in
//! `tests/`: `tcc`, `saga`, `msg`, `answers` (retries, in progress, late and repeated
//! answers), `budget` (the call budget), `operator`, `table` (rows no other test
//! reaches), `rounds` (order and grouping of a round's answers) and `model` (the
//! model-based test).

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
            payload: format!("{{\"step\":{i}}}").into(),
        })
        .collect();
    Transaction::saga("s1", steps, opts(), T0)
}

/// A saga of `n` steps under `options` (a timeout, orders), with plain URLs.
fn saga_with(options: TxOptions, n: usize) -> Transaction {
    let steps = (0..n)
        .map(|i| SagaStep {
            action: format!("http://p/{i}/a"),
            compensate: format!("http://p/{i}/c"),
            payload: Payload::default(),
        })
        .collect();
    Transaction::saga("s", steps, options, T0)
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

mod answers;
mod budget;
mod model;
mod msg;
mod operator;
mod rounds;
mod saga;
mod table;
mod tcc;

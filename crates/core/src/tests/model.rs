//! A model-based test of the core: random TCC, saga (sequential and concurrent) and msg
//! transactions with 1–5 branches, driven the way the engine drives them, against
//! participants that answer at random (success, refusal, in progress, unknown with or
//! without the step having happened, duplicates), with answers reordered and grouped
//! arbitrarily, and with crashes that lose everything not yet stored.
//!
//! The properties checked are the product's promises, observed from the outside:
//! - liveness: within a bounded number of events every transaction is terminal or
//!   stalled, and an active stored state always has a next step scheduled;
//! - TCC: never both a Confirm and a Cancel for one branch, and no Confirm unless every
//!   Try idem recorded succeeded;
//! - saga: a failed saga compensates every step that may have run, and only those;
//! - attempts never exceed their cap between two operator retries;
//! - an outcome, once stored as terminal, never changes.
//!
//! The cases and the paths they must reach are here; `drive.rs` plays the coordinator,
//! the client and the operator, `world.rs` the participants and the checks.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use super::*;

#[derive(Clone, Copy, Debug)]
enum Shape {
    Tcc,
    Saga,
    ConcurrentSaga,
    Msg,
}

#[derive(Clone, Debug)]
struct Case {
    shape: Shape,
    branches: usize,
    max_attempts: u32,
    retry_interval_ms: u64,
    max_in_progress_ms: u64,
    saga_timeout_ms: Option<u64>,
    seed: u64,
}

fn cases() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            Just(Shape::Tcc),
            Just(Shape::Saga),
            Just(Shape::ConcurrentSaga),
            Just(Shape::Msg)
        ],
        1usize..=5,
        1u32..=4,
        10u64..=100,
        50u64..=2_000,
        prop::option::of(200u64..=5_000),
        any::<u64>(),
    )
        .prop_map(
            |(shape, branches, max_attempts, retry, in_progress, timeout, seed)| Case {
                shape,
                branches,
                max_attempts,
                retry_interval_ms: retry,
                max_in_progress_ms: in_progress,
                saga_timeout_ms: timeout,
                seed,
            },
        )
}

/// What the participants saw, per branch operation, and what the checks need.
#[derive(Default)]
struct World {
    /// Calls that left the coordinator, per operation.
    sent: BTreeMap<BranchKey, u32>,
    /// Forward steps (Try, saga action) that took effect at the participant.
    executed: BTreeSet<String>,
    /// Saga steps whose action was planned as due in a stored state: the steps that may
    /// have run, as far as anyone can know after a crash.
    made_due: BTreeSet<String>,
    /// Misses per operation since the last operator retry.
    misses: BTreeMap<BranchKey, u32>,
    /// The first terminal status stored.
    outcome: Option<Status>,
    /// Once true, participants answer every call with success.
    healed: bool,
    /// One operation that answers "in progress" until this time after its first call.
    slow: Option<(BranchKey, Millis)>,
    slow_since: Option<Millis>,
    /// Which paths this case took, so that a test can see the model exercises them all.
    paths: BTreeSet<&'static str>,
}

struct Driver {
    rng: StdRng,
    case: Case,
    now: Millis,
    /// The state as last stored: what a restarted coordinator resumes from.
    stored: Transaction,
    world: World,
    events: usize,
    crashes: u32,
}

const EVENT_BOUND: usize = 5_000;

fn path_name(kind: Kind, status: Status) -> &'static str {
    match (kind, status) {
        (Kind::Tcc, Status::Committing) => "tcc committing",
        (Kind::Tcc, Status::Aborting) => "tcc aborting",
        (Kind::Tcc, Status::Succeeded) => "tcc succeeded",
        (Kind::Tcc, Status::Failed) => "tcc failed",
        (Kind::Tcc, Status::Stalled) => "tcc stalled",
        (Kind::Saga, Status::Aborting) => "saga aborting",
        (Kind::Saga, Status::Succeeded) => "saga succeeded",
        (Kind::Saga, Status::Failed) => "saga failed",
        (Kind::Saga, Status::Stalled) => "saga stalled",
        (Kind::Msg, Status::Committing) => "msg committing",
        (Kind::Msg, Status::Succeeded) => "msg succeeded",
        (Kind::Msg, Status::Failed) => "msg failed",
        (Kind::Msg, Status::Stalled) => "msg stalled",
        (Kind::Msg, Status::Prepared) => "msg back-check resumed",
        _ => "other",
    }
}

fn model_cases() -> u32 {
    std::env::var("IDEM_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: model_cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_transactions_keep_every_promise(case in cases()) {
        Driver::new(case).run()?;
    }
}

/// The model is only as good as the paths it takes: every one of these must be reached by
/// a few thousand deterministic cases, or the property above proves little.
#[test]
fn the_model_reaches_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&'static str, usize> = BTreeMap::new();
    for _ in 0..3_000 {
        let case = cases().new_tree(&mut runner).unwrap().current();
        for path in Driver::new(case).run().expect("the property holds") {
            *seen.entry(path).or_default() += 1;
        }
    }
    let expected = [
        "tcc committing",
        "tcc aborting",
        "tcc succeeded",
        "tcc failed",
        "tcc stalled",
        "tcc commit refused",
        "saga aborting",
        "saga succeeded",
        "saga failed",
        "saga stalled",
        "msg committing",
        "msg succeeded",
        "msg failed",
        "msg stalled",
        "msg back-check resumed",
        "msg timeout without back-check",
        "tcc timeout",
        "saga timeout",
        "in-progress cap reached",
        "crash",
        "operator retry",
        "force-stop",
    ];
    for path in expected {
        assert!(
            seen.get(path).is_some_and(|&n| n > 0),
            "never reached {path}: {seen:?}"
        );
    }
    eprintln!("{seen:?}");
}

mod drive;
mod world;

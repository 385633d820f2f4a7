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

impl Driver {
    fn new(case: Case) -> Driver {
        let mut rng = StdRng::seed_from_u64(case.seed);
        let mut options = TxOptions {
            retry_interval_ms: case.retry_interval_ms,
            max_retry_interval_ms: case.retry_interval_ms * 8,
            max_attempts: case.max_attempts,
            max_in_progress_ms: case.max_in_progress_ms,
            ..TxOptions::default()
        };
        let n = case.branches;
        let tx = match case.shape {
            Shape::Tcc => {
                options.timeout_ms = Some(rng.random_range(100..=3_000));
                let mut tx = Transaction::prepared("m", Kind::Tcc, options, T0);
                for i in 0..n {
                    let id = format!("b{i}");
                    let mut new = vec![
                        Branch::new(&id, Action::Confirm, 0, "u", "{}", T0),
                        Branch::new(&id, Action::Cancel, 0, "u", "{}", T0),
                    ];
                    if rng.random_bool(0.5) {
                        new.push(Branch::new(&id, Action::Try, 0, "u", "{}", T0));
                    }
                    tx.add_branches(new);
                }
                tx
            }
            Shape::Saga | Shape::ConcurrentSaga => {
                options.timeout_ms = case.saga_timeout_ms;
                if matches!(case.shape, Shape::ConcurrentSaga) {
                    options.concurrent = true;
                    for step in 1..n {
                        let deps: Vec<usize> = (0..step).filter(|_| rng.random_bool(0.4)).collect();
                        if !deps.is_empty() {
                            options.orders.insert(step, deps);
                        }
                    }
                }
                let steps = (0..n)
                    .map(|i| SagaStep {
                        action: format!("a{i}"),
                        compensate: format!("c{i}"),
                        payload: String::new(),
                    })
                    .collect();
                Transaction::saga("m", steps, options, T0)
            }
            Shape::Msg => {
                options.timeout_ms = Some(rng.random_range(100..=3_000));
                let mut tx = Transaction::prepared("m", Kind::Msg, options, T0);
                let mut branches = Vec::new();
                if rng.random_bool(0.7) {
                    branches.push(Branch::new("00", Action::QueryPrepared, -1, "q", "", T0));
                }
                for i in 0..n {
                    let id = step_branch_id(i);
                    branches.push(Branch::new(id, Action::Action, i as i32, "u", "{}", T0));
                }
                tx.add_branches(branches);
                tx
            }
        };
        let mut world = World::default();
        if rng.random_bool(0.4) && !tx.branches.is_empty() {
            let ops: Vec<&Branch> = tx.branches.iter().collect();
            let slow = ops[rng.random_range(0..ops.len())].key();
            let lasts = rng.random_range(0..=(case.max_in_progress_ms as Millis * 2));
            world.slow = Some((slow, lasts));
        }
        Driver {
            rng,
            case,
            now: T0,
            stored: tx,
            world,
            events: 0,
            crashes: 0,
        }
    }

    fn ctx(&mut self) -> Ctx {
        Ctx {
            now: self.now,
            jitter: self.rng.random_range(0.0..1.0),
        }
    }

    /// Stores a transition's state, checking every property that holds of a stored state.
    fn store(&mut self, t: &Transition) -> Result<(), TestCaseError> {
        let before = self.stored.status;
        if t.tx.status != before {
            self.world.paths.insert(path_name(t.tx.kind, t.tx.status));
        }
        if let Some(reason) = &t.tx.reason {
            for (needle, path) in [
                ("no query_prepared", "msg timeout without back-check"),
                ("global timeout while prepared", "tcc timeout"),
                ("global timeout before every step", "saga timeout"),
            ] {
                if reason.contains(needle) {
                    self.world.paths.insert(path);
                }
            }
        }
        if t.tx.branches.iter().any(|b| {
            b.last_error
                .as_deref()
                .is_some_and(|e| e.contains("still in progress"))
        }) {
            self.world.paths.insert("in-progress cap reached");
        }
        self.stored = t.tx.clone();
        let tx = &self.stored;
        if let Some(first) = self.world.outcome {
            prop_assert_eq!(tx.status, first, "a stored outcome changed");
        } else if tx.status.is_terminal() {
            self.world.outcome = Some(tx.status);
        }
        for b in &tx.branches {
            prop_assert!(
                b.attempts <= tx.options.max_attempts as i32,
                "{} has {} attempts over a cap of {}",
                b.key(),
                b.attempts,
                tx.options.max_attempts
            );
        }
        let active = Status::ACTIVE.contains(&tx.status);
        let idle_prepared = tx.status == Status::Prepared && tx.timeout_at.is_none();
        prop_assert_eq!(
            tx.next_attempt_at.is_some(),
            active && !idle_prepared,
            "{} with next_attempt_at {:?}",
            tx.status,
            tx.next_attempt_at
        );
        // A stored state's due calls may go out (from this process or, after a crash,
        // from another): those saga steps may have run.
        for key in t.calls() {
            if key.action == Action::Action && tx.kind == Kind::Saga {
                self.world.made_due.insert(key.branch_id.clone());
            }
        }
        if before != Status::Committing && tx.status == Status::Committing && tx.kind == Kind::Tcc {
            for b in tx.branches_with(Action::Try) {
                prop_assert_eq!(b.status, BranchStatus::Succeeded, "commit with {}", b.key());
            }
        }
        Ok(())
    }

    fn answer(&mut self, key: &BranchKey) -> CallOutcome {
        if let Some((slow, lasts)) = self.world.slow.clone()
            && slow == *key
        {
            let since = *self.world.slow_since.get_or_insert(self.now);
            if self.now - since < lasts {
                return CallOutcome::InProgress("working on it".into());
            }
        }
        if self.world.healed {
            self.record_effect(key);
            return CallOutcome::Success;
        }
        let may_refuse = matches!(key.action, Action::Action | Action::QueryPrepared)
            || key.action == Action::Try;
        let roll = self.rng.random_range(0..100);
        let outcome = match roll {
            0..=54 => CallOutcome::Success,
            55..=64 if may_refuse => CallOutcome::Failure("no".into()),
            55..=64 => CallOutcome::Failure("refused a must-succeed call".into()),
            65..=74 => CallOutcome::InProgress("ONGOING".into()),
            // The step happened; its answer was lost.
            75..=84 => {
                self.record_effect(key);
                return CallOutcome::Unknown("timed out".into());
            }
            _ => CallOutcome::Unknown("HTTP 503".into()),
        };
        if outcome == CallOutcome::Success {
            self.record_effect(key);
        }
        outcome
    }

    fn record_effect(&mut self, key: &BranchKey) {
        if matches!(key.action, Action::Action | Action::Try) {
            self.world.executed.insert(key.branch_id.clone());
        }
    }

    fn count_call(&mut self, key: &BranchKey, outcome: &CallOutcome) -> Result<(), TestCaseError> {
        *self.world.sent.entry(key.clone()).or_default() += 1;
        if matches!(outcome, CallOutcome::Unknown(_))
            || (matches!(outcome, CallOutcome::Failure(_))
                && matches!(
                    key.action,
                    Action::Confirm | Action::Cancel | Action::Compensate
                ))
            || (matches!(outcome, CallOutcome::Failure(_))
                && self.stored.kind == Kind::Msg
                && key.action == Action::Action)
        {
            let misses = self.world.misses.entry(key.clone()).or_default();
            *misses += 1;
            // A crash loses the answers of the round in flight, so each crash may add one
            // call the store never counted; nothing else may.
            prop_assert!(
                *misses <= self.case.max_attempts + self.crashes,
                "{} called {} times without success, cap {} and {} crashes",
                key,
                misses,
                self.case.max_attempts,
                self.crashes
            );
        }
        Ok(())
    }

    /// Drives until nothing more happens without the client or operator; returns the
    /// last transition. May crash and resume from the stored state.
    fn drive(&mut self, mut t: Transition) -> Result<Transition, TestCaseError> {
        loop {
            self.events += 1;
            prop_assert!(
                self.events < EVENT_BOUND,
                "no end after {} events",
                EVENT_BOUND
            );
            if t.persist {
                if self.maybe_crash() {
                    t = self.resume()?;
                    continue;
                }
                self.store(&t)?;
            }
            let calls = match &t.next {
                Next::Call(calls) => calls.clone(),
                Next::WakeAt(at) => {
                    let at = *at;
                    prop_assert!(at > self.now - 1, "wake-up in the past");
                    self.now = at.max(self.now + 1);
                    let ctx = self.ctx();
                    t = apply(&self.stored, &Event::Wake, ctx).expect("a wake-up is always legal");
                    continue;
                }
                Next::Done(_) => return Ok(t),
            };
            prop_assert!(!calls.is_empty(), "a round with no calls");
            // Planned from a stored state: due, whether or not a crash stops them now.
            for key in &calls {
                if key.action == Action::Action && self.stored.kind == Kind::Saga {
                    self.world.made_due.insert(key.branch_id.clone());
                }
            }
            if self.maybe_crash() {
                // Crashed after storing, before sending anything.
                t = self.resume()?;
                continue;
            }
            let mut events = Vec::new();
            for key in &calls {
                let outcome = self.answer(key);
                self.count_call(key, &outcome)?;
                let event = Event::Outcome {
                    key: key.clone(),
                    outcome,
                };
                if self.rng.random_bool(0.1) {
                    events.push(event.clone());
                }
                events.push(event);
            }
            if self.maybe_crash() {
                // The calls went out; their answers are lost.
                t = self.resume()?;
                continue;
            }
            self.now += 1;
            t = self.apply_in_random_groups(events)?;
        }
    }

    /// A round's answers reordered, duplicated and split into groups, each group applied
    /// (and stored) as the engine would apply a round.
    fn apply_in_random_groups(
        &mut self,
        mut events: Vec<Event>,
    ) -> Result<Transition, TestCaseError> {
        for i in (1..events.len()).rev() {
            let j = self.rng.random_range(0..=i);
            events.swap(i, j);
        }
        let mut t = None;
        while !events.is_empty() {
            let take = self.rng.random_range(1..=events.len());
            let group: Vec<Event> = events.drain(..take).collect();
            let ctx = self.ctx();
            let next = apply_all(&self.stored, &group, ctx);
            let next = match next {
                Ok(next) => next,
                Err(e) => {
                    prop_assert!(false, "answers of a round refused: {e}");
                    unreachable!()
                }
            };
            if next.persist {
                self.store(&next)?;
            }
            t = Some(next);
        }
        Ok(t.expect("a round has answers"))
    }

    fn maybe_crash(&mut self) -> bool {
        if self.crashes < 3 && self.rng.random_bool(0.03) {
            self.crashes += 1;
            self.world.paths.insert("crash");
            true
        } else {
            false
        }
    }

    /// A coordinator restarts: it claims the stored row and wakes it up.
    fn resume(&mut self) -> Result<Transition, TestCaseError> {
        self.now += 1;
        let ctx = self.ctx();
        Ok(apply(&self.stored, &Event::Wake, ctx).expect("a wake-up is always legal"))
    }

    /// A client or operator request against the stored state; refused ones change nothing.
    fn request(&mut self, event: Event) -> Result<Option<Transition>, TestCaseError> {
        self.now += 1;
        let ctx = self.ctx();
        match apply(&self.stored, &event, ctx) {
            Ok(t) => Ok(Some(t)),
            Err(_) => Ok(None),
        }
    }

    fn run(mut self) -> Result<BTreeSet<&'static str>, TestCaseError> {
        let first = match self.stored.kind {
            Kind::Saga => {
                let ctx = self.ctx();
                apply(&self.stored, &Event::Wake, ctx).expect("wake")
            }
            Kind::Tcc => self.client_tcc()?,
            Kind::Msg => self.client_msg()?,
        };
        let mut t = self.drive(first)?;
        // The operator: retries a stalled transaction (sometimes after healing the
        // participant), and force-stops it after a few tries.
        let mut retries = 0;
        while self.stored.status == Status::Stalled {
            retries += 1;
            self.world.misses.clear();
            self.world.paths.insert(if retries > 3 {
                "force-stop"
            } else {
                "operator retry"
            });
            let event = if retries > 3 {
                Event::ForceStop {
                    reason: "operator".into(),
                }
            } else {
                if self.rng.random_bool(0.5) {
                    self.world.healed = true;
                }
                Event::Retry
            };
            let next = self
                .request(event)?
                .expect("retry and force-stop of a stalled one");
            t = self.drive(next)?;
        }
        let end = self.stored.clone();
        prop_assert!(
            end.status.is_terminal()
                || (end.status == Status::Prepared && end.timeout_at.is_none()),
            "ended {} after {} events",
            end.status,
            self.events
        );
        prop_assert!(matches!(t.next, Next::Done(_)));
        self.check_protocol(&end)?;
        Ok(std::mem::take(&mut self.world.paths))
    }

    fn client_tcc(&mut self) -> Result<Transition, TestCaseError> {
        // The client calls the registered Trys through idem; some answers never come.
        let tries: Vec<BranchKey> = self
            .stored
            .branches_with(Action::Try)
            .map(Branch::key)
            .collect();
        for key in tries {
            if self.rng.random_bool(0.9) {
                let outcome = self.answer(&key);
                let event = Event::Outcome { key, outcome };
                if let Some(t) = self.request(event)?
                    && t.persist
                {
                    self.store(&t)?;
                }
            }
        }
        let choice = self.rng.random_range(0..10);
        let decision = match choice {
            0..=6 => match self.request(Event::Submit)? {
                Some(t) => Some(t),
                // A refused commit: the client aborts instead.
                None => {
                    self.world.paths.insert("tcc commit refused");
                    self.request(Event::Abort {
                        reason: "commit refused".into(),
                    })?
                }
            },
            7..=8 => self.request(Event::Abort {
                reason: "client".into(),
            })?,
            // The client goes away: the timeout decides.
            _ => None,
        };
        self.or_at_the_timeout(decision)
    }

    /// The client's decision, or, when it made none, the coordinator waking at the timeout.
    fn or_at_the_timeout(
        &mut self,
        decision: Option<Transition>,
    ) -> Result<Transition, TestCaseError> {
        match decision {
            Some(t) => Ok(t),
            None => {
                self.now = self.stored.timeout_at.unwrap_or(self.now);
                self.resume()
            }
        }
    }

    fn client_msg(&mut self) -> Result<Transition, TestCaseError> {
        let choice = self.rng.random_range(0..10);
        let decision = match choice {
            0..=4 => self.request(Event::Submit)?,
            5..=6 => self.request(Event::Abort {
                reason: "client".into(),
            })?,
            _ => None,
        };
        self.or_at_the_timeout(decision)
    }

    fn check_protocol(&self, end: &Transaction) -> Result<(), TestCaseError> {
        let sent = |id: &str, action| {
            self.world.sent.get(&BranchKey {
                branch_id: id.to_owned(),
                action,
            })
        };
        let forced = end.reason.as_deref() == Some("operator");
        match end.kind {
            Kind::Tcc => {
                for b in end.branches_with(Action::Confirm) {
                    prop_assert!(
                        sent(&b.branch_id, Action::Confirm).is_none()
                            || sent(&b.branch_id, Action::Cancel).is_none(),
                        "{} got both Confirm and Cancel",
                        b.branch_id
                    );
                }
            }
            Kind::Saga => {
                let compensated: BTreeSet<String> = end
                    .branches_with(Action::Compensate)
                    .filter(|b| sent(&b.branch_id, Action::Compensate).is_some())
                    .map(|b| b.branch_id.clone())
                    .collect();
                for id in &compensated {
                    prop_assert!(
                        self.world.made_due.contains(id),
                        "compensated {} that never could have run",
                        id
                    );
                }
                match end.status {
                    Status::Succeeded => prop_assert!(compensated.is_empty()),
                    Status::Failed if !forced => {
                        for id in &self.world.executed {
                            let c = end
                                .branch(&BranchKey {
                                    branch_id: id.clone(),
                                    action: Action::Compensate,
                                })
                                .expect("every step has a compensation");
                            prop_assert_eq!(
                                c.status,
                                BranchStatus::Succeeded,
                                "step {} ran but was not compensated",
                                id
                            );
                        }
                    }
                    _ => {}
                }
            }
            Kind::Msg => {
                if end.status == Status::Failed && !forced {
                    prop_assert!(
                        end.branches_with(Action::Action).all(|b| sent(
                            &b.branch_id,
                            Action::Action
                        )
                        .is_none()),
                        "a failed msg delivered a message"
                    );
                }
            }
        }
        Ok(())
    }
}

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

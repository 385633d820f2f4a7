//! How the model drives a transaction: the coordinator's loop (store, then call, wait or
//! stop), crashes that lose what is not stored, and the client and operator requests.

use super::*;

impl Driver {
    pub(super) fn new(case: Case) -> Driver {
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
                        Branch::new(id.as_str(), Action::Confirm, 0, "u", "{}", T0),
                        Branch::new(id.as_str(), Action::Cancel, 0, "u", "{}", T0),
                    ];
                    if rng.random_bool(0.5) {
                        new.push(Branch::new(id.as_str(), Action::Try, 0, "u", "{}", T0));
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
                        payload: Payload::default(),
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
            jitter: self.rng.random_range(0.0..1.0),
            // The budget has its own tests (`budget.rs`); here it never binds.
            ..Ctx::at(self.now)
        }
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

    pub(super) fn run(mut self) -> Result<BTreeSet<&'static str>, TestCaseError> {
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
}

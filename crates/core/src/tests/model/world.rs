//! The world the model acts on: participants that answer at random, and the checks of
//! what they saw and of every stored state.

use super::*;

impl Driver {
    /// Stores a transition's state, checking every property that holds of a stored state.
    pub(super) fn store(&mut self, t: &Transition) -> Result<(), TestCaseError> {
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

    pub(super) fn answer(&mut self, key: &BranchKey) -> CallOutcome {
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

    pub(super) fn count_call(
        &mut self,
        key: &BranchKey,
        outcome: &CallOutcome,
    ) -> Result<(), TestCaseError> {
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

    pub(super) fn check_protocol(&self, end: &Transaction) -> Result<(), TestCaseError> {
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
                    .map(|b| b.branch_id.to_string())
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

//! How long barrier rows must be kept, derived from the coordinator's settings, and a task
//! that purges older ones on a schedule.
//!
//! A barrier row is what lets a late call find out what already happened to its branch.
//! Purged too early, it cannot:
//!
//! - **a late Cancel becomes a wrong empty rollback.** The Try ran and committed its
//!   reservation with its row. If that row is gone when the Cancel arrives (a Cancel retried
//!   for hours against a participant that was down, then answered), the Cancel's insert of
//!   the Try row succeeds, so the barrier concludes the Try never ran and records an empty
//!   rollback: nothing is undone and the reservation stays for ever. A saga compensation
//!   after its action's row was purged is undone the same wrong way.
//! - **a late Try passes anti-suspension.** A Cancel that arrived first left a guard row
//!   that rejects the Try. If the guard is purged before a delayed Try arrives, the Try
//!   executes and reserves, and no Cancel will ever come again.
//! - **a late Confirm is refused for ever** when its Try's row is gone (the barrier only
//!   confirms an executed Try): the branch stalls.
//!
//! So a row must outlive the latest moment any call for its transaction can arrive:
//!
//! - **a Cancel, Confirm or saga call from the coordinator**: the longest time a
//!   transaction can stay unfinished. The transaction timeout, a Try in flight at it (a
//!   request timeout), then each branch operation's whole retry budget (attempts with
//!   capped exponential backoff, each call up to its request timeout, "in progress" answers
//!   up to their own cap), saga steps one after another, a coordinator's lease to be taken
//!   over, and the time a stalled transaction waits for an operator's `idem tx retry`. That
//!   last one has no bound in the coordinator: [`BarrierRetention`] takes it from you as
//!   `operator_bound`.
//! - **a Try your client calls itself** (directly, or through idem's `register` with a
//!   `try` URL): the client may call it while the transaction is prepared, up to its
//!   timeout, and keeps repeating it for as long as it retries a request
//!   ([`CoordinatorSettings::client_retry_period_ms`], `idem serve
//!   --client-retry-period-ms`), each call up to a request timeout. The Cancel's guard row
//!   that rejects it may have been written at the transaction's very start.

use std::time::Duration;

use sqlx::Pool;

use crate::backend::BarrierDatabase;

/// The coordinator's settings that bound how long a transaction keeps calling its
/// participants, under the names and with the defaults of `idem serve`'s flags
/// (`--prepared-timeout-ms`, ...). Give the largest values any transaction of yours uses:
/// a client may set its own `timeout_ms`, `request_timeout_ms`, `retry_interval_ms` and
/// `max_attempts` per transaction, and those count, not only the server's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoordinatorSettings {
    /// How long a TCC or msg transaction may stay prepared (`--prepared-timeout-ms`, or a
    /// transaction's own `timeout_ms`).
    pub prepared_timeout_ms: u64,
    /// One call to a participant, at most (`--request-timeout-ms`).
    pub request_timeout_ms: u64,
    /// The first retry delay, doubled per attempt (`--retry-interval-ms`).
    pub retry_interval_ms: u64,
    /// The cap on the retry delay (`--max-retry-interval-ms`).
    pub max_retry_interval_ms: u64,
    /// Attempts per branch operation before it stalls or compensates (`--max-attempts`).
    pub max_attempts: u32,
    /// How long a call may keep answering "in progress" (`--max-in-progress-ms`).
    pub max_in_progress_ms: u64,
    /// Steps of a saga, which run one after another (`--max-branches`); the longest saga
    /// that calls this participant is enough.
    pub max_branches: u32,
    /// How soon another coordinator takes over a dead one's transactions (`--lease-ms`).
    pub lease_ms: u64,
    /// How often a coordinator looks for them (`--recovery-interval-ms`).
    pub recovery_interval_ms: u64,
    /// The longest time a client keeps repeating a request, a Try it calls itself
    /// included (`--client-retry-period-ms`). Give your slowest client's: one that retries
    /// a Try for a week sends it up to a week after its Cancel may have come.
    pub client_retry_period_ms: u64,
}

impl Default for CoordinatorSettings {
    /// `idem serve`'s defaults.
    fn default() -> Self {
        CoordinatorSettings {
            prepared_timeout_ms: 60_000,
            request_timeout_ms: 5_000,
            retry_interval_ms: 1_000,
            max_retry_interval_ms: 60_000,
            max_attempts: 12,
            max_in_progress_ms: 3_600_000,
            max_branches: 100,
            lease_ms: 15_000,
            recovery_interval_ms: 1_000,
            client_retry_period_ms: 86_400_000,
        }
    }
}

impl CoordinatorSettings {
    /// The longest one branch operation (a Confirm, a Cancel, a saga step) keeps being
    /// called: every attempt up to its request timeout, each preceded by "in progress"
    /// answers up to their cap (a failed attempt starts that cap again), the backoff
    /// delays between attempts at their upper end, and one takeover by another
    /// coordinator.
    pub fn longest_operation(&self) -> Duration {
        let base = self.retry_interval_ms.max(1);
        let cap = self.max_retry_interval_ms.max(base);
        let attempts = u64::from(self.max_attempts.max(1));
        // Doubling until the cap, then the cap for every delay left.
        let mut delays = 0u64;
        let mut delay = base;
        let mut k = 1;
        while k < attempts && delay < cap {
            delays = delays.saturating_add(delay);
            delay = delay.saturating_mul(2).min(cap);
            k += 1;
        }
        let delays = delays.saturating_add((attempts - k).saturating_mul(cap));
        let per_attempt = self
            .request_timeout_ms
            .saturating_add(self.max_in_progress_ms)
            .saturating_add(base);
        let takeover = self.lease_ms.saturating_add(self.recovery_interval_ms);
        Duration::from_millis(
            attempts
                .saturating_mul(per_attempt)
                .saturating_add(delays)
                .saturating_add(takeover),
        )
    }

    /// The longest a transaction can stay unfinished without stalling: the larger of a
    /// TCC (prepared, a Try in flight at the timeout, then its Confirms or Cancels, which
    /// run at once), a msg (prepared, its back-check, its actions) and a saga (every step
    /// forward, then every compensation, one after another).
    pub fn longest_unfinished(&self) -> Duration {
        let op = self.longest_operation();
        let prepared = Duration::from_millis(self.prepared_timeout_ms);
        let tcc = prepared
            .saturating_add(Duration::from_millis(self.request_timeout_ms))
            .saturating_add(op);
        let msg = prepared.saturating_add(op.saturating_mul(2));
        let saga = op.saturating_mul(self.max_branches.max(1).saturating_mul(2));
        tcc.max(msg).max(saga)
    }

    /// The latest a Try that your client calls itself can arrive, counted from its
    /// transaction's creation: the transaction timeout (the client may call it while the
    /// transaction is prepared), a request timeout (that call in flight) and the client's
    /// retry period (its repeats of it).
    pub fn latest_client_try(&self) -> Duration {
        Duration::from_millis(
            self.prepared_timeout_ms
                .saturating_add(self.request_timeout_ms)
                .saturating_add(self.client_retry_period_ms),
        )
    }
}

/// The barrier rows' safe retention: the later of the last coordinator call and the last
/// client-called Try, and a margin. The coordinator calls until
/// [`CoordinatorSettings::longest_unfinished`] (when a transaction may first stall), then
/// for as long as the operator lets a stalled transaction wait, then the same schedule
/// again after the operator's last `tx retry` (which gives the calls fresh attempts); a
/// client's Try comes until [`CoordinatorSettings::latest_client_try`]. Both are counted
/// from the transaction's creation, which every one of its rows follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierRetention {
    /// The coordinator's settings.
    pub coordinator: CoordinatorSettings,
    /// The longest your operators let a stalled transaction wait, from its first stall to
    /// their last `idem tx retry` of it. The coordinator cannot bound this (a stalled
    /// transaction waits for a person); the stalled-transactions alert is what keeps the
    /// promise. Force-stopping a transaction ends its calls.
    pub operator_bound: Duration,
    /// Added on top, for what nothing above bounds: every coordinator down, a database
    /// outage, calls held in a network. One day unless you say otherwise.
    pub margin: Duration,
}

impl BarrierRetention {
    /// The retention for these settings and operator bound, with a margin of one day.
    pub fn new(coordinator: CoordinatorSettings, operator_bound: Duration) -> BarrierRetention {
        BarrierRetention {
            coordinator,
            operator_bound,
            margin: Duration::from_secs(86_400),
        }
    }

    /// The age past which a barrier row may be purged.
    pub fn window(&self) -> Duration {
        let unfinished = self.coordinator.longest_unfinished();
        let last_coordinator_call = unfinished
            .saturating_add(self.operator_bound)
            .saturating_add(unfinished);
        last_coordinator_call
            .max(self.coordinator.latest_client_try())
            .saturating_add(self.margin)
    }
}

/// Purges the barrier table `table` every `every`: rows older than `retention.window()`
/// go ([`crate::purge_barriers`], on the database's clock). Runs until the handle is
/// aborted or its runtime stops; a failed purge is logged and tried again next time.
pub fn spawn_barrier_purge<DB: BarrierDatabase>(
    pool: Pool<DB>,
    table: impl Into<String>,
    retention: BarrierRetention,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let table = table.into();
    let window = retention.window();
    let every = every.max(Duration::from_millis(10));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match crate::barrier::schema::purge_barriers(&pool, &table, window).await {
                Ok(0) => {}
                Ok(rows) => tracing::info!(rows, table, "purged old barrier rows"),
                Err(e) => tracing::warn!(error = %e, table, "barrier purge failed"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    #[test]
    fn one_operation_adds_attempts_capped_backoff_in_progress_and_a_takeover() {
        let s = CoordinatorSettings {
            request_timeout_ms: 10,
            retry_interval_ms: 100,
            max_retry_interval_ms: 300,
            max_attempts: 5,
            max_in_progress_ms: 1_000,
            lease_ms: 7,
            recovery_interval_ms: 3,
            ..CoordinatorSettings::default()
        };
        // Delays 100, 200, 300 (capped), 300; five attempts of 10 + 1,000 + 100; 7 + 3.
        let expected = 100 + 200 + 300 + 300 + 5 * (10 + 1_000 + 100) + 10;
        assert_eq!(s.longest_operation(), Duration::from_millis(expected));
    }

    #[test]
    fn the_defaults_give_the_documented_window() {
        let s = CoordinatorSettings::default();
        // 1+2+4+8+16+32 s, then five delays at the 60 s cap; 12 × (5 s + 1 h + 1 s);
        // 15 s + 1 s.
        let op = (63 + 5 * 60) * 1_000 + 12 * (5_000 + HOUR + 1_000) + 16_000;
        assert_eq!(s.longest_operation(), Duration::from_millis(op));
        // A saga of 100 steps, forward then back, is the longest kind.
        assert_eq!(s.longest_unfinished(), Duration::from_millis(200 * op));
        let three_steps = CoordinatorSettings {
            max_branches: 3,
            ..s
        };
        assert_eq!(
            three_steps.longest_unfinished(),
            Duration::from_millis(6 * op)
        );
        let r = BarrierRetention::new(three_steps, Duration::from_secs(7 * 86_400));
        assert_eq!(
            r.window(),
            Duration::from_millis(12 * op + 7 * 24 * HOUR + 24 * HOUR)
        );
    }

    #[test]
    fn a_long_prepared_timeout_dominates_short_sagas() {
        let s = CoordinatorSettings {
            prepared_timeout_ms: 10 * HOUR,
            max_branches: 1,
            ..CoordinatorSettings::default()
        };
        let op = s.longest_operation();
        // A msg: 10 h prepared, its back-check, its actions; longer than a TCC's
        // 10 h + a Try in flight + one phase, and than a one-step saga's 2 × op.
        let prepared = Duration::from_millis(10 * HOUR);
        assert_eq!(s.longest_unfinished(), prepared + op * 2);
        assert!(s.longest_unfinished() > prepared + Duration::from_millis(5_000) + op);
    }

    #[test]
    fn every_setting_can_only_lengthen_the_window() {
        let base = BarrierRetention::new(CoordinatorSettings::default(), Duration::ZERO);
        let longer = [
            CoordinatorSettings {
                prepared_timeout_ms: 10_000 * HOUR,
                ..base.coordinator
            },
            CoordinatorSettings {
                request_timeout_ms: 600_000,
                ..base.coordinator
            },
            CoordinatorSettings {
                retry_interval_ms: HOUR,
                ..base.coordinator
            },
            CoordinatorSettings {
                max_retry_interval_ms: HOUR,
                ..base.coordinator
            },
            CoordinatorSettings {
                max_attempts: 13,
                ..base.coordinator
            },
            CoordinatorSettings {
                max_in_progress_ms: 2 * HOUR,
                ..base.coordinator
            },
            CoordinatorSettings {
                max_branches: 101,
                ..base.coordinator
            },
            CoordinatorSettings {
                lease_ms: 60_000,
                ..base.coordinator
            },
            CoordinatorSettings {
                client_retry_period_ms: 10_000 * HOUR,
                ..base.coordinator
            },
        ];
        for coordinator in longer {
            let r = BarrierRetention {
                coordinator,
                ..base
            };
            assert!(r.window() > base.window(), "{coordinator:?}");
        }
        let patient = BarrierRetention {
            operator_bound: Duration::from_secs(3_600),
            ..base
        };
        assert_eq!(patient.window(), base.window() + Duration::from_secs(3_600));
    }

    #[test]
    fn the_window_covers_a_try_the_client_sends_until_its_retries_end() {
        // Clients that retry for 30 days, one-step sagas, operators that retry at once: the
        // client's own Try is the latest call, not the coordinator's.
        let s = CoordinatorSettings {
            client_retry_period_ms: 30 * 24 * HOUR,
            max_branches: 1,
            ..CoordinatorSettings::default()
        };
        let latest_try = Duration::from_millis(60_000 + 5_000 + 30 * 24 * HOUR);
        assert_eq!(s.latest_client_try(), latest_try);
        let r = BarrierRetention::new(s, Duration::ZERO);
        assert!(s.longest_unfinished() * 2 < latest_try);
        assert_eq!(r.window(), latest_try + r.margin);
        // The transaction's own timeout, and each call's, move it as far.
        let later = CoordinatorSettings {
            prepared_timeout_ms: 10 * HOUR,
            request_timeout_ms: 600_000,
            ..s
        };
        let r2 = BarrierRetention::new(later, Duration::ZERO);
        assert_eq!(
            r2.window(),
            r.window() + Duration::from_millis(10 * HOUR - 60_000 + 600_000 - 5_000)
        );
        // With the defaults (a one-day period) the coordinator's calls come later.
        let d = BarrierRetention::new(CoordinatorSettings::default(), Duration::ZERO);
        assert!(d.coordinator.latest_client_try() < d.coordinator.longest_unfinished());
    }

    #[test]
    fn extreme_settings_saturate_instead_of_overflowing() {
        let s = CoordinatorSettings {
            prepared_timeout_ms: u64::MAX,
            request_timeout_ms: u64::MAX,
            retry_interval_ms: u64::MAX,
            max_retry_interval_ms: u64::MAX,
            max_attempts: u32::MAX,
            max_in_progress_ms: u64::MAX,
            max_branches: u32::MAX,
            lease_ms: u64::MAX,
            recovery_interval_ms: u64::MAX,
            client_retry_period_ms: u64::MAX,
        };
        let r = BarrierRetention::new(s, Duration::MAX);
        assert_eq!(r.window(), Duration::MAX);
        let zero = CoordinatorSettings {
            max_attempts: 0,
            retry_interval_ms: 0,
            ..CoordinatorSettings::default()
        };
        assert!(zero.longest_operation() > Duration::ZERO);
    }
}

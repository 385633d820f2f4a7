//! How often a local transaction that lost a lock conflict is run again, and how long to
//! wait before each new attempt.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// How often [`run_local`](super::run_local) and [`Barrier::run`](crate::Barrier::run)
/// re-run a local transaction that lost a lock conflict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total, the first included.
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each time, up to `max_delay`, with jitter.
    pub base_delay: Duration,
    /// Cap on the delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 20,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt number `attempt` (1-based). `unit` in [0, 1) picks the
    /// point in the upper half of the exponential window: the jitter keeps two transactions
    /// that deadlocked each other from colliding again in lockstep.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let capped = exp.min(self.max_delay);
        capped.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// A random number in [0, 1) without a dependency: the standard library seeds each
/// `RandomState` from the OS.
pub(crate) fn jitter_unit() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_grows_caps_and_jitters() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(2),
            max_delay: Duration::from_millis(50),
        };
        assert!(p.delay(1, 0.999_999).as_micros() >= 1999);
        assert!(p.delay(1, 1.0) <= Duration::from_millis(2));
        assert_eq!(p.delay(1, 0.0), Duration::from_millis(1));
        assert_eq!(p.delay(3, 0.0), Duration::from_millis(4));
        assert_eq!(p.delay(30, 0.0), Duration::from_millis(25));
        assert!(p.delay(30, 1.0) <= Duration::from_millis(50));
        let u = jitter_unit();
        assert!((0.0..1.0).contains(&u));
    }
}

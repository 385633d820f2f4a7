//! The engine's clock.

use crate::core::Millis;

/// A source of the current time, so tests can control it.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Millis;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Millis {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as Millis)
            .unwrap_or(0)
    }
}

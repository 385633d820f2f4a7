//! Refusing a call id seen before within the window: a bounded, in-memory set per
//! process.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::{SignatureError, unix_seconds};

/// Call ids remembered by default, at most: about 1,600 signed calls a second over the
/// default 5-minute window, in at most about 17 MiB.
pub const DEFAULT_REPLAY_CAPACITY: usize = 500_000;

/// The call ids of verified v2 calls, each kept until its signature leaves the window
/// (after that the window refuses a replay on its own). Bounded: when full of ids still
/// within the window, a new call is refused ([`SignatureError::ReplayCacheFull`], 503,
/// which idem retries) rather than accepted unchecked.
///
/// It protects one process. Several replicas of a participant behind one address each
/// hold their own: a call recorded at one replica can be replayed once to each other
/// replica within the window. Route a participant's calls to one replica, or accept that
/// residual risk (the barrier still makes a repeat of the same step harmless).
#[derive(Debug)]
pub struct ReplayCache {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The first 64 bits of a call id, and when it leaves the window (Unix seconds). Two
    /// ids sharing 64 bits (about one in 10^8 at full capacity) refuse the second call
    /// once; idem retries it under a new id.
    seen: HashMap<u64, u64>,
    /// When ids past their window are dropped next.
    next_sweep: u64,
}

impl ReplayCache {
    /// Remembers up to `capacity` call ids.
    pub fn new(capacity: usize) -> ReplayCache {
        ReplayCache {
            capacity: capacity.max(1),
            state: Mutex::default(),
        }
    }

    /// Records `call_id` (of a call signed at `timestamp`, verified within `window` of
    /// `now`), or refuses it if it was recorded before.
    pub fn check(
        &self,
        call_id: &str,
        timestamp: u64,
        window: Duration,
        now: SystemTime,
    ) -> Result<(), SignatureError> {
        let id = call_id
            .get(..16)
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .ok_or(SignatureError::Malformed(
                "Idem-Call-Id is not 32 lowercase hex digits",
            ))?;
        let now = unix_seconds(now);
        let until = timestamp.saturating_add(window.as_secs());
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.seen.contains_key(&id) {
            return Err(SignatureError::Replayed(call_id.to_owned()));
        }
        if now >= state.next_sweep || state.seen.len() >= self.capacity {
            state.seen.retain(|_, until| *until >= now);
            state.next_sweep = now.saturating_add(window.as_secs().max(1));
        }
        if state.seen.len() >= self.capacity {
            return Err(SignatureError::ReplayCacheFull);
        }
        state.seen.insert(id, until);
        Ok(())
    }

    /// Call ids remembered now.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    const WINDOW: Duration = Duration::from_secs(300);

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(s)
    }

    fn id(n: u64) -> String {
        format!("{n:016x}{:016x}", 0)
    }

    #[test]
    fn a_seen_id_is_refused_until_it_leaves_the_window() {
        let cache = ReplayCache::new(10);
        assert_eq!(cache.check(&id(1), 1_000, WINDOW, at(1_000)), Ok(()));
        let again = cache.check(&id(1), 1_000, WINDOW, at(1_200)).unwrap_err();
        assert_eq!(again.code(), "signature_replayed");
        assert_eq!(cache.check(&id(2), 1_000, WINDOW, at(1_200)), Ok(()));
        // Past its window the id is dropped at the next sweep (its signature would be
        // refused as expired by then anyway).
        assert_eq!(cache.check(&id(3), 1_400, WINDOW, at(1_400)), Ok(()));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn a_full_cache_refuses_rather_than_forgets() {
        let cache = ReplayCache::new(2);
        cache.check(&id(1), 1_000, WINDOW, at(1_000)).unwrap();
        cache.check(&id(2), 1_000, WINDOW, at(1_000)).unwrap();
        let full = cache.check(&id(3), 1_000, WINDOW, at(1_001)).unwrap_err();
        assert_eq!(full, SignatureError::ReplayCacheFull);
        assert_eq!(full.code(), "replay_cache_full");
        // Still refused as a replay, not forgotten.
        assert!(matches!(
            cache.check(&id(1), 1_000, WINDOW, at(1_001)),
            Err(SignatureError::Replayed(_))
        ));
        // Once the first two leave their window there is room again.
        assert_eq!(cache.check(&id(3), 1_400, WINDOW, at(1_400)), Ok(()));
        assert_eq!(cache.len(), 1);
    }
}

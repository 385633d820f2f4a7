//! Waiting for an outcome, and the recent states that spare reads.
//!
//! `wait_result` waits here for a terminal or stalled state. The recent-state cache keeps
//! unfinished states while they are unfinished (at most `ACTIVE_KEPT`) and only the
//! newest `FINISHED_KEPT` finished ones, enough for the waits on them: memory follows the
//! work under way, not the traffic.

use std::collections::VecDeque;
use std::sync::Arc;

use super::*;

impl Engine {
    // ---- waiting ---------------------------------------------------------------------

    /// Waits until the transaction is terminal or stalled, or until `timeout`; returns the
    /// state it then has.
    pub async fn wait_settled(
        &self,
        gid: &str,
        timeout: Duration,
    ) -> Result<StoredTx, EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let waiter = Waiter::new(self, gid);
            let notified = waiter.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let settled =
                |s: &StoredTx| s.tx.status.is_terminal() || s.tx.status == Status::Stalled;
            // A stopping process answers at once with what it knows.
            let expired = tokio::time::Instant::now() >= deadline || self.stopping.is_cancelled();
            // This process's driver keeps its copy current and notifies when it settles;
            // the database is read only for a transaction this process does not drive.
            let stored = match self.recent.get(gid) {
                Some(s) if settled(&s) => Some(s),
                Some(_) if self.is_driving(gid) && !expired => None,
                _ => Some(self.reads.load(gid).await?),
            };
            if let Some(stored) = stored
                && (settled(&stored) || expired)
            {
                return Ok(stored);
            }
            // The notification comes from this process's driver; a transaction driven by
            // another coordinator is noticed by re-reading now and then.
            let poll = tokio::time::Instant::now() + Duration::from_millis(500);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(poll.min(deadline)) => {}
                _ = self.stopping.cancelled() => {}
            }
        }
    }

    pub(super) fn notify(&self, gid: &str) {
        let notify = self.waiters.lock().expect("poisoned").remove(gid);
        if let Some(notify) = notify {
            notify.notify_waiters();
        }
    }
}

/// One wait's registration for a gid's notification. Dropped on every way out of a wait
/// (settled, expired, the client gone), it removes the entry once no one else waits, so a
/// wait that is never notified leaves nothing behind.
struct Waiter<'a> {
    engine: &'a Engine,
    gid: &'a str,
    notify: Arc<Notify>,
}

impl<'a> Waiter<'a> {
    fn new(engine: &'a Engine, gid: &'a str) -> Waiter<'a> {
        let mut waiters = engine.waiters.lock().expect("poisoned");
        let notify = Arc::clone(waiters.entry(gid.to_owned()).or_default());
        Waiter {
            engine,
            gid,
            notify,
        }
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut waiters = self.engine.waiters.lock().expect("poisoned");
        // The map's reference and ours: nobody else waits on this one.
        if let Some(entry) = waiters.get(self.gid)
            && Arc::ptr_eq(entry, &self.notify)
            && Arc::strong_count(entry) <= 2
        {
            waiters.remove(self.gid);
        }
    }
}

impl Engine {
    /// Gids someone waits on now (for tests of the bound).
    pub fn waiting(&self) -> usize {
        self.waiters.lock().expect("poisoned").len()
    }
}

/// Recent states of transactions this process created, changed or drives, so that a
/// submit after a create, and a wait after a submit, need no read. A finished one is kept
/// only long enough for the waits on it to read it (the newest `FINISHED_KEPT`), so a
/// coordinator that runs for months holds about as much as it has in flight.
#[derive(Default)]
pub(super) struct Recent {
    inner: Mutex<RecentInner>,
}

#[derive(Default)]
struct RecentInner {
    map: HashMap<String, StoredTx>,
    /// Gids of finished entries, oldest first (a gid may appear twice if put twice).
    finished: VecDeque<String>,
}

/// Finished states kept for late waits and repeats; older ones are read again if asked.
const FINISHED_KEPT: usize = 2_048;
/// Unfinished states kept at most: about what this process drives at once (see
/// `EngineConfig::max_driving`) plus room for prepared TCCs awaiting their submit. Past
/// it the cache starts over, which costs reads, not correctness: with 100,000 sagas in
/// flight and most of them waiting in the database, a bound of 50,000 held some 60 MB
/// of states nobody here would read.
const ACTIVE_KEPT: usize = 8_192;

impl Recent {
    pub(super) fn get(&self, gid: &str) -> Option<StoredTx> {
        self.inner.lock().expect("poisoned").map.get(gid).cloned()
    }

    pub(super) fn put(&self, stored: StoredTx) {
        let mut inner = self.inner.lock().expect("poisoned");
        let RecentInner { map, finished } = &mut *inner;
        if stored.tx.status.is_terminal() {
            finished.push_back(stored.tx.gid.clone());
            while finished.len() > FINISHED_KEPT {
                let old = finished.pop_front().expect("longer than the bound");
                if map.get(&old).is_some_and(|s| s.tx.status.is_terminal()) {
                    map.remove(&old);
                }
            }
        } else if map.len() >= ACTIVE_KEPT + FINISHED_KEPT && !map.contains_key(&stored.tx.gid) {
            map.clear();
            finished.clear();
        }
        map.insert(stored.tx.gid.clone(), stored);
    }

    pub(super) fn remove(&self, gid: &str) {
        self.inner.lock().expect("poisoned").map.remove(gid);
    }

    /// Entries held (for tests of the bound).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().expect("poisoned").map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Kind, Transaction, TxOptions};

    fn stored(gid: &str, status: Status) -> StoredTx {
        let mut tx = Transaction::prepared(gid, Kind::Saga, TxOptions::default(), 0);
        tx.status = status;
        StoredTx {
            tx,
            request_hash: String::new(),
            owner_token: None,
            lease_until: None,
            version: 1,
        }
    }

    #[test]
    fn finished_states_are_kept_only_up_to_their_bound() {
        let recent = Recent::default();
        recent.put(stored("active", Status::Running));
        for i in 0..FINISHED_KEPT * 3 {
            recent.put(stored(&format!("g{i}"), Status::Succeeded));
        }
        assert_eq!(recent.len(), FINISHED_KEPT + 1);
        // The unfinished one survives the churn; the newest finished ones are there.
        assert!(recent.get("active").is_some());
        assert!(recent.get(&format!("g{}", FINISHED_KEPT * 3 - 1)).is_some());
        assert!(recent.get("g0").is_none());
    }

    #[test]
    fn a_finished_entry_made_unfinished_again_is_not_dropped_with_its_old_place() {
        let recent = Recent::default();
        recent.put(stored("again", Status::Failed));
        recent.put(stored("again", Status::Running));
        for i in 0..FINISHED_KEPT {
            recent.put(stored(&format!("g{i}"), Status::Succeeded));
        }
        assert_eq!(
            recent.get("again").map(|s| s.tx.status),
            Some(Status::Running)
        );
    }
}

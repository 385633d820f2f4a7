//! Waiting for an outcome, and the recent states that spare reads.

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
                _ => Some(self.load(gid).await?),
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
/// submit after a create, and a wait after a submit, need no read. Bounded: past the cap,
/// finished ones go first.
#[derive(Default)]
pub(super) struct Recent {
    map: Mutex<HashMap<String, StoredTx>>,
}

const RECENT_CAP: usize = 50_000;

impl Recent {
    pub(super) fn get(&self, gid: &str) -> Option<StoredTx> {
        self.map.lock().expect("poisoned").get(gid).cloned()
    }

    pub(super) fn put(&self, stored: StoredTx) {
        let mut map = self.map.lock().expect("poisoned");
        if map.len() >= RECENT_CAP && !map.contains_key(&stored.tx.gid) {
            map.retain(|_, s| !s.tx.status.is_terminal());
            if map.len() >= RECENT_CAP {
                map.clear();
            }
        }
        map.insert(stored.tx.gid.clone(), stored);
    }

    pub(super) fn remove(&self, gid: &str) {
        self.map.lock().expect("poisoned").remove(gid);
    }
}

//! Storing a transaction's new state: the one way the engine writes one, whoever made the
//! change (a client's or operator's request, a driver's round, a stall). What surrounds a
//! write is here once: a decision's points before and after it, the status change
//! observed, and the copy as the row now holds it (version, owner, lease) kept in the
//! recent cache, as a create keeps its new row.

use super::*;

/// A new state, to be written over the row as read or last written.
pub(super) struct Change<'a> {
    /// The row the write is conditional on: its state is the one before, its version the
    /// one expected.
    pub stored: &'a StoredTx,
    pub after: &'a Transaction,
    /// A driver's token: the write is also conditional on it ([`Guard::Owner`]). `None`:
    /// a request's write, on the version alone, which takes the row over
    /// ([`Guard::Version`]).
    pub owner: Option<&'a str>,
    /// The calls of the round that did not simply succeed, numbered (`history::number`).
    pub attempts: &'a [AttemptRecord],
}

/// What a write does when the database fails it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnError {
    /// Gives up: a request's caller gets the error and may ask again.
    Fail,
    /// Tries again while the error lasts (see [`Engine::save_with_retries`]): a driver
    /// holds answers nobody else has.
    Retry,
}

impl Engine {
    /// Writes `change`, with the lease `lease` gives (`None` releases the row), and returns
    /// the row as now stored; `Ok(None)`: the write lost, the row is no longer the one
    /// read (or no longer this driver's). The lease is worked out after a decision's
    /// first point, as it always was: a pause there (the lab's faults) must not shorten it.
    pub(super) async fn save_state(
        &self,
        change: Change<'_>,
        lease: impl FnOnce() -> Option<Lease>,
        on_error: OnError,
    ) -> Result<Option<StoredTx>, StoreError> {
        let Change {
            stored,
            after,
            owner,
            attempts,
        } = change;
        let gid = after.gid.as_str();
        let decision = is_decision(&stored.tx, after);
        if decision {
            self.observer.point(Point::BeforeDecisionStored, gid);
        }
        let lease = lease();
        let save = Save {
            before: &stored.tx,
            after,
            guard: match owner {
                Some(token) => Guard::Owner(token, stored.version),
                None => Guard::Version(stored.version),
            },
            lease: lease.as_ref(),
            attempts,
        };
        let saved = match on_error {
            OnError::Fail => self.store.save(save).await? == Saved::Saved,
            OnError::Retry => self.save_with_retries(save).await?,
        };
        if !saved {
            return Ok(None);
        }
        let now_stored = self.record_saved(
            after.clone(),
            stored.request_hash.clone(),
            stored.version + 1,
            lease.as_ref(),
        );
        self.observe_status(&stored.tx, after);
        if decision {
            self.observer.point(Point::AfterDecisionStored, gid);
        }
        Ok(Some(now_stored))
    }

    /// A state just written, as its row now holds it (the lease's token as owner), kept in
    /// the recent cache so that the next request or wait on it needs no read.
    pub(super) fn record_saved(
        &self,
        tx: Transaction,
        request_hash: String,
        version: i64,
        lease: Option<&Lease>,
    ) -> StoredTx {
        let stored = StoredTx {
            tx,
            request_hash,
            owner_token: lease.map(|l| l.token.clone()),
            lease_until: lease.map(|l| l.until),
            version,
        };
        self.recent.put(stored.clone());
        stored
    }

    pub(super) fn observe_status(&self, before: &Transaction, after: &Transaction) {
        if before.status != after.status {
            self.observer
                .status(&after.gid, before.status, after.status, after.updated_at);
            self.observer.changed(before, after);
        }
    }

    /// Stores a state, retrying transient database errors for as long as they last: the
    /// driver holds answers nobody else has, and giving up would leave recovery to send
    /// those calls again. Its own recovery loop leaves the transaction alone meanwhile
    /// (it skips what this process drives); another coordinator may take it once the
    /// lease lapses, and then the save is lost, as it must be. Ok(false): the row is not
    /// ours. Gives up only when the process stops, or on an error no retry can cure.
    async fn save_with_retries(&self, save: Save<'_>) -> Result<bool, StoreError> {
        let gid = save.after.gid.as_str();
        let mut delay = Duration::from_millis(50);
        let mut failed = false;
        loop {
            let error = match self.store.save(save.clone()).await {
                Ok(Saved::Saved) => return Ok(true),
                // A retry after an error whose commit did land looks like a lost race:
                // ask the stored row whether it is exactly what we wrote.
                Ok(Saved::Lost) if failed => match self.store.load(gid).await {
                    Ok(stored) => return Ok(stored.is_some_and(|s| is_our_save(&s, &save))),
                    Err(e) => e,
                },
                Ok(Saved::Lost) => return Ok(false),
                Err(e) => e,
            };
            if error.is_permanent() || self.stopping.is_cancelled() {
                return Err(error);
            }
            tracing::warn!(gid, error = %error, "store write failed; retrying");
            failed = true;
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = self.stopping.cancelled() => return Err(error),
            }
            delay = (delay * 2).min(SAVE_RETRY_CAP);
        }
    }
}

/// The lease a row holds, if any.
pub(super) fn lease_of(stored: &StoredTx) -> Option<Lease> {
    let token = stored.owner_token.clone()?;
    let until = stored.lease_until?;
    Some(Lease { token, until })
}

/// The longest pause between two tries of a save the database failed.
const SAVE_RETRY_CAP: Duration = Duration::from_secs(2);

/// Whether the stored row is exactly what `save` wrote: its state, its owner, and the
/// version right after the one it expected.
fn is_our_save(stored: &StoredTx, save: &Save<'_>) -> bool {
    let expected = match save.guard {
        Guard::Owner(_, version) | Guard::Version(version) => version,
    };
    stored.owner_token.as_deref() == save.lease.map(|l| l.token.as_str())
        && stored.version == expected + 1
        && stored.tx == *save.after
}

/// A move into a phase whose calls must not go out before it is stored.
pub(super) fn is_decision(before: &Transaction, after: &Transaction) -> bool {
    before.status != after.status && matches!(after.status, Status::Committing | Status::Aborting)
}

//! What the front doors read, through one handle ([`Reads`], from [`Engine::reads`]): the
//! HTTP API's doors and console, the metrics' sampler, and `idem tx --database-url`, which
//! reads a database no coordinator serves the same way. The native door's reads come as
//! its views (`views`); the DTM door and the console shape their own from the rows, whose
//! types are named here. Nothing outside the engine reads transactions from the store
//! (tokens are `auth`'s, through its `TokenAdmin`), so a cache or a read policy has one
//! place to go.

use std::sync::Arc;
use std::time::Duration;

use super::views::{AttemptPageView, HISTORY_IN_VIEW, PageView, TxView, page_view, tx_view};
use super::{Engine, EngineError};
use crate::core::{Millis, Status};
use crate::store::{Store, StoreError};
use crate::tenant::client_gid;

pub use crate::store::{
    AttemptRecord, CoordinatorSeen, ListFilter, Overview, Page, StatusSummary, StoredTx,
};

/// Reads of the transactions: cheap to clone, it shares the engine's store.
#[derive(Clone)]
pub struct Reads {
    store: Arc<dyn Store>,
}

impl Engine {
    /// The handle every read goes through.
    pub fn reads(&self) -> &Reads {
        &self.reads
    }
}

impl Reads {
    pub(super) fn new(store: Arc<dyn Store>) -> Reads {
        Reads { store }
    }

    /// The transaction as stored, or `None`: for a door that answers an unknown gid with
    /// an empty result rather than an error (DTM's `query`).
    pub async fn find(&self, key: &str) -> Result<Option<StoredTx>, EngineError> {
        Ok(self.store.load(key).await?)
    }

    /// The transaction as stored; not found is an error.
    pub async fn load(&self, key: &str) -> Result<StoredTx, EngineError> {
        self.find(key)
            .await?
            .ok_or_else(|| EngineError::NotFound(client_gid(key).to_owned()))
    }

    /// The transaction as the native door shows it, with the newest [`HISTORY_IN_VIEW`]
    /// records of its history (numbers are consecutive, so they are found from the
    /// stored counts alone).
    pub async fn view(&self, key: &str) -> Result<TxView, EngineError> {
        let stored = self.load(key).await?;
        let tx = &stored.tx;
        let after = (tx.history - i64::from(HISTORY_IN_VIEW)).max(tx.history_dropped);
        let history = self.history(key, after, HISTORY_IN_VIEW).await?;
        Ok(tx_view(&stored, Some(history)))
    }

    /// A page of the transaction's kept history: at most `limit` records numbered above
    /// `after` (and above those no longer kept), oldest first.
    pub async fn attempts(
        &self,
        key: &str,
        after: i64,
        limit: u32,
    ) -> Result<AttemptPageView, EngineError> {
        let stored = self.load(key).await?;
        let tx = &stored.tx;
        let records = self
            .history(key, after.max(tx.history_dropped), limit)
            .await?;
        // As the list does: a full page may have a next one.
        let next_cursor = (records.len() == limit as usize)
            .then(|| records.last().map(|r| r.number.to_string()))
            .flatten();
        Ok(AttemptPageView {
            gid: client_gid(key).to_owned(),
            attempts: super::views::shown_records(records),
            total: tx.history,
            dropped: tx.history_dropped,
            next_cursor,
        })
    }

    async fn history(
        &self,
        key: &str,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AttemptRecord>, EngineError> {
        Ok(self.store.attempts(key, after, limit).await?)
    }

    /// One page of transactions, newest first, without their branches. The filter's
    /// `limit` is taken as given: the doors check it (`api::validate::list_limit`).
    pub async fn list(&self, filter: &ListFilter) -> Result<Page, EngineError> {
        Ok(self.store.list(filter).await?)
    }

    /// [`Reads::list`] as the native door shows it.
    pub async fn page(&self, filter: &ListFilter) -> Result<PageView, EngineError> {
        Ok(page_view(&self.list(filter).await?))
    }

    /// How many of `tenant`'s transactions are not finished (stalled ones included): the
    /// per-tenant cap's count.
    pub async fn count_unfinished(&self, tenant: &str) -> Result<u64, EngineError> {
        let statuses = [
            Status::Prepared,
            Status::Running,
            Status::Committing,
            Status::Aborting,
            Status::Stalled,
        ];
        Ok(self.store.count(Some(tenant), &statuses).await?)
    }

    /// The non-terminal transactions per status, and the oldest's creation time (the
    /// metrics' sampler).
    pub async fn active_summary(&self) -> Result<Vec<StatusSummary>, StoreError> {
        self.store.active_summary().await
    }

    /// One tenant's overview for the console: counts, the `limit` oldest stalled and
    /// active transactions, and creations and finishes per minute from `since` on.
    pub async fn overview(
        &self,
        tenant: &str,
        since: Millis,
        limit: u32,
    ) -> Result<Overview, EngineError> {
        Ok(self.store.overview(tenant, since, limit).await?)
    }

    /// The coordinators whose recovery loop ran at or after `since`.
    pub async fn coordinators(&self, since: Millis) -> Result<Vec<CoordinatorSeen>, EngineError> {
        Ok(self.store.coordinators(since).await?)
    }

    /// Whether the database answers within `timeout` (readiness; see
    /// [`super::READY_TIMEOUT`]).
    pub async fn ping_database(&self, timeout: Duration) -> Result<(), StoreError> {
        self.store.ping(timeout).await
    }

    /// The database's kind (`sqlite`, `postgres`, `mysql`), for health answers and logs.
    pub fn database(&self) -> &'static str {
        self.store.backend()
    }
}

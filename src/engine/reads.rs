//! What the front doors read: a transaction, its retry history, a page of the list, and
//! whether the database answers. They go through here rather than to the store, so the
//! engine is the one way into the data (and the one place a cache or a read policy would
//! go).

use std::time::Duration;

use super::{Engine, EngineError};
use crate::core::Status;
use crate::store::{AttemptRecord, ListFilter, Page, StatusSummary, StoreError, StoredTx};

impl Engine {
    /// The transaction as stored, or `None`: for a door that answers an unknown gid with
    /// an empty result rather than an error (DTM's `query`).
    pub async fn find(&self, gid: &str) -> Result<Option<StoredTx>, EngineError> {
        Ok(self.store.load(gid).await?)
    }

    /// Every call of the transaction that did not simply succeed, oldest first.
    pub async fn history(&self, gid: &str) -> Result<Vec<AttemptRecord>, EngineError> {
        Ok(self.store.attempts(gid).await?)
    }

    /// One page of transactions, newest first, without their branches. The filter's
    /// `limit` is taken as given: the doors check it (`api::validate::check_list_limit`).
    pub async fn list(&self, filter: &ListFilter) -> Result<Page, EngineError> {
        Ok(self.store.list(filter).await?)
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

    /// Every API token as stored (hashes, never secrets).
    pub async fn tokens(&self) -> Result<Vec<crate::store::TokenRecord>, EngineError> {
        Ok(self.store.tokens().await?)
    }

    /// Issues an API token (see [`crate::auth::tokens::issue`]).
    pub async fn issue_token(
        &self,
        tenant: &str,
        role: crate::auth::Role,
        label: &str,
    ) -> Result<crate::auth::tokens::Issued, crate::auth::tokens::IssueError> {
        crate::auth::tokens::issue(self.store.as_ref(), tenant, role, label, self.now()).await
    }

    /// Revokes a token; false when no live token has that id.
    pub async fn revoke_token(
        &self,
        id: &str,
        now: crate::core::Millis,
    ) -> Result<bool, EngineError> {
        Ok(self.store.revoke_token(id, now).await?)
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
        since: crate::core::Millis,
        limit: u32,
    ) -> Result<crate::store::Overview, EngineError> {
        Ok(self.store.overview(tenant, since, limit).await?)
    }

    /// The coordinators whose recovery loop ran at or after `since`.
    pub async fn coordinators(
        &self,
        since: crate::core::Millis,
    ) -> Result<Vec<crate::store::CoordinatorSeen>, EngineError> {
        Ok(self.store.coordinators(since).await?)
    }

    /// Whether the database answers within `timeout` (readiness).
    pub async fn ping_database(&self, timeout: Duration) -> Result<(), StoreError> {
        self.store.ping(timeout).await
    }

    /// The database's kind (`sqlite`, `postgres`, `mysql`), for health answers and logs.
    pub fn database(&self) -> &'static str {
        self.store.backend()
    }
}

//! Every call to a server database, bounded in time.
//!
//! The pools bound opening a connection and waiting for one, but a statement sent on an
//! open connection to a server that stopped answering (a partition: packets dropped, no
//! reset) would wait for the operating system's TCP timeout, many minutes. [`Bounded`]
//! cuts each store call at `call_timeout` instead and reports it as
//! [`StoreError::TimedOut`], which the engine retries like a lost connection and the API
//! answers as `503 unavailable`. A cut write is as ambiguous as a lost connection, which
//! every caller already handles: writes are conditional, and the cut connection is closed,
//! never reused mid-statement.
//!
//! A call that fails for a reason other than its data also marks the store's
//! [`Suspicion`], so that the connections idle since are checked before their next use.
//! Every failed call is counted by kind (`idem_store_errors_total`); SQLite goes through
//! here for that alone, uncut ([`Bounded::uncut`]): it has no network to be cut from.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::pools::Suspicion;
use super::*;

pub struct Bounded {
    inner: Arc<dyn Store>,
    call_timeout: Option<Duration>,
    suspicion: Suspicion,
}

impl Bounded {
    pub fn new(inner: Arc<dyn Store>, call_timeout: Duration, suspicion: Suspicion) -> Bounded {
        Bounded {
            inner,
            call_timeout: Some(call_timeout),
            suspicion,
        }
    }

    /// Counts the errors of `inner` without cutting its calls.
    pub fn uncut(inner: Arc<dyn Store>) -> Bounded {
        Bounded {
            inner,
            call_timeout: None,
            suspicion: Suspicion::default(),
        }
    }

    async fn within<T>(
        &self,
        limit: Option<Duration>,
        call: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let result = match limit {
            Some(limit) => match tokio::time::timeout(limit, call).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::TimedOut(limit)),
            },
            None => call.await,
        };
        if let Err(e) = &result {
            if let Some(kind) = e.kind() {
                super::metrics::error(kind);
            }
            if !e.is_permanent() {
                self.suspicion.mark();
            }
        }
        result
    }

    async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        self.within(self.call_timeout, call).await
    }
}

#[async_trait::async_trait]
impl Store for Bounded {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn ping(&self, timeout: Duration) -> Result<()> {
        let limit = self.call_timeout.map(|c| c.min(timeout));
        self.within(limit, self.inner.ping(timeout)).await
    }

    async fn migrate(&self) -> Result<()> {
        // Not cut: a migration may rewrite a large table, and it runs before serving.
        self.inner.migrate().await
    }

    async fn create(
        &self,
        tx: &Transaction,
        request_hash: &str,
        lease: Option<&Lease>,
    ) -> Result<Created> {
        self.call(self.inner.create(tx, request_hash, lease)).await
    }

    async fn load(&self, gid: &str) -> Result<Option<StoredTx>> {
        self.call(self.inner.load(gid)).await
    }

    async fn register(
        &self,
        gid: &str,
        branches: &[Branch],
        now: Millis,
        access: Access,
    ) -> Result<Registered> {
        self.call(self.inner.register(gid, branches, now, access))
            .await
    }

    async fn save(&self, save: Save<'_>) -> Result<Saved> {
        self.call(self.inner.save(save)).await
    }

    async fn claim_due_of(
        &self,
        lease: &Lease,
        now: Millis,
        limit: u32,
        held: &[String],
        tenants: TenantScope<'_>,
    ) -> Result<Vec<Claimed>> {
        self.call(self.inner.claim_due_of(lease, now, limit, held, tenants))
            .await
    }

    async fn renew(&self, gid: &str, token: &str, until: Millis) -> Result<bool> {
        self.call(self.inner.renew(gid, token, until)).await
    }

    async fn release(&self, gid: &str, token: &str, now: Millis) -> Result<bool> {
        self.call(self.inner.release(gid, token, now)).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page> {
        self.call(self.inner.list(filter)).await
    }

    async fn attempts(&self, gid: &str, after: i64, limit: u32) -> Result<Vec<AttemptRecord>> {
        self.call(self.inner.attempts(gid, after, limit)).await
    }

    async fn release_node(&self, token_prefix: &str) -> Result<u64> {
        self.call(self.inner.release_node(token_prefix)).await
    }

    async fn count(&self, tenant: Option<&str>, statuses: &[Status]) -> Result<u64> {
        self.call(self.inner.count(tenant, statuses)).await
    }

    async fn insert_token(&self, token: &TokenRecord) -> Result<bool> {
        self.call(self.inner.insert_token(token)).await
    }

    async fn tokens(&self) -> Result<Vec<TokenRecord>> {
        self.call(self.inner.tokens()).await
    }

    async fn revoke_token(&self, id: &str, now: Millis) -> Result<bool> {
        self.call(self.inner.revoke_token(id, now)).await
    }

    async fn active_summary(&self) -> Result<Vec<StatusSummary>> {
        self.call(self.inner.active_summary()).await
    }

    async fn overview(&self, tenant: &str, since: Millis, limit: u32) -> Result<Overview> {
        self.call(self.inner.overview(tenant, since, limit)).await
    }

    async fn coordinator_seen(
        &self,
        node: &str,
        now: Millis,
        claimed_at: Option<Millis>,
    ) -> Result<()> {
        self.call(self.inner.coordinator_seen(node, now, claimed_at))
            .await
    }

    async fn coordinators(&self, since: Millis) -> Result<Vec<CoordinatorSeen>> {
        self.call(self.inner.coordinators(since)).await
    }

    async fn db_now(&self) -> Result<Millis> {
        self.call(self.inner.db_now()).await
    }

    async fn purge_finished(&self, finished_before: Millis, limit: u32) -> Result<Purged> {
        self.call(self.inner.purge_finished(finished_before, limit))
            .await
    }
}

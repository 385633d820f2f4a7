//! Operators' actions on many transactions at once: after an outage, 300 stalled
//! transactions are retried with one command, not 300.
//!
//! A bulk action selects by filter (status, kind, created before a time) within one tenant
//! (or every tenant, for the operator's direct view of the database), takes at most
//! `limit` of them, oldest first, and applies the operation to each exactly as the
//! single-transaction operation does, reporting each one's outcome. A dry run selects the
//! same and changes nothing. The bound is per call: repeating the call reaches the next
//! ones, since those done no longer match (a retried transaction is no longer stalled).

use std::sync::Arc;

use super::{Engine, EngineError};
use crate::core::{Access, Status};
use crate::store::ListFilter;

/// The most transactions one bulk call acts on.
pub const MAX_BULK: u32 = 500;

/// Which operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkOperation {
    Retry,
    ForceStop,
    Abort,
}

/// What a bulk action selects and does.
#[derive(Clone, Debug)]
pub struct BulkRequest {
    pub operation: BulkOperation,
    /// The selection; its `limit` (at most [`MAX_BULK`]) bounds the call.
    pub filter: ListFilter,
    /// Recorded on force-stops and aborts.
    pub reason: String,
    pub dry_run: bool,
}

/// One selected transaction and what became of it.
#[derive(Debug)]
pub struct BulkOutcome {
    /// The storage key (`tenant/gid` beyond the default tenant).
    pub key: String,
    /// Its status when selected.
    pub before: Status,
    /// Its status after the operation, or why the operation was refused; `None` in a
    /// dry run.
    pub after: Option<Result<Status, EngineError>>,
}

/// What a bulk call did.
#[derive(Debug)]
pub struct BulkReport {
    pub outcomes: Vec<BulkOutcome>,
    /// More transactions matched than this call took.
    pub more: bool,
}

impl Engine {
    /// Selects by `request.filter`, oldest first, and applies the operation to each (see
    /// the module's docs). `access` is the caller's, as for one transaction.
    pub async fn bulk(
        self: &Arc<Self>,
        request: &BulkRequest,
        access: Access,
    ) -> Result<BulkReport, EngineError> {
        let limit = request.filter.limit.clamp(1, MAX_BULK);
        // The oldest have waited longest; one more than taken tells whether more match.
        let filter = ListFilter {
            limit: limit + 1,
            after: None,
            oldest_first: true,
            ..request.filter.clone()
        };
        let mut page = self.reads().list(&filter).await?.items;
        let more = page.len() > limit as usize;
        page.truncate(limit as usize);
        let mut outcomes = Vec::with_capacity(page.len());
        for stored in page {
            let key = stored.tx.gid.clone();
            let before = stored.tx.status;
            let after = if request.dry_run {
                None
            } else {
                let done = match request.operation {
                    BulkOperation::Retry => self.retry(&key).await,
                    BulkOperation::ForceStop => self.force_stop(&key, &request.reason).await,
                    BulkOperation::Abort => self
                        .abort(&key, &request.reason, access)
                        .await
                        .map(|(s, _)| s),
                };
                Some(done.map(|s| s.tx.status))
            };
            outcomes.push(BulkOutcome { key, before, after });
        }
        Ok(BulkReport { outcomes, more })
    }
}

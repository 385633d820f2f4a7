//! The cap on a tenant's unfinished transactions (`--max-active-per-tenant`).
//!
//! Counting on every create would put a query in front of each one, so a tenant's count
//! is read at most once per [`RECOUNT_EVERY`] and the creates this coordinator lets
//! through in between are added to it. The cap is a guard against runaway work, not an
//! exact quota: coordinators that share a database each see the others' creates only at
//! their next count, so a burst across N of them can pass the cap by what they admit
//! in one interval.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use super::error::ApiError;
use crate::engine::Engine;

/// How long a tenant's count is trusted.
pub const RECOUNT_EVERY: Duration = Duration::from_secs(1);

pub struct ActiveCap {
    /// 0: no cap.
    limit: u64,
    counts: Mutex<HashMap<String, (Instant, u64)>>,
}

impl ActiveCap {
    pub fn new(limit: u64) -> ActiveCap {
        ActiveCap {
            limit,
            counts: Mutex::new(HashMap::new()),
        }
    }

    /// Refuses (429 `tenant_active_limit`) a create that would take `tenant` past the cap.
    pub async fn admit(&self, engine: &Engine, tenant: &str) -> Result<(), ApiError> {
        if self.limit == 0 {
            return Ok(());
        }
        let cached = self.counts.lock().expect("cap lock").get(tenant).copied();
        let count = match cached {
            Some((at, count)) if at.elapsed() < RECOUNT_EVERY => count,
            _ => {
                let count = engine.reads().count_unfinished(tenant).await?;
                self.counts
                    .lock()
                    .expect("cap lock")
                    .insert(tenant.to_owned(), (Instant::now(), count));
                count
            }
        };
        if count >= self.limit {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "tenant_active_limit",
                format!(
                    "the tenant has {count} unfinished transactions, the most allowed is {}; \
                     retry when some have finished",
                    self.limit
                ),
            ));
        }
        if let Some(entry) = self.counts.lock().expect("cap lock").get_mut(tenant) {
            entry.1 += 1;
        }
        Ok(())
    }
}

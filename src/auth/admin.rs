//! The token table's one way in: issuing, listing and revoking API tokens, for the API's
//! `/api/v1/tokens`, `idem token` on the database, and the [`TokenCache`](super::cache)
//! that verifies them.

use std::sync::Arc;

use super::Role;
use super::tokens::{IssueError, Issued, issue};
use crate::core::Millis;
use crate::store::{Store, StoreError};

pub use crate::store::TokenRecord;

/// Tokens on the coordinator's database: cheap to clone, it shares the store.
#[derive(Clone)]
pub struct TokenAdmin {
    store: Arc<dyn Store>,
}

impl TokenAdmin {
    pub fn new(store: Arc<dyn Store>) -> TokenAdmin {
        TokenAdmin { store }
    }

    /// Every token as stored (hashes, never secrets), revoked ones too.
    pub async fn list(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.store.tokens().await
    }

    /// Issues a token (see [`issue`]) created at `now`.
    pub async fn issue(
        &self,
        tenant: &str,
        role: Role,
        label: &str,
        now: Millis,
    ) -> Result<Issued, IssueError> {
        issue(self.store.as_ref(), tenant, role, label, now).await
    }

    /// The database's time: what `idem token` stamps an issue or a revocation with, as a
    /// coordinator does with its clock kept to the database's.
    pub async fn now(&self) -> Result<Millis, StoreError> {
        self.store.db_now().await
    }

    /// Revokes a token at `now`; false when no live token has that id.
    pub async fn revoke(&self, id: &str, now: Millis) -> Result<bool, StoreError> {
        self.store.revoke_token(id, now).await
    }
}

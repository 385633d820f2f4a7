//! Canonical JSON and request hashes live in `idem-canonical`, shared with the participant
//! SDK so that a participant's Idempotency-Key layer hashes requests as the coordinator does.
//! Here: what a create request hands the engine so that it can tell a repeat.

pub use idem_canonical::{canonical_json, request_hash, same_up_to_numbers};

use serde_json::Value;

use crate::core::TxOptions;

/// A create request as the engine recognises its repeats (the API builds it, see
/// `api::identity`). Its canonical form takes every option it leaves out from this server's
/// defaults, and its hash is stored with the transaction it creates. A repeat arriving
/// after those defaults changed (a restart with other flags, another configuration file,
/// an upgrade) resolves differently, so it is also judged as of the stored transaction:
/// with the options it leaves out taken from that transaction's.
pub trait CanonicalRequest: Send + Sync + std::fmt::Debug {
    /// The hash of the request with this server's defaults, stored with a new
    /// transaction: [`request_hash`] of its canonical form.
    fn hash(&self) -> String;

    /// The hashes of the canonical forms this request had if it created a transaction
    /// whose options are `stored`: what it states laid over `stored`. More than one where
    /// `stored` cannot tell whether the first request stated a value or left it to a
    /// default that was filled after the hash (a prepared transaction's timeout).
    fn hashes_as_of(&self, stored: &TxOptions) -> Vec<String>;

    /// Whether this is the request that created a transaction stored with `stored_hash`
    /// and options `stored`: with today's defaults or as of those options, its form
    /// hashes as the stored one did.
    fn repeats(&self, stored_hash: &str, stored: &TxOptions) -> bool {
        self.hash() == stored_hash
            || self
                .hashes_as_of(stored)
                .iter()
                .any(|hash| hash == stored_hash)
    }
}

/// A request whose canonical form is fixed (an embedding program's own, a test's): it takes
/// no default, so its one form is the same as of any stored transaction.
impl CanonicalRequest for Value {
    fn hash(&self) -> String {
        request_hash(self)
    }

    fn hashes_as_of(&self, _stored: &TxOptions) -> Vec<String> {
        Vec::new()
    }
}

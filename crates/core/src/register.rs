//! Registration of TCC branch operations on a prepared transaction.

use super::machine::{CoreError, illegal};
use super::model::*;

/// Result of a branch registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// These operations are new and must be stored.
    New(Vec<Branch>),
    /// Every operation is already registered with the same URL and payload.
    AlreadyRegistered,
}

/// Registers TCC branch operations (Confirm and Cancel, optionally Try) on a prepared
/// transaction. Registering the same operation again with the same URL and payload is a
/// harmless repeat; with a different URL or payload it is a conflict.
pub fn register(
    tx: &Transaction,
    branches: Vec<Branch>,
    _now: Millis,
) -> Result<Registration, CoreError> {
    if tx.kind != Kind::Tcc || tx.status != Status::Prepared {
        return Err(illegal(tx, "register a branch on"));
    }
    let mut new = Vec::new();
    for branch in branches {
        match tx.branch(&branch.key()) {
            Some(existing) if existing.url == branch.url && existing.payload == branch.payload => {}
            Some(_) => return Err(CoreError::BranchConflict(branch.key())),
            None => new.push(branch),
        }
    }
    Ok(if new.is_empty() {
        Registration::AlreadyRegistered
    } else {
        Registration::New(new)
    })
}

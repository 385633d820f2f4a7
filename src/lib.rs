//! idem: a TCC/Saga branch-transaction coordinator.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

pub mod canonical;
pub mod core;
pub mod store;

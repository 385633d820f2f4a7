//! idem: a TCC/Saga branch-transaction coordinator.
//!
//! See `ARCHITECTURE.md` for the map of this crate.

pub mod api;
pub mod auth;
pub mod canonical;
pub mod cli;
pub mod console;
pub mod core;
pub mod engine;
pub mod http_server;
pub mod metrics;
pub mod outbound;
pub mod retention;
pub mod server;
pub mod signing;
pub mod store;
pub mod telemetry;
pub mod tenant;
pub mod timestamp;
pub mod tls;
pub mod trace;
pub mod transport;

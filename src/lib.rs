//! idem: a TCC/Saga branch-transaction coordinator.
//!
//! See `ARCHITECTURE.md` for the map of this crate.
//!
//! # Floors
//!
//! Each module stands on a floor and imports (`crate::…`) only from floors below its own,
//! never from one beside it or above: so no two modules depend on each other, directly or
//! around a circle. `tests/it/layering.rs` reads this list and checks every `crate::` path in
//! `src/` (unit-test files excepted); a new module must be given a floor here.
//!
//! 0. `core`, `store`: crates of their own (`crates/core`, `crates/store`), re-exported.
//! 1. `canonical`, `reload`, `tenant`, `timestamp`, `trace`: small helpers over the core's
//!    types.
//! 2. `auth`, `retention`: on the store: tokens and callers; finished transactions deleted.
//! 3. `outbound`, `signing`, `tls`: where calls may go, how they are signed, certificates.
//! 4. `http_server`, `telemetry`, `transport`: serving HTTP, exporting traces, calling
//!    participants.
//! 5. `engine`: drives transactions with the core, the store and the transport; reports
//!    through its `Observer`.
//! 6. `metrics`: what the engine reports, counted; the database's gauges sampled.
//! 7. `api`: both doors, the console, health and `/metrics`.
//! 8. `server`: a coordinator assembled and started.
//! 9. `cli`: the `idem` command.

pub mod api;
pub mod auth;
pub mod canonical;
pub mod cli;
pub mod engine;
pub mod http_server;
pub mod metrics;
pub mod outbound;
pub mod reload;
pub mod retention;
pub mod server;
pub mod signing;
pub mod telemetry;
pub mod tenant;
pub mod timestamp;
pub mod tls;
pub mod trace;
pub mod transport;

// The pure core and the store are crates of their own (`crates/core`, `crates/store`);
// these names keep `crate::core::…` and `idem::store::…` paths working.
pub use idem_core as core;
pub use idem_store as store;

//! The SQL plumbing that both sides of idem share: the coordinator's store (`idem-store`)
//! and the participant SDK (`idem-participant`).
//!
//! - [`Backend`]: which database a URL or a connection names (SQLite, PostgreSQL,
//!   MySQL/MariaDB), with what differs between them in the SQL both sides send: the
//!   placeholder style and the statement that opens a write transaction.
//! - [`rewrite_placeholders`]: SQL written once with `?` placeholders, made ready for a
//!   backend that numbers them (`$1, $2, ...`).
//! - [`LeanPool`]: a connection pool whose hand-back costs no round trip, for the hot
//!   one-transaction writes of both sides.
//!
//! Nothing here knows about transactions, barriers or schemas: it depends on sqlx and tokio
//! only, so that neither the coordinator nor the SDK has to depend on the other.

#![warn(missing_docs)]

mod backend;
pub mod placeholders;
pub mod pool;

pub use backend::Backend;
pub use placeholders::{Placeholders, rewrite_placeholders};
pub use pool::{AfterConnect, LeanPool, LeanPoolOptions, Leased};

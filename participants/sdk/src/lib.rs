//! Participant SDK for idem: makes every TCC and saga branch step exactly-once.
//!
//! A coordinator retries. Networks drop responses. A Cancel can overtake its own Try. So a
//! participant's Try/Confirm/Cancel and action/compensate handlers are called any number of
//! times, in any order, concurrently; the business change must still happen once. This crate
//! does that with a barrier table in the participant's own database, written in the same
//! local transaction as the business change (see [`barrier`] for the algorithm):
//!
//! ```no_run
//! # use idem_participant::{Barrier, Op, Outcome, TransType};
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # struct Reserved { sku: String, n: i64 }
//! # async fn reserve(pool: sqlx::SqlitePool, gid: &str, branch_id: &str, sku: &str, n: i64)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! let outcome = Barrier::new(TransType::Tcc, gid, branch_id, Op::Try)?
//!     .run(&pool, |tx| async move {
//!         sqlx::query(tx.sql("UPDATE stock SET available = available - ? WHERE sku = ? AND available >= ?"))
//!             .bind(n).bind(sku).bind(n)
//!             .execute(&mut *tx.conn())
//!             .await?;
//!         Ok(Reserved { sku: sku.to_owned(), n })
//!     })
//!     .await?;
//! match outcome {
//!     Outcome::Executed(r) | Outcome::Duplicate(r) => { /* the first (and only) result */ }
//!     Outcome::EmptyRollback => { /* a Cancel whose Try never ran: nothing to undo */ }
//!     Outcome::Rejected => { /* a Try after its Cancel: answered with 409 */ }
//! }
//! # Ok(()) }
//! ```
//!
//! Every row is keyed by the call's tenant too (the `Idem-Tenant` header, [`tenant`]): two
//! tenants' same gid at one shared participant stay two transactions. [`BranchCall::barrier`]
//! takes the tenant from the call; [`Barrier::with_tenant`] sets it by hand. The closure's
//! transaction names the call it guards (`tx.call().tenant()`, `.gid()`, ...), for ledger
//! rows keyed like the barrier's.
//!
//! A TCC Confirm whose Try has not executed and committed never reaches its closure: it
//! comes back as [`ParticipantError::ConfirmWithoutTry`] (503, so the coordinator retries it
//! once the Try has committed), with nothing written.
//!
//! It runs on SQLite, PostgreSQL and MySQL/MariaDB, with typed sqlx pools or with
//! `sqlx::Any` (one binary, backend chosen by URL: see [`connect`]). The `axum` feature adds
//! the callback extractor and the outcome-to-status mapping ([`http`]).
//!
//! A coordinator with signing keys signs every call; [`signature`] verifies it (an axum
//! middleware, and [`signature::verify_call`] for other frameworks).
//!
//! [`Barrier::run`] opens each step's transaction on a `sqlx::Pool` or on a [`LeanPool`]
//! (see [`StepConnections`]); the lean pool saves the round trip sqlx's pool spends on
//! every release, one per step.
//!
//! # Floors
//!
//! The modules stand on floors. A module imports (`crate::…`, or `super::` up to the crate
//! root) only from floors below its own: never from a floor above, nor from another module
//! on its own floor. So no two modules import each other, even through others, and each
//! floor can be read and changed without the ones above it. `tests/it/floors.rs` checks every
//! import against this table, and refuses a module that is on no floor, or an import
//! through the crate root's re-exports (which would hide the module it comes from).
//!
//! | floor | modules | what they are |
//! |---|---|---|
//! | 0 | `error`, `backend`, `signature` | what a step can fail with, the database primitives, verifying signed calls; they import nothing of the crate |
//! | 1 | `tenant` | the tenant a call belongs to |
//! | 2 | `kit` | the ground floor: the branch call's key ([`BranchCall`]), the one local transaction guard ([`LocalTx`]) with its conflict retries and where its connections come from, the clock and owner tokens of claims, DDL, bounded deletes |
//! | 3 | `barrier`, `idempotency`, `callback`, `consumer`, `jobs` | the tools, each with its own table and protocol, built on `kit` and never on each other |
//! | 4 | `retention`, `http`, `grpc`, `metrics`, `testing` | the edges: the barrier rows' scheduled purge, axum, tonic, the metrics' names and HELP text, test databases; nothing in the crate imports them |

#![warn(missing_docs)]

pub mod backend;
pub mod barrier;
pub mod callback;
pub mod consumer;
pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
#[cfg(feature = "axum")]
pub mod http;
pub mod idempotency;
pub mod jobs;
pub mod kit;
pub mod metrics;
pub mod retention;
pub mod signature;
pub mod tenant;

/// The lean pool lives in `idem-sql`, shared with the coordinator; re-exported here so that
/// participants need only this crate.
pub use idem_sql::pool;

#[cfg(feature = "testing")]
pub mod testing;

pub use backend::BarrierDatabase;
pub use barrier::schema::{
    BarrierRecord, MsgState, barrier_ddl, barrier_records, barrier_records_in,
    create_barrier_table, create_barrier_table_named, purge_barriers, query_prepared,
    upgrade_barrier_table,
};
pub use barrier::{Barrier, DEFAULT_TABLE, Outcome};
pub use callback::{CallbackOutcome, OrderTable, PaymentCallbacks, PaymentNotice};
pub use consumer::{ConsumerLog, Handled, create_consumer_tables, purge_consumer_log};
pub use error::{InvalidCall, ParticipantError};
#[cfg(feature = "axum")]
pub use http::Payload;
/// Which database a participant runs on, shared with the coordinator (`idem-sql`).
pub use idem_sql::Backend;
/// [`Backend`] under the SDK's former name: `Dialect::from_url`, `tx.dialect().sql(..)`.
pub use idem_sql::Backend as Dialect;
pub use idem_sql::{LeanPool, LeanPoolOptions, Leased, Placeholders, rewrite_placeholders};
pub use idempotency::{
    Claim, IdempotencyError, IdempotencyStore, Recovery, RecoveryHook, StoredResult,
};
pub use jobs::{
    JobSummary, JobUnits, UnitClaim, UnitKey, UnitOutcome, create_job_tables, purge_job_units,
};
pub use kit::{
    BranchCall, Clock, LocalConn, LocalTx, MSG_BRANCH_ID, ManualClock, Op, OpenedStep, RetryPolicy,
    SharedClock, StepConnections, StepTx, SystemClock, TransType, new_owner_token, run_local,
    split_sql_script, system_clock,
};
pub use retention::{BarrierRetention, CoordinatorSettings, spawn_barrier_purge};
pub use tenant::{DEFAULT_TENANT, TENANT_HEADER};

use std::time::Duration;

use sqlx::AnyPool;
use sqlx::any::AnyPoolOptions;

/// Opens an `AnyPool` for a participant database given by URL (`sqlite://file.db?mode=rwc`,
/// `postgres://...`, `mysql://...`), with settings the barrier relies on.
///
/// SQLite is switched to WAL so that readers (the query endpoints) do not block the single
/// writer. Use a file: every connection to `sqlite::memory:` is a separate database.
pub async fn connect(url: &str, max_connections: u32) -> Result<AnyPool, sqlx::Error> {
    sqlx::any::install_default_drivers();
    let backend = Backend::from_url(url).ok_or_else(|| {
        sqlx::Error::Configuration(
            format!("unsupported database URL `{url}`: use sqlite:, postgres:// or mysql://")
                .into(),
        )
    })?;
    // No ping before each use (a round trip per step): a broken connection fails the
    // step, which the coordinator retries.
    let pool = AnyPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await?;
    if backend == Backend::Sqlite {
        sqlx::raw_sql("PRAGMA journal_mode = WAL")
            .execute(&pool)
            .await?;
    }
    Ok(pool)
}

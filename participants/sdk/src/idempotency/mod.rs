//! Idempotency records for the requests a service's own clients resend: the seed's
//! distributed-idempotency chapter, §5 to §14, §24, §27 and §28.
//!
//! One row of `idem_idempotency` per (scope, key), in the service's own database:
//!
//! - **Scope and key (§5).** The scope is `"<tenant>:<operation>"` (each at most 128
//!   characters together), so one tenant's key never answers another's request; the key is
//!   1 to 128 characters of `[A-Za-z0-9._:-]`. Lengths and charset are checked before any
//!   write, so a bad key is an [`IdempotencyError::Invalid`], never a database error.
//! - **Request digest (§6).** The caller passes a 64-hex SHA-256 of the canonical request
//!   ([`request_digest`] builds the one the HTTP layer uses); the same key with another
//!   digest is [`Claim::Conflict`] (HTTP 409).
//! - **Status model (§7).** `PROCESSING` → `SUCCEEDED` / `FAILED_RETRYABLE` /
//!   `FAILED_FINAL`, with the owner token of the claim, its lease, the result (status,
//!   headers, body, bounded) or a resource id, attempts and a version.
//! - **Atomic claim (§9, §10).** The right to act is won by inserting the row if absent
//!   (`ON CONFLICT DO NOTHING` on PostgreSQL and SQLite, a plain INSERT whose error 1062
//!   means "exists" on MySQL), and a re-claim (of `FAILED_RETRYABLE`, or of an expired
//!   `PROCESSING` after the [`RecoveryHook`] said the effect did not happen) by a
//!   conditional UPDATE naming the expected status and version or owner token, resolved by
//!   reading the row back and comparing the owner token with the fresh one just written.
//!   Affected-row counts never decide.
//! - **Mode 1 (§11).** [`IdempotencyStore::run_local`]: claim, business change and
//!   `SUCCEEDED` in one local transaction; no `PROCESSING` row is ever committed, and a
//!   concurrent repeat waits on the row's lock and then reads the result.
//! - **Mode 2 (§12).** [`IdempotencyStore::claim`] commits `PROCESSING` with a lease, the
//!   handler makes its external calls outside any transaction, and
//!   [`IdempotencyStore::complete`] / [`fail_retryable`](IdempotencyStore::fail_retryable) /
//!   [`fail_final`](IdempotencyStore::fail_final) write the end with `owner_token` and
//!   `status = 'PROCESSING'` in the WHERE; a stale owner gets
//!   [`IdempotencyError::StaleOwner`] and changes nothing.
//! - **Answering a repeat (§13, §27).** [`Claim`] has one variant per state; an expired
//!   lease is never re-run blindly: [`IdempotencyStore::claim_with_recovery`] asks the
//!   service's [`RecoveryHook`] what really happened.
//! - **HTTP (§14, §25).** `http` (feature `axum`): the `Idempotency-Key` layer.
//! - **Retention (§24).** [`purge_idempotency`] deletes only terminal rows older than the
//!   window, in bounded batches, and refuses a window under [`MIN_RETENTION`].
//! - **Metrics (§28).** [`IDEMPOTENCY_TOTAL`], labelled by operation (never tenant or key).

mod rows;
mod store;

#[cfg(feature = "axum")]
pub mod http;

pub use store::{IdempotencyStore, LocalOutcome};

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase};
use crate::error::ParticipantError;
use crate::kit::SharedClock;
use idem_sql::Backend;

/// The table's name.
pub const TABLE: &str = "idem_idempotency";
/// Longest scope (`tenant:operation`) and longest key, in characters (the columns' size).
pub const MAX_SCOPE_LEN: usize = 128;
/// Longest `Idempotency-Key`.
pub const MAX_KEY_LEN: usize = 128;
/// Longest resource id stored with a result.
pub const MAX_RESOURCE_ID_LEN: usize = 128;
/// The shortest retention window [`purge_idempotency`] accepts. Below a client's retry
/// period a purged key would run its request a second time (§24); an hour is shorter than
/// any real repeat window, so this only catches a unit mistake (seconds for hours).
pub const MIN_RETENTION: Duration = Duration::from_secs(3600);

/// The values of the `status` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Claimed; the owner is running the request (mode 2) until its lease runs out.
    Processing,
    /// Finished; repeats get the stored result.
    Succeeded,
    /// Failed in a way a retry may cure; the next request re-claims under a new owner token.
    FailedRetryable,
    /// Failed for good; repeats get the first failure again.
    FailedFinal,
}

impl Status {
    /// The column text.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCEEDED",
            Status::FailedRetryable => "FAILED_RETRYABLE",
            Status::FailedFinal => "FAILED_FINAL",
        }
    }

    /// Parses the column text.
    pub fn parse(text: &str) -> Option<Status> {
        [
            Status::Processing,
            Status::Succeeded,
            Status::FailedRetryable,
            Status::FailedFinal,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// The result a repeat is answered with: the first request's status, the headers the
/// service chose to keep, its body (text, bounded by the store's maximum) and optionally the
/// id of the resource it created.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredResult {
    /// The HTTP status (or any code the service uses).
    pub status: u16,
    /// Headers to replay, as (name, value).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
    /// The created resource, if any (at most [`MAX_RESOURCE_ID_LEN`] characters).
    pub resource_id: Option<String>,
}

impl StoredResult {
    /// A result with a status and a body, no headers, no resource id.
    pub fn new(status: u16, body: impl Into<String>) -> StoredResult {
        StoredResult {
            status,
            body: body.into(),
            ..StoredResult::default()
        }
    }
}

/// The right to run a request, won by a claim: who holds it (the owner token) and which
/// attempt this is. Every later write names the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// This owner's token (32 hex digits), written into the row by the claim.
    pub owner_token: String,
    /// 1 for the first run, +1 for each re-claim.
    pub attempt: i64,
}

/// A `PROCESSING` record whose lease ran out: its owner crashed, hung, or is slow. Whether
/// its effect happened is for the service's source of truth to say ([`RecoveryHook`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredClaim {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// The digest of the request the owner was running.
    pub request_hash: String,
    /// The owner token of the claim that expired.
    pub owner_token: String,
    /// Its attempt number.
    pub attempt: i64,
    /// When its lease ran out, Unix ms.
    pub lease_until_ms: i64,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This caller won the right to run the request (first time, a re-claim of
    /// `FAILED_RETRYABLE`, or a takeover the recovery hook allowed).
    Acquired(Ticket),
    /// The request already succeeded: answer with its result (flagged as a replay).
    Replay(StoredResult),
    /// Another owner holds a live lease: answer 202 (or wait) and never run it again.
    InProgress {
        /// How long until the lease runs out.
        retry_after: Duration,
    },
    /// The key was used for another request (other digest): 409.
    Conflict,
    /// The owner's lease ran out; ask the [`RecoveryHook`] (or, when it could not tell,
    /// answer that the outcome is not known yet, and keep the record `PROCESSING`).
    Expired(ExpiredClaim),
    /// The request failed for good: answer with the first failure again.
    FailedFinal(StoredResult),
}

/// What the service's source of truth says about an expired claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// The effect happened: record this result and answer with it.
    Succeeded(StoredResult),
    /// The effect did not happen and will not: safe to run again, under a new owner token.
    NotHappened,
    /// The effect failed for good: record this failure and answer with it.
    FailedFinal(StoredResult),
    /// Cannot tell yet (the provider does not answer): keep `PROCESSING`, answer "unknown,
    /// retry later" (503).
    Unknown,
}

/// A boxed future, for [`RecoveryHook`] to stay usable as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The service's way of finding out what happened to a request whose owner's lease ran out
/// (§7, §13, §27: confirm the real state from the fact source, never a blind re-run).
pub trait RecoveryHook: Send + Sync + 'static {
    /// Looks the request up in the source of truth (the service's own tables, the payment
    /// provider's query API, ...).
    fn recover<'a>(&'a self, expired: &'a ExpiredClaim) -> BoxFuture<'a, Recovery>;
}

/// What can go wrong with an idempotency record.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    /// Bad input (key, scope, digest or result too long or malformed): a 400-class answer.
    /// `code` is stable (`invalid_idempotency_key`, `invalid_scope`, ...).
    #[error("{code}: {message}")]
    Invalid {
        /// The stable error code.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The ticket's owner no longer holds the record: its lease ran out and another owner
    /// took over or recorded the outcome. Nothing was written.
    #[error("stale owner: the record {scope}/{key} is no longer held by this ticket")]
    StaleOwner {
        /// The record's scope.
        scope: String,
        /// The record's key.
        key: String,
    },
    /// The database failed (or another [`ParticipantError`]).
    #[error(transparent)]
    Store(#[from] ParticipantError),
}

impl From<sqlx::Error> for IdempotencyError {
    fn from(e: sqlx::Error) -> Self {
        IdempotencyError::Store(e.into())
    }
}

pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> IdempotencyError {
    IdempotencyError::Invalid {
        code,
        message: message.into(),
    }
}

/// True for a valid `Idempotency-Key`: 1 to [`MAX_KEY_LEN`] characters of
/// `[A-Za-z0-9._:-]` (no spaces, no secrets' punctuation, one spelling per key).
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

pub(crate) fn check_inputs(scope: &str, key: &str, hash: &str) -> Result<(), IdempotencyError> {
    if !valid_key(key) {
        return Err(invalid(
            "invalid_idempotency_key",
            format!("the key must be 1 to {MAX_KEY_LEN} characters of [A-Za-z0-9._:-]"),
        ));
    }
    if scope.is_empty() || scope.chars().count() > MAX_SCOPE_LEN {
        return Err(invalid(
            "invalid_scope",
            format!("the scope must be 1 to {MAX_SCOPE_LEN} characters"),
        ));
    }
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(invalid(
            "invalid_request_hash",
            "the request hash must be 64 hex digits (SHA-256)",
        ));
    }
    Ok(())
}

/// The digest the HTTP layer takes: SHA-256 over the canonical JSON (sorted keys,
/// normalised numbers) of `{method, path, query, body}`, with the `ignored` fields
/// (top-level names, or dotted paths such as `meta.trace_id`) removed from the body first.
pub fn request_digest(
    method: &str,
    path: &str,
    query: Option<&str>,
    mut body: serde_json::Value,
    ignored: &[String],
) -> String {
    for field in ignored {
        remove_path(&mut body, field);
    }
    idem_canonical::request_hash(&serde_json::json!({
        "method": method.to_ascii_uppercase(),
        "path": path,
        "query": query,
        "body": body,
    }))
}

fn remove_path(value: &mut serde_json::Value, path: &str) {
    let mut parts = path.split('.').peekable();
    let mut current = value;
    while let Some(part) = parts.next() {
        let Some(object) = current.as_object_mut() else {
            return;
        };
        if parts.peek().is_none() {
            object.remove(part);
            return;
        }
        match object.get_mut(part) {
            Some(next) => current = next,
            None => return,
        }
    }
}

/// The DDL of `idem_idempotency` for a backend (shipped as `sql/idempotency.*.sql`).
pub fn idempotency_ddl(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => include_str!("../../sql/idempotency.sqlite.sql"),
        Backend::Postgres => include_str!("../../sql/idempotency.postgres.sql"),
        Backend::Mysql => include_str!("../../sql/idempotency.mysql.sql"),
    }
}

/// Creates `idem_idempotency` and its indexes if they do not exist.
pub async fn create_idempotency_tables<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<(), sqlx::Error> {
    crate::kit::run_script(
        pool,
        idempotency_ddl(Backend::Sqlite),
        idempotency_ddl(Backend::Postgres),
        idempotency_ddl(Backend::Mysql),
    )
    .await
}

/// Deletes terminal records (`SUCCEEDED`, `FAILED_FINAL`, `FAILED_RETRYABLE`) last
/// written more than `older_than` ago by `clock`, `batch` rows per statement; returns how
/// many went. `PROCESSING` rows are never deleted, whatever their age: they wait for
/// recovery. The window is the business's repeat window (§24: the longest a client keeps
/// retrying); a window under [`MIN_RETENTION`] is refused.
pub async fn purge_idempotency<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    older_than: Duration,
    batch: u32,
    clock: &SharedClock,
) -> Result<u64, IdempotencyError> {
    if older_than < MIN_RETENTION {
        return Err(invalid(
            "retention_too_short",
            format!(
                "an idempotency window of {older_than:?} is under the minimum {MIN_RETENTION:?}: a client retrying after the purge would run its request again"
            ),
        ));
    }
    let window = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let cutoff = clock.now_ms().saturating_sub(window);
    let deleted = crate::kit::delete_all_in_batches(
        pool,
        TABLE,
        "status IN ('SUCCEEDED', 'FAILED_FINAL', 'FAILED_RETRYABLE') AND updated_at_ms < ?",
        vec![Arg::Int(cutoff)],
        batch,
    )
    .await?;
    metrics::counter!(IDEMPOTENCY_PURGED_TOTAL).increment(deleted);
    Ok(deleted)
}

/// Requests by what their record said, labelled `operation` (the part of the scope after
/// its last `:`, a route's configured name: bounded) and `outcome`: `first` (claimed and
/// run), `replay` (stored result returned), `conflict` (same key, other digest),
/// `in_progress` (live lease), `expired` (lease ran out, recovery asked), `recovered` (the
/// hook settled an expired claim), `unknown` (the hook could not tell), `retry` (a
/// `FAILED_RETRYABLE` record re-claimed), `failed_final` (a stored final failure returned),
/// `stale_owner` (a late write refused).
pub const IDEMPOTENCY_TOTAL: &str = "idem_participant_idempotency_total";
/// Records deleted by retention.
pub const IDEMPOTENCY_PURGED_TOTAL: &str = "idem_participant_idempotency_purged_total";

/// Gives this module's metrics their HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        IDEMPOTENCY_TOTAL,
        "Idempotency-Key requests by operation and outcome: first, replay, conflict, in_progress, expired, recovered, unknown, retry, failed_final, stale_owner."
    );
    metrics::describe_counter!(
        IDEMPOTENCY_PURGED_TOTAL,
        "Idempotency records deleted by retention."
    );
}

pub(crate) fn count(scope: &str, outcome: &'static str) {
    let operation = scope.rsplit(':').next().unwrap_or(scope).to_owned();
    metrics::counter!(IDEMPOTENCY_TOTAL, "operation" => operation, "outcome" => outcome)
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_bounded_and_use_a_small_charset() {
        assert!(valid_key("order-1_a.b:c"));
        assert!(valid_key(&"k".repeat(MAX_KEY_LEN)));
        assert!(!valid_key(""));
        assert!(!valid_key(&"k".repeat(MAX_KEY_LEN + 1)));
        assert!(!valid_key("has space"));
        assert!(!valid_key("slash/"));
        assert!(!valid_key("ünïcode"));
    }

    #[test]
    fn the_digest_ignores_key_order_number_spelling_and_ignored_fields() {
        let a = serde_json::json!({"a": 1, "b": {"c": 2.0, "trace": "x"}, "req_id": "1"});
        let b = serde_json::json!({"b": {"trace": "y", "c": 2}, "a": 1.0, "req_id": "2"});
        let ignored = vec!["req_id".to_owned(), "b.trace".to_owned()];
        assert_eq!(
            request_digest("post", "/o", None, a.clone(), &ignored),
            request_digest("POST", "/o", None, b.clone(), &ignored)
        );
        assert_ne!(
            request_digest("POST", "/o", None, a.clone(), &[]),
            request_digest("POST", "/o", None, b, &[])
        );
        assert_ne!(
            request_digest("POST", "/o", None, a.clone(), &ignored),
            request_digest("POST", "/p", None, a, &ignored)
        );
    }

    #[test]
    fn statuses_round_trip() {
        for s in [
            Status::Processing,
            Status::Succeeded,
            Status::FailedRetryable,
            Status::FailedFinal,
        ] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("processing"), None);
    }
}

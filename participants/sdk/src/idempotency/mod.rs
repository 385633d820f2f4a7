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
//!   `FAILED_FINAL` / `UNKNOWN`, with the owner token of the claim, its lease, the result
//!   (status, headers, body as bytes, bounded) or a resource id, attempts and a version.
//!   `UNKNOWN` is a run that ended after the handler may have acted, without a known
//!   outcome; it is settled through the service's fact source, never re-run blindly.
//! - **Atomic claim (§9, §10).** The right to act is won by inserting the row if absent
//!   (`ON CONFLICT DO NOTHING` on PostgreSQL and SQLite, a plain INSERT whose error 1062
//!   means "exists" on MySQL), and a re-claim (of `FAILED_RETRYABLE`, or of an expired
//!   `PROCESSING` or an `UNKNOWN` record after the [`RecoveryHook`] said the effect did
//!   not happen) by a conditional UPDATE naming the expected status and version or owner
//!   token, resolved by reading the row back and comparing the owner token with the fresh
//!   one just written. Affected-row counts never decide.
//! - **Leases on the database's clock.** A claim's lease and every "has it run out" are
//!   computed in SQL from the database's time ([`crate::kit::db_now_ms`]), so instances
//!   whose clocks disagree still agree on when a claim may be recovered; a store given a
//!   [`Clock`](crate::Clock) (tests: a `ManualClock`) reads that instead.
//! - **Mode 1 (§11).** [`IdempotencyStore::run_local`]: claim, business change and
//!   `SUCCEEDED` in one local transaction; no `PROCESSING` row is ever committed, and a
//!   concurrent repeat waits on the row's lock and then reads the result.
//! - **Mode 2 (§12).** [`IdempotencyStore::claim`] commits `PROCESSING` with a lease
//!   ([`IdempotencyStore::renew`] extends it while the handler runs), the handler makes
//!   its external calls outside any transaction, and [`IdempotencyStore::complete`] /
//!   [`fail_retryable`](IdempotencyStore::fail_retryable) /
//!   [`fail_final`](IdempotencyStore::fail_final) /
//!   [`mark_unknown`](IdempotencyStore::mark_unknown) write the end with `owner_token` and
//!   `status = 'PROCESSING'` in the WHERE; a stale owner gets
//!   [`IdempotencyError::StaleOwner`] and changes nothing.
//! - **Answering a repeat (§13, §27).** [`Claim`] has one variant per state; an expired
//!   lease or an `UNKNOWN` record is never re-run blindly:
//!   [`IdempotencyStore::claim_with_recovery`] asks the service's [`RecoveryHook`] what
//!   really happened.
//! - **Settling in the background.** A [`Settler`] asks the hook about every expired
//!   `PROCESSING` and `UNKNOWN` record on a schedule and exports the backlog gauges;
//!   [`IdempotencyStore::unsettled`] lists those records for an operator and
//!   [`IdempotencyStore::settle`] records an operator's verdict.
//! - **HTTP (§14, §25).** `http` (feature `axum`): the `Idempotency-Key` layer.
//! - **Retention (§24).** [`purge_idempotency`] deletes only terminal rows older than the
//!   window, in bounded batches, and refuses a window under [`MIN_RETENTION`].
//! - **Metrics (§28).** [`IDEMPOTENCY_TOTAL`], labelled by operation (never tenant or key),
//!   and the gauges [`PROCESSING_GAUGE`], [`PROCESSING_OLDEST_GAUGE`] and [`UNKNOWN_GAUGE`].

mod rows;
mod settle;
mod settler;
mod store;
mod table;
mod types;

#[cfg(feature = "axum")]
pub mod http;

pub use settle::{Backlog, Settled};
pub use settler::{Settler, SettlerHandle};
pub use store::{IdempotencyStore, LocalOutcome, MAX_RESULT_BODY_LIMIT};
pub use table::{
    create_idempotency_tables, idempotency_ddl, idempotency_upgrade_ddl, purge_idempotency,
};
pub(crate) use types::invalid;
pub use types::{
    BoxFuture, Claim, ExpiredClaim, IdempotencyError, Recovery, RecoveryHook, Status, StoredResult,
    Ticket,
};

use std::time::Duration;

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

/// Requests by what their record said, labelled `operation` (the part of the scope after
/// its last `:`, a route's configured name: bounded) and `outcome`: `first` (claimed and
/// run), `replay` (stored result returned), `conflict` (same key, other digest),
/// `in_progress` (live lease), `expired` (no owner and no recorded outcome: the hook is
/// asked), `recovered` (the hook settled such a record on a repeat), `unknown` (the hook
/// could not tell), `retry` (a `FAILED_RETRYABLE` record re-claimed), `failed` (a run
/// ended in a failure), `failed_final` (a stored final failure returned), `ended_unknown`
/// (a run ended `UNKNOWN`), `settled` (an expired or `UNKNOWN` record settled by the
/// settler or an operator), `lease_lost` (a running owner found its record taken),
/// `stale_owner` (a late write refused).
pub const IDEMPOTENCY_TOTAL: &str = "idem_participant_idempotency_total";
/// Records deleted by retention.
pub const IDEMPOTENCY_PURGED_TOTAL: &str = "idem_participant_idempotency_purged_total";
/// Gauge: records in `PROCESSING` (running, or their owner died and nobody has recovered
/// them yet), as the last [`IdempotencyStore::backlog`] read them.
pub const PROCESSING_GAUGE: &str = "idem_participant_idempotency_processing";
/// Gauge: how long ago, in seconds, the oldest `PROCESSING` record was claimed; 0 when
/// there is none.
pub const PROCESSING_OLDEST_GAUGE: &str = "idem_participant_idempotency_processing_oldest_seconds";
/// Gauge: records in `UNKNOWN`, waiting for the fact source or an operator.
pub const UNKNOWN_GAUGE: &str = "idem_participant_idempotency_unknown";

/// Gives this module's metrics their HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        IDEMPOTENCY_TOTAL,
        "Idempotency-Key requests by operation and outcome: first, replay, conflict, in_progress, expired, recovered, unknown, retry, failed, failed_final, ended_unknown, settled, lease_lost, stale_owner."
    );
    metrics::describe_counter!(
        IDEMPOTENCY_PURGED_TOTAL,
        "Idempotency records deleted by retention."
    );
    metrics::describe_gauge!(
        PROCESSING_GAUGE,
        "Idempotency records in PROCESSING (running, or waiting for their expired lease to be recovered)."
    );
    metrics::describe_gauge!(
        PROCESSING_OLDEST_GAUGE,
        metrics::Unit::Seconds,
        "How long ago the oldest PROCESSING idempotency record was claimed; 0 when there is none."
    );
    metrics::describe_gauge!(
        UNKNOWN_GAUGE,
        "Idempotency records whose outcome is UNKNOWN, waiting for the fact source or an operator."
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
            Status::Unknown,
        ] {
            assert_eq!(Status::parse(s.as_str()), Some(s));
        }
        assert_eq!(Status::parse("processing"), None);
    }
}

//! Bind values in statement order: one macro per column list of `statements.rs`, shared by
//! every database and by both ways of writing (a transaction, or PostgreSQL's one-statement
//! CTEs). Macros, not functions: sqlx's query types differ per database and per
//! `query`/`query_scalar`, and a generic `bind` chain would need each bound spelled out.

/// Binds the values of `GLOBAL_SET` and the WHERE of a save's conditional update, in
/// statement order: the same for every database and for both ways of writing a save.
macro_rules! bind_global_update {
    ($query:expr, $save:expr) => {{
        let save = $save;
        let (before, after) = (save.before, save.after);
        let query = $query
            .bind(after.status.as_str())
            .bind(after.stalled_from.map(|s| s.as_str()))
            .bind(after.attempts)
            .bind(after.next_attempt_at)
            .bind($crate::sql::binds::clip(&after.last_error))
            .bind($crate::sql::binds::clip(&after.reason))
            .bind(after.timeout_at)
            .bind(after.updated_at)
            .bind(after.finished_at)
            .bind(save.lease.map(|l| l.token.as_str()))
            .bind(save.lease.map(|l| l.until))
            .bind(after.calls)
            .bind(after.history)
            .bind(after.history_dropped)
            .bind(after.gid.as_str())
            .bind(before.status.as_str());
        match save.guard {
            $crate::Guard::Owner(token, version) => query.bind(token).bind(version),
            $crate::Guard::Version(version) => query.bind(version),
        }
    }};
}

/// Binds the values of an insert of the global row (`GLOBAL_COLUMNS` order).
macro_rules! bind_global_insert {
    ($query:expr, $tx:expr, $request_hash:expr, $options:expr, $lease:expr) => {{
        let (tx, lease) = ($tx, $lease);
        $query
            .bind(tx.gid.as_str())
            .bind(tx.kind.as_str())
            .bind(tx.status.as_str())
            .bind(tx.stalled_from.map(|s| s.as_str()))
            .bind($request_hash)
            .bind($options)
            .bind(tx.timeout_at)
            .bind(tx.attempts)
            .bind(tx.next_attempt_at)
            .bind($crate::sql::binds::clip(&tx.last_error))
            .bind($crate::sql::binds::clip(&tx.reason))
            .bind(lease.map(|l| l.token.as_str()))
            .bind(lease.map(|l| l.until))
            .bind(0i64)
            .bind(tx.created_at)
            .bind(tx.updated_at)
            .bind(tx.finished_at)
            .bind(tx.trace.as_ref().map(|t| t.traceparent.as_str()))
            .bind(tx.trace.as_ref().and_then(|t| t.tracestate.as_deref()))
            .bind(tx.tokenless)
    }};
}

/// Binds a branch group's new values (`BRANCH_SET` order).
macro_rules! bind_branch_set {
    ($query:expr, $branch:expr) => {{
        let b = $branch;
        $query
            .bind(b.status.as_str())
            .bind(b.attempts)
            .bind(b.next_attempt_at)
            .bind($crate::sql::binds::clip(&b.last_error))
            .bind(b.in_progress_since)
            .bind(b.updated_at)
            .bind(b.finished_at)
    }};
}

/// Binds a branch row's columns after its gid, in the order of the branch INSERTs.
macro_rules! bind_branch_insert {
    ($query:expr, $branch:expr) => {{
        let b = $branch;
        // The columns after the payload are those a branch update sets, in that order.
        bind_branch_set!(
            $query
                .bind(&*b.branch_id)
                .bind(b.action.as_str())
                .bind(b.seq)
                .bind(&*b.url)
                .bind($crate::sql::binds::payload_text(&b.payload))
                .bind($crate::sql::binds::payload_bin(&b.payload)),
            b
        )
    }};
}

/// Binds an attempt row's columns after its gid, in the order of the attempt INSERTs.
macro_rules! bind_attempt {
    ($query:expr, $attempt:expr) => {{
        let a = $attempt;
        $query
            .bind(a.number)
            .bind(a.branch_id.as_str())
            .bind(a.action.as_str())
            .bind(a.attempt)
            .bind(a.started_at)
            .bind(a.duration_ms)
            .bind(a.outcome.as_str())
            .bind($crate::sql::binds::clip(&a.detail))
    }};
}

pub(crate) use {
    bind_attempt, bind_branch_insert, bind_branch_set, bind_global_insert, bind_global_update,
};

/// Error texts and reasons longer than this are cut before they are stored (the API refuses
/// longer client reasons; idem's own can quote a participant's answer).
const MAX_ERROR_LEN: usize = 2_000;

pub(crate) fn clip(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(|s| {
        if s.len() <= MAX_ERROR_LEN {
            s
        } else {
            let mut end = MAX_ERROR_LEN;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            &s[..end]
        }
    })
}

use idem_core::Payload;

/// A payload as every database's text column holds it: UTF-8 without NUL (PostgreSQL's
/// `TEXT` has no NUL).
fn as_column_text(payload: &Payload) -> Option<&str> {
    payload.as_text().filter(|text| !text.contains('\0'))
}

/// A payload's `payload` column: the payload when it is text, empty when it is not.
pub(crate) fn payload_text(payload: &Payload) -> &str {
    as_column_text(payload).unwrap_or_default()
}

/// A payload's `payload_bin` column: the payload when it is not text (see the migration
/// `binary_payloads`), NULL when it is.
pub(crate) fn payload_bin(payload: &Payload) -> Option<&[u8]> {
    as_column_text(payload)
        .is_none()
        .then(|| payload.as_bytes())
}

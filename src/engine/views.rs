//! How a transaction is shown: the native API's views, which `idem tx` prints too, made
//! here so that the read handle ([`super::Reads`]) hands them out. The view types are
//! `idem-types`' (Serialize and Deserialize in one place), so `idem-client` parses what
//! this writes.

pub use idem_types::{AttemptPageView, BranchView, PageView, PayloadEncoding, TxView};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use crate::core::{Payload, Transaction};
use crate::outbound::redact::{redact_header_values, redact_userinfo, redacted};
use crate::store::{AttemptRecord, Page, StoredTx};
use crate::tenant::{client_gid, split_key};

/// A page of the list as the API answers it; `idem tx list --database-url` prints the same.
pub fn page_view(page: &Page) -> PageView {
    PageView {
        transactions: page.items.iter().map(|s| tx_view(s, None)).collect(),
        // The client's gid: the handler scopes it again to its caller's tenant.
        next_cursor: page
            .next
            .as_ref()
            .map(|(at, key)| format!("{at}:{}", client_gid(key))),
    }
}

/// A payload as views show it: its text, or the base64 of bytes that are not text.
pub fn shown_payload(payload: &Payload) -> (String, Option<PayloadEncoding>) {
    match payload.as_text() {
        Some(text) => (text.to_owned(), None),
        None => (base64(payload.as_bytes()), Some(PayloadEncoding::Base64)),
    }
}

/// Standard base64 with padding (what Go's `[]byte` marshals to, in DTM's views).
pub fn base64(bytes: &[u8]) -> String {
    BASE64.encode(bytes)
}

/// The most records of its history a transaction's view shows: the newest, as many as a
/// transaction keeps by default (`--max-history-per-transaction`); `GET .../attempts`
/// pages through all that are kept.
pub const HISTORY_IN_VIEW: u32 = 100;

/// A stored transaction as the API shows it, with its history of calls when given. URLs'
/// userinfo is `***` in every field that can hold one (see `outbound::redact`).
pub fn tx_view(stored: &StoredTx, history: Option<Vec<AttemptRecord>>) -> TxView {
    let tx: &Transaction = &stored.tx;
    let (tenant, gid) = split_key(&tx.gid);
    TxView {
        gid: gid.to_owned(),
        tenant: tenant.to_owned(),
        kind: tx.kind,
        status: tx.status,
        stalled_from: tx.stalled_from,
        reason: redacted(&tx.reason),
        last_error: redacted(&tx.last_error),
        attempts: tx.attempts,
        calls: tx.calls,
        history_total: tx.history,
        history_dropped: tx.history_dropped,
        timeout_at: tx.timeout_at,
        next_attempt_at: tx.next_attempt_at,
        created_at: tx.created_at,
        updated_at: tx.updated_at,
        finished_at: tx.finished_at,
        options: idem_types::TxOptions {
            branch_headers: redact_header_values(&tx.options.branch_headers),
            ..tx.options.clone()
        },
        branches: tx
            .branches
            .iter()
            .map(|b| {
                let (payload, payload_encoding) = shown_payload(&b.payload);
                BranchView {
                    branch_id: b.branch_id.to_string(),
                    action: b.action,
                    url: redact_userinfo(&b.url).into_owned(),
                    payload,
                    payload_encoding,
                    status: b.status,
                    attempts: b.attempts,
                    next_attempt_at: b.next_attempt_at,
                    last_error: redacted(&b.last_error),
                    in_progress_since: b.in_progress_since,
                    updated_at: b.updated_at,
                    finished_at: b.finished_at,
                }
            })
            .collect(),
        trace_id: tx
            .trace
            .as_ref()
            .and_then(|t| crate::trace::parse_traceparent(&t.traceparent))
            .map(|p| format!("{:032x}", p.trace_id)),
        history: history.map(shown_records),
    }
}

/// History records as the API shows them: a detail may quote a URL, whose userinfo is
/// `***`.
pub fn shown_records(records: Vec<AttemptRecord>) -> Vec<AttemptRecord> {
    records
        .into_iter()
        .map(|record| AttemptRecord {
            detail: redacted(&record.detail),
            ..record
        })
        .collect()
}

//! How the native API shows a transaction; `idem tx` prints the same. The view types are
//! `idem-types`' (Serialize and Deserialize in one place), so `idem-client` parses what
//! this writes.

pub use idem_types::{BranchView, PageView, TxView};

use crate::core::Transaction;
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
            .map(|b| BranchView {
                branch_id: b.branch_id.to_string(),
                action: b.action,
                url: redact_userinfo(&b.url).into_owned(),
                payload: b.payload.to_string(),
                status: b.status,
                attempts: b.attempts,
                next_attempt_at: b.next_attempt_at,
                last_error: redacted(&b.last_error),
                in_progress_since: b.in_progress_since,
                updated_at: b.updated_at,
                finished_at: b.finished_at,
            })
            .collect(),
        trace_id: tx
            .trace
            .as_ref()
            .and_then(|t| crate::trace::parse_traceparent(&t.traceparent))
            .map(|p| format!("{:032x}", p.trace_id)),
        history: history.map(|records| {
            records
                .into_iter()
                .map(|record| AttemptRecord {
                    detail: redacted(&record.detail),
                    ..record
                })
                .collect()
        }),
    }
}

/// The answer to a branch registration: the Try's outcome when idem called it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct RegisterView {
    pub gid: String,
    pub branch_id: String,
    /// Present when the request had a `try` URL.
    #[serde(rename = "try", skip_serializing_if = "Option::is_none")]
    pub try_outcome: Option<TryView>,
    /// Present when the Try did not succeed: `try_failed`, `try_in_progress`, `try_unknown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<idem_types::ErrorView>,
}

/// What the Try idem called answered.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct TryView {
    /// `success`, `failure`, `in_progress` or `unknown`.
    pub outcome: String,
    pub detail: Option<String>,
}

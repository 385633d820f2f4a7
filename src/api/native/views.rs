//! How the native API shows a transaction; `idem tx` prints the same.

use serde::Serialize;
use serde_json::Value;

use crate::core::{Action, BranchStatus, Kind, Millis, Status, Transaction, TxOptions};
use crate::store::{AttemptRecord, Page, StoredTx};

/// A page of the list as the API answers it; `idem tx list --database-url` prints the same.
pub fn page_view(page: &Page) -> Value {
    let items: Vec<TxView> = page.items.iter().map(|s| TxView::new(s, None)).collect();
    serde_json::json!({
        "transactions": items,
        "next_cursor": page.next.as_ref().map(|(at, gid)| format!("{at}:{gid}")),
    })
}

/// A transaction as the API shows it.
#[derive(Debug, Serialize)]
pub struct TxView {
    pub gid: String,
    pub kind: Kind,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_from: Option<Status>,
    pub reason: Option<String>,
    pub last_error: Option<String>,
    /// Failed branch calls so far.
    pub attempts: i32,
    pub timeout_at: Option<Millis>,
    pub next_attempt_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
    pub options: TxOptions,
    pub branches: Vec<BranchView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<AttemptRecord>>,
}

#[derive(Debug, Serialize)]
pub struct BranchView {
    pub branch_id: String,
    pub action: Action,
    pub url: String,
    pub payload: String,
    pub status: BranchStatus,
    pub attempts: i32,
    pub next_attempt_at: Option<Millis>,
    pub last_error: Option<String>,
    /// When it first answered "in progress" in its current run of such answers.
    pub in_progress_since: Option<Millis>,
    pub updated_at: Millis,
    pub finished_at: Option<Millis>,
}

impl TxView {
    pub fn new(stored: &StoredTx, history: Option<Vec<AttemptRecord>>) -> TxView {
        let tx: &Transaction = &stored.tx;
        TxView {
            gid: tx.gid.clone(),
            kind: tx.kind,
            status: tx.status,
            stalled_from: tx.stalled_from,
            reason: tx.reason.clone(),
            last_error: tx.last_error.clone(),
            attempts: tx.attempts,
            timeout_at: tx.timeout_at,
            next_attempt_at: tx.next_attempt_at,
            created_at: tx.created_at,
            updated_at: tx.updated_at,
            finished_at: tx.finished_at,
            options: tx.options.clone(),
            branches: tx
                .branches
                .iter()
                .map(|b| BranchView {
                    branch_id: b.branch_id.clone(),
                    action: b.action,
                    url: b.url.clone(),
                    payload: b.payload.clone(),
                    status: b.status,
                    attempts: b.attempts,
                    next_attempt_at: b.next_attempt_at,
                    last_error: b.last_error.clone(),
                    in_progress_since: b.in_progress_since,
                    updated_at: b.updated_at,
                    finished_at: b.finished_at,
                })
                .collect(),
            history,
        }
    }
}

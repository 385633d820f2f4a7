//! What the native API's answers show. A transaction, a page of the list and a page of a
//! history are the read handle's views (`engine::views`); the answer to a branch
//! registration is the API's own.

pub use crate::engine::views::{
    AttemptPageView, BranchView, HISTORY_IN_VIEW, PageView, TxView, page_view, shown_records,
    tx_view,
};

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

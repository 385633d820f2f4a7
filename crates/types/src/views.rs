//! The API's answers, as the coordinator writes them and a client reads them.

use serde::{Deserialize, Serialize};

use crate::{Action, BranchStatus, Kind, Millis, Status, TxOptions};

fn default_tenant() -> String {
    "default".to_owned()
}

/// A global transaction as `GET /api/v1/transactions/{gid}` (and every answer that returns
/// one) shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TxView {
    /// The global transaction's id: the client's idempotency key.
    pub gid: String,
    /// The tenant it belongs to (its gid is unique within it).
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// TCC, saga or msg.
    pub kind: Kind,
    /// Where it stands.
    pub status: Status,
    /// A stalled transaction: the phase an operator's retry resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_from: Option<Status>,
    /// Why it failed or is being aborted.
    pub reason: Option<String>,
    /// The last error of a branch call.
    pub last_error: Option<String>,
    /// Failed branch calls so far.
    pub attempts: i32,
    /// Calls idem made by itself (every branch call but a Try) since the transaction was
    /// created or an operator last retried it: what the server's call budget
    /// (`--max-calls-per-transaction`) counts.
    #[serde(default)]
    pub calls: i64,
    /// Calls that did not simply succeed, recorded in all: the newest are kept as its
    /// history, numbered from 1 in the order they were made.
    #[serde(default)]
    pub history_total: i64,
    /// How many of the oldest of them are no longer kept (the server keeps the newest
    /// `--max-history-per-transaction`): numbers 1 to this one are gone.
    #[serde(default)]
    pub history_dropped: i64,
    /// When a prepared TCC or msg, or a saga still running forward, times out.
    pub timeout_at: Option<Millis>,
    /// When the coordinator acts on it next.
    pub next_attempt_at: Option<Millis>,
    /// When it was created (the database's clock).
    pub created_at: Millis,
    /// When it last changed.
    pub updated_at: Millis,
    /// When it became terminal.
    pub finished_at: Option<Millis>,
    /// The options it runs under, resolved against the server's defaults at creation.
    pub options: TxOptions,
    /// One entry per branch operation.
    pub branches: Vec<BranchView>,
    /// The W3C trace id (32 hex digits) its branch calls continue, for a link to a
    /// tracing UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// On `GET` of one transaction: the newest of the calls that did not succeed at
    /// once, at most 100, oldest first; `GET .../attempts` pages through every one kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<AttemptRecord>>,
}

/// One branch operation of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BranchView {
    /// The branch (a saga step's index as two digits, a TCC branch's own id).
    pub branch_id: String,
    /// Which operation of the branch this is.
    pub action: Action,
    /// Where it is sent.
    pub url: String,
    /// The body sent: the text itself, or the base64 of bytes that are not UTF-8 text (a
    /// gRPC client's protobuf), as `payload_encoding` says.
    pub payload: String,
    /// `base64` when `payload` is the base64 of bytes that are not text; absent for text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_encoding: Option<PayloadEncoding>,
    /// Where it stands.
    pub status: BranchStatus,
    /// Calls made so far.
    pub attempts: i32,
    /// When it is called next.
    pub next_attempt_at: Option<Millis>,
    /// The last call's error.
    pub last_error: Option<String>,
    /// When it first answered "in progress" in its current run of such answers.
    pub in_progress_since: Option<Millis>,
    /// When it last changed.
    pub updated_at: Millis,
    /// When it got its final answer.
    pub finished_at: Option<Millis>,
}

/// How a view spells a payload that is not text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum PayloadEncoding {
    /// Standard base64, with padding.
    Base64,
}

/// One call to a participant that did not simply succeed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptRecord {
    /// Its place in the transaction's history: 1 for the first call that did not
    /// succeed, counting every one recorded, kept or not.
    #[serde(default)]
    pub number: i64,
    /// The branch called.
    pub branch_id: String,
    /// The operation called.
    pub action: Action,
    /// 1 for the first call of this branch operation.
    pub attempt: i32,
    /// When the call started.
    pub started_at: Millis,
    /// How long it took.
    pub duration_ms: i64,
    /// `failure`, `in_progress` or `unknown`.
    pub outcome: String,
    /// What the participant answered, or why there was no answer (cut).
    pub detail: Option<String>,
}

/// A page of `GET /api/v1/transactions/{gid}/attempts`: the kept history of a
/// transaction's calls that did not simply succeed, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AttemptPageView {
    /// The transaction's gid.
    pub gid: String,
    /// The calls of this page, by number.
    pub attempts: Vec<AttemptRecord>,
    /// Calls recorded in all (the newest one's number).
    pub total: i64,
    /// The oldest ones no longer kept: numbers 1 to this one.
    pub dropped: i64,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// A page of `GET /api/v1/transactions`, newest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PageView {
    /// The transactions of this page.
    pub transactions: Vec<TxView>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// The body of every error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorView,
}

/// A stable code (see docs/api.md, *Error codes*) and a message for humans.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorView {
    /// Stable and machine-readable: `gid_conflict`, `not_found`, `unavailable`, ...
    pub code: String,
    /// For humans.
    pub message: String,
}

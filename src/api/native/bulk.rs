//! `POST /api/v1/bulk`: an operator's retry, force-stop or abort of every
//! transaction of the caller's tenant that a filter selects, at most `limit` (500) per
//! call, oldest first, with a dry run that changes nothing (see `engine::bulk`). Each
//! transaction's outcome is reported: the status it went to, or the code and message its
//! operation was refused with.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use idem_types::ErrorView;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::api::validate::{check_reason, parse_body};
use crate::auth::Role;
use crate::core::{Access, Kind, Status};
use crate::engine::{BulkOperation, BulkReport, BulkRequest, ListFilter, MAX_BULK};
use crate::tenant::client_gid;

/// How many a bulk call takes when `limit` is not given.
const DEFAULT_BULK: u32 = 100;

/// What to do, and to which transactions.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkActionRequest {
    /// `retry`, `force_stop` or `abort`.
    operation: String,
    /// Only transactions in this status (required: a bulk action names what it is for).
    #[schema(value_type = Status)]
    status: String,
    /// Only this kind.
    #[schema(value_type = Option<Kind>)]
    kind: Option<String>,
    /// Only transactions created at least this many milliseconds ago.
    older_than_ms: Option<u64>,
    /// The caller's tenant, when given (a token acts in its own tenant only).
    tenant: Option<String>,
    /// Force-stop and abort: why (at most 1,024 bytes).
    #[schema(max_length = 1024)]
    reason: Option<String>,
    /// Select and report, change nothing.
    #[serde(default)]
    dry_run: bool,
    /// At most this many (1-500, default 100).
    limit: Option<u32>,
}

/// One selected transaction and its outcome.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkItemView {
    gid: String,
    /// Its status when selected.
    before: Status,
    /// Its status after the operation (absent in a dry run or when refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<Status>,
    /// Why the operation was refused for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<ErrorView>,
}

/// What a bulk call did.
#[derive(Debug, Serialize, ToSchema)]
pub struct BulkView {
    operation: String,
    dry_run: bool,
    /// More transactions matched than this call took: call again for the next ones.
    more: bool,
    results: Vec<BulkItemView>,
}

fn operation(name: &str) -> Result<BulkOperation, ApiError> {
    Ok(match name {
        "retry" => BulkOperation::Retry,
        "force_stop" => BulkOperation::ForceStop,
        "abort" => BulkOperation::Abort,
        other => {
            return Err(ApiError::bad_request(
                "invalid_operation",
                format!("operation {other:?}: retry, force_stop or abort"),
            ));
        }
    })
}

#[utoipa::path(
    post,
    path = "/api/v1/bulk",
    operation_id = "bulk",
    tag = "transactions",
    description = "An operator's retry, force-stop or abort of the caller's tenant's transactions that a filter selects: at most `limit` (500) per call, oldest first; `dry_run` selects and changes nothing.",
    request_body = BulkActionRequest,
    responses((status = 200, description = "Each selected transaction with its outcome", body = BulkView))
)]
pub(super) async fn bulk(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<BulkView>, ApiError> {
    caller.require(Role::Operator, "act on transactions in bulk")?;
    let req: BulkActionRequest = parse_body(body, None)?;
    let op = operation(&req.operation)?;
    let status = req
        .status
        .parse::<Status>()
        .map_err(|e| ApiError::bad_request("invalid_status", e.to_string()))?;
    let kind = req
        .kind
        .as_deref()
        .map(str::parse::<Kind>)
        .transpose()
        .map_err(|e| ApiError::bad_request("invalid_kind", e.to_string()))?;
    if let Some(tenant) = &req.tenant
        && tenant != caller.tenant()
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token acts in tenant {:?} only", caller.tenant()),
        ));
    }
    check_reason("reason", req.reason.as_deref())?;
    let limit = req.limit.unwrap_or(DEFAULT_BULK);
    if !(1..=MAX_BULK).contains(&limit) {
        return Err(ApiError::bad_request(
            "invalid_limit",
            format!("limit {limit}: 1 to {MAX_BULK}"),
        ));
    }
    let created_to = match req.older_than_ms {
        Some(ms) => {
            let ms = i64::try_from(ms).map_err(|_| {
                ApiError::bad_request("invalid_older_than", "older_than_ms is too large")
            })?;
            Some(app.engine.now().saturating_sub(ms))
        }
        None => None,
    };
    let reason = req.reason.unwrap_or_else(|| match op {
        BulkOperation::Abort => "aborted by an operator".into(),
        _ => "force-stopped by an operator".into(),
    });
    let request = BulkRequest {
        operation: op,
        filter: ListFilter {
            tenant: Some(caller.tenant().to_owned()),
            tokenless_only: caller.access() == Access::Tokenless,
            statuses: vec![status],
            kind,
            created_from: None,
            created_to,
            after: None,
            limit,
            oldest_first: true,
        },
        reason,
        dry_run: req.dry_run,
    };
    let report = app.engine.bulk(&request, caller.access()).await?;
    Ok(Json(bulk_view(report, op, req.dry_run, false)))
}

/// The name of `operation` in requests and answers.
pub fn operation_name(operation: BulkOperation) -> &'static str {
    match operation {
        BulkOperation::Retry => "retry",
        BulkOperation::ForceStop => "force_stop",
        BulkOperation::Abort => "abort",
    }
}

/// What a bulk call did, as the API answers it. `keys`: name each transaction by its
/// storage key (`tenant/gid`), as `idem tx --database-url`, which reaches every tenant,
/// does; else by the gid its client gave.
pub fn bulk_view(
    report: BulkReport,
    operation: BulkOperation,
    dry_run: bool,
    keys: bool,
) -> BulkView {
    let results = report
        .outcomes
        .into_iter()
        .map(|o| {
            let (after, error) = match o.after {
                None => (None, None),
                Some(Ok(status)) => (Some(status), None),
                Some(Err(e)) => {
                    let e = ApiError::from(e);
                    let view = ErrorView {
                        code: e.code.into(),
                        message: e.message,
                    };
                    (None, Some(view))
                }
            };
            BulkItemView {
                gid: if keys {
                    o.key
                } else {
                    client_gid(&o.key).to_owned()
                },
                before: o.before,
                after,
                error,
            }
        })
        .collect();
    BulkView {
        operation: operation_name(operation).into(),
        dry_run,
        more: report.more,
        results,
    }
}

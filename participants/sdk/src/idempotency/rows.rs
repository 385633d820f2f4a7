//! The rows of `idem_idempotency` as the protocol reads and writes them: the insert that
//! claims, the end write fenced by the owner token, the read-back that resolves it.

use super::{Status, StoredResult, TABLE};
use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::ParticipantError;
use crate::kit::LocalTx;
use crate::kit::local::fetch;

/// A row as the protocol reads it.
pub(super) struct Row {
    pub(super) request_hash: String,
    pub(super) status: Status,
    pub(super) owner_token: String,
    pub(super) headers: Option<String>,
    pub(super) body: Option<String>,
    pub(super) resource_id: Option<String>,
    pub(super) lease_until_ms: Option<i64>,
    pub(super) result_status: Option<i64>,
    pub(super) attempts: i64,
    pub(super) version: i64,
}

pub(super) const ROW_COLUMNS: &str = "request_hash, status, owner_token, result_headers, result_body, resource_id, lease_until_ms, result_status, attempts, version";
pub(super) const ROW_KINDS: &[CellKind] = &[
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Int,
    CellKind::Int,
    CellKind::Int,
    CellKind::Int,
];

impl Row {
    pub(super) fn result(&self) -> Result<StoredResult, ParticipantError> {
        let status = self
            .result_status
            .and_then(|s| u16::try_from(s).ok())
            .ok_or_else(|| {
                ParticipantError::internal("a finished idempotency record has no result status")
            })?;
        let headers = match &self.headers {
            Some(json) => serde_json::from_str(json).map_err(|e| {
                ParticipantError::internal(format!("stored result headers do not decode: {e}"))
            })?,
            None => Vec::new(),
        };
        Ok(StoredResult {
            status,
            headers,
            body: self.body.clone().unwrap_or_default(),
            resource_id: self.resource_id.clone(),
        })
    }
}

/// The end write of a claim: status, result and owner token, WHERE it is still
/// `PROCESSING` under the expected owner (`extra` adds conditions; the owner token is the
/// last-but-extra bind).
pub(super) fn end_sql(extra: &str) -> String {
    format!(
        "UPDATE {TABLE} SET status = ?, result_status = ?, result_headers = ?, result_body = ?, resource_id = ?, owner_token = ?, lease_until_ms = NULL, version = version + 1, updated_at_ms = ? \
         WHERE scope = ? AND idem_key = ? AND status = 'PROCESSING' AND owner_token = ? {extra}"
    )
}

/// The binds of [`end_sql`] up to (not including) the expected owner token.
pub(super) fn end_args(
    status: Status,
    new_token: &str,
    result: &StoredResult,
    now: i64,
    scope: &str,
    key: &str,
) -> Vec<Arg> {
    let headers = serde_json::to_string(&result.headers).unwrap_or_else(|_| "[]".into());
    vec![
        Arg::Text(status.as_str().into()),
        Arg::OptInt(Some(i64::from(result.status))),
        Arg::OptText(Some(headers)),
        Arg::OptText(Some(result.body.clone())),
        Arg::OptText(result.resource_id.clone()),
        Arg::Text(new_token.into()),
        Arg::Int(now),
        Arg::Text(scope.into()),
        Arg::Text(key.into()),
    ]
}

/// Inserts the `PROCESSING` row unless (scope, key) exists; true when this call inserted it.
pub(super) async fn insert_if_absent<DB: BarrierDatabase>(
    tx: &LocalTx<'static, DB>,
    scope: &str,
    key: &str,
    hash: &str,
    token: &str,
    lease_until: i64,
    now: i64,
) -> Result<bool, ParticipantError> {
    let columns = "(scope, idem_key, request_hash, status, owner_token, lease_until_ms, attempts, version, created_at_ms, updated_at_ms) \
                   VALUES (?, ?, ?, 'PROCESSING', ?, ?, 1, 1, ?, ?)";
    let args = vec![
        Arg::Text(scope.into()),
        Arg::Text(key.into()),
        Arg::Text(hash.into()),
        Arg::Text(token.into()),
        Arg::Int(lease_until),
        Arg::Int(now),
        Arg::Int(now),
    ];
    crate::kit::insert_if_absent(tx, TABLE, columns, "scope, idem_key", args).await
}

pub(super) async fn read_row<DB: BarrierDatabase>(
    tx: &LocalTx<'static, DB>,
    scope: &str,
    key: &str,
) -> Result<Option<Row>, ParticipantError> {
    let rows = fetch(
        tx,
        &format!("SELECT {ROW_COLUMNS} FROM {TABLE} WHERE scope = ? AND idem_key = ?"),
        vec![Arg::Text(scope.into()), Arg::Text(key.into())],
        ROW_KINDS,
    )
    .await?;
    let Some(cells) = rows.into_iter().next() else {
        return Ok(None);
    };
    let text = |c: &Cell| c.text().map(str::to_owned);
    let status_text = text(&cells[1]).unwrap_or_default();
    let status = Status::parse(&status_text).ok_or_else(|| {
        ParticipantError::internal(format!("unknown idempotency status `{status_text}`"))
    })?;
    Ok(Some(Row {
        request_hash: text(&cells[0]).unwrap_or_default(),
        status,
        owner_token: text(&cells[2]).unwrap_or_default(),
        headers: text(&cells[3]),
        body: text(&cells[4]),
        resource_id: text(&cells[5]),
        lease_until_ms: cells[6].int(),
        result_status: cells[7].int(),
        attempts: cells[8].int().unwrap_or(1),
        version: cells[9].int().unwrap_or(1),
    }))
}

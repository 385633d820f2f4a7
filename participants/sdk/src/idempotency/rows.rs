//! The rows of `idem_idempotency` as the protocol reads and writes them: the insert that
//! claims, the re-claim, the end write fenced by the owner token, the read-back that
//! resolves them. `now` in these builders is SQL for the current time in Unix ms: the
//! database's clock, or a literal from the store's `Clock`.

use super::{ExpiredClaim, Status, StoredResult, TABLE};
use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::error::ParticipantError;
use crate::kit::LocalTx;
use crate::kit::local::fetch;

/// A row as the protocol reads it, with the time it was read at.
pub(super) struct Row {
    pub(super) request_hash: String,
    pub(super) status: Status,
    pub(super) owner_token: String,
    pub(super) headers: Option<String>,
    pub(super) body: Option<String>,
    pub(super) bytes: Option<Vec<u8>>,
    pub(super) resource_id: Option<String>,
    pub(super) lease_until_ms: Option<i64>,
    pub(super) result_status: Option<i64>,
    pub(super) attempts: i64,
    pub(super) version: i64,
    pub(super) updated_at_ms: i64,
    /// `now` as the statement that read the row saw it.
    pub(super) now_ms: i64,
}

const ROW_COLUMNS: &str = "request_hash, status, owner_token, result_headers, result_body, result_bytes, resource_id, lease_until_ms, result_status, attempts, version, updated_at_ms";
const ROW_KINDS: &[CellKind] = &[
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Bytes,
    CellKind::Text,
    CellKind::Int,
    CellKind::Int,
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
        // One of the two body columns holds it (text for UTF-8, bytes otherwise); a row an
        // older SDK wrote has only the text one.
        let body = match (&self.bytes, &self.body) {
            (Some(bytes), _) => bytes.clone(),
            (None, Some(text)) => text.clone().into_bytes(),
            (None, None) => Vec::new(),
        };
        Ok(StoredResult {
            status,
            headers,
            body,
            resource_id: self.resource_id.clone(),
        })
    }

    /// The row as an [`ExpiredClaim`] when nobody runs it and its outcome is not recorded:
    /// `UNKNOWN`, or `PROCESSING` with its lease run out at `now_ms`.
    pub(super) fn unsettled(&self, scope: &str, key: &str) -> Option<ExpiredClaim> {
        let open = match self.status {
            Status::Unknown => true,
            Status::Processing => self.lease_until_ms.unwrap_or(0) <= self.now_ms,
            _ => false,
        };
        open.then(|| ExpiredClaim {
            scope: scope.into(),
            key: key.into(),
            request_hash: self.request_hash.clone(),
            owner_token: self.owner_token.clone(),
            attempt: self.attempts,
            status: self.status,
            lease_until_ms: self.lease_until_ms,
            answered: self.result_status.and_then(|s| u16::try_from(s).ok()),
            since_ms: self.updated_at_ms,
        })
    }
}

/// How a run ends: the status it leaves and what the row keeps of its answer.
pub(super) struct End<'a> {
    pub(super) status: Status,
    /// The status the handler answered (kept for an `UNKNOWN` record too, for operators).
    pub(super) answered: Option<u16>,
    /// The answer repeats replay (`SUCCEEDED`, `FAILED_FINAL`); none for the others.
    pub(super) result: Option<&'a StoredResult>,
}

impl<'a> End<'a> {
    pub(super) fn with_result(status: Status, result: &'a StoredResult) -> End<'a> {
        End {
            status,
            answered: Some(result.status),
            result: Some(result),
        }
    }

    pub(super) fn bare(status: Status, answered: Option<u16>) -> End<'a> {
        End {
            status,
            answered,
            result: None,
        }
    }
}

/// The end write: status, result and owner token, WHERE the row is still in `expected`
/// under the expected owner token (the last binds), plus `fence` (more conditions).
pub(super) fn end_sql(now: &str, fence: &str) -> String {
    format!(
        "UPDATE {TABLE} SET status = ?, result_status = ?, result_headers = ?, result_body = ?, result_bytes = ?, resource_id = ?, owner_token = ?, lease_until_ms = NULL, version = version + 1, updated_at_ms = {now} \
         WHERE scope = ? AND idem_key = ? AND status = ? AND owner_token = ?{fence}"
    )
}

/// The binds of [`end_sql`].
pub(super) fn end_args(
    end: &End<'_>,
    new_token: &str,
    scope: &str,
    key: &str,
    expected: Status,
    expected_token: &str,
) -> Vec<Arg> {
    let (headers, text, bytes, resource_id) = match end.result {
        Some(result) => {
            let headers = serde_json::to_string(&result.headers).unwrap_or_else(|_| "[]".into());
            let (text, bytes) = body_columns(&result.body);
            (Some(headers), text, bytes, result.resource_id.clone())
        }
        None => (None, None, None, None),
    };
    vec![
        Arg::Text(end.status.as_str().into()),
        Arg::OptInt(end.answered.map(i64::from)),
        Arg::OptText(headers),
        Arg::OptText(text),
        Arg::OptBytes(bytes),
        Arg::OptText(resource_id),
        Arg::Text(new_token.into()),
        Arg::Text(scope.into()),
        Arg::Text(key.into()),
        Arg::Text(expected.as_str().into()),
        Arg::Text(expected_token.into()),
    ]
}

/// Where a body goes: the text column when it is UTF-8 without NUL (PostgreSQL's text
/// cannot hold NUL), readable in SQL and replayed by SDKs older than `result_bytes`; the
/// bytes column otherwise. Never both.
fn body_columns(body: &[u8]) -> (Option<String>, Option<Vec<u8>>) {
    match std::str::from_utf8(body) {
        Ok(text) if !text.contains('\0') => (Some(text.to_owned()), None),
        _ => (None, Some(body.to_vec())),
    }
}

/// The re-claim of a record under a new owner token (`PROCESSING`, a fresh lease, the old
/// answer cleared, attempt + 1), WHERE `fence` (SQL naming the expected state) holds.
/// Binds: the new token, the lease in ms, scope, key, then `fence`'s.
pub(super) fn reclaim_sql(now: &str, fence: &str) -> String {
    format!(
        "UPDATE {TABLE} SET status = 'PROCESSING', owner_token = ?, lease_until_ms = {now} + ?, result_status = NULL, result_headers = NULL, result_body = NULL, result_bytes = NULL, resource_id = NULL, attempts = attempts + 1, version = version + 1, updated_at_ms = {now} \
         WHERE scope = ? AND idem_key = ? AND {fence}"
    )
}

/// The lease renewal of a running owner. Binds: the lease in ms, scope, key, owner token.
pub(super) fn renew_sql(now: &str) -> String {
    format!(
        "UPDATE {TABLE} SET lease_until_ms = {now} + ? \
         WHERE scope = ? AND idem_key = ? AND status = 'PROCESSING' AND owner_token = ?"
    )
}

/// Inserts the `PROCESSING` row unless (scope, key) exists; true when this call inserted it.
pub(super) async fn insert_if_absent<DB: BarrierDatabase>(
    tx: &LocalTx<'static, DB>,
    now: &str,
    (scope, key, hash): (&str, &str, &str),
    token: &str,
    lease_ms: i64,
) -> Result<bool, ParticipantError> {
    let columns = format!(
        "(scope, idem_key, request_hash, status, owner_token, lease_until_ms, attempts, version, created_at_ms, updated_at_ms) \
         VALUES (?, ?, ?, 'PROCESSING', ?, {now} + ?, 1, 1, {now}, {now})"
    );
    let args = vec![
        Arg::Text(scope.into()),
        Arg::Text(key.into()),
        Arg::Text(hash.into()),
        Arg::Text(token.into()),
        Arg::Int(lease_ms),
    ];
    crate::kit::insert_if_absent(tx, TABLE, &columns, "scope, idem_key", args).await
}

/// Reads the record, and `now` with it.
pub(super) async fn read_row<DB: BarrierDatabase>(
    tx: &LocalTx<'static, DB>,
    now: &str,
    scope: &str,
    key: &str,
) -> Result<Option<Row>, ParticipantError> {
    let rows = fetch(
        tx,
        &format!("SELECT {ROW_COLUMNS}, {now} FROM {TABLE} WHERE scope = ? AND idem_key = ?"),
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
        bytes: cells[5].bytes().map(<[u8]>::to_vec),
        resource_id: text(&cells[6]),
        lease_until_ms: cells[7].int(),
        result_status: cells[8].int(),
        attempts: cells[9].int().unwrap_or(1),
        version: cells[10].int().unwrap_or(1),
        updated_at_ms: cells[11].int().unwrap_or(0),
        now_ms: cells[12].int().unwrap_or(0),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_bodies_go_to_the_text_column_and_the_rest_to_bytes() {
        assert_eq!(body_columns(b"{}"), (Some("{}".to_owned()), None));
        assert_eq!(
            body_columns("ünï".as_bytes()),
            (Some("ünï".to_owned()), None)
        );
        assert_eq!(body_columns(b"a\0b"), (None, Some(b"a\0b".to_vec())));
        assert_eq!(body_columns(&[0xff, 0xfe]), (None, Some(vec![0xff, 0xfe])));
        assert_eq!(body_columns(b""), (Some(String::new()), None));
    }
}

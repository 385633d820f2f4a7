//! The rows as stored, what they map to, and the reads that load them.

use std::collections::HashMap;

use sqlx::{Encode, Executor, FromRow, IntoArguments, Type};

use super::statements::{BRANCH_COLUMNS, GLOBAL_READ};
use super::{SqlStore, StoreDatabase};
use crate::{AttemptRecord, Created, Result, StoreError, StoredTx, Transaction};
use idem_core::{Branch, TxOptions};

/// A global row as stored.
#[derive(Debug, Clone, FromRow)]
pub struct GlobalRow {
    pub gid: String,
    pub kind: String,
    pub status: String,
    pub stalled_from: Option<String>,
    pub request_hash: String,
    pub options: String,
    pub timeout_at: Option<i64>,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub reason: Option<String>,
    pub owner_token: Option<String>,
    pub lease_until: Option<i64>,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    pub tokenless: bool,
    pub calls: i64,
    pub history: i64,
    pub history_dropped: i64,
}

/// A branch row as stored.
#[derive(Debug, Clone, FromRow)]
pub struct BranchRow {
    pub gid: String,
    pub branch_id: String,
    pub action: String,
    pub seq: i32,
    pub url: String,
    pub payload: String,
    /// A payload that is not UTF-8 (then `payload` is empty).
    pub payload_bin: Option<Vec<u8>>,
    pub status: String,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<String>,
    pub in_progress_since: Option<i64>,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

#[derive(Debug, Clone, FromRow)]
pub(super) struct AttemptRow {
    number: i64,
    branch_id: String,
    action: String,
    attempt: i32,
    started_at: i64,
    duration_ms: i64,
    outcome: String,
    detail: Option<String>,
}

pub(super) fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl AttemptRow {
    pub(super) fn into_record(self) -> Result<AttemptRecord> {
        Ok(AttemptRecord {
            number: self.number,
            branch_id: self.branch_id,
            action: self.action.parse().map_err(corrupt)?,
            attempt: self.attempt,
            started_at: self.started_at,
            duration_ms: self.duration_ms,
            outcome: self.outcome,
            detail: self.detail,
        })
    }
}

impl BranchRow {
    fn into_branch(self) -> Result<Branch> {
        Ok(Branch {
            branch_id: self.branch_id.into(),
            action: self.action.parse().map_err(corrupt)?,
            seq: self.seq,
            url: self.url.into(),
            payload: match self.payload_bin {
                Some(bytes) => bytes.into(),
                None => self.payload.into(),
            },
            status: self.status.parse().map_err(corrupt)?,
            attempts: self.attempts,
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error,
            in_progress_since: self.in_progress_since,
            updated_at: self.updated_at,
            finished_at: self.finished_at,
        })
    }
}

impl GlobalRow {
    pub(super) fn into_stored(self, branches: Vec<Branch>) -> Result<StoredTx> {
        let options: TxOptions = serde_json::from_str(&self.options).map_err(corrupt)?;
        Ok(StoredTx {
            tx: Transaction {
                gid: self.gid,
                kind: self.kind.parse().map_err(corrupt)?,
                status: self.status.parse().map_err(corrupt)?,
                stalled_from: self
                    .stalled_from
                    .map(|s| s.parse())
                    .transpose()
                    .map_err(corrupt)?,
                options,
                timeout_at: self.timeout_at,
                attempts: self.attempts,
                calls: self.calls,
                history: self.history,
                history_dropped: self.history_dropped,
                next_attempt_at: self.next_attempt_at,
                last_error: self.last_error,
                reason: self.reason,
                created_at: self.created_at,
                updated_at: self.updated_at,
                finished_at: self.finished_at,
                branches,
                trace: self.traceparent.map(|traceparent| idem_core::TraceContext {
                    traceparent,
                    tracestate: self.tracestate,
                }),
                tokenless: self.tokenless,
            },
            request_hash: self.request_hash,
            owner_token: self.owner_token,
            lease_until: self.lease_until,
            version: self.version,
        })
    }
}

impl<DB> SqlStore<DB>
where
    DB: StoreDatabase,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> GlobalRow: FromRow<'r, DB::Row>,
    for<'r> BranchRow: FromRow<'r, DB::Row>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    /// Loads several transactions with two queries per batch of gids.
    pub(super) async fn load_many(&self, gids: &[String]) -> Result<Vec<StoredTx>> {
        let mut out = Vec::with_capacity(gids.len());
        for chunk in gids.chunks(200) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let globals = self.sql.dynamic(&format!(
                "SELECT {GLOBAL_READ} FROM idem_global WHERE gid IN ({marks})"
            ));
            let branches = self.sql.dynamic(&format!(
                "SELECT {BRANCH_COLUMNS} FROM idem_branch WHERE gid IN ({marks})"
            ));
            let mut gq = sqlx::query_as::<DB, GlobalRow>(sqlx::AssertSqlSafe(globals));
            let mut bq = sqlx::query_as::<DB, BranchRow>(sqlx::AssertSqlSafe(branches));
            for gid in chunk {
                gq = gq.bind(gid.as_str());
                bq = bq.bind(gid.as_str());
            }
            let rows = gq.fetch_all(&self.pool).await?;
            let mut by_gid: HashMap<String, Vec<Branch>> = HashMap::new();
            for row in bq.fetch_all(&self.pool).await? {
                let gid = row.gid.clone();
                by_gid.entry(gid).or_default().push(row.into_branch()?);
            }
            for row in rows {
                let mut branches = by_gid.remove(&row.gid).unwrap_or_default();
                idem_core::sort_branches(&mut branches);
                out.push(row.into_stored(branches)?);
            }
        }
        Ok(out)
    }

    pub(super) async fn load_one(&self, gid: &str) -> Result<Option<StoredTx>> {
        let mut conn = self.pool.acquire().await?;
        let row: Option<GlobalRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_global.clone()))
                .bind(gid)
                .fetch_optional(&mut *conn)
                .await?;
        let Some(row) = row else { return Ok(None) };
        let branches = self.load_branches(&mut conn, gid).await?;
        Ok(Some(row.into_stored(branches)?))
    }

    /// What is stored under a gid that an insert found taken.
    pub(super) async fn existing(&self, gid: &str) -> Result<Created> {
        match self.load_one(gid).await? {
            Some(existing) => Ok(Created::Exists(Box::new(existing))),
            // Deleted between the insert and this read; report it as taken anyway.
            None => Err(StoreError::Corrupt(format!("gid {gid} vanished"))),
        }
    }

    pub(super) async fn load_global(
        &self,
        conn: &mut DB::Connection,
        gid: &str,
    ) -> Result<StoredTx> {
        let row: GlobalRow = sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_global.clone()))
            .bind(gid)
            .fetch_one(&mut *conn)
            .await?;
        row.into_stored(Vec::new())
    }

    pub(super) async fn load_branches(
        &self,
        conn: &mut DB::Connection,
        gid: &str,
    ) -> Result<Vec<Branch>> {
        let rows: Vec<BranchRow> =
            sqlx::query_as(sqlx::AssertSqlSafe(self.sql.select_branches.clone()))
                .bind(gid)
                .fetch_all(&mut *conn)
                .await?;
        let mut branches = rows
            .into_iter()
            .map(BranchRow::into_branch)
            .collect::<Result<Vec<_>>>()?;
        // Sorted here rather than by SQL: collations order branch ids differently.
        idem_core::sort_branches(&mut branches);
        Ok(branches)
    }
}

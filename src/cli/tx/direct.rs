//! The operator's commands on a database directly (`--database-url`), for when no
//! coordinator runs. They never create or migrate a database: a read in the wrong
//! directory must say so, not leave an empty `idem.db` behind and print an empty table.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use serde_json::Value;

use super::{BoxError, ListQuery, Operation, SelectArgs};
use crate::api::error::ApiError;
use crate::api::native::{bulk_view, page_view, tx_view};
use crate::api::validate::{
    DEFAULT_LIST_LIMIT, check_id, check_reason, decode_cursor_with, list_limit,
};
use crate::cli::redact;
use crate::core::Access;
use crate::engine::{
    BulkRequest, Engine, EngineConfig, EngineError, ListFilter, MAX_BULK, SystemClock,
};
use crate::store::{self, ConnectOptions};
use crate::transport::HttpTransport;

/// On the database every tenant's transactions are reachable: a gid of the default tenant,
/// or `tenant/gid` (as the list shows it).
fn check_key(key: &str) -> Result<(), ApiError> {
    if let Some((tenant, _)) = key.split_once('/') {
        crate::tenant::check_tenant(tenant).map_err(|e| ApiError::bad_request("invalid_gid", e))?;
    }
    check_id("gid", "invalid_gid", crate::tenant::client_gid(key))
}

pub(super) struct Direct {
    engine: Arc<Engine>,
    url: String,
}

impl Direct {
    pub(super) async fn open(url: &str) -> Result<Direct, BoxError> {
        let shown = redact(url);
        if let Some(path) = sqlite_file(url)?
            && !path.exists()
        {
            let path = std::path::absolute(&path).unwrap_or(path);
            return Err(format!(
                "no SQLite database at {} ({shown}): the tx commands never create one. Is the \
                 path right, relative to this directory? Or talk to the coordinator with \
                 --server.",
                path.display()
            )
            .into());
        }
        let options = ConnectOptions {
            max_connections: 2,
            ..ConnectOptions::default()
        };
        let store = store::connect_existing(url, &options)
            .await
            .map_err(|e| format!("cannot open {shown}: {e}"))?;
        let config = EngineConfig {
            drive: false,
            ..EngineConfig::default()
        };
        let engine = Engine::new(
            store,
            Arc::new(HttpTransport::new()?),
            Arc::new(SystemClock),
            config,
        );
        // A database without idem's tables is the wrong one; say so before any command
        // reports "not found" or an empty list.
        let probe = ListFilter {
            limit: 1,
            ..ListFilter::default()
        };
        engine.reads().list(&probe).await.map_err(|e| {
            format!("cannot read idem's tables in {shown}: {e}. Is it the coordinator's database? (`idem serve` or `idem migrate` creates them.)")
        })?;
        Ok(Direct { engine, url: shown })
    }

    pub(super) async fn list(&self, query: &ListQuery) -> Result<Value, BoxError> {
        // The API's checks, so both ways refuse the same; every tenant's rows are listed
        // here, so a cursor ends in a storage key (`tenant/gid`), not a gid.
        let limit =
            list_limit("limit", Some(query.limit), DEFAULT_LIST_LIMIT).map_err(api_error)?;
        let after = query
            .cursor
            .as_deref()
            .map(|cursor| decode_cursor_with("cursor", cursor, check_key))
            .transpose()
            .map_err(api_error)?;
        let filter = ListFilter {
            statuses: query.status.into_iter().collect(),
            kind: query.kind,
            after,
            limit,
            ..ListFilter::default()
        };
        let page = self
            .engine
            .reads()
            .list(&filter)
            .await
            .map_err(|e| self.engine_error(e))?;
        let mut view = page_view(&page);
        // Every tenant's rows are listed here: the cursor keeps the key, not the gid.
        view.next_cursor = page.next.as_ref().map(|(at, key)| format!("{at}:{key}"));
        Ok(serde_json::to_value(view)?)
    }

    pub(super) async fn show(&self, gid: &str) -> Result<Value, BoxError> {
        check_key(gid).map_err(api_error)?;
        let view = self
            .engine
            .reads()
            .view(gid)
            .await
            .map_err(|e| self.engine_error(e))?;
        Ok(serde_json::to_value(view)?)
    }

    pub(super) async fn operate(
        &self,
        gid: &str,
        op: Operation,
        reason: &str,
    ) -> Result<Value, BoxError> {
        check_key(gid).map_err(api_error)?;
        check_reason("reason", Some(reason)).map_err(api_error)?;
        let engine = &self.engine;
        let stored = match op {
            Operation::Retry => engine.retry(gid).await,
            Operation::ForceStop => engine.force_stop(gid, reason).await,
            Operation::Abort => engine
                .abort(gid, reason, Access::Tenant)
                .await
                .map(|(s, _)| s),
        }
        .map_err(|e| self.engine_error(e))?;
        Ok(serde_json::to_value(tx_view(&stored, None))?)
    }

    /// The engine's bulk action over every tenant (or `--tenant`'s), answered as the API's.
    pub(super) async fn bulk(
        &self,
        select: &SelectArgs,
        op: Operation,
        reason: Option<&str>,
    ) -> Result<Value, BoxError> {
        let status = select.status.ok_or("a bulk action needs --status")?;
        if let Some(tenant) = &select.tenant {
            crate::tenant::check_tenant(tenant)
                .map_err(|e| api_error(ApiError::bad_request("invalid_tenant", e)))?;
        }
        check_reason("reason", reason).map_err(api_error)?;
        let limit = select.limit.unwrap_or(100);
        if !(1..=MAX_BULK).contains(&limit) {
            return Err(format!("invalid_limit: limit {limit}: 1 to {MAX_BULK}").into());
        }
        let created_to = select.older_than.map(|age| {
            let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            self.engine.now().saturating_sub(age)
        });
        let request = BulkRequest {
            operation: op.bulk(),
            filter: ListFilter {
                tenant: select.tenant.clone(),
                statuses: vec![status],
                kind: select.kind,
                created_to,
                limit,
                ..ListFilter::default()
            },
            reason: reason.unwrap_or_default().to_owned(),
            dry_run: select.dry_run,
        };
        let report = self
            .engine
            .bulk(&request, Access::Tenant)
            .await
            .map_err(|e| self.engine_error(e))?;
        let view = bulk_view(report, op.bulk(), select.dry_run, true);
        Ok(serde_json::to_value(view)?)
    }

    /// The engine's refusals as the API words them (`code: message`); database failures
    /// as what they are, naming the database.
    fn engine_error(&self, e: EngineError) -> BoxError {
        match e {
            EngineError::Store(_) => self.database_error(e),
            other => api_error(ApiError::from(other)),
        }
    }

    fn database_error(&self, e: EngineError) -> BoxError {
        format!("database error on {}: {e}", self.url).into()
    }
}

fn api_error(e: ApiError) -> BoxError {
    format!("{}: {}", e.code, e.message).into()
}

/// The file an `sqlite:` URL names; `None` for other databases and in-memory ones.
fn sqlite_file(url: &str) -> Result<Option<PathBuf>, BoxError> {
    if idem_sql::Backend::from_url(url) != Some(idem_sql::Backend::Sqlite) {
        return Ok(None);
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url)
        .map_err(|e| format!("invalid SQLite URL {url:?}: {e}"))?;
    let path = options.get_filename();
    if path.as_os_str() == ":memory:" || path.to_string_lossy().starts_with("file:sqlx-in-memory") {
        return Ok(None);
    }
    Ok(Some(path.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        for (url, file) in [
            ("sqlite:idem.db", "idem.db"),
            ("sqlite://idem.db?mode=rwc", "idem.db"),
            ("sqlite:///tmp/x.db", "/tmp/x.db"),
            ("sqlite:/tmp/x.db?mode=rw", "/tmp/x.db"),
        ] {
            assert_eq!(
                sqlite_file(url).unwrap(),
                Some(PathBuf::from(file)),
                "{url}"
            );
        }
        assert_eq!(sqlite_file("sqlite::memory:").unwrap(), None);
        assert_eq!(sqlite_file("postgres://h/db").unwrap(), None);
    }
}

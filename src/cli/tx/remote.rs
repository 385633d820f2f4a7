//! The operator's commands through a running coordinator's HTTP API.

use std::time::Duration;

use reqwest::{Method, Url};
use serde_json::{Value, json};

use super::{BoxError, ListQuery, Operation};

pub(super) struct Remote {
    base: Url,
    http: reqwest::Client,
}

/// How long to wait for a connection: a coordinator on the network answers in
/// milliseconds; one that does not answer in seconds is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one command waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl Remote {
    pub(super) fn new(server: &str) -> Result<Remote, BoxError> {
        // `host:port` is what people type; it means plain HTTP.
        let full = match server.contains("://") {
            true => server.to_owned(),
            false => format!("http://{server}"),
        };
        let base = Url::parse(&full)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.has_host())
            .ok_or_else(|| {
                format!("invalid server URL {server:?}: use http://host:port, e.g. http://127.0.0.1:8686")
            })?;
        crate::transport::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()?;
        Ok(Remote { base, http })
    }

    /// `<base>/api/v1/transactions[/<gid>[/<op>]]`, with the gid escaped as a path
    /// segment (what the operator typed may hold anything).
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url.path_segments_mut().expect("http URLs have a path");
            path.pop_if_empty().extend(["api", "v1", "transactions"]);
            path.extend(segments);
        }
        url
    }

    pub(super) async fn list(&self, query: &ListQuery) -> Result<Value, BoxError> {
        let mut url = self.url(&[]);
        {
            let mut q = url.query_pairs_mut();
            if let Some(status) = query.status {
                q.append_pair("status", status.as_str());
            }
            if let Some(kind) = query.kind {
                q.append_pair("kind", kind.as_str());
            }
            q.append_pair("limit", &query.limit.to_string());
            if let Some(cursor) = &query.cursor {
                q.append_pair("cursor", cursor);
            }
        }
        self.send(Method::GET, url, None).await
    }

    pub(super) async fn show(&self, gid: &str) -> Result<Value, BoxError> {
        self.send(Method::GET, self.url(&[gid]), None).await
    }

    pub(super) async fn operate(
        &self,
        gid: &str,
        op: Operation,
        reason: &str,
    ) -> Result<Value, BoxError> {
        let body = match op {
            Operation::Retry => json!({}),
            Operation::ForceStop | Operation::Abort => json!({"reason": reason}),
        };
        self.send(Method::POST, self.url(&[gid, op.path()]), Some(body))
            .await
    }

    /// Sends one request. The API's errors come back as `code: message`; a coordinator
    /// that cannot be reached, or something else answering, say so in words an operator
    /// can act on. Nothing falls back to a database.
    async fn send(&self, method: Method, url: Url, body: Option<Value>) -> Result<Value, BoxError> {
        let mut request = self.http.request(method, url.clone());
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| format!("reading the answer from {url}: {}", root_cause(&e)))?;
        let value: Option<Value> = serde_json::from_str(&text).ok();
        if status.is_success()
            && let Some(value) = value
        {
            return Ok(value);
        }
        if let Some(error) = value.as_ref().and_then(|v| v.get("error"))
            && let (Some(code), Some(message)) = (error["code"].as_str(), error["message"].as_str())
        {
            return Err(format!("{code}: {message}").into());
        }
        let mut excerpt: String = text.chars().take(200).collect();
        excerpt.retain(|c| !c.is_control());
        Err(format!(
            "unexpected answer from {url}: HTTP {status}: {excerpt} (is {} an idem coordinator?)",
            self.base
        )
        .into())
    }

    fn unreachable(&self, e: &reqwest::Error) -> BoxError {
        let base = self.base.as_str().trim_end_matches('/');
        let why = if e.is_timeout() {
            format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
        } else {
            root_cause(e)
        };
        format!(
            "cannot reach the coordinator at {base}: {why}. Is `idem serve` running there? \
             Name it with --server or IDEM_SERVER, or work on its database directly with \
             --database-url."
        )
        .into()
    }
}

/// The innermost cause of an error: reqwest's own message ("error sending request for
/// url ...") wraps the part an operator can act on ("Connection refused", "failed to
/// lookup address").
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut cause = e;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_a_path_prefix_and_escape_the_gid() {
        let r = Remote::new("http://host:8686").unwrap();
        assert_eq!(
            r.url(&["g-1", "retry"]).as_str(),
            "http://host:8686/api/v1/transactions/g-1/retry"
        );
        // Behind a proxy that serves idem under a prefix.
        let r = Remote::new("https://host/idem/").unwrap();
        assert_eq!(
            r.url(&["a/b?c"]).as_str(),
            "https://host/idem/api/v1/transactions/a%2Fb%3Fc"
        );
    }

    #[test]
    fn server_urls_must_be_http() {
        assert_eq!(
            Remote::new("127.0.0.1:8686").unwrap().base.as_str(),
            "http://127.0.0.1:8686/"
        );
        for bad in ["ftp://host", "http://", "sqlite:idem.db", "postgres://h/db"] {
            let err = Remote::new(bad).err().expect(bad).to_string();
            assert!(err.contains("invalid server URL"), "{bad}: {err}");
        }
    }
}

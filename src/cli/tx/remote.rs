//! The operator's commands through a running coordinator's HTTP API, with the typed
//! client's raw answers (printed as the API gave them).

use std::time::Duration;

use idem_client::{Client, Error, RetryPolicy, Url};
use serde_json::Value;

use super::{BoxError, ListQuery, Operation};

pub(super) struct Remote {
    base: Url,
    client: Client,
}

/// How long to wait for a connection: a coordinator on the network answers in
/// milliseconds; one that does not answer in seconds is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one command waits for its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl Remote {
    pub(super) fn new(
        server: &str,
        token: Option<&str>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Remote, BoxError> {
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
        crate::tls::install_crypto_provider();
        let mut http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if let Some(token) = token {
            http = http.default_headers(idem_client::bearer_headers(token)?);
        }
        if let Some(path) = ca_file {
            // The same loading as `idem serve --outbound-ca-file`.
            let tls = crate::tls::OutboundTls::load(Some(path), None, None)?;
            http = tls.apply(http);
        }
        let http = http.build()?;
        // An operator's command is sent once: what it met is what it reports.
        let client = Client::with_http(base.as_str(), http)?.retry_policy(RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        });
        Ok(Remote { base, client })
    }

    /// `<base>/api/v1/transactions[/<gid>[/<op>]]`, with the gid escaped as a path
    /// segment (what the operator typed may hold anything).
    fn url(&self, segments: &[&str]) -> Url {
        self.client.transactions_url(segments)
    }

    pub(super) async fn list(&self, query: &ListQuery) -> Result<Value, BoxError> {
        let query = idem_client::ListQuery {
            status: query.status,
            kind: query.kind,
            limit: Some(query.limit),
            cursor: query.cursor.clone(),
            ..idem_client::ListQuery::default()
        };
        let answer = self.client.raw().list(&query).await;
        answer.map_err(|e| self.explain(e, &self.client.list_url(&query)))
    }

    pub(super) async fn show(&self, gid: &str) -> Result<Value, BoxError> {
        let answer = self.client.raw().get(gid).await;
        answer.map_err(|e| self.explain(e, &self.url(&[gid])))
    }

    pub(super) async fn operate(
        &self,
        gid: &str,
        op: Operation,
        reason: &str,
    ) -> Result<Value, BoxError> {
        let raw = self.client.raw();
        let answer = match op {
            Operation::Retry => raw.retry(gid).await,
            Operation::ForceStop => raw.force_stop(gid, reason).await,
            Operation::Abort => raw.abort(gid, Some(reason), false).await,
        };
        answer.map_err(|e| self.explain(e, &self.url(&[gid, op.path()])))
    }

    /// `POST /api/v1/bulk` with `request` (see `bulk.rs`).
    pub(super) async fn bulk(&self, request: &Value) -> Result<Value, BoxError> {
        let answer = self.client.raw().bulk(request).await;
        answer.map_err(|e| self.explain(e, &self.client.bulk_url()))
    }

    /// The API's errors come back as `code: message`; a coordinator that cannot be
    /// reached, or something else answering, say so in words an operator can act on.
    /// Nothing falls back to a database.
    fn explain(&self, e: Error, url: &Url) -> BoxError {
        let unexpected = |status: u16, text: &str| {
            let status = reqwest::StatusCode::from_u16(status)
                .map_or_else(|_| status.to_string(), |s| s.to_string());
            let mut excerpt: String = text.chars().take(200).collect();
            excerpt.retain(|c| !c.is_control());
            format!(
                "unexpected answer from {url}: HTTP {status}: {excerpt} (is {} an idem coordinator?)",
                self.base
            )
        };
        match &e {
            Error::Api { code, message, .. } if e.is_from_api() => format!("{code}: {message}"),
            Error::Api {
                status, message, ..
            } => unexpected(*status, message),
            Error::Decode { status, body, .. } => unexpected(*status, body),
            Error::Transport(t) if t.while_reading_answer() => {
                format!("reading the answer from {url}: {}", t.cause())
            }
            Error::Transport(t) => self.unreachable(t),
            Error::InvalidUrl(_) => e.to_string(),
        }
        .into()
    }

    fn unreachable(&self, e: &idem_client::TransportError) -> String {
        let base = self.base.as_str().trim_end_matches('/');
        let why = if e.is_timeout() {
            format!("no answer within {} s", REQUEST_TIMEOUT.as_secs())
        } else {
            e.cause().to_owned()
        };
        format!(
            "cannot reach the coordinator at {base}: {why}. Is `idem serve` running there? \
             Name it with --server or IDEM_SERVER, or work on its database directly with \
             --database-url."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_a_path_prefix_and_escape_the_gid() {
        let r = Remote::new("http://host:8686", None, None).unwrap();
        assert_eq!(
            r.url(&["g-1", "retry"]).as_str(),
            "http://host:8686/api/v1/transactions/g-1/retry"
        );
        // Behind a proxy that serves idem under a prefix.
        let r = Remote::new("https://host/idem/", None, None).unwrap();
        assert_eq!(
            r.url(&["a/b?c"]).as_str(),
            "https://host/idem/api/v1/transactions/a%2Fb%3Fc"
        );
    }

    /// What the operator reads for each way a request can fail (the same words as when
    /// this module spoke HTTP itself).
    #[test]
    fn failures_are_explained_in_the_operators_words() {
        let r = Remote::new("http://h:1", None, None).unwrap();
        let url = r.url(&["g"]);
        let said = |e: Error| r.explain(e, &url).to_string();
        let api = Error::Api {
            status: 404,
            code: "not_found".into(),
            message: "no transaction with gid \"g\"".into(),
        };
        assert_eq!(said(api), "not_found: no transaction with gid \"g\"");
        let page = Error::Api {
            status: 404,
            code: "http_404".into(),
            message: "<html>\n gone</html>".into(),
        };
        assert_eq!(
            said(page),
            "unexpected answer from http://h:1/api/v1/transactions/g: HTTP 404 Not Found: \
             <html> gone</html> (is http://h:1/ an idem coordinator?)"
        );
        let not_json = Error::Decode {
            status: 200,
            message: "expected value".into(),
            body: "x".repeat(250),
        };
        assert_eq!(
            said(not_json),
            format!(
                "unexpected answer from http://h:1/api/v1/transactions/g: HTTP 200 OK: {} \
                 (is http://h:1/ an idem coordinator?)",
                "x".repeat(200)
            )
        );
        let refused = Error::Transport("Connection refused (os error 111)".into());
        assert!(said(refused).starts_with(
            "cannot reach the coordinator at http://h:1: Connection refused (os error 111). \
                 Is `idem serve` running there?"
        ),);
    }

    #[test]
    fn server_urls_must_be_http() {
        assert_eq!(
            Remote::new("127.0.0.1:8686", None, None)
                .unwrap()
                .base
                .as_str(),
            "http://127.0.0.1:8686/"
        );
        for bad in ["ftp://host", "http://", "sqlite:idem.db", "postgres://h/db"] {
            let err = Remote::new(bad, None, None).err().expect(bad).to_string();
            assert!(err.contains("invalid server URL"), "{bad}: {err}");
        }
    }
}

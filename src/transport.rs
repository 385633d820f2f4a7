//! Calling participants.
//!
//! The engine hands a [`CallRequest`] to a [`Transport`] and gets back the participant's
//! answer classified as a [`CallOutcome`]. The HTTP transport follows DTM's conventions so
//! DTM-style participants work unchanged: `POST <branch url>?gid=..&trans_type=..&branch_id=..&op=..`
//! with the registered payload as the body. Fault injection wraps this trait.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::core::{Action, CallOutcome, Kind, Protocol};

/// One call to a participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRequest {
    pub gid: String,
    pub kind: Kind,
    pub branch_id: String,
    pub action: Action,
    pub url: String,
    pub payload: String,
    pub timeout: Duration,
    pub headers: BTreeMap<String, String>,
    pub protocol: Protocol,
    /// 1 for the first call of this branch operation.
    pub attempt: u32,
}

/// What came back, with what the history records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallResult {
    pub outcome: CallOutcome,
    /// The HTTP status, when there was a response.
    pub status: Option<u16>,
    pub duration: Duration,
    /// The injected fault that shaped this result, if any (see `faults`).
    pub fault: Option<String>,
}

#[async_trait::async_trait]
pub trait Transport: Send + Sync + 'static {
    async fn call(&self, request: &CallRequest) -> CallResult;
}

/// The real transport: one shared reqwest client (pooled keep-alive connections).
#[derive(Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
}

/// Bytes of a response body kept in an error message.
const BODY_SNIPPET: usize = 300;

impl HttpTransport {
    pub fn new() -> Result<HttpTransport, reqwest::Error> {
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        Ok(HttpTransport { client })
    }

    fn url(request: &CallRequest) -> Result<reqwest::Url, String> {
        let mut url = reqwest::Url::parse(&request.url).map_err(|e| format!("bad URL: {e}"))?;
        url.query_pairs_mut()
            .append_pair("gid", &request.gid)
            .append_pair("trans_type", request.kind.as_str())
            .append_pair("branch_id", &request.branch_id)
            .append_pair("op", request.action.op());
        Ok(url)
    }
}

#[async_trait::async_trait]
impl Transport for HttpTransport {
    async fn call(&self, request: &CallRequest) -> CallResult {
        let started = Instant::now();
        let url = match Self::url(request) {
            Ok(url) => url,
            Err(e) => {
                return CallResult {
                    outcome: CallOutcome::Unknown(e),
                    status: None,
                    duration: started.elapsed(),
                    fault: None,
                };
            }
        };
        // DTM asks its msg back-check with GET and no body; everything else is a POST.
        let builder = if request.action == Action::QueryPrepared {
            self.client.get(url)
        } else {
            self.client
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(request.payload.clone())
        };
        let mut builder = builder.timeout(request.timeout);
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        let response = builder.send().await;
        let (outcome, status) = match response {
            Err(e) => (CallOutcome::Unknown(describe(&e)), None),
            Ok(response) => {
                let status = response.status().as_u16();
                match response.text().await {
                    Ok(body) => (classify(request.protocol, status, &body), Some(status)),
                    Err(e) => (CallOutcome::Unknown(describe(&e)), Some(status)),
                }
            }
        };
        CallResult {
            outcome,
            status,
            duration: started.elapsed(),
            fault: None,
        }
    }
}

/// Reads a participant's answer. Native: by status code alone. DTM: a body that contains
/// `ONGOING` or `FAILURE` says so whatever the status (DTM clients rely on it).
pub fn classify(protocol: Protocol, status: u16, body: &str) -> CallOutcome {
    let snippet = || snippet(body);
    if protocol == Protocol::Dtm {
        if status == 425 || body.contains("ONGOING") {
            return CallOutcome::InProgress(format!("HTTP {status}: {}", snippet()));
        }
        if status == 409 || body.contains("FAILURE") {
            return CallOutcome::Failure(format!("HTTP {status}: {}", snippet()));
        }
    }
    match status {
        200..=299 => CallOutcome::Success,
        409 => CallOutcome::Failure(format!("HTTP 409: {}", snippet())),
        425 => CallOutcome::InProgress(format!("HTTP 425: {}", snippet())),
        _ => CallOutcome::Unknown(format!("HTTP {status}: {}", snippet())),
    }
}

fn snippet(body: &str) -> String {
    let body = body.trim();
    if body.len() <= BODY_SNIPPET {
        return body.to_owned();
    }
    let mut end = BODY_SNIPPET;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &body[..end])
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        format!("connection failed: {e}")
    } else {
        e.to_string()
    }
}

/// reqwest and sqlx share rustls with the ring provider; it must be chosen once per process.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_reads_status_codes_only() {
        assert_eq!(
            classify(Protocol::Native, 200, "FAILURE"),
            CallOutcome::Success
        );
        assert_eq!(classify(Protocol::Native, 204, ""), CallOutcome::Success);
        assert!(matches!(
            classify(Protocol::Native, 409, "x"),
            CallOutcome::Failure(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 425, ""),
            CallOutcome::InProgress(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 500, ""),
            CallOutcome::Unknown(_)
        ));
        assert!(matches!(
            classify(Protocol::Native, 404, ""),
            CallOutcome::Unknown(_)
        ));
    }

    #[test]
    fn dtm_also_reads_the_body() {
        assert!(matches!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"FAILURE"}"#),
            CallOutcome::Failure(_)
        ));
        assert!(matches!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"ONGOING"}"#),
            CallOutcome::InProgress(_)
        ));
        assert!(matches!(
            classify(Protocol::Dtm, 500, "ONGOING"),
            CallOutcome::InProgress(_)
        ));
        assert_eq!(
            classify(Protocol::Dtm, 200, r#"{"dtm_result":"SUCCESS"}"#),
            CallOutcome::Success
        );
    }

    #[test]
    fn query_parameters_follow_dtm() {
        let request = CallRequest {
            gid: "g 1".into(),
            kind: Kind::Tcc,
            branch_id: "01".into(),
            action: Action::Confirm,
            url: "http://h:1/p?x=1".into(),
            payload: String::new(),
            timeout: Duration::from_secs(1),
            headers: BTreeMap::new(),
            protocol: Protocol::Native,
            attempt: 1,
        };
        assert_eq!(
            HttpTransport::url(&request).unwrap().as_str(),
            "http://h:1/p?x=1&gid=g+1&trans_type=tcc&branch_id=01&op=confirm"
        );
    }

    #[test]
    fn long_bodies_are_cut_on_a_char_boundary() {
        let body = "é".repeat(400);
        let s = snippet(&body);
        assert!(s.len() <= BODY_SNIPPET + "…".len());
        assert!(s.ends_with('…'));
    }
}

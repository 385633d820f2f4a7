//! A scriptable participant: a real HTTP server that records every call it gets and
//! answers by rules (status code, delay) matched on path and gid.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use serde::Deserialize;
use tokio::sync::Notify;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub path: String,
    pub gid: String,
    pub trans_type: String,
    pub branch_id: String,
    pub op: String,
    pub body: String,
    /// The caller's User-Agent: idem names its node there.
    pub agent: String,
    /// The W3C trace context the call carried.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The `Idem-Tenant` header: set on every call, the default tenant included.
    pub tenant: Option<String>,
    /// The `Authorization` header (Basic, from a URL's userinfo).
    pub authorization: Option<String>,
    /// When the call arrived.
    pub at: std::time::Instant,
}

#[derive(Clone, Debug)]
struct Rule {
    path: String,
    gid: Option<String>,
    remaining: usize,
    status: u16,
    delay: Duration,
    body: Option<String>,
}

#[derive(Default)]
struct Inner {
    calls: Mutex<Vec<Call>>,
    rules: Mutex<Vec<Rule>>,
    changed: Notify,
}

#[derive(Clone)]
pub struct Recorder {
    pub base: String,
    inner: Arc<Inner>,
}

#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    gid: String,
    #[serde(default)]
    trans_type: String,
    #[serde(default)]
    branch_id: String,
    #[serde(default)]
    op: String,
}

async fn handle(
    State(inner): State<Arc<Inner>>,
    uri: Uri,
    headers: axum::http::HeaderMap,
    Query(p): Query<Params>,
    body: Bytes,
) -> (StatusCode, String) {
    let at = std::time::Instant::now();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let agent = header("user-agent").unwrap_or_default();
    let (traceparent, tracestate) = (header("traceparent"), header("tracestate"));
    let authorization = header("authorization");
    let path = uri.path().to_owned();
    let rule = {
        let mut rules = inner.rules.lock().unwrap();
        let found = rules.iter_mut().find(|r| {
            r.remaining > 0 && r.path == path && r.gid.as_ref().is_none_or(|g| *g == p.gid)
        });
        found.map(|r| {
            r.remaining -= 1;
            r.clone()
        })
    };
    let (status, delay, answer) =
        rule.map_or((200, Duration::ZERO, None), |r| (r.status, r.delay, r.body));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    inner.calls.lock().unwrap().push(Call {
        path,
        gid: p.gid,
        trans_type: p.trans_type,
        branch_id: p.branch_id,
        op: p.op,
        body: String::from_utf8_lossy(&body).into_owned(),
        agent,
        traceparent,
        tracestate,
        tenant: header("idem-tenant"),
        authorization,
        at,
    });
    inner.changed.notify_waiters();
    let status = StatusCode::from_u16(status).unwrap();
    let answer = answer.unwrap_or_else(|| format!("{{\"status\":{}}}", status.as_u16()));
    (status, answer)
}

impl Recorder {
    pub async fn start() -> Recorder {
        let (inner, app) = Recorder::app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Recorder {
            base: format!("http://{addr}"),
            inner,
        }
    }

    /// A recorder served over TLS by `acceptor` (which may require client certificates):
    /// only calls that got through the handshake are recorded.
    pub async fn start_tls(acceptor: tokio_rustls::TlsAcceptor) -> Recorder {
        let (inner, app) = Recorder::app();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request| {
                        tower::ServiceExt::oneshot(app.clone(), request)
                    });
                    let io = hyper_util::rt::TokioIo::new(tls);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                });
            }
        });
        Recorder {
            base: format!("https://{addr}"),
            inner,
        }
    }

    fn app() -> (Arc<Inner>, Router) {
        let inner = Arc::new(Inner::default());
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&inner));
        (inner, app)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The next `times` calls to `path` (for `gid`, if given) answer `status`.
    pub fn answer(&self, path: &str, gid: Option<&str>, times: usize, status: u16) {
        self.rule(path, gid, times, status, Duration::ZERO);
    }

    /// The next `times` calls to `path` wait `delay` before answering 200.
    pub fn delay(&self, path: &str, gid: Option<&str>, times: usize, delay: Duration) {
        self.rule(path, gid, times, 200, delay);
    }

    /// The next `times` calls to `path` answer `status` with `body`.
    pub fn answer_body(&self, path: &str, times: usize, status: u16, body: &str) {
        self.push(Rule {
            path: path.into(),
            gid: None,
            remaining: times,
            status,
            delay: Duration::ZERO,
            body: Some(body.into()),
        });
    }

    fn rule(&self, path: &str, gid: Option<&str>, times: usize, status: u16, delay: Duration) {
        self.push(Rule {
            path: path.into(),
            gid: gid.map(Into::into),
            remaining: times,
            status,
            delay,
            body: None,
        });
    }

    /// Drops every rule: the participant answers 200 from now on (an outage heals).
    pub fn heal(&self) {
        self.inner.rules.lock().unwrap().clear();
    }

    /// Calls for `gid` whose path ends with `suffix`.
    pub fn count(&self, gid: &str, suffix: &str) -> usize {
        self.paths(gid)
            .iter()
            .filter(|p| p.ends_with(suffix))
            .count()
    }

    fn push(&self, rule: Rule) {
        self.inner.rules.lock().unwrap().push(rule);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.inner.calls.lock().unwrap().clone()
    }

    /// `path` of every call for `gid`, in arrival order.
    pub fn paths(&self, gid: &str) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter(|c| c.gid == gid)
            .map(|c| c.path)
            .collect()
    }

    /// Waits until `done(calls)` holds, or panics after `timeout`.
    pub async fn wait_until(&self, timeout: Duration, done: impl Fn(&[Call]) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&self.calls()) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "condition not reached in {timeout:?}; calls: {:#?}",
                    self.calls()
                );
            }
        }
    }
}

//! Calling participants.
//!
//! The engine hands a [`CallRequest`] to a [`Transport`] and gets back the participant's
//! answer classified as a [`CallOutcome`]. The HTTP transport follows DTM's conventions so
//! DTM-style participants work unchanged: `POST <branch url>?gid=..&trans_type=..&branch_id=..&op=..`
//! with the registered payload as the body. Fault injection wraps this trait.
//!
//! A participant's answer is untrusted input: only its first [`DEFAULT_MAX_ANSWER_BYTES`]
//! (or the configured bound) are read, so one huge answer cannot make the coordinator
//! buffer it, and redirects are never followed, so a call goes only to the URL the client
//! registered (a 3xx is an unknown outcome). Nothing the participant wrote reaches the
//! outcome's detail, which clients read: only its status and DTM's `FAILURE`/`ONGOING`
//! marker (see [`classify`]); the answer's first bytes and a redirect's `Location` are
//! logged at debug level for operators.
//!
//! Every call carries `Idem-Tenant` (its tenant, the default one included) and
//! `Idem-Call-Id` (128 random bits, new for every attempt), which idem sets over any a
//! client put in `branch_headers`. With signing keys (`--signing-secret-file`,
//! `--signing-secret`), it also carries an `Idem-Signature` over its method, scheme, host,
//! port, path and query, body, time, tenant and call id, made with the tenant's key (see
//! [`idem_signing`] and [`crate::signing`]); without keys, calls go unsigned.
//!
//! A branch URL without a scheme is DTM's gRPC target: [`grpc`] calls it.
//!
//! Every call is checked against the tenant's entry of the outbound policy (see
//! [`crate::outbound`]) before anything is sent: the URL, and every address its name
//! resolves to (each entry has its own client, whose resolver drops what the entry does
//! not allow; URLs on one of idem's own ports get a second client whose resolver also
//! drops this host's addresses). A refused call makes no connection and is an unknown
//! outcome whose detail starts with `outbound_denied:`, so it is retried and stalls or
//! compensates like any call that got no answer. Details never carry a URL's userinfo.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::core::{Action, CallOutcome, Kind, Payload, Protocol};
use crate::tls::OutboundTls;
// Where callers outside idem (the lab, tests, examples) have always found it.
pub use crate::tls::install_crypto_provider;

mod answer;
mod grpc;
use crate::outbound::resolve::PolicyResolver;
use crate::outbound::{DENIED_PREFIX, OutboundPolicy, Refusal, Rule, redact_userinfo};
pub use answer::classify;
use answer::{log_answer, read_head, redirected};

/// One call to a participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRequest {
    /// The client's gid (never the tenant-scoped storage key: see [`crate::tenant`]).
    pub gid: String,
    /// The transaction's tenant.
    pub tenant: String,
    pub kind: Kind,
    pub branch_id: String,
    pub action: Action,
    pub url: String,
    pub payload: Payload,
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

/// The real transport: a shared reqwest client (pooled keep-alive connections) per entry
/// of the outbound policy that calls went through.
#[derive(Clone)]
pub struct HttpTransport {
    clients: Arc<Clients>,
    max_answer: usize,
    signer: Option<Arc<crate::signing::Signer>>,
    /// Connections to gRPC participants, shared by every clone.
    grpc_channels: Arc<grpc::Channels>,
}

/// The policy and its entries' clients, built on first use: a resolver sees only the
/// host name, so the entry it checks against is the client's.
struct Clients {
    policy: Arc<OutboundPolicy>,
    /// Extra roots and the client certificate, the same for every entry's client.
    tls: OutboundTls,
    /// By entry index, then whether the URL is on one of idem's own ports; once built,
    /// taken without a lock.
    built: Vec<[OnceLock<reqwest::Client>; 2]>,
}

impl Clients {
    fn new(policy: Arc<OutboundPolicy>, tls: OutboundTls) -> Result<Clients, reqwest::Error> {
        let clients = Clients {
            built: (0..policy.entries()).map(|_| Default::default()).collect(),
            policy,
            tls,
        };
        // The default entry's client now, so a builder error stops the start.
        let (index, rule) = clients.policy.rule_for(crate::tenant::DEFAULT_TENANT);
        clients.get(index, rule, false)?;
        Ok(clients)
    }

    fn get(
        &self,
        index: usize,
        rule: &Arc<Rule>,
        own_port: bool,
    ) -> Result<reqwest::Client, reqwest::Error> {
        let slot = &self.built[index][usize::from(own_port)];
        if let Some(client) = slot.get() {
            return Ok(client.clone());
        }
        let resolver = PolicyResolver::new(Arc::clone(rule), own_port);
        let builder = client_builder().dns_resolver(Arc::new(resolver));
        let client = self.tls.apply(builder).build()?;
        // Two first calls may both build one; either serves, the other is dropped.
        Ok(slot.get_or_init(|| client).clone())
    }
}

/// Every participant client's settings, whichever entry of the policy it serves.
fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        // A followed redirect would deliver the call to a URL nobody registered (and
        // defeat any check of where calls may go); the 3xx is reported instead.
        .redirect(reqwest::redirect::Policy::none())
        // Through a proxy, the resolver would check the proxy's address, not the
        // participant's: calls go direct, so the outbound policy judges where they go.
        .no_proxy()
}

/// The headers idem sets on every call itself: a client's values are dropped.
const IDEM_HEADERS: [&str; 3] = [
    idem_signing::HEADER,
    idem_signing::TENANT_HEADER,
    idem_signing::CALL_ID_HEADER,
];

/// How much of an answer is read by default. What idem keeps is the status and DTM's
/// marker; DTM's markers sit in a short JSON answer. 64 KiB leaves room for verbose error
/// pages while bounding memory at about 64 MiB for the engine's 1,024 concurrent calls.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 * 1024;

impl HttpTransport {
    /// The default answer bound and the built-in policy of a server with tokens (public
    /// addresses only); a server's transport comes from `ServerConfig::transport`.
    pub fn new() -> Result<HttpTransport, reqwest::Error> {
        HttpTransport::with_policy(
            DEFAULT_MAX_ANSWER_BYTES,
            Arc::default(),
            &OutboundTls::default(),
        )
    }

    /// Reads at most `max_answer` bytes of each answer's body; calls only what `policy`
    /// allows, with `tls`'s extra roots and client certificate.
    pub fn with_policy(
        max_answer: usize,
        policy: Arc<OutboundPolicy>,
        tls: &OutboundTls,
    ) -> Result<HttpTransport, reqwest::Error> {
        install_crypto_provider();
        Ok(HttpTransport {
            clients: Arc::new(Clients::new(policy, tls.clone())?),
            max_answer: max_answer.max(1),
            signer: None,
            grpc_channels: Arc::default(),
        })
    }

    /// Signs every call with `signer`'s keys (`None`: calls go unsigned).
    pub fn with_signer(mut self, signer: Option<Arc<crate::signing::Signer>>) -> HttpTransport {
        self.signer = signer;
        self
    }

    /// The client for `request`'s tenant, once its URL passed idem's own listeners and
    /// the tenant's entry.
    fn client_for(
        &self,
        request: &CallRequest,
        url: &reqwest::Url,
    ) -> Result<reqwest::Client, String> {
        let policy = &self.clients.policy;
        policy
            .check_parsed(&request.tenant, url)
            .map_err(|refusal| format!("{DENIED_PREFIX} {refusal}"))?;
        let own_port = url
            .port_or_known_default()
            .is_some_and(|port| policy.own().has_port(port));
        let (index, rule) = policy.rule_for(&request.tenant);
        self.clients
            .get(index, rule, own_port)
            .map_err(|e| format!("cannot build the HTTP client: {}", describe(&e)))
    }

    fn url(request: &CallRequest) -> Result<reqwest::Url, String> {
        let url = reqwest::Url::parse(&request.url).map_err(|e| format!("bad URL: {e}"))?;
        Ok(with_call_query(url, request))
    }
}

/// `url` with DTM's query parameters of a branch call appended: what an HTTP call is sent
/// to, and what a gRPC call (whose parameters travel as metadata) is signed for.
fn with_call_query(mut url: reqwest::Url, request: &CallRequest) -> reqwest::Url {
    url.query_pairs_mut()
        .append_pair("gid", &request.gid)
        .append_pair("trans_type", request.kind.as_str())
        .append_pair("branch_id", &request.branch_id)
        .append_pair("op", request.action.op());
    url
}

#[async_trait::async_trait]
impl Transport for HttpTransport {
    async fn call(&self, request: &CallRequest) -> CallResult {
        // DTM's gRPC branches: a URL without a scheme (see `outbound::GrpcTarget`).
        if let Some(target) = crate::outbound::GrpcTarget::parse(&request.url) {
            let caller = grpc::Caller {
                policy: &self.clients.policy,
                channels: &self.grpc_channels,
                signer: self.signer.as_deref(),
                max_answer: self.max_answer,
            };
            return grpc::call(&caller, request, &target).await;
        }
        let started = Instant::now();
        let checked = Self::url(request)
            .and_then(|url| self.client_for(request, &url).map(|client| (url, client)));
        let (url, client) = match checked {
            Ok(checked) => checked,
            Err(e) => {
                return CallResult {
                    outcome: CallOutcome::Unknown(redact_userinfo(&e).into_owned()),
                    status: None,
                    duration: started.elapsed(),
                    fault: None,
                };
            }
        };
        // DTM asks its msg back-check with GET and no body; everything else is a POST.
        let get = request.action == Action::QueryPrepared;
        let (method, body) = if get {
            ("GET", &[][..])
        } else {
            ("POST", request.payload.as_bytes())
        };
        let call_id = idem_signing::new_call_id();
        let signature = self
            .signer
            .as_ref()
            .and_then(|signer| signer.sign_request(method, &url, body, &request.tenant, &call_id));
        // reqwest moves a URL's userinfo into an `Authorization: Basic` header.
        let builder = if get {
            client.get(url)
        } else {
            // A payload that is not text came from a gRPC client (protobuf bytes).
            let content_type = match request.payload.as_text() {
                Some(_) => "application/json",
                None => "application/octet-stream",
            };
            client
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes::Bytes::from_owner(request.payload.clone()))
        };
        let mut builder = builder.timeout(request.timeout);
        for (name, value) in &request.headers {
            // idem's own signature, tenant and call id, never ones a client set in
            // branch_headers.
            if !IDEM_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h)) {
                builder = builder.header(name, value);
            }
        }
        builder = builder
            .header(idem_signing::TENANT_HEADER, &request.tenant)
            .header(idem_signing::CALL_ID_HEADER, &call_id);
        if let Some(signature) = signature {
            builder = builder.header(idem_signing::HEADER, signature);
        }
        let response = builder.send().await;
        let (outcome, status) = match response {
            Err(e) => (CallOutcome::Unknown(describe(&e)), None),
            Ok(response) if response.status().is_redirection() => {
                let status = response.status().as_u16();
                let location = response.headers().get(reqwest::header::LOCATION);
                let shown = location.map(|l| String::from_utf8_lossy(l.as_bytes()));
                log_answer(
                    request,
                    status,
                    "a redirect to",
                    shown.as_deref().unwrap_or(""),
                );
                (redirected(status), Some(status))
            }
            Ok(response) => {
                let status = response.status().as_u16();
                match read_head(response, self.max_answer).await {
                    Ok(head) => {
                        let outcome = head.classify(request.protocol, status);
                        if outcome != CallOutcome::Success {
                            log_answer(request, status, "answered", &head.text);
                        }
                        (outcome, Some(status))
                    }
                    Err(e) => (CallOutcome::Unknown(describe(&e)), Some(status)),
                }
            }
        };
        CallResult {
            outcome: redact_outcome(outcome),
            status,
            duration: started.elapsed(),
            fault: None,
        }
    }
}

/// The outcome with its detail's userinfo redacted: the detail is stored, shown and
/// logged, and a redirect's `Location` or an error's URL may carry credentials.
fn redact_outcome(outcome: CallOutcome) -> CallOutcome {
    let clean = |detail: String| redact_userinfo(&detail).into_owned();
    match outcome {
        CallOutcome::Success => CallOutcome::Success,
        CallOutcome::Failure(d) => CallOutcome::Failure(clean(d)),
        CallOutcome::InProgress(d) => CallOutcome::InProgress(clean(d)),
        CallOutcome::Unknown(d) => CallOutcome::Unknown(clean(d)),
    }
}

fn describe(e: &reqwest::Error) -> String {
    if let Some(refusal) = refusal_in(e) {
        return format!("{DENIED_PREFIX} {refusal}");
    }
    if e.is_timeout() {
        return "timed out".to_owned();
    }
    let mut text = if e.is_connect() {
        format!("connection failed: {e}")
    } else {
        e.to_string()
    };
    // reqwest's own text names only the URL; why (refused, an untrusted certificate, a
    // TLS alert) is further down the chain, and that is what an operator needs.
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text = format!("{text}: {c_text}");
        }
        cause = c.source();
    }
    text
}

/// The outbound policy's refusal a failed call carries, if that is why it failed: the
/// resolver's error sits a few sources down reqwest's error.
fn refusal_in(e: &reqwest::Error) -> Option<&Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if let Some(refusal) = error.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        source = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_follow_dtm() {
        let request = CallRequest {
            gid: "g 1".into(),
            tenant: crate::tenant::DEFAULT_TENANT.into(),
            kind: Kind::Tcc,
            branch_id: "01".into(),
            action: Action::Confirm,
            url: "http://h:1/p?x=1".into(),
            payload: Payload::default(),
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
}

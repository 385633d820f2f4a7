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
//! registered (a 3xx is an unknown outcome naming its `Location`).
//!
//! With a signing key (`--signing-secret-file`, `--signing-secret`), every call carries an
//! `Idem-Signature` header over its method, path and query, time and body (see
//! [`idem_signing`]); without one, calls go unsigned.
//!
//! Every call is checked against the tenant's entry of the outbound policy (see
//! [`crate::outbound`]) before anything is sent: the URL, and every address its name
//! resolves to (each entry has its own client, whose resolver drops what the entry does
//! not allow). A refused call makes no connection and is an unknown outcome whose detail
//! starts with `outbound_denied:`, so it is retried and stalls or compensates like any
//! call that got no answer. Details never carry a URL's userinfo.

use std::collections::BTreeMap;

use crate::tls::OutboundTls;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::core::{Action, CallOutcome, Kind, Protocol};
use crate::outbound::resolve::PolicyResolver;
use crate::outbound::{DENIED_PREFIX, OutboundPolicy, Refusal, Rule, redact_userinfo};

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

/// The real transport: a shared reqwest client (pooled keep-alive connections) per entry
/// of the outbound policy that calls went through.
#[derive(Clone)]
pub struct HttpTransport {
    clients: Arc<Clients>,
    max_answer: usize,
    signing_key: Option<idem_signing::Key>,
}

/// The policy and its entries' clients, built on first use: a resolver sees only the
/// host name, so the entry it checks against is the client's.
struct Clients {
    policy: Arc<OutboundPolicy>,
    /// Extra roots and the client certificate, the same for every entry's client.
    tls: OutboundTls,
    /// By entry index; once built, taken without a lock.
    built: Vec<OnceLock<reqwest::Client>>,
}

impl Clients {
    fn new(policy: Arc<OutboundPolicy>, tls: OutboundTls) -> Result<Clients, reqwest::Error> {
        let clients = Clients {
            built: (0..policy.entries()).map(|_| OnceLock::new()).collect(),
            policy,
            tls,
        };
        // The default entry's client now, so a builder error stops the start.
        let (index, rule) = clients.policy.rule_for(crate::tenant::DEFAULT_TENANT);
        clients.get(index, rule)?;
        Ok(clients)
    }

    fn get(&self, index: usize, rule: &Arc<Rule>) -> Result<reqwest::Client, reqwest::Error> {
        let slot = &self.built[index];
        if let Some(client) = slot.get() {
            return Ok(client.clone());
        }
        let builder =
            client_builder().dns_resolver(Arc::new(PolicyResolver::new(Arc::clone(rule))));
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

/// Bytes of a response body kept in an error message.
const BODY_SNIPPET: usize = 300;

/// How much of an answer is read by default. What idem keeps is the status and a
/// 300-byte snippet; DTM's markers sit in a short JSON answer. 64 KiB leaves room for
/// verbose error pages while bounding memory at about 64 MiB for the engine's 1,024
/// concurrent calls.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 64 * 1024;

impl HttpTransport {
    pub fn new() -> Result<HttpTransport, reqwest::Error> {
        HttpTransport::with_answer_limit(DEFAULT_MAX_ANSWER_BYTES)
    }

    /// Reads at most `max_answer` bytes of each answer's body; no policy file (every
    /// http(s) URL but the always-denied addresses).
    pub fn with_answer_limit(max_answer: usize) -> Result<HttpTransport, reqwest::Error> {
        HttpTransport::with_policy(max_answer, Arc::default(), &OutboundTls::default())
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
            signing_key: None,
        })
    }

    /// The transport a server configuration describes: its answer bound, outbound
    /// policy and TLS, and signing key.
    pub fn for_server(
        config: &crate::server::ServerConfig,
    ) -> Result<HttpTransport, reqwest::Error> {
        let mut transport = HttpTransport::with_policy(
            config.max_answer_bytes,
            Arc::clone(&config.outbound_policy),
            &config.outbound_tls,
        )?;
        transport.signing_key = config.signing_key.clone();
        Ok(transport)
    }

    /// The client for `request`'s tenant, once its URL passed the tenant's entry.
    fn client_for(
        &self,
        request: &CallRequest,
        url: &reqwest::Url,
    ) -> Result<reqwest::Client, String> {
        let (index, rule) = self.clients.policy.rule_for(&request.tenant);
        rule.check_url(url)
            .map_err(|refusal| format!("{DENIED_PREFIX} {refusal}"))?;
        self.clients
            .get(index, rule)
            .map_err(|e| format!("cannot build the HTTP client: {}", describe(&e)))
    }

    /// The `Idem-Signature` of a call to `url` with `body`, signed now; `None` unsigned.
    fn signature(&self, method: &str, url: &reqwest::Url, body: &[u8]) -> Option<String> {
        let key = self.signing_key.as_ref()?;
        // The request target as reqwest writes it on the request line.
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        let now = idem_signing::unix_seconds(std::time::SystemTime::now());
        Some(idem_signing::sign(key, now, method, &target, body))
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
            ("GET", "")
        } else {
            ("POST", request.payload.as_str())
        };
        let signature = self.signature(method, &url, body.as_bytes());
        // reqwest moves a URL's userinfo into an `Authorization: Basic` header.
        let builder = if get {
            client.get(url)
        } else {
            client
                .post(url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(request.payload.clone())
        };
        let mut builder = builder.timeout(request.timeout);
        for (name, value) in &request.headers {
            // idem's own signature, never one a client set in branch_headers.
            if !name.eq_ignore_ascii_case(idem_signing::HEADER) {
                builder = builder.header(name, value);
            }
        }
        if let Some(signature) = signature {
            builder = builder.header(idem_signing::HEADER, signature);
        }
        let response = builder.send().await;
        let (outcome, status) = match response {
            Err(e) => (CallOutcome::Unknown(describe(&e)), None),
            Ok(response) if response.status().is_redirection() => {
                let status = response.status().as_u16();
                let location = response.headers().get(reqwest::header::LOCATION);
                (redirected(status, location), Some(status))
            }
            Ok(response) => {
                let status = response.status().as_u16();
                match read_head(response, self.max_answer).await {
                    Ok(head) => (head.classify(request.protocol, status), Some(status)),
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

/// The first bytes of an answer's body, and whether there were more.
struct Head {
    text: String,
    cut: Option<usize>,
}

impl Head {
    fn classify(&self, protocol: Protocol, status: u16) -> CallOutcome {
        let outcome = classify(protocol, status, &self.text);
        let Some(max) = self.cut else {
            return outcome;
        };
        let note = |detail: String| format!("{detail} (answer over {max} bytes, read no further)");
        match outcome {
            CallOutcome::Success => CallOutcome::Success,
            CallOutcome::Failure(d) => CallOutcome::Failure(note(d)),
            CallOutcome::InProgress(d) => CallOutcome::InProgress(note(d)),
            CallOutcome::Unknown(d) => CallOutcome::Unknown(note(d)),
        }
    }
}

/// Reads the body chunk by chunk and stops after `max` bytes: what is kept of an answer
/// is its status and a snippet, so the rest is never buffered. Dropping the response with
/// body left unread closes that connection instead of returning it to the pool.
async fn read_head(mut response: reqwest::Response, max: usize) -> Result<Head, reqwest::Error> {
    let mut head = Vec::new();
    let mut cut = None;
    while let Some(chunk) = response.chunk().await? {
        let room = max - head.len();
        if chunk.len() > room {
            head.extend_from_slice(&chunk[..room]);
            cut = Some(max);
            break;
        }
        head.extend_from_slice(&chunk);
    }
    // A cut may split a character; the lossy decoding marks it rather than failing.
    let text = String::from_utf8_lossy(&head).into_owned();
    Ok(Head { text, cut })
}

/// A 3xx: the participant did not say whether it did the work, and its answer points
/// somewhere nobody registered. Unknown, so it is retried (and stalls or compensates once
/// the attempts are used up), with the target in the detail for the operator.
fn redirected(status: u16, location: Option<&reqwest::header::HeaderValue>) -> CallOutcome {
    let target = match location {
        Some(value) => snippet(&String::from_utf8_lossy(value.as_bytes())),
        None => "nowhere (no Location header)".to_owned(),
    };
    CallOutcome::Unknown(format!("HTTP {status}: redirect to {target}, not followed"))
}

/// Reads a participant's answer. Native: by status code alone. DTM: a body that contains
/// `ONGOING` or `FAILURE` says so whatever the status (DTM clients rely on it); only the
/// head that was read (see [`DEFAULT_MAX_ANSWER_BYTES`]) is searched.
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

/// The start of an answer for a detail. NULs are replaced: the detail is stored, and
/// PostgreSQL cannot store a NUL in a text column.
fn snippet(body: &str) -> String {
    let body = body.trim().replace('\0', "\u{FFFD}");
    if body.len() <= BODY_SNIPPET {
        return body;
    }
    let mut end = BODY_SNIPPET;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &body[..end])
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
            tenant: crate::tenant::DEFAULT_TENANT.into(),
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
    fn a_signature_covers_the_path_and_query_as_sent() {
        let keys = idem_signing::Keys::parse("k1:0123456789abcdef-transport").unwrap();
        let mut transport = HttpTransport::new().unwrap();
        assert_eq!(
            transport.signature("POST", &"http://h/".parse().unwrap(), b""),
            None
        );
        transport.signing_key = Some(keys.signing_key().clone());
        let url = reqwest::Url::parse("http://h:1/a%20b?x=1&gid=g+1#frag").unwrap();
        let header = transport.signature("POST", &url, b"{}").unwrap();
        let now = std::time::SystemTime::now();
        let window = idem_signing::DEFAULT_WINDOW;
        let check = |target: &str| {
            idem_signing::verify(Some(&header), "POST", target, b"{}", now, &keys, window)
        };
        // The fragment is never sent, the percent-encoding is.
        assert_eq!(check("/a%20b?x=1&gid=g+1"), Ok("k1"));
        assert!(check("/a b?x=1&gid=g+1").is_err());
        let bare = transport
            .signature("GET", &"http://h:1".parse().unwrap(), b"")
            .unwrap();
        let verified = idem_signing::verify(Some(&bare), "GET", "/", b"", now, &keys, window);
        assert_eq!(verified, Ok("k1"));
    }

    #[test]
    fn a_redirect_is_unknown_and_names_its_target() {
        let location = reqwest::header::HeaderValue::from_static("http://elsewhere/x");
        let CallOutcome::Unknown(detail) = redirected(307, Some(&location)) else {
            panic!("a redirect must be unknown");
        };
        assert_eq!(
            detail,
            "HTTP 307: redirect to http://elsewhere/x, not followed"
        );
        let CallOutcome::Unknown(detail) = redirected(302, None) else {
            panic!("a redirect must be unknown");
        };
        assert!(detail.contains("no Location"), "{detail}");
    }

    #[test]
    fn a_cut_answer_says_so_and_is_classified_by_its_head() {
        let head = |text: &str, cut| Head {
            text: text.to_owned(),
            cut,
        };
        let outcome = head(r#"{"dtm_result":"FAILURE"}"#, Some(64)).classify(Protocol::Dtm, 200);
        let CallOutcome::Failure(detail) = outcome else {
            panic!("FAILURE in the head is a failure: {outcome:?}");
        };
        assert!(
            detail.ends_with("(answer over 64 bytes, read no further)"),
            "{detail}"
        );
        assert_eq!(
            head("x", Some(64)).classify(Protocol::Native, 204),
            CallOutcome::Success
        );
        let outcome = head("oops", None).classify(Protocol::Native, 500);
        assert_eq!(outcome, CallOutcome::Unknown("HTTP 500: oops".into()));
    }

    #[test]
    fn snippets_carry_no_nul_and_stay_short() {
        assert_eq!(snippet("a\0b"), "a\u{FFFD}b");
        // The replacement is wider than a NUL: the cut comes after it.
        let s = snippet(&"\0".repeat(1_000));
        assert!(s.len() <= BODY_SNIPPET + "…".len(), "{}", s.len());
    }

    #[test]
    fn long_bodies_are_cut_on_a_char_boundary() {
        let body = "é".repeat(400);
        let s = snippet(&body);
        assert!(s.len() <= BODY_SNIPPET + "…".len());
        assert!(s.ends_with('…'));
    }
}

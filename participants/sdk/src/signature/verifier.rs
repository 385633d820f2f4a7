//! The axum middleware: what it checks a call against, and what it hands the handler.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::{OriginalUri, Request, State};
use axum::http::request::Parts;
use axum::http::uri::Authority;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{
    CALL_ID_HEADER, DEFAULT_REPLAY_CAPACITY, DEFAULT_TENANT, HEADER, Keyring, Policy, ReplayCache,
    SharedKeyring, SignatureError, TENANT_HEADER, Version, verify_call,
};

/// The bytes of a body read to check its signature, by default: idem's API takes
/// requests of 1 MiB, so no registered payload is longer.
const DEFAULT_MAX_BODY: usize = 2 << 20;

/// Where the participant is reached as the coordinator calls it: a v2 signature covers
/// the scheme, host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// What [`require_signature`] checks against: the keys (replaceable while serving), the
/// window, v1 or not, where the participant is reached, the replay cache, and how much of
/// a body it reads. Cheap to clone; clones share the keys and the replay cache.
#[derive(Clone, Debug)]
pub struct Verifier {
    keys: SharedKeyring,
    window: Duration,
    max_body: usize,
    accept_v1: bool,
    scheme: String,
    origins: Arc<Vec<Origin>>,
    replay: Option<Arc<ReplayCache>>,
}

impl Verifier {
    /// Accepts calls signed with v2 by the keys of the call's tenant in `keys` (a
    /// [`Keyring`](super::Keyring), or one [`Keys`](super::Keys) list for every tenant),
    /// within [`super::DEFAULT_WINDOW`], each call id once; the target is rebuilt from
    /// the `Host` header over `http` (see [`Verifier::scheme`], [`Verifier::external_url`]).
    pub fn new(keys: impl Into<Keyring>) -> Verifier {
        Verifier::shared(SharedKeyring::new(keys.into()))
    }

    /// Like [`Verifier::new`], with keys that the caller replaces while serving (see
    /// [`Verifier::keyring`]).
    pub fn shared(keys: SharedKeyring) -> Verifier {
        Verifier {
            keys,
            window: super::DEFAULT_WINDOW,
            max_body: DEFAULT_MAX_BODY,
            accept_v1: false,
            scheme: "http".into(),
            origins: Arc::default(),
            replay: Some(Arc::new(ReplayCache::new(DEFAULT_REPLAY_CAPACITY))),
        }
    }

    /// The keys, to replace them without a restart (`verifier.keyring().reload(path)`,
    /// or `replace(keyring)`): calls from then on are checked against the new ones.
    pub fn keyring(&self) -> SharedKeyring {
        self.keys.clone()
    }

    /// Rereads the key file `path` every `every` in a task of its own (until the runtime
    /// ends or the handle is aborted); a file that cannot be used is logged and the keys
    /// in use stay.
    pub fn reload_every(&self, path: PathBuf, every: Duration) -> tokio::task::JoinHandle<()> {
        let keys = self.keys.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match keys.reload(&path) {
                    Ok(true) => tracing::info!(file = %path.display(), "reloaded the signing keys"),
                    Ok(false) => {}
                    Err(e) => {
                        tracing::error!(error = %e, "cannot reload the signing keys; still verifying with the previous ones")
                    }
                }
            }
        })
    }

    /// How far a call's timestamp may be from this host's clock, either way (call ids are
    /// remembered as long).
    pub fn window(mut self, window: Duration) -> Verifier {
        self.window = window;
        self
    }

    /// The longest body read (a longer one is refused with 413 `body_too_large`).
    pub fn max_body_bytes(mut self, max: usize) -> Verifier {
        self.max_body = max;
        self
    }

    /// Also accepts calls signed with v1 only (a coordinator that predates v2, or
    /// `--signing-legacy-v1` calls stripped of their v2): v1 binds neither the target,
    /// the tenant nor the call, so leave it off once the coordinator sends v2.
    pub fn accept_v1(mut self, accept: bool) -> Verifier {
        self.accept_v1 = accept;
        self
    }

    /// The scheme the coordinator calls this service with when the target is rebuilt from
    /// `Host` (`http` by default; `https` behind TLS).
    pub fn scheme(mut self, scheme: &str) -> Verifier {
        self.scheme = scheme.to_ascii_lowercase();
        self
    }

    /// A base URL the coordinator calls this service at (`https://shop.example`,
    /// `http://10.0.0.5:8080`); may be given more than once. With one, `Host` is ignored
    /// and a call must be signed for one of these: behind a proxy that changes `Host`, and
    /// to bind the target fully (a replay with another service's `Host` is refused).
    pub fn external_url(mut self, url: &str) -> Result<Verifier, String> {
        let bad = |why: &str| format!("external URL {url:?}: {why}");
        let uri: Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri.scheme_str().ok_or_else(|| bad("no scheme"))?;
        let scheme = scheme.to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(bad("the scheme is not http or https"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        if uri.path() != "/" && !uri.path().is_empty() || uri.query().is_some() {
            return Err(bad("a base URL has no path or query"));
        }
        let origin = origin_of(&scheme, authority).ok_or_else(|| bad("not host[:port]"))?;
        Arc::make_mut(&mut self.origins).push(origin);
        Ok(self)
    }

    /// Remembers up to `capacity` call ids to refuse a replay (default
    /// [`DEFAULT_REPLAY_CAPACITY`]); 0 remembers none (replays within the window are then
    /// accepted, and left to the barrier).
    pub fn replay_capacity(mut self, capacity: usize) -> Verifier {
        self.replay = (capacity > 0).then(|| Arc::new(ReplayCache::new(capacity)));
        self
    }

    /// How much of a body is read to check it.
    pub(crate) fn max_body(&self) -> usize {
        self.max_body
    }

    /// Checks a request's head and body (the target is the one on the request line, also
    /// under a nested router), then its call id against the replay cache.
    pub fn verify_parts(&self, parts: &Parts, body: &[u8]) -> Result<SignedCall, SignatureError> {
        let header = single(&parts.headers, HEADER)?;
        let tenant = single(&parts.headers, TENANT_HEADER)?.unwrap_or(DEFAULT_TENANT);
        let call_id = single(&parts.headers, CALL_ID_HEADER)?.unwrap_or("");
        let uri = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(&parts.uri, |o| &o.0);
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        let from_host;
        let origins: &[Origin] = if self.origins.is_empty() {
            from_host = [self.origin_from_host(parts)?];
            &from_host
        } else {
            &self.origins
        };
        let keyring = self.keys.current();
        let policy = Policy {
            window: self.window,
            accept_v1: self.accept_v1,
        };
        let now = SystemTime::now();
        let mut outcome = Err(SignatureError::Mismatch);
        for origin in origins {
            let call = super::Call {
                method: parts.method.as_str(),
                scheme: &origin.scheme,
                host: &origin.host,
                port: origin.port,
                target,
                body,
                tenant,
                call_id,
            };
            outcome = verify_call(header, &call, now, &keyring, policy);
            // Only a mismatch can depend on the origin tried.
            if outcome != Err(SignatureError::Mismatch) {
                break;
            }
        }
        let verified = outcome?;
        let v2 = verified.version == Version::V2;
        if let (true, Some(replay)) = (v2, &self.replay) {
            replay.check(call_id, verified.timestamp, self.window, now)?;
        }
        Ok(SignedCall {
            kid: verified.kid,
            version: verified.version,
            tenant: tenant.to_owned(),
            call_id: v2.then(|| call_id.to_owned()),
        })
    }

    /// The target from `Host` (or an HTTP/2 request's authority) and the configured scheme.
    fn origin_from_host(&self, parts: &Parts) -> Result<Origin, SignatureError> {
        let no_host = SignatureError::Malformed("no valid Host to rebuild the signed target");
        let authority = match parts.uri.authority() {
            Some(a) => a.clone(),
            None => single(&parts.headers, header::HOST.as_str())?
                .and_then(|h| h.parse::<Authority>().ok())
                .ok_or(no_host.clone())?,
        };
        origin_of(&self.scheme, &authority).ok_or(no_host)
    }
}

/// `scheme` and an authority without userinfo, the host lowercase, the port the scheme's
/// when none is named.
fn origin_of(scheme: &str, authority: &Authority) -> Option<Origin> {
    if authority.as_str().contains('@') || authority.host().is_empty() {
        return None;
    }
    Some(Origin {
        scheme: scheme.to_owned(),
        host: authority.host().to_ascii_lowercase(),
        port: authority.port_u16().unwrap_or_else(|| default_port(scheme)),
    })
}

/// A header that may appear at most once, as text.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, SignatureError> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(SignatureError::Malformed("a signed header appears twice")),
        (Some(v), None) => v
            .to_str()
            .map(Some)
            .map_err(|_| SignatureError::Malformed("a signed header is not visible ASCII")),
    }
}

/// Which key signed the call: put in the request's extensions by
/// [`require_signature`] (`Extension<SignedBy>` in a handler).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedBy(pub String);

/// The verified call: put in the request's extensions by [`require_signature`]
/// (`Extension<SignedCall>`; [`BranchCall`](crate::BranchCall) takes its tenant).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedCall {
    /// The key that signed.
    pub kid: String,
    /// The version checked.
    pub version: Version,
    /// The tenant: the signed one with v2; with v1 only the `Idem-Tenant` header, which
    /// v1 does not cover.
    pub tenant: String,
    /// The call id, with v2.
    pub call_id: Option<String>,
}

/// A refused signature as a response: 401 with the error's stable code (503 for a full
/// replay cache, which the coordinator retries).
#[derive(Debug)]
pub struct SignatureRejection(pub SignatureError);

impl IntoResponse for SignatureRejection {
    fn into_response(self) -> Response {
        let body = json!({"error": self.0.code(), "message": self.0.to_string()});
        if self.0 == SignatureError::ReplayCacheFull {
            return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        }
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Idem-Signature")],
            axum::Json(body),
        )
            .into_response()
    }
}

/// axum middleware (`axum::middleware::from_fn_with_state(verifier,
/// require_signature)`): reads the body (up to the verifier's bound), checks the
/// signature, and passes the request on with the same body and [`SignedCall`] and
/// [`SignedBy`] in its extensions, or answers 401.
pub async fn require_signature(
    State(verifier): State<Verifier>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, verifier.max_body).await else {
        let body = json!({"error": "body_too_large", "message": format!("a signed body is read up to {} bytes", verifier.max_body)});
        return (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(body)).into_response();
    };
    let signed = match verifier.verify_parts(&parts, &bytes) {
        Ok(signed) => signed,
        Err(e) => {
            tracing::warn!(code = e.code(), error = %e, "refused an unsigned or badly signed call");
            return SignatureRejection(e).into_response();
        }
    };
    parts.extensions.insert(SignedBy(signed.kid.clone()));
    parts.extensions.insert(signed);
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

//! What the signed-call tests share: participants over real HTTP that verify with the
//! SDK's middleware (or do not, or check v1 alone as a participant that predates v2), each
//! recording every call that reached its handler whole, so a test can replay it; and
//! coordinators that sign.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, OriginalUri, Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use idem::server::RunningServer;
use idem::signing::Signer;
use idem_client::{Action, Client, Status};
use idem_participant::BranchCall;
use idem_participant::signature::{
    Keyring, Keys, SignatureRejection, SignedCall, Verifier, require_signature, verify_v1,
};
use serde_json::json;

use crate::common;
use crate::common::typed::{created, wait_status};

pub const WAIT: Duration = Duration::from_secs(30);

/// One call that reached a participant's handler, whole.
#[derive(Clone, Debug)]
pub struct Reached {
    /// The request target as called.
    pub target: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The key that signed it (empty when the participant does not verify).
    pub kid: String,
    /// The tenant the SDK's extractor gave the handler.
    pub tenant: String,
}

impl Reached {
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct Log {
    reached: Mutex<Vec<Reached>>,
    /// `code: message` of every answer the participant refused (4xx, 5xx): idem shows its
    /// clients the status alone, so the reason is read here.
    refusals: Mutex<Vec<String>>,
    /// Calls still to answer with 503 before answering with success.
    failures: Mutex<usize>,
}

/// A participant: every route `/{step}/{op}` answers DTM's SUCCESS (after the failures it
/// was told to give) and records what reached it.
pub struct Participant {
    pub base: String,
    pub port: u16,
    log: Arc<Log>,
    /// Dropping the service stops it.
    _service: idem_demo::Service,
}

/// How a participant checks calls.
pub enum Check {
    /// Not at all: an attacker's host recording what it gets.
    None,
    /// With the SDK's middleware as configured by the closure (given the port it listens on).
    Sdk(Box<dyn FnOnce(u16) -> Verifier + Send>),
    /// As a participant that predates v2: the v1 signature alone, with these keys.
    V1Only(Keys),
}

impl Participant {
    /// A participant verifying v2 with the SDK's defaults and `keys` (a key file's text).
    pub async fn start(keys: &str) -> Participant {
        let keyring = Keyring::parse(keys).unwrap();
        Participant::open(Check::Sdk(Box::new(move |_| Verifier::new(keyring)))).await
    }

    pub async fn open(check: Check) -> Participant {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log: Arc<Log> = Arc::default();
        let app = axum::Router::new()
            .route("/{step}/{op}", post(handle))
            .with_state(Arc::clone(&log));
        let app = match check {
            Check::None => app,
            Check::Sdk(verifier) => app.layer(axum::middleware::from_fn_with_state(
                verifier(port),
                require_signature,
            )),
            Check::V1Only(keys) => app.layer(axum::middleware::from_fn_with_state(
                Arc::new(keys),
                v1_only,
            )),
        };
        let app = app.layer(axum::middleware::from_fn_with_state(
            Arc::clone(&log),
            record_refusals,
        ));
        let service = idem_demo::spawn_on(app, listener);
        Participant {
            base: service.url(""),
            port,
            log,
            _service: service,
        }
    }

    /// Answers the next `n` calls that get through with 503.
    pub fn fail_next(&self, n: usize) {
        *self.log.failures.lock().unwrap() = n;
    }

    pub fn calls(&self) -> Vec<Reached> {
        self.log.reached.lock().unwrap().clone()
    }

    /// `code: message` of each call refused, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.log.refusals.lock().unwrap().clone()
    }

    /// Whether some refusal's code is `code`.
    pub fn refused_with(&self, code: &str) -> bool {
        let prefix = format!("{code}:");
        self.refusals().iter().any(|r| r.starts_with(&prefix))
    }

    /// (path, key id) of each call that got through.
    pub fn reached(&self) -> Vec<(String, String)> {
        let calls = self.calls();
        calls
            .iter()
            .map(|c| (c.path().to_owned(), c.kid.clone()))
            .collect()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

async fn handle(
    State(log): State<Arc<Log>>,
    OriginalUri(uri): OriginalUri,
    signed: Option<Extension<SignedCall>>,
    call: BranchCall,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    log.reached.lock().unwrap().push(Reached {
        target: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        headers,
        body,
        kid: signed.map(|s| s.0.kid).unwrap_or_default(),
        tenant: call.tenant().to_owned(),
    });
    let mut failures = log.failures.lock().unwrap();
    if *failures > 0 {
        *failures -= 1;
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "try again").into_response();
    }
    axum::Json(json!({"dtm_result": "SUCCESS"})).into_response()
}

/// Records the code and message of every refusal, outside the signature check.
async fn record_refusals(State(log): State<Arc<Log>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status().as_u16() < 400 {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let text = |field: &str| answer[field].as_str().unwrap_or_default().to_owned();
    let refusal = format!("{}: {}", text("error"), text("message"));
    log.refusals.lock().unwrap().push(refusal);
    Response::from_parts(parts, bytes.into())
}

/// What a participant built on the SDK before v2 did: check `v1` alone.
async fn v1_only(State(keys): State<Arc<Keys>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
    let header = parts
        .headers
        .get(idem_participant::signature::HEADER)
        .and_then(|v| v.to_str().ok());
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let now = std::time::SystemTime::now();
    let window = idem_participant::signature::DEFAULT_WINDOW;
    match verify_v1(
        header,
        parts.method.as_str(),
        target,
        &bytes,
        now,
        &keys,
        window,
    ) {
        Ok(_) => next.run(Request::from_parts(parts, bytes.into())).await,
        Err(e) => SignatureRejection(e).into_response(),
    }
}

/// Sends `call` again, as recorded, to `base`, with `change` applied to its headers first;
/// the status and the error code of the answer.
pub async fn replay(
    base: &str,
    call: &Reached,
    change: impl FnOnce(&mut HeaderMap),
) -> (u16, String) {
    idem::transport::install_crypto_provider();
    let mut headers = HeaderMap::new();
    for name in [
        "idem-signature",
        "idem-tenant",
        "idem-call-id",
        "content-type",
    ] {
        if let Some(value) = call.headers.get(name) {
            headers.insert(name, value.clone());
        }
    }
    change(&mut headers);
    let response = reqwest::Client::new()
        .post(format!("{base}{}", call.target))
        .headers(headers)
        .body(call.body.clone())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    (
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
    )
}

/// A coordinator on `url` signing with the key file text `keys` (`None`: unsigned).
pub async fn coordinator(url: &str, keys: Option<&str>) -> RunningServer {
    let signer = keys.map(|k| Signer::new(Keyring::parse(k).unwrap()).unwrap());
    common::coordinator_with(url, |config| config.signing = signer).await
}

/// A one-step saga on `p` (`/s1/action`, `/s1/compensate`); its final view.
pub async fn saga(idem: &Client, p: &Participant, gid: &str) -> idem_client::TxView {
    let answer = idem
        .saga(gid)
        .step(
            p.url("/s1/action"),
            p.url("/s1/compensate"),
            json!({"step": 1}),
        )
        .wait_result(true)
        .send()
        .await;
    created(answer.unwrap_or_else(|e| panic!("{gid}: {e:?}")));
    wait_status(
        idem,
        gid,
        &[Status::Succeeded, Status::Failed, Status::Stalled],
        WAIT,
    )
    .await
}

/// The last error of the saga's action: the participant's status only (its reason stays
/// out of what clients read; [`Participant::refusals`] has it).
pub fn action_error(tx: &idem_client::TxView) -> String {
    tx.branches
        .iter()
        .find(|b| b.action == Action::Action)
        .and_then(|b| b.last_error.clone())
        .unwrap_or_default()
}

/// Runs `body` on a fresh database of every backend.
pub async fn each_backend(
    test: &str,
    body: impl AsyncFn(&idem_participant::testing::TestDatabase),
) {
    for db in idem_participant::testing::all(test).await {
        body(&db).await;
        db.drop_database().await;
    }
}

//! The `Idempotency-Key` middleware for axum (seed §13, §14, §25, §27), mode 2 of the
//! record protocol: the claim commits `PROCESSING` with a lease before the handler runs,
//! so the handler may call other services; its answer is stored when it returns.
//!
//! ```no_run
//! # use axum::{Router, routing::post, http::Method};
//! # use idem_participant::idempotency::{IdempotencyStore, http::{IdempotencyLayer, RouteRule}};
//! # async fn create_order() -> &'static str { "" }
//! # fn app(pool: sqlx::AnyPool) -> Router {
//! let store = IdempotencyStore::new(pool);
//! let router = Router::new().route("/orders", post(create_order));
//! // After the routes: axum's `layer` wraps only the routes that exist when it is called.
//! IdempotencyLayer::new(store)
//!     .route(Method::POST, "/orders", RouteRule::new("create_order").ignore("client_trace_id"))
//!     .apply(router)
//! # }
//! ```
//!
//! Per configured (method, route) — the route is axum's matched path, such as
//! `/orders/{id}`:
//!
//! - The key (`Idempotency-Key`, 1–128 of `[A-Za-z0-9._:-]`) is checked first: missing on a
//!   route that requires it → 400 `idempotency_key_required`; malformed → 400
//!   `invalid_idempotency_key`. The tenant comes from the configured extractor (header
//!   `Idem-Tenant` by default, `-` when absent); the scope is `"<tenant>:<operation>"`. Put
//!   authentication in front of this layer (§25: no record before the caller is known).
//! - The digest is [`request_digest`] over method, path, query and the JSON body minus the
//!   rule's ignored fields (a body that is not JSON is hashed as text). Bodies over the
//!   rule's `max_body` → 413 `request_too_large`.
//! - While the handler runs, the layer renews the claim's lease every third of its length,
//!   so a handler slower than the lease is never run a second time beside itself.
//!
//! How the first run ends, what its client sees, and what a repeat (same key, same
//! digest) then gets:
//!
//! | the handler | record | first client | a repeat |
//! |---|---|---|---|
//! | answers 1xx–3xx | `SUCCEEDED` | the answer | the same status, kept headers (`content-type`, `location` by default) and body, byte for byte, plus `Idempotency-Replayed: true` |
//! | answers a 4xx other than 408/429 | `FAILED_FINAL` ([`RouteRule::client_errors_retryable`]: `FAILED_RETRYABLE`) | the answer | the same failure, replayed |
//! | answers 408 or 429 | `FAILED_RETRYABLE` | the answer | runs the handler again |
//! | answers a 5xx the route marks "nothing happened" ([`RouteRule::nothing_happened_on`], or the [`NothingHappened`] extension on the response) | `FAILED_RETRYABLE` | the answer | runs the handler again |
//! | answers any other 5xx (a 502/504 from a provider after the charge may have gone through) | `UNKNOWN` | the answer | settled by the [`RecoveryHook`]; without one, or while it cannot tell: 503 `idempotency_outcome_unknown` with `Retry-After` |
//! | panics | `UNKNOWN` | 500 `handler_panicked` | as above |
//! | is dropped because its client hung up (or the server shut down) | `UNKNOWN` | — | as above |
//! | answers a body larger than the store's bound | `UNKNOWN` (an error is logged: raise the bound) | the answer | as above: never an empty replay |
//! | answers a body that cannot be read | `UNKNOWN` | 500 `response_unreadable` | as above |
//!
//! 408 and 429 are not final because both say the request was not acted on: 408 (RFC
//! 9110 §15.5.9) that the server stopped waiting for the request itself, 429 (RFC 6585)
//! that it was refused for rate before being processed. The next repeat is a new attempt,
//! so the handler runs again. A handler must therefore answer 408/429 only before it acts;
//! a timeout middleware *inside* this layer that answers 408 after dropping a running
//! handler (tower-http's `TimeoutLayer` does by default) breaks that promise: put timeouts
//! outside this layer, where a dropped handler is recorded `UNKNOWN`, or have them answer
//! 503/504.
//!
//! "Settled by the hook": [`RecoveryHook::recover`] is asked (bounded by the store's
//! recovery timeout). `Succeeded(r)` / `FailedFinal(r)` are recorded and `r` is answered as
//! a replay; `NotHappened` takes the record over under a new owner token and runs the
//! handler once more, for this repeat; `Unknown` leaves the record and answers 503
//! `idempotency_outcome_unknown`. An expired `PROCESSING` record (its owner crashed) is
//! settled the same way. A [`Settler`](super::Settler) settles both kinds without waiting
//! for a repeat, and [`IdempotencyStore::unsettled`] lists them for an operator.
//!
//! Other repeats: same key, other digest → 409 `idempotency_key_conflict`; `PROCESSING`
//! with a live lease → 202 with `Retry-After` and `{"status":"processing"}`, or, with
//! [`RouteRule::wait`], a bounded wait for the first request's answer.
//!
//! Not done here: mode 1 (use [`IdempotencyStore::run_local`] inside the handler), and no
//! per-tenant rate limit (§25) is applied.

mod run;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{
    Claim, IdempotencyError, IdempotencyStore, MAX_SCOPE_LEN, RecoveryHook, Status, StoredResult,
    request_digest, valid_key,
};
use crate::backend::BarrierDatabase;

/// The request header carrying the key.
pub const KEY_HEADER: &str = "idempotency-key";
/// The response header set on a replayed answer.
pub const REPLAYED_HEADER: &str = "idempotency-replayed";
/// The default tenant header: the one the coordinator names its calls' tenant in.
pub use crate::tenant::TENANT_HEADER;

/// A response extension by which a handler says its failure happened before it acted
/// (the provider refused the connection, a validation against another service failed):
/// the record becomes `FAILED_RETRYABLE` and the next repeat runs the handler again.
/// Without it a 5xx is an unknown outcome. Ignored on a success.
///
/// ```
/// # use axum::{Extension, http::StatusCode, response::IntoResponse};
/// # use idem_participant::idempotency::http::NothingHappened;
/// # fn f() -> impl IntoResponse {
/// (StatusCode::SERVICE_UNAVAILABLE, Extension(NothingHappened), "the provider is down")
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NothingHappened;

/// Finds the tenant of a request (after authentication: from a verified claim, not a
/// header the caller picks, in a multi-tenant service).
pub type TenantFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// How one route uses keys.
#[derive(Clone, Debug)]
pub struct RouteRule {
    operation: String,
    required: bool,
    ignored_fields: Vec<String>,
    max_body: usize,
    wait: Option<Duration>,
    client_errors_final: bool,
    nothing_happened: Vec<StatusCode>,
}

/// How the layer records a run's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Succeeded,
    FailedFinal,
    /// Nothing happened: the next repeat runs the handler again.
    Retryable,
    /// The handler may have acted: settled through the fact source, never re-run blindly.
    Unknown,
}

impl RouteRule {
    /// A rule for the operation `operation` (the scope's second half and the metrics'
    /// `operation` label: a fixed name such as `create_order`). The key is required, bodies
    /// up to 1 MiB, a repeat during `PROCESSING` gets 202 at once, 4xx answers are final,
    /// every 5xx is an unknown outcome.
    pub fn new(operation: impl Into<String>) -> RouteRule {
        RouteRule {
            operation: operation.into(),
            required: true,
            ignored_fields: Vec::new(),
            max_body: 1024 * 1024,
            wait: None,
            client_errors_final: true,
            nothing_happened: Vec::new(),
        }
    }

    /// Requests without a key pass through unguarded (for routes documented as unsafe to
    /// retry without one).
    pub fn optional(mut self) -> RouteRule {
        self.required = false;
        self
    }

    /// Leaves a body field (a top-level name or a dotted path) out of the digest: a trace
    /// id or a client timestamp that differs between retries of one intent.
    pub fn ignore(mut self, field: impl Into<String>) -> RouteRule {
        self.ignored_fields.push(field.into());
        self
    }

    /// The largest request body accepted, in bytes.
    pub fn max_body(mut self, bytes: usize) -> RouteRule {
        self.max_body = bytes;
        self
    }

    /// A repeat during `PROCESSING` waits up to `limit` for the first request's answer
    /// (polling the record) before it gets 202.
    pub fn wait(mut self, limit: Duration) -> RouteRule {
        self.wait = Some(limit);
        self
    }

    /// 4xx answers are stored as `FAILED_RETRYABLE` (run again on the next request)
    /// instead of `FAILED_FINAL`.
    pub fn client_errors_retryable(mut self) -> RouteRule {
        self.client_errors_final = false;
        self
    }

    /// This route's handler answers `status` (a 4xx or 5xx) only when it did nothing:
    /// such an answer is `FAILED_RETRYABLE` and the next repeat runs the handler again
    /// (e.g. a 503 the handler returns when its provider refused the connection). Every
    /// other 5xx stays an unknown outcome.
    pub fn nothing_happened_on(mut self, status: StatusCode) -> RouteRule {
        self.nothing_happened.push(status);
        self
    }

    /// How an answer with `status` is recorded; `marked` when the response carries
    /// [`NothingHappened`].
    fn ending(&self, status: StatusCode, marked: bool) -> Ending {
        if status.as_u16() < 400 {
            Ending::Succeeded
        } else if marked
            || status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || self.nothing_happened.contains(&status)
        {
            Ending::Retryable
        } else if status.is_server_error() {
            Ending::Unknown
        } else if self.client_errors_final {
            Ending::FailedFinal
        } else {
            Ending::Retryable
        }
    }
}

/// The middleware's configuration; [`apply`](Self::apply) puts it on a router.
pub struct IdempotencyLayer<DB: BarrierDatabase> {
    store: IdempotencyStore<DB>,
    routes: Vec<(Method, String, RouteRule)>,
    tenant: TenantFn,
    hook: Option<Arc<dyn RecoveryHook>>,
    kept_headers: Vec<HeaderName>,
    poll: Duration,
}

impl<DB: BarrierDatabase> IdempotencyLayer<DB> {
    /// A layer on `store`, guarding no route yet.
    pub fn new(store: IdempotencyStore<DB>) -> Self {
        IdempotencyLayer {
            store,
            routes: Vec::new(),
            tenant: Arc::new(|parts: &Parts| {
                parts
                    .headers
                    .get(TENANT_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            }),
            hook: None,
            kept_headers: vec![header::CONTENT_TYPE, header::LOCATION],
            poll: Duration::from_millis(25),
        }
    }

    /// Guards `method` on the route `path` (axum's route syntax, as given to
    /// `Router::route`).
    ///
    /// # Panics
    /// For a safe method (GET, HEAD, OPTIONS, TRACE): those are idempotent by definition
    /// and keys there are a configuration mistake.
    pub fn route(mut self, method: Method, path: &str, rule: RouteRule) -> Self {
        assert!(
            matches!(
                method,
                Method::POST | Method::PUT | Method::PATCH | Method::DELETE
            ),
            "Idempotency-Key guards unsafe methods only, not {method}"
        );
        self.routes.push((method, path.to_owned(), rule));
        self
    }

    /// Takes the tenant from `tenant` instead of the `Idem-Tenant` header.
    pub fn tenant_from(
        mut self,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.tenant = Arc::new(tenant);
        self
    }

    /// Asks `hook` about records nobody runs and whose outcome is not recorded (expired
    /// `PROCESSING`, `UNKNOWN`). Pass an `Arc` to share one hook with a
    /// [`Settler`](super::Settler).
    pub fn recovery(mut self, hook: impl RecoveryHook) -> Self {
        self.hook = Some(Arc::new(hook));
        self
    }

    /// Also stores and replays the response header `name`.
    pub fn keep_header(mut self, name: HeaderName) -> Self {
        self.kept_headers.push(name);
        self
    }

    /// Wraps the routes of `router` (those added before this call).
    pub fn apply<S: Clone + Send + Sync + 'static>(self, router: Router<S>) -> Router<S> {
        router.layer(axum::middleware::from_fn_with_state(
            Arc::new(self),
            guard::<DB>,
        ))
    }

    async fn claim(&self, scope: &str, key: &str, hash: &str) -> Result<Claim, IdempotencyError> {
        match &self.hook {
            Some(hook) => {
                self.store
                    .claim_with_recovery(scope, key, hash, hook.as_ref())
                    .await
            }
            None => self.store.claim(scope, key, hash).await,
        }
    }

    /// Polls the record until it leaves `PROCESSING` or `until` passes.
    async fn wait_settled(&self, scope: &str, key: &str, until: Instant) {
        while Instant::now() < until {
            match self.store.lookup(scope, key).await {
                Ok(Some((Status::Processing, _))) => tokio::time::sleep(self.poll).await,
                _ => return,
            }
        }
    }
}

async fn guard<DB: BarrierDatabase>(
    State(layer): State<Arc<IdempotencyLayer<DB>>>,
    req: Request,
    next: Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let Some(rule) = layer
        .routes
        .iter()
        .find(|(method, path, _)| method == req.method() && *path == route)
        .map(|(_, _, rule)| rule.clone())
    else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    let key = match parts.headers.get(KEY_HEADER) {
        None if rule.required => {
            return error(
                StatusCode::BAD_REQUEST,
                "idempotency_key_required",
                "this operation needs an Idempotency-Key header",
            );
        }
        None => return next.run(Request::from_parts(parts, body)).await,
        Some(value) => match value.to_str() {
            Ok(key) if valid_key(key) => key.to_owned(),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_idempotency_key",
                    "Idempotency-Key must be 1 to 128 characters of [A-Za-z0-9._:-]",
                );
            }
        },
    };
    let tenant = (layer.tenant)(&parts).unwrap_or_else(|| "-".to_owned());
    let scope = format!("{tenant}:{}", rule.operation);
    if tenant.is_empty() || tenant.contains(':') || scope.chars().count() > MAX_SCOPE_LEN {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_tenant",
            "the tenant must be non-empty, without ':', and short enough for a 128-character scope",
        );
    }
    let bytes = match axum::body::to_bytes(body, rule.max_body).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request_too_large",
                &format!("the body is over {} bytes", rule.max_body),
            );
        }
    };
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    let hash = request_digest(
        parts.method.as_str(),
        parts.uri.path(),
        parts.uri.query(),
        value,
        &rule.ignored_fields,
    );
    let deadline = rule.wait.map(|limit| Instant::now() + limit);
    loop {
        let claim = match layer.claim(&scope, &key, &hash).await {
            Ok(claim) => claim,
            Err(e) => return store_error(&e),
        };
        match claim {
            Claim::Acquired(ticket) => {
                let req = Request::from_parts(parts, Body::from(bytes));
                return layer.run(ticket, &rule, req, next).await;
            }
            Claim::Replay(result) | Claim::FailedFinal(result) => return replay(result),
            Claim::Conflict => {
                return error(
                    StatusCode::CONFLICT,
                    "idempotency_key_conflict",
                    "this Idempotency-Key was used for a different request",
                );
            }
            Claim::Expired(_) => return outcome_unknown(),
            Claim::InProgress { retry_after } => match deadline {
                Some(deadline) if Instant::now() < deadline => {
                    let until = deadline.min(Instant::now() + retry_after);
                    layer.wait_settled(&scope, &key, until).await;
                }
                _ => return processing(retry_after),
            },
        }
    }
}

fn processing(retry_after: Duration) -> Response {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut response = (
        StatusCode::ACCEPTED,
        axum::Json(json!({"status": "processing"})),
    )
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&seconds.max(1).to_string()) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    response
}

fn replay(result: StoredResult) -> Response {
    let status = StatusCode::from_u16(result.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = Response::new(Body::from(result.body));
    *response.status_mut() = status;
    for (name, value) in result.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
        .headers_mut()
        .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    response
}

/// The answer to a repeat of a record nobody runs whose outcome is not known (no hook, or
/// the hook could not tell): stable, so a client can tell it from any other 503.
fn outcome_unknown() -> Response {
    let mut response = error(
        StatusCode::SERVICE_UNAVAILABLE,
        "idempotency_outcome_unknown",
        "the first request's outcome is not known yet; retry later with the same key",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn store_error(e: &IdempotencyError) -> Response {
    match e {
        IdempotencyError::Invalid { code, message } => {
            error(StatusCode::BAD_REQUEST, code, message)
        }
        IdempotencyError::StaleOwner { .. } => {
            error(StatusCode::CONFLICT, "stale_owner", &e.to_string())
        }
        IdempotencyError::Store(inner) => {
            tracing::warn!(error = %inner, "the idempotency record could not be read or written");
            error(
                StatusCode::from_u16(inner.status_code())
                    .unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                inner.kind(),
                "the idempotency record could not be read or written; retry with the same key",
            )
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": code, "message": message})),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_recorded_by_what_they_say_happened() {
        let rule = RouteRule::new("op").nothing_happened_on(StatusCode::SERVICE_UNAVAILABLE);
        let ending =
            |code: u16, marked: bool| rule.ending(StatusCode::from_u16(code).unwrap(), marked);
        assert_eq!(ending(200, false), Ending::Succeeded);
        assert_eq!(
            ending(201, true),
            Ending::Succeeded,
            "a success is a success"
        );
        assert_eq!(ending(303, false), Ending::Succeeded);
        assert_eq!(ending(422, false), Ending::FailedFinal);
        assert_eq!(ending(408, false), Ending::Retryable);
        assert_eq!(ending(429, false), Ending::Retryable);
        assert_eq!(ending(502, false), Ending::Unknown);
        assert_eq!(ending(504, false), Ending::Unknown);
        assert_eq!(ending(500, false), Ending::Unknown);
        assert_eq!(ending(500, true), Ending::Retryable);
        assert_eq!(ending(503, false), Ending::Retryable, "the route's own set");
        assert_eq!(ending(409, true), Ending::Retryable);
        let lenient = RouteRule::new("op").client_errors_retryable();
        assert_eq!(
            lenient.ending(StatusCode::UNPROCESSABLE_ENTITY, false),
            Ending::Retryable
        );
        assert_eq!(
            lenient.ending(StatusCode::BAD_GATEWAY, false),
            Ending::Unknown
        );
    }
}

//! Authentication before anything else: the layer below verifies the caller's token in
//! memory (no database round trip; see [`crate::auth::cache`]) and puts its
//! [`Principal`] on the request; handlers take it as a [`Caller`] and check its role before
//! they reach the engine. A refused request touches nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::same_origin;
use crate::auth::cache::{Refusal, TokenCache};
use crate::auth::{AuthConfig, AuthMode, Principal, Role};
use crate::core::Access;
use crate::tenant::scoped_key;

/// The authentication layer's settings and its token cache (`None` without tokens).
pub struct Auth {
    pub config: AuthConfig,
    pub cache: Option<Arc<TokenCache>>,
}

impl Auth {
    /// Reads the tokens again after this coordinator changed them, so its change holds here
    /// at once; a failed read leaves it to the next refresh.
    pub async fn refreshed(&self) {
        if let Some(cache) = &self.cache
            && let Err(e) = cache.refresh().await
        {
            tracing::warn!(error = %e, "could not read the API tokens again after a change");
        }
    }

    /// No tokens (`config.mode` is `None`): every caller is [`Principal::anonymous`].
    pub fn without_tokens(config: AuthConfig) -> Arc<Auth> {
        Arc::new(Auth {
            config,
            cache: None,
        })
    }
}

/// What a route asks of its caller before the handler runs.
enum Gate {
    Open,
    /// A valid token of at least this role.
    Token(Role),
}

fn gate(config: &AuthConfig, path: &str) -> Gate {
    match path {
        "/health/live" | "/api/v1/openapi.json" | "/api/ping" => Gate::Open,
        // The console's files hold no data: what it shows comes from the API, with the
        // token its user types.
        "/ui" => Gate::Open,
        p if p.starts_with("/ui/") => Gate::Open,
        "/health" | "/health/ready" if !config.protect_readiness => Gate::Open,
        "/metrics" if !config.protect_metrics => Gate::Open,
        "/health" | "/health/ready" | "/metrics" => Gate::Token(Role::Operator),
        // Each handler checks the role its operation needs.
        _ => Gate::Token(Role::Client),
    }
}

pub async fn authenticate(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let principal = match (&auth.config.mode, &auth.cache) {
        (AuthMode::Tokens, Some(cache)) => match gate(&auth.config, request.uri().path()) {
            Gate::Open => None,
            Gate::Token(role) => {
                let principal = match tokenless(&auth.config, &request) {
                    Some(door) => door,
                    None => principal_of(cache, request.headers()).await,
                };
                match principal {
                    Ok(p) if p.role >= role => Some(p),
                    Ok(p) => return forbidden(&p, "this route").into_response(),
                    Err(refusal) => return refusal.into_response(),
                }
            }
        },
        (AuthMode::None, _) => Some(Principal::anonymous()),
        // Tokens required but nothing to check them against: refuse rather than let
        // everyone in.
        (AuthMode::Tokens, None) => return unauthorized(Refusal::Invalid),
    };
    if let Some(principal) = principal {
        request.extensions_mut().insert(principal);
    }
    next.run(request).await
}

/// Why a request was refused before its handler.
enum Refused {
    Token(Refusal),
    Browser(same_origin::Refusal),
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        match self {
            Refused::Token(refusal) => unauthorized(refusal),
            Refused::Browser(refusal) => refusal.into_response(),
        }
    }
}

/// DTM's clients send no token: its door can take them as a client of `--dtm-tenant`,
/// from the networks `--dtm-tokenless-from` lists (others need a token like everyone)
/// and with one of idem's own `Host` names (nothing else vouches for the caller, so a
/// page loaded through DNS rebinding must not pass). `None`: not such a request.
fn tokenless(config: &AuthConfig, request: &Request) -> Option<Result<Principal, Refused>> {
    let tenant = config.dtm_tenant.as_ref()?;
    if request.headers().contains_key(header::AUTHORIZATION)
        || !request.uri().path().starts_with("/api/dtmsvr/")
    {
        return None;
    }
    // No peer address (a router served by something else) takes nobody in.
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip());
    if !peer.is_some_and(|ip| config.takes_tokenless_from(ip)) {
        return Some(Err(Refused::Token(Refusal::Missing)));
    }
    let host = same_origin::check_host(&config.allowed_hosts, request.headers(), request.uri());
    Some(host.map_err(Refused::Browser).map(|()| Principal {
        tenant: tenant.clone(),
        role: Role::Client,
        token_id: None,
        tokenless: true,
    }))
}

async fn principal_of(cache: &TokenCache, headers: &HeaderMap) -> Result<Principal, Refused> {
    let value = headers
        .get(header::AUTHORIZATION)
        .ok_or(Refused::Token(Refusal::Missing))?;
    let bearer = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or(Refused::Token(Refusal::Malformed))?
        .trim()
        .to_owned();
    cache.verify(&bearer).await.map_err(Refused::Token)
}

fn unauthorized(refusal: Refusal) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, refusal.code(), refusal.message()).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

fn forbidden(principal: &Principal, what: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("a {} token may not use {what}", principal.role),
    )
}

/// The authenticated caller of a handler.
#[derive(Clone, Debug)]
pub struct Caller(pub Principal);

impl Caller {
    /// Refuses (403 `forbidden`) a caller whose role is below `role`.
    pub fn require(&self, role: Role, what: &str) -> Result<(), ApiError> {
        if self.0.role >= role {
            Ok(())
        } else {
            Err(forbidden(&self.0, what))
        }
    }

    pub fn tenant(&self) -> &str {
        &self.0.tenant
    }

    /// Which of its tenant's transactions the caller may read and change.
    pub fn access(&self) -> Access {
        if self.0.tokenless {
            Access::Tokenless
        } else {
            Access::Tenant
        }
    }

    /// The storage key of the caller's `gid`.
    pub fn key(&self, gid: &str) -> String {
        scoped_key(&self.0.tenant, gid)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Caller, ApiError> {
        // The layer puts a principal on every request it lets through to a handler that
        // asks for one; none means the router was built without it, which must not grant
        // anything.
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the request was not authenticated",
                )
            })
    }
}

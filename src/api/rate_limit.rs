//! The per-tenant request rate (`--rate-limit-per-second`, `--rate-limit-burst`): a
//! middleware on both doors' transaction routes that refuses a tenant's request past its
//! quota with `429 rate_limited` and a `Retry-After`, before the request is read, so it
//! changes nothing. Health, metrics, DTM's `/api/ping` and the OpenAPI document are not
//! covered: a probe or a scrape refused with 429 would take a healthy coordinator out of
//! rotation, and none of them is a tenant's traffic.
//!
//! The key is the tenant of the request's [`Principal`], which the authentication layer
//! puts in the extensions; that layer must run before this one (a layer outside it). A
//! request without one is the default tenant's, as when authentication is off. The quota is
//! per coordinator process: N coordinators behind a balancer let a tenant through at up to
//! N times the rate.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

use super::dtm::DtmError;
use super::error::ApiError;
use crate::auth::Principal;
use crate::tenant::DEFAULT_TENANT;

/// The flags: requests per second and per tenant (0: no limit), and how many may come at
/// once (0: one second's worth).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    pub per_second: u32,
    pub burst: u32,
}

impl RateLimitConfig {
    /// The quota, if the limit is on.
    fn quota(self) -> Option<Quota> {
        let rate = NonZeroU32::new(self.per_second)?;
        let burst = NonZeroU32::new(self.burst).unwrap_or(rate);
        Some(Quota::per_second(rate).allow_burst(burst))
    }
}

/// Checks between two sweeps of the limiter's state.
const SWEEP_EVERY: u64 = 1_024;

/// A GCRA limiter keyed by tenant. Its store keeps one entry per tenant seen: tenants are
/// few (each is an operator's token), and every [`SWEEP_EVERY`] checks the entries that
/// are back to a full burst, and so say nothing a fresh one would not, are dropped: the
/// store holds the tenants active lately, not every tenant ever seen.
pub struct TenantRateLimit<C: Clock = DefaultClock> {
    limiter: RateLimiter<String, DefaultKeyedStateStore<String>, C, NoOpMiddleware<C::Instant>>,
    clock: C,
    config: RateLimitConfig,
    checks: AtomicU64,
}

impl TenantRateLimit {
    /// The limit `config` describes on the monotonic clock; `None` when it is off.
    pub fn new(config: RateLimitConfig) -> Option<TenantRateLimit> {
        TenantRateLimit::with_clock(config, DefaultClock::default())
    }
}

impl<C: Clock + Clone> TenantRateLimit<C> {
    /// The limit on `clock` (a test's fake clock); `None` when it is off.
    pub fn with_clock(config: RateLimitConfig, clock: C) -> Option<TenantRateLimit<C>> {
        let quota = config.quota()?;
        Some(TenantRateLimit {
            limiter: RateLimiter::new(quota, DefaultKeyedStateStore::default(), clock.clone()),
            clock,
            config,
            checks: AtomicU64::new(0),
        })
    }

    /// Counts one request of `tenant`: `Err` with how long until the next one would pass
    /// when it is over its quota.
    pub fn check(&self, tenant: &str) -> Result<(), Duration> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % SWEEP_EVERY == SWEEP_EVERY - 1 {
            self.limiter.retain_recent();
            self.limiter.shrink_to_fit();
        }
        self.limiter
            .check_key(&tenant.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Tenants the store holds an entry for.
    pub fn tenants_held(&self) -> usize {
        self.limiter.len()
    }

    fn refusal(&self, tenant: &str, wait: Duration) -> (ApiError, u64) {
        // Whole seconds, rounded up: a client that waits that long gets through.
        let seconds = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
        let RateLimitConfig { per_second, burst } = self.config;
        let burst = if burst == 0 { per_second } else { burst };
        let e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "tenant {tenant:?} is over its request rate ({per_second} per second, \
                 {burst} at once); retry in {seconds} s"
            ),
        );
        (e, seconds)
    }
}

/// Which door's error body a refusal takes.
#[derive(Clone, Copy)]
pub(super) enum Door {
    Native,
    Dtm,
}

/// A refusal of a request that was not read, in `door`'s error body, with `Retry-After`
/// in whole seconds.
pub(super) fn refusal(door: Door, error: ApiError, retry_after: u64) -> Response {
    let mut response = match door {
        Door::Native => error.into_response(),
        Door::Dtm => DtmError::from(error).into_response(),
    };
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
    response
}

/// The middleware of the native door's transaction routes.
pub async fn native<C: Clock + Clone>(
    State(limit): State<Arc<TenantRateLimit<C>>>,
    request: Request,
    next: Next,
) -> Response {
    check(&limit, Door::Native, request, next).await
}

/// The middleware of the DTM door's routes: the refusal in DTM's envelope (no
/// `dtm_result`, which a DTM client would read as the transaction's outcome).
pub async fn dtm<C: Clock + Clone>(
    State(limit): State<Arc<TenantRateLimit<C>>>,
    request: Request,
    next: Next,
) -> Response {
    check(&limit, Door::Dtm, request, next).await
}

async fn check<C: Clock + Clone>(
    limit: &TenantRateLimit<C>,
    door: Door,
    request: Request,
    next: Next,
) -> Response {
    let tenant = request
        .extensions()
        .get::<Principal>()
        .map_or(DEFAULT_TENANT, |p| p.tenant.as_str());
    let Err(wait) = limit.check(tenant) else {
        return next.run(request).await;
    };
    metrics::counter!("idem_rate_limited_total").increment(1);
    let (error, seconds) = limit.refusal(tenant, wait);
    refusal(door, error, seconds)
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use governor::clock::FakeRelativeClock;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::*;
    use crate::auth::Role;

    fn limit(
        per_second: u32,
        burst: u32,
    ) -> (TenantRateLimit<FakeRelativeClock>, FakeRelativeClock) {
        let clock = FakeRelativeClock::default();
        let config = RateLimitConfig { per_second, burst };
        let limit = TenantRateLimit::with_clock(config, clock.clone()).expect("on");
        (limit, clock)
    }

    #[test]
    fn zero_per_second_is_no_limit() {
        assert!(TenantRateLimit::new(RateLimitConfig::default()).is_none());
        assert!(
            TenantRateLimit::new(RateLimitConfig {
                per_second: 0,
                burst: 5
            })
            .is_none()
        );
    }

    #[test]
    fn a_burst_passes_the_next_waits_for_the_refill_and_tenants_do_not_share() {
        let (limit, clock) = limit(1, 3);
        for i in 0..3 {
            assert_eq!(limit.check("a"), Ok(()), "request {i} of the burst");
        }
        let wait = limit.check("a").unwrap_err();
        assert_eq!(wait, Duration::from_secs(1));
        // Another tenant has its own burst.
        assert_eq!(limit.check("b"), Ok(()));
        // Half the interval later it is still refused, with half left to wait.
        clock.advance(Duration::from_millis(500));
        assert_eq!(limit.check("a"), Err(Duration::from_millis(500)));
        clock.advance(Duration::from_millis(500));
        assert_eq!(limit.check("a"), Ok(()), "one request refilled");
        assert!(limit.check("a").is_err(), "and only one");
        // After a whole burst's refill, the whole burst passes again.
        clock.advance(Duration::from_secs(3));
        for _ in 0..3 {
            assert_eq!(limit.check("a"), Ok(()));
        }
    }

    #[test]
    fn the_burst_defaults_to_one_seconds_worth() {
        let (limit, _) = limit(4, 0);
        for _ in 0..4 {
            assert_eq!(limit.check("a"), Ok(()));
        }
        assert_eq!(limit.check("a"), Err(Duration::from_millis(250)));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let (limit, _) = limit(1, 1);
        let (e, seconds) = limit.refusal("t", Duration::from_millis(1));
        assert_eq!(
            (e.status, e.code, seconds),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limited", 1)
        );
        assert!(
            e.message.contains("\"t\"") && e.message.contains("1 per second"),
            "{}",
            e.message
        );
        assert_eq!(limit.refusal("t", Duration::from_millis(2_001)).1, 3);
        assert_eq!(limit.refusal("t", Duration::from_secs(2)).1, 2);
        assert_eq!(limit.refusal("t", Duration::ZERO).1, 1);
    }

    #[test]
    fn the_store_forgets_tenants_whose_burst_is_full_again() {
        let (limit, clock) = limit(1_000, 1);
        for i in 0..SWEEP_EVERY - 1 {
            let _ = limit.check(&format!("tenant-{i}"));
        }
        assert_eq!(limit.tenants_held(), (SWEEP_EVERY - 1) as usize);
        // Every one of them has refilled by now; the next check sweeps them away.
        clock.advance(Duration::from_secs(1));
        assert_eq!(limit.check("last"), Ok(()));
        assert_eq!(limit.tenants_held(), 1, "only the tenant just counted");
    }

    /// Both doors behind the limit on a fake clock, with a stand-in for the authentication
    /// layer outside it that puts the `x-tenant` header's tenant on the request.
    fn app(limit: &Arc<TenantRateLimit<FakeRelativeClock>>) -> Router {
        async fn principal(mut request: Request, next: Next) -> Response {
            let tenant = request
                .headers()
                .get("x-tenant")
                .map(|t| t.to_str().unwrap().to_owned());
            if let Some(tenant) = tenant {
                request.extensions_mut().insert(Principal {
                    tenant,
                    role: Role::Client,
                    token_id: Some("t1".into()),
                    tokenless: false,
                });
            }
            next.run(request).await
        }
        let native_limit = axum::middleware::from_fn_with_state(Arc::clone(limit), native);
        let dtm_limit = axum::middleware::from_fn_with_state(Arc::clone(limit), dtm);
        Router::new()
            .merge(
                Router::new()
                    .route("/api/v1/x", get(|| async { "ok" }))
                    .route_layer(native_limit),
            )
            .merge(
                Router::new()
                    .route("/api/dtmsvr/y", get(|| async { "ok" }))
                    .route_layer(dtm_limit),
            )
            .layer(axum::middleware::from_fn(principal))
    }

    async fn call(app: &Router, path: &str, tenant: Option<&str>) -> (u16, Option<String>, Value) {
        let mut request = axum::http::Request::get(path);
        if let Some(t) = tenant {
            request = request.header("x-tenant", t);
        }
        let response = app
            .clone()
            .oneshot(request.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (status, retry_after, body)
    }

    #[tokio::test]
    async fn the_middleware_keys_by_the_principals_tenant_and_answers_each_doors_error_body() {
        let clock = FakeRelativeClock::default();
        let config = RateLimitConfig {
            per_second: 1,
            burst: 2,
        };
        let limit = Arc::new(TenantRateLimit::with_clock(config, clock.clone()).unwrap());
        let app = app(&limit);

        // No principal: the default tenant. Both doors count against one quota.
        assert_eq!(call(&app, "/api/v1/x", None).await.0, 200);
        assert_eq!(call(&app, "/api/dtmsvr/y", None).await.0, 200);
        let (status, retry_after, body) = call(&app, "/api/v1/x", None).await;
        assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{body}");
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("\"default\""),
            "{body}"
        );
        let (status, retry_after, body) = call(&app, "/api/dtmsvr/y", None).await;
        assert_eq!((status, retry_after.as_deref()), (429, Some("1")), "{body}");
        assert_eq!(body["error"]["code"], "rate_limited", "{body}");
        assert!(body.get("dtm_result").is_none(), "{body}");
        assert!(body["message"].is_string(), "DTM's envelope: {body}");

        // Another tenant has its own quota; the default tenant's is a tenant named so.
        assert_eq!(call(&app, "/api/v1/x", Some("acme")).await.0, 200);
        assert_eq!(call(&app, "/api/v1/x", Some("acme")).await.0, 200);
        assert_eq!(call(&app, "/api/v1/x", Some("acme")).await.0, 429);
        assert_eq!(call(&app, "/api/v1/x", Some(DEFAULT_TENANT)).await.0, 429);

        // A second later one request of each has refilled, and only one.
        clock.advance(Duration::from_secs(1));
        assert_eq!(call(&app, "/api/v1/x", None).await.0, 200);
        assert_eq!(call(&app, "/api/dtmsvr/y", None).await.0, 429);
        assert_eq!(call(&app, "/api/dtmsvr/y", Some("acme")).await.0, 200);
    }
}

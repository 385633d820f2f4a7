//! The cap on requests in flight (`--max-requests-in-flight`) and on the request-body
//! bytes they hold (`--max-body-bytes-in-flight`), over both doors' transaction routes.
//!
//! Every request holds its body and what is parsed from it until it is answered, and the
//! connection cap (`--max-http-connections`) alone lets thousands of them do so at once:
//! 4,096 bodies of 1 MiB are gigabytes. Here a request counts from the moment its head is
//! routed until its answer (a `wait_result` request while it waits, too), for one request
//! and for its body's declared length (`Content-Length`; the 1 MiB body limit when it
//! declares none). One past either cap is refused at once, before its body is parsed:
//! `503 overloaded` with `Retry-After: 1`, in the door's error body. The client gets that
//! answer whole: the refused body is read and dropped a chunk at a time (never held), as
//! closing a connection with unread data would reset it and lose the answer; a client
//! that waits for `100 Continue` is answered at once instead, and sends nothing.
//!
//! Health, readiness, `/metrics`, DTM's `/api/ping`, the OpenAPI document and the console
//! are not counted or refused: a probe must answer however busy the API is.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use futures::StreamExt;
use hyper::body::Body as _;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::MAX_BODY;
use super::error::ApiError;
use super::rate_limit::{Door, refusal};

/// `--max-requests-in-flight`'s default.
pub const DEFAULT_MAX_REQUESTS: u32 = 1_024;
/// `--max-body-bytes-in-flight`'s default: 32 full bodies, or tens of thousands of
/// ordinary ones.
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 << 20;
/// How long a refused client is told to wait: requests in flight end in milliseconds.
const RETRY_AFTER_SECONDS: u64 = 1;

/// The two caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlightConfig {
    pub max_requests: u32,
    /// At least [`MAX_BODY`], or a full body could never be admitted.
    pub max_body_bytes: u64,
}

impl Default for InFlightConfig {
    fn default() -> Self {
        InFlightConfig {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// What the requests in flight hold of each cap.
pub struct InFlight {
    config: InFlightConfig,
    requests: Arc<Semaphore>,
    body_bytes: Arc<Semaphore>,
}

/// A request's share of both caps, given back when it is dropped.
struct Admitted {
    _request: OwnedSemaphorePermit,
    _body_bytes: OwnedSemaphorePermit,
}

impl InFlight {
    pub fn new(config: InFlightConfig) -> InFlight {
        let config = InFlightConfig {
            max_requests: config.max_requests.max(1),
            max_body_bytes: config.max_body_bytes.max(MAX_BODY as u64),
        };
        InFlight {
            config,
            requests: Arc::new(Semaphore::new(config.max_requests as usize)),
            body_bytes: Arc::new(Semaphore::new(
                usize::try_from(config.max_body_bytes)
                    .unwrap_or(usize::MAX)
                    .min(Semaphore::MAX_PERMITS),
            )),
        }
    }

    /// Admits a request whose body is `body_bytes` long, or says which cap it is past.
    fn admit(&self, body_bytes: u32) -> Result<Admitted, (&'static str, ApiError)> {
        let overloaded =
            |message: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message);
        let request = Arc::clone(&self.requests).try_acquire_owned().map_err(|_| {
            let max = self.config.max_requests;
            let message = format!(
                "idem is answering {max} requests, the most it takes at once; retry in {RETRY_AFTER_SECONDS} s"
            );
            ("requests", overloaded(message))
        })?;
        let body = Arc::clone(&self.body_bytes)
            .try_acquire_many_owned(body_bytes)
            .map_err(|_| {
                let max = self.config.max_body_bytes;
                let message = format!(
                    "the requests idem is answering hold {max} bytes of bodies, the most it takes \
                     at once; retry in {RETRY_AFTER_SECONDS} s"
                );
                ("body_bytes", overloaded(message))
            })?;
        Ok(Admitted {
            _request: request,
            _body_bytes: body,
        })
    }
}

/// The middleware of the native door's transaction routes.
pub async fn native(State(cap): State<Arc<InFlight>>, request: Request, next: Next) -> Response {
    limit(&cap, Door::Native, request, next).await
}

/// The middleware of the DTM door's routes: the refusal in DTM's envelope (no
/// `dtm_result`).
pub async fn dtm(State(cap): State<Arc<InFlight>>, request: Request, next: Next) -> Response {
    limit(&cap, Door::Dtm, request, next).await
}

async fn limit(cap: &InFlight, door: Door, request: Request, next: Next) -> Response {
    let hint = request.body().size_hint();
    let declared = hint.exact().unwrap_or(MAX_BODY as u64).min(MAX_BODY as u64);
    let declared = u32::try_from(declared).expect("the body limit fits in u32");
    let (cap_reached, error) = match cap.admit(declared) {
        Ok(admitted) => {
            let response = next.run(request).await;
            drop(admitted);
            return response;
        }
        Err(refused) => refused,
    };
    metrics::counter!("idem_overloaded_total", "limit" => cap_reached).increment(1);
    let waits_for_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !waits_for_continue {
        drain(request.into_body()).await;
    }
    refusal(door, error, RETRY_AFTER_SECONDS)
}

/// Reads a refused body to its end (the server's read timeout bounds how long), keeping
/// none of it; past the body limit it stops, and the connection is closed after the
/// answer as for any body over the limit.
async fn drain(body: Body) {
    let mut chunks = body.into_data_stream();
    let mut read = 0;
    while let Some(Ok(chunk)) = chunks.next().await {
        read += chunk.len();
        if read > MAX_BODY {
            break;
        }
    }
}

#[cfg(test)]
mod tests;

//! One run of a guarded handler: its lease renewed while it runs, a panic caught, a
//! dropped run (the client hung up) noticed, and its answer recorded as what it says
//! happened.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::response::Parts;
use axum::middleware::Next;
use axum::response::Response;

use super::{Ending, IdempotencyLayer, NothingHappened, RouteRule, error};
use crate::backend::BarrierDatabase;
use crate::idempotency::{IdempotencyError, IdempotencyStore, StoredResult, Ticket};

/// What the handler left: its answer with the whole body, or the panic it raised.
type Finished = Result<(Parts, Result<Bytes, axum::Error>), Box<dyn Any + Send>>;

impl<DB: BarrierDatabase> IdempotencyLayer<DB> {
    /// Runs the handler for `ticket` and records how it ended (module documentation of
    /// `http`). The answer is recorded by a task of its own, so a client that hangs up
    /// once the answer exists cannot cut the write short.
    pub(super) async fn run(
        &self,
        ticket: Ticket,
        rule: &RouteRule,
        req: Request,
        next: Next,
    ) -> Response {
        let hang_up = HangUpGuard(Some((self.store.clone(), ticket.clone())));
        let handler = async move {
            let (parts, body) = next.run(req).await.into_parts();
            (parts, axum::body::to_bytes(body, usize::MAX).await)
        };
        let finished: Finished = tokio::select! {
            biased;
            finished = catch_unwind(handler) => finished,
            never = keep_lease(&self.store, &ticket) => match never {},
        };
        hang_up.disarm();
        let (ending, response) = self.answer(&ticket, rule, finished);
        let store = self.store.clone();
        let scope = ticket.scope.clone();
        let written = tokio::spawn(async move { ending.record(&store, &ticket).await }).await;
        match written {
            Ok(Ok(())) => {}
            // The handler's effect may have happened; a recovery already answered for it
            // (stale owner), or the write failed (the lease runs out and the hook decides).
            Ok(Err(e)) => {
                tracing::warn!(scope = %scope, error = %e, "the handler's answer was not recorded");
            }
            Err(e) => {
                tracing::warn!(scope = %scope, error = %e, "recording the handler's answer did not finish");
            }
        }
        response
    }

    /// What to record for `finished`, and what to answer its client.
    fn answer(&self, ticket: &Ticket, rule: &RouteRule, finished: Finished) -> (Record, Response) {
        let scope = ticket.scope.as_str();
        let (parts, body) = match finished {
            Err(_) => {
                tracing::error!(
                    scope,
                    "the handler panicked; its outcome is unknown until the recovery hook or an operator settles it"
                );
                let response = error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "handler_panicked",
                    "the request failed while it ran and whether it took effect is not known; retry with the same key to learn the outcome",
                );
                return (Record::Unknown(None), response);
            }
            Ok(finished) => finished,
        };
        let status = parts.status;
        let body = match body {
            Ok(body) => body,
            Err(e) => {
                tracing::warn!(scope, status = status.as_u16(), error = %e,
                    "the handler's answer could not be read; its outcome is unknown");
                let response = error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "response_unreadable",
                    &e.to_string(),
                );
                return (Record::Unknown(Some(status.as_u16())), response);
            }
        };
        let marked = parts.extensions.get::<NothingHappened>().is_some();
        let ending = rule.ending(status, marked);
        let record = match ending {
            Ending::Retryable => Record::Retryable,
            Ending::Unknown => {
                tracing::warn!(
                    scope,
                    status = status.as_u16(),
                    "the handler answered a server error after it may have acted; the record is UNKNOWN until the recovery hook or an operator settles it"
                );
                Record::Unknown(Some(status.as_u16()))
            }
            Ending::Succeeded | Ending::FailedFinal => {
                let stored = StoredResult {
                    status: status.as_u16(),
                    headers: self.kept_headers(&parts),
                    body: body.to_vec(),
                    resource_id: None,
                };
                Record::Result(ending, stored)
            }
        };
        (record, Response::from_parts(parts, Body::from(body)))
    }

    fn kept_headers(&self, parts: &Parts) -> Vec<(String, String)> {
        self.kept_headers
            .iter()
            .filter_map(|name| {
                let value = parts.headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), value.to_owned()))
            })
            .collect()
    }
}

/// The write that ends a run.
enum Record {
    Result(Ending, StoredResult),
    Retryable,
    /// The status the handler answered, if it answered.
    Unknown(Option<u16>),
}

impl Record {
    async fn record<DB: BarrierDatabase>(
        self,
        store: &IdempotencyStore<DB>,
        ticket: &Ticket,
    ) -> Result<(), IdempotencyError> {
        match self {
            Record::Retryable => store.fail_retryable(ticket).await,
            Record::Unknown(answered) => store.mark_unknown(ticket, answered).await,
            Record::Result(ending, result) => {
                let status = result.status;
                let stored = if ending == Ending::Succeeded {
                    store.complete(ticket, result).await
                } else {
                    store.fail_final(ticket, result).await
                };
                match stored {
                    // The store refuses an answer it could not replay whole; the client
                    // has it, and repeats are settled through the fact source instead
                    // of replaying it empty.
                    Err(IdempotencyError::Invalid {
                        code: "result_too_large",
                        message,
                    }) => {
                        tracing::error!(scope = %ticket.scope, %message,
                            "the answer is too large to store (raise the store's max_result_body); the record is UNKNOWN");
                        store.mark_unknown(ticket, Some(status)).await
                    }
                    other => other,
                }
            }
        }
    }
}

/// Marks the record `UNKNOWN` when the run is dropped before its answer exists: the client
/// hung up (hyper drops the handler's future) or the server is shutting down. The handler
/// may have acted by then. Drop cannot wait, so the write is a task of its own; if no
/// runtime is left, the record stays `PROCESSING` and its lease runs out instead.
struct HangUpGuard<DB: BarrierDatabase>(Option<(IdempotencyStore<DB>, Ticket)>);

impl<DB: BarrierDatabase> HangUpGuard<DB> {
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl<DB: BarrierDatabase> Drop for HangUpGuard<DB> {
    fn drop(&mut self) {
        let Some((store, ticket)) = self.0.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            tracing::warn!(scope = %ticket.scope,
                "the handler was dropped before it answered (client hang-up or shutdown); the record is UNKNOWN");
            if let Err(e) = store.mark_unknown(&ticket, None).await {
                tracing::warn!(scope = %ticket.scope, error = %e,
                    "could not mark a dropped run UNKNOWN; its lease will run out instead");
            }
        });
    }
}

/// Renews the ticket's lease every third of its length, for as long as it is polled (the
/// handler's run). Never returns: once the record is lost (a stall longer than the lease
/// let someone settle it), it stops renewing and the owner's end write will be refused.
async fn keep_lease<DB: BarrierDatabase>(
    store: &IdempotencyStore<DB>,
    ticket: &Ticket,
) -> Infallible {
    let every = (store.lease() / 3).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(every).await;
        match store.renew(ticket).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(scope = %ticket.scope,
                    "a running handler's record was taken by recovery after its lease ran out; its answer will not be recorded");
                return std::future::pending().await;
            }
            // The next renewal may get through before the lease runs out.
            Err(e) => tracing::warn!(scope = %ticket.scope, error = %e, "lease renewal failed"),
        }
    }
}

/// Polls `future`, catching a panic of any poll as an `Err`.
async fn catch_unwind<F: Future>(future: F) -> Result<F::Output, Box<dyn Any + Send>> {
    let mut future = pin!(future);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

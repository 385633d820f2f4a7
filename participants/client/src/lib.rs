//! A typed Rust client of idem's native HTTP API (`/api/v1`).
//!
//! Builders for sagas, TCC transactions (register branches, call their Trys, submit or
//! abort) and two-phase messages; the answers parsed into the views the coordinator
//! writes ([`TxView`], shared through `idem-types`); errors that carry the API's stable
//! codes ([`Error::Api`]); and retries of the client's own requests with the same gid, so
//! a timeout or a coordinator restart never creates a second transaction.
//!
//! ```no_run
//! # async fn example() -> Result<(), idem_client::Error> {
//! use idem_client::{Client, Status};
//! use serde_json::json;
//!
//! let idem = Client::new("http://127.0.0.1:8686")?;
//! let saga = idem
//!     .saga("order-1001")
//!     .step(
//!         "http://inventory/reserve",
//!         "http://inventory/release",
//!         json!({"sku": "apple", "quantity": 2}),
//!     )
//!     .wait_result(true)
//!     .create()
//!     .await?;
//! assert_eq!(saga.status, Status::Succeeded);
//!
//! let tcc = idem.tcc("order-1002").create().await?;
//! tcc.register("01", "http://inv/confirm", "http://inv/cancel", json!({"sku": "apple"}))
//!     .await?;
//! // ... the application calls its Try here (or registers it with `register_with_try`) ...
//! let done = tcc.submit(true).await?;
//! println!("{} is {}", done.gid, done.status);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

mod backoff;
mod builders;
mod error;
mod raw;

pub use builders::{MsgBuilder, Options, SagaBuilder, Tcc, TccBuilder, TryOutcome};
pub use error::{Error, TransportError};
pub use idem_types::{
    Action, AttemptRecord, BranchStatus, BranchView, ErrorBody, ErrorView, Kind, Millis, PageView,
    Protocol, Status, TxOptions, TxView,
};
pub use raw::Raw;
/// The URL type of [`Client::transactions_url`] (reqwest's, which is `url`'s).
pub use reqwest::Url;

/// How the client retries its own requests: only failures after which the request may or
/// may not have been applied (no answer, `503 unavailable`) or that were refused before
/// being read (`429`), and always with the same gid, so a repeat is absorbed by the
/// coordinator. Waits are jittered (between half the backoff and all of it) and never
/// shorter than a `Retry-After` the coordinator sent; one longer than `max_delay` ends the
/// retries.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Tries in all, the first included (1: no retry).
    pub attempts: u32,
    /// Backoff before the first retry; doubled after each, up to `max_delay`.
    pub first_delay: Duration,
    /// Cap on the backoff, and on the `Retry-After` the client is willing to wait.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 5,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

/// What a create answered: the transaction, and whether this request created it (`201`)
/// or found it already created by a request with the same gid and body (`200`, or `202` while
/// that transaction is still being driven). A retry
/// by the client's own policy after a lost answer sees `new == false` for a transaction
/// its first attempt created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Created {
    /// The transaction as stored.
    pub view: TxView,
    /// This request created it.
    pub new: bool,
}

/// Filters of [`Client::list`]; unset ones match everything.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    /// Only this status.
    pub status: Option<Status>,
    /// Only this kind.
    pub kind: Option<Kind>,
    /// Created at or after (ms since the epoch).
    pub created_from: Option<Millis>,
    /// Created before (ms since the epoch).
    pub created_to: Option<Millis>,
    /// Page size, 1–1000.
    pub limit: Option<u32>,
    /// A previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// The `Authorization` header of an API token, marked sensitive so that reqwest keeps it
/// out of its debug output.
pub fn bearer_headers(token: &str) -> Result<reqwest::header::HeaderMap, Error> {
    let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| Error::InvalidUrl("the API token holds characters a header cannot".into()))?;
    value.set_sensitive(true);
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, value);
    Ok(headers)
}

/// A client of one coordinator (or of a load balancer in front of several).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    root: Url,
    retry: RetryPolicy,
}

impl Client {
    /// A client of the coordinator at `base_url` (e.g. `http://127.0.0.1:8686`, or
    /// `https://host/idem` behind a proxy that serves it under a prefix). Chooses rustls'
    /// ring provider for the process if none was chosen before.
    pub fn new(base_url: &str) -> Result<Client, Error> {
        // Already chosen (by the application, or by an earlier client): that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Transport(TransportError::of(&e, None)))?;
        Client::with_http(base_url, http)
    }

    /// A client of a coordinator that requires API tokens (`idem serve --auth tokens`):
    /// every request carries `Authorization: Bearer <token>`, and acts in the token's
    /// tenant with its role.
    pub fn with_token(base_url: &str, token: &str) -> Result<Client, Error> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .default_headers(bearer_headers(token)?)
            .build()
            .map_err(|e| Error::Transport(TransportError::of(&e, None)))?;
        Client::with_http(base_url, http)
    }

    /// A client that sends its requests through `http` (its own timeouts, TLS, proxy,
    /// connection pool).
    pub fn with_http(base_url: &str, http: reqwest::Client) -> Result<Client, Error> {
        let base = base_url.trim_end_matches('/').to_owned();
        let root = Url::parse(&base)
            .ok()
            .filter(|u| !u.cannot_be_a_base())
            .ok_or_else(|| Error::InvalidUrl(format!("{base}: not a base URL")))?;
        Ok(Client {
            http,
            base,
            root,
            retry: RetryPolicy::default(),
        })
    }

    /// Retries its own requests by `policy` instead of the default (5 tries).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Client {
        self.retry = policy;
        self
    }

    /// The coordinator's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `<base>/api/v1/transactions/<segments...>`, each segment escaped as one path
    /// segment (a gid holding `/` or `?` stays one segment, which the coordinator refuses
    /// as `invalid_gid`, instead of reaching another resource).
    pub fn transactions_url(&self, segments: &[&str]) -> Url {
        let mut url = self.root.clone();
        url.path_segments_mut()
            .expect("checked to be a base URL")
            .pop_if_empty()
            .extend(["api", "v1", "transactions"])
            .extend(segments);
        url
    }

    /// `<base>/api/v1/bulk`: an operator's action on the transactions a filter selects.
    pub fn bulk_url(&self) -> Url {
        let mut url = self.root.clone();
        url.path_segments_mut()
            .expect("checked to be a base URL")
            .pop_if_empty()
            .extend(["api", "v1", "bulk"]);
        url
    }

    /// A saga named `gid`: add steps, then [`SagaBuilder::create`].
    pub fn saga(&self, gid: impl Into<String>) -> SagaBuilder {
        SagaBuilder::new(self.clone(), gid.into())
    }

    /// A TCC transaction named `gid`: [`TccBuilder::create`] it, register branches, then
    /// submit or abort.
    pub fn tcc(&self, gid: impl Into<String>) -> TccBuilder {
        TccBuilder::new(self.clone(), gid.into())
    }

    /// A TCC transaction created before (by this process or another, through this
    /// coordinator or another): register its branches, submit or abort it.
    pub fn existing_tcc(&self, gid: impl Into<String>) -> Tcc {
        Tcc::new(self.clone(), gid.into())
    }

    /// A two-phase message named `gid`: add steps and its back-check, prepare it, commit
    /// the local transaction, then submit.
    pub fn msg(&self, gid: impl Into<String>) -> MsgBuilder {
        MsgBuilder::new(self.clone(), gid.into())
    }

    /// The same requests answered with the API's JSON as it came, for a tool that prints
    /// or forwards it (fields a newer coordinator adds are kept).
    pub fn raw(&self) -> Raw<'_> {
        Raw::new(self)
    }

    /// The transaction, with its history of calls that did not simply succeed.
    pub async fn get(&self, gid: &str) -> Result<TxView, Error> {
        self.fetch(gid).await
    }

    /// A page of transactions, newest first.
    pub async fn list(&self, query: &ListQuery) -> Result<PageView, Error> {
        self.fetch_page(query).await
    }

    /// Submits a prepared TCC or msg (waiting for the outcome with `wait_result`).
    pub async fn submit(&self, gid: &str, wait_result: bool) -> Result<TxView, Error> {
        let body = json!({"wait_result": wait_result});
        self.post(self.transactions_url(&[gid, "submit"]), &body)
            .await
    }

    /// Aborts a prepared TCC or msg (waiting for its Cancels with `wait_result`).
    pub async fn abort(
        &self,
        gid: &str,
        reason: Option<&str>,
        wait_result: bool,
    ) -> Result<TxView, Error> {
        self.operate(gid, Operation::Abort, reason, wait_result)
            .await
    }

    /// Operator: resumes a stalled transaction with fresh attempts.
    pub async fn retry(&self, gid: &str) -> Result<TxView, Error> {
        self.operate(gid, Operation::Retry, None, false).await
    }

    /// Operator: marks the transaction failed and calls nothing more (what was applied
    /// stays applied).
    pub async fn force_stop(&self, gid: &str, reason: &str) -> Result<TxView, Error> {
        self.operate(gid, Operation::ForceStop, Some(reason), false)
            .await
    }

    /// The coordinator's Prometheus text (`GET /metrics`).
    pub async fn metrics(&self) -> Result<String, Error> {
        let mut url = self.root.clone();
        url.path_segments_mut()
            .expect("checked to be a base URL")
            .pop_if_empty()
            .push("metrics");
        Ok(self.send(reqwest::Method::GET, url, None).await?.1)
    }

    async fn fetch<T: DeserializeOwned>(&self, gid: &str) -> Result<T, Error> {
        let url = self.transactions_url(&[gid]);
        self.parse(self.send(reqwest::Method::GET, url, None).await?)
    }

    /// The URL [`Client::list`] sends `query` to.
    pub fn list_url(&self, query: &ListQuery) -> Url {
        let mut url = self.transactions_url(&[]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(status) = query.status {
                pairs.append_pair("status", status.as_str());
            }
            if let Some(kind) = query.kind {
                pairs.append_pair("kind", kind.as_str());
            }
            if let Some(t) = query.created_from {
                pairs.append_pair("created_from", &t.to_string());
            }
            if let Some(t) = query.created_to {
                pairs.append_pair("created_to", &t.to_string());
            }
            if let Some(n) = query.limit {
                pairs.append_pair("limit", &n.to_string());
            }
            if let Some(c) = &query.cursor {
                pairs.append_pair("cursor", c);
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        url
    }

    async fn fetch_page<T: DeserializeOwned>(&self, query: &ListQuery) -> Result<T, Error> {
        let url = self.list_url(query);
        self.parse(self.send(reqwest::Method::GET, url, None).await?)
    }

    async fn operate<T: DeserializeOwned>(
        &self,
        gid: &str,
        operation: Operation,
        reason: Option<&str>,
        wait_result: bool,
    ) -> Result<T, Error> {
        let mut body = json!({});
        if let Some(reason) = reason {
            body["reason"] = Value::from(reason);
        }
        if wait_result {
            body["wait_result"] = Value::Bool(true);
        }
        self.post(self.transactions_url(&[gid, operation.segment()]), &body)
            .await
    }

    /// A create: its view, and whether this request made it (201) or found it made (200).
    pub(crate) async fn post_create(&self, body: &Value) -> Result<Created, Error> {
        let (status, text) = self
            .send(
                reqwest::Method::POST,
                self.transactions_url(&[]),
                Some(body),
            )
            .await?;
        let view = self.parse((status, text))?;
        Ok(Created {
            view,
            new: status == 201,
        })
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        url: Url,
        body: &Value,
    ) -> Result<T, Error> {
        self.parse(self.send(reqwest::Method::POST, url, Some(body)).await?)
    }

    fn parse<T: DeserializeOwned>(&self, (status, text): (u16, String)) -> Result<T, Error> {
        serde_json::from_str(&text).map_err(|e| Error::Decode {
            status,
            message: e.to_string(),
            body: cut(&text, 300).to_owned(),
        })
    }

    /// Sends one request, retrying what may not have been applied; the status and body of
    /// a success.
    async fn send(
        &self,
        method: reqwest::Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<(u16, String), Error> {
        let mut delay = self.retry.first_delay;
        let mut tries = 0;
        loop {
            tries += 1;
            let (error, asked) = match self.send_once(method.clone(), url.clone(), body).await {
                Ok(answer) => return Ok(answer),
                Err(refused) => refused,
            };
            if !error.may_succeed_on_retry() || tries >= self.retry.attempts.max(1) {
                return Err(error);
            }
            let jitter = rand::random::<f64>();
            let Some(wait) = backoff::next_wait(delay, asked, self.retry.max_delay, jitter) else {
                return Err(error);
            };
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(self.retry.max_delay);
        }
    }

    async fn send_once(
        &self,
        method: reqwest::Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<(u16, String), (Error, Option<Duration>)> {
        let mut request = self.http.request(method, url);
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| (Error::Transport(TransportError::of(&e, None)), None))?;
        let status = answer.status().as_u16();
        let asked = backoff::retry_after(answer.headers());
        let text = answer
            .text()
            .await
            .map_err(|e| (Error::Transport(TransportError::of(&e, Some(status))), None))?;
        if !(200..300).contains(&status) {
            return Err((Error::from_answer(status, &text), asked));
        }
        Ok((status, text))
    }
}

/// The operations on one transaction that take an optional reason.
#[derive(Clone, Copy)]
enum Operation {
    Abort,
    Retry,
    ForceStop,
}

impl Operation {
    fn segment(self) -> &'static str {
        match self {
            Operation::Abort => "abort",
            Operation::Retry => "retry",
            Operation::ForceStop => "force-stop",
        }
    }
}

pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests;

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

use serde::Serialize;
use serde_json::{Value, json};

mod builders;
mod error;

pub use builders::{MsgBuilder, Options, SagaBuilder, Tcc, TccBuilder};
pub use error::Error;
pub use idem_types::{
    Action, AttemptRecord, BranchStatus, BranchView, ErrorBody, ErrorView, Kind, Millis, PageView,
    Protocol, Status, TxOptions, TxView,
};

/// How the client retries its own requests: only failures after which the request may or
/// may not have been applied (no answer, `503 unavailable`), and always with the same
/// gid, so a repeat is absorbed by the coordinator.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Tries in all, the first included (1: no retry).
    pub attempts: u32,
    /// Delay before the first retry; doubled after each, up to `max_delay`.
    pub first_delay: Duration,
    /// Cap on the delay.
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

/// A client of one coordinator (or of a load balancer in front of several).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    retry: RetryPolicy,
}

impl Client {
    /// A client of the coordinator at `base_url` (e.g. `http://127.0.0.1:8686`).
    pub fn new(base_url: &str) -> Result<Client, Error> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Transport(e.to_string()))?;
        Client::with_http(base_url, http)
    }

    /// A client that sends its requests through `http` (its own timeouts, TLS, proxy).
    pub fn with_http(base_url: &str, http: reqwest::Client) -> Result<Client, Error> {
        let base = base_url.trim_end_matches('/').to_owned();
        reqwest::Url::parse(&base).map_err(|e| Error::InvalidUrl(format!("{base}: {e}")))?;
        Ok(Client {
            http,
            base,
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

    /// A saga named `gid`: add steps, then [`SagaBuilder::create`].
    pub fn saga(&self, gid: impl Into<String>) -> SagaBuilder {
        SagaBuilder::new(self.clone(), gid.into())
    }

    /// A TCC transaction named `gid`: [`TccBuilder::create`] it, register branches, then
    /// submit or abort.
    pub fn tcc(&self, gid: impl Into<String>) -> TccBuilder {
        TccBuilder::new(self.clone(), gid.into())
    }

    /// A two-phase message named `gid`: add steps and its back-check, prepare it, commit
    /// the local transaction, then submit.
    pub fn msg(&self, gid: impl Into<String>) -> MsgBuilder {
        MsgBuilder::new(self.clone(), gid.into())
    }

    /// The transaction, with its history of calls that did not simply succeed.
    pub async fn get(&self, gid: &str) -> Result<TxView, Error> {
        self.send(reqwest::Method::GET, &tx_path(gid, ""), None)
            .await
    }

    /// A page of transactions, newest first.
    pub async fn list(&self, query: &ListQuery) -> Result<PageView, Error> {
        let mut pairs: Vec<(&str, String)> = Vec::new();
        if let Some(status) = query.status {
            pairs.push(("status", status.as_str().to_owned()));
        }
        if let Some(kind) = query.kind {
            pairs.push(("kind", kind.as_str().to_owned()));
        }
        if let Some(t) = query.created_from {
            pairs.push(("created_from", t.to_string()));
        }
        if let Some(t) = query.created_to {
            pairs.push(("created_to", t.to_string()));
        }
        if let Some(n) = query.limit {
            pairs.push(("limit", n.to_string()));
        }
        if let Some(c) = &query.cursor {
            pairs.push(("cursor", c.clone()));
        }
        let mut url = reqwest::Url::parse(&format!("{}/api/v1/transactions", self.base))
            .map_err(|e| Error::InvalidUrl(e.to_string()))?;
        url.query_pairs_mut().extend_pairs(pairs);
        let path = format!("/api/v1/transactions?{}", url.query().unwrap_or(""));
        self.send(reqwest::Method::GET, &path, None).await
    }

    /// Submits a prepared TCC or msg (waiting for the outcome with `wait_result`).
    pub async fn submit(&self, gid: &str, wait_result: bool) -> Result<TxView, Error> {
        let body = json!({"wait_result": wait_result});
        self.post(&tx_path(gid, "/submit"), &body).await
    }

    /// Aborts a prepared TCC or msg.
    pub async fn abort(&self, gid: &str, reason: Option<&str>) -> Result<TxView, Error> {
        let body = match reason {
            Some(r) => json!({"reason": r}),
            None => json!({}),
        };
        self.post(&tx_path(gid, "/abort"), &body).await
    }

    /// Operator: resumes a stalled transaction with fresh attempts.
    pub async fn retry(&self, gid: &str) -> Result<TxView, Error> {
        self.post(&tx_path(gid, "/retry"), &json!({})).await
    }

    /// Operator: marks the transaction failed and calls nothing more (what was applied
    /// stays applied).
    pub async fn force_stop(&self, gid: &str, reason: &str) -> Result<TxView, Error> {
        self.post(&tx_path(gid, "/force-stop"), &json!({"reason": reason}))
            .await
    }

    pub(crate) async fn post<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, Error> {
        let body = serde_json::to_value(body).map_err(|e| Error::Decode(e.to_string()))?;
        self.send(reqwest::Method::POST, path, Some(&body)).await
    }

    /// Sends one request, retrying what may not have been applied; parses the answer.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, Error> {
        let mut delay = self.retry.first_delay;
        let mut tries = 0;
        loop {
            tries += 1;
            let result = self.send_once(method.clone(), path, body).await;
            match result {
                Err(e) if e.may_succeed_on_retry() && tries < self.retry.attempts.max(1) => {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.retry.max_delay);
                }
                other => return other,
            }
        }
    }

    async fn send_once<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, Error> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        let answer = request
            .send()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        let status = answer.status().as_u16();
        let text = answer
            .text()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        if !(200..300).contains(&status) {
            return Err(Error::from_answer(status, &text));
        }
        serde_json::from_str(&text).map_err(|e| Error::Decode(format!("{e}: {}", cut(&text, 300))))
    }
}

fn tx_path(gid: &str, tail: &str) -> String {
    // Gids are restricted to characters that need no escaping; an invalid one is refused
    // by the coordinator with `400 invalid_gid`, not mangled here.
    format!("/api/v1/transactions/{gid}{tail}")
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

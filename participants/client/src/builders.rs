//! Builders of the three kinds of global transaction.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::{Client, Created, Error, TxView};

/// Options a transaction may set; unset ones take the coordinator's defaults (ranges in
/// docs/api.md, *Limits*).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Options {
    /// Timeout of one call to a participant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// First retry delay (doubled per attempt).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_interval_ms: Option<u64>,
    /// Cap on the retry delay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_retry_interval_ms: Option<u64>,
    /// Attempts per branch operation before it stalls (a saga action: compensates).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Longest one call may keep answering "in progress".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_progress_ms: Option<u64>,
    /// The global timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Headers sent with every branch call.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub branch_headers: BTreeMap<String, String>,
    /// Saga: run steps concurrently, as `orders` allows.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub concurrent: bool,
    /// Saga with `concurrent`: step index -> the steps it waits for.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub orders: BTreeMap<String, Vec<usize>>,
}

impl Options {
    fn is_empty(&self) -> bool {
        serde_json::to_value(self).is_ok_and(|v| v.as_object().is_some_and(|m| m.is_empty()))
    }
}

fn to_json(payload: impl Serialize) -> Value {
    // A payload that cannot be serialised is a bug of the caller's type, found at once.
    serde_json::to_value(payload).expect("a payload serialisable as JSON")
}

/// A saga being described; [`SagaBuilder::create`] sends it.
#[must_use = "nothing is sent until `create`"]
pub struct SagaBuilder {
    client: Client,
    gid: String,
    steps: Vec<Value>,
    options: Options,
    wait_result: bool,
}

impl SagaBuilder {
    pub(crate) fn new(client: Client, gid: String) -> SagaBuilder {
        SagaBuilder {
            client,
            gid,
            steps: Vec::new(),
            options: Options::default(),
            wait_result: false,
        }
    }

    /// Adds a step: its action, its compensation and the JSON payload both receive.
    pub fn step(
        mut self,
        action: impl Into<String>,
        compensate: impl Into<String>,
        payload: impl Serialize,
    ) -> SagaBuilder {
        self.steps.push(json!({
            "action": action.into(),
            "compensate": compensate.into(),
            "payload": to_json(payload),
        }));
        self
    }

    /// Sets the transaction's options.
    pub fn options(mut self, options: Options) -> SagaBuilder {
        self.options = options;
        self
    }

    /// Answer once the saga succeeded, failed or stalled (or the server's wait ended).
    pub fn wait_result(mut self, wait: bool) -> SagaBuilder {
        self.wait_result = wait;
        self
    }

    /// Creates and submits the saga. Sent again with the same gid (by the retry policy or
    /// by the caller), it answers with the stored transaction and runs nothing twice.
    pub async fn create(self) -> Result<TxView, Error> {
        Ok(self.send().await?.view)
    }

    /// [`SagaBuilder::create`], also telling whether this request created the saga.
    pub async fn send(self) -> Result<Created, Error> {
        let mut body = json!({
            "gid": self.gid,
            "kind": "saga",
            "steps": self.steps,
            "wait_result": self.wait_result,
        });
        if !self.options.is_empty() {
            body["options"] = to_json(&self.options);
        }
        self.client.post_create(&body).await
    }
}

/// A TCC transaction being described; [`TccBuilder::create`] sends it.
#[must_use = "nothing is sent until `create`"]
pub struct TccBuilder {
    client: Client,
    gid: String,
    branches: Vec<Value>,
    options: Options,
}

impl TccBuilder {
    pub(crate) fn new(client: Client, gid: String) -> TccBuilder {
        TccBuilder {
            client,
            gid,
            branches: Vec::new(),
            options: Options::default(),
        }
    }

    /// Registers a branch's Confirm and Cancel with the creation itself (one request for
    /// all); call its Try once [`TccBuilder::create`] answered.
    pub fn branch(
        mut self,
        branch_id: impl Into<String>,
        confirm: impl Into<String>,
        cancel: impl Into<String>,
        payload: impl Serialize,
    ) -> TccBuilder {
        self.branches.push(json!({
            "branch_id": branch_id.into(),
            "confirm": confirm.into(),
            "cancel": cancel.into(),
            "payload": to_json(payload),
        }));
        self
    }

    /// Sets the transaction's options.
    pub fn options(mut self, options: Options) -> TccBuilder {
        self.options = options;
        self
    }

    /// Creates the transaction, `prepared`, with the branches given by
    /// [`TccBuilder::branch`] (none: register them one by one on the [`Tcc`]).
    pub async fn create(self) -> Result<Tcc, Error> {
        let mut body = json!({"gid": self.gid, "kind": "tcc"});
        if !self.branches.is_empty() {
            body["branches"] = Value::Array(self.branches);
        }
        if !self.options.is_empty() {
            body["options"] = to_json(&self.options);
        }
        let created = self.client.post_create(&body).await?;
        let mut tcc = Tcc::new(self.client, created.view.gid);
        tcc.created_now = created.new;
        Ok(tcc)
    }
}

/// A created TCC transaction: register its branches (before their Trys), then submit or
/// abort.
#[derive(Clone, Debug)]
pub struct Tcc {
    client: Client,
    gid: String,
    created_now: bool,
}

impl Tcc {
    pub(crate) fn new(client: Client, gid: String) -> Tcc {
        Tcc {
            client,
            gid,
            created_now: false,
        }
    }

    /// This handle's create made the transaction (`201`); false when it existed already
    /// (or the handle was made with [`Client::existing_tcc`]).
    pub fn created_now(&self) -> bool {
        self.created_now
    }

    /// The transaction's gid.
    pub fn gid(&self) -> &str {
        &self.gid
    }

    /// Registers a branch's Confirm and Cancel. Register before calling its Try, so that
    /// an abort also cancels a Try whose answer was lost.
    pub async fn register(
        &self,
        branch_id: &str,
        confirm: &str,
        cancel: &str,
        payload: impl Serialize,
    ) -> Result<(), Error> {
        let body = json!({
            "branch_id": branch_id,
            "confirm": confirm,
            "cancel": cancel,
            "payload": to_json(payload),
        });
        let _: Value = self.client.post(self.branches_url(), &body).await?;
        Ok(())
    }

    /// Registers a branch and has the coordinator call its Try: what the Try answered
    /// (register again to call it again, or abort, unless it succeeded). An error is a
    /// registration that failed (`branch_conflict`, `not_prepared`, no answer, ...).
    pub async fn register_with_try(
        &self,
        branch_id: &str,
        try_url: &str,
        confirm: &str,
        cancel: &str,
        payload: impl Serialize,
    ) -> Result<TryOutcome, Error> {
        let body = json!({
            "branch_id": branch_id,
            "try": try_url,
            "confirm": confirm,
            "cancel": cancel,
            "payload": to_json(payload),
        });
        let answer: Result<Value, Error> = self.client.post(self.branches_url(), &body).await;
        match answer {
            Ok(_) => Ok(TryOutcome::Succeeded),
            Err(e) => TryOutcome::of_refusal(e),
        }
    }

    /// Submits: the Confirm decision is stored, then every Confirm is delivered.
    pub async fn submit(&self, wait_result: bool) -> Result<TxView, Error> {
        self.client.submit(&self.gid, wait_result).await
    }

    /// Aborts: every registered branch is cancelled (answers once they are, with
    /// `wait_result`).
    pub async fn abort(&self, reason: Option<&str>, wait_result: bool) -> Result<TxView, Error> {
        self.client.abort(&self.gid, reason, wait_result).await
    }

    fn branches_url(&self) -> crate::Url {
        self.client.transactions_url(&[&self.gid, "branches"])
    }
}

/// What a Try that the coordinator called for the application answered
/// ([`Tcc::register_with_try`]); the details are the participant's answer or why there
/// was none, as the coordinator recorded them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TryOutcome {
    /// It succeeded: the branch can be confirmed.
    Succeeded,
    /// The participant refused (`409 try_failed`): abort the transaction.
    Failed(String),
    /// It is still working on it (`425 try_in_progress`).
    InProgress(String),
    /// No definite answer (`502 try_unknown`): a timeout, a 5xx, a redirect.
    Unknown(String),
}

impl TryOutcome {
    fn of_refusal(e: Error) -> Result<TryOutcome, Error> {
        let Error::Api { code, message, .. } = &e else {
            return Err(e);
        };
        match code.as_str() {
            "try_failed" => Ok(TryOutcome::Failed(message.clone())),
            "try_in_progress" => Ok(TryOutcome::InProgress(message.clone())),
            "try_unknown" => Ok(TryOutcome::Unknown(message.clone())),
            _ => Err(e),
        }
    }

    /// The coordinator's name for it: `success`, `failure`, `in_progress` or `unknown`.
    pub fn label(&self) -> &'static str {
        match self {
            TryOutcome::Succeeded => "success",
            TryOutcome::Failed(_) => "failure",
            TryOutcome::InProgress(_) => "in_progress",
            TryOutcome::Unknown(_) => "unknown",
        }
    }

    /// What the participant answered, or why there was no answer (none on success).
    pub fn detail(&self) -> Option<&str> {
        match self {
            TryOutcome::Succeeded => None,
            TryOutcome::Failed(d) | TryOutcome::InProgress(d) | TryOutcome::Unknown(d) => Some(d),
        }
    }
}

/// A two-phase message being described; [`MsgBuilder::prepare`] sends it.
#[must_use = "nothing is sent until `prepare`"]
pub struct MsgBuilder {
    client: Client,
    gid: String,
    steps: Vec<Value>,
    query_prepared: Option<String>,
    options: Options,
}

impl MsgBuilder {
    pub(crate) fn new(client: Client, gid: String) -> MsgBuilder {
        MsgBuilder {
            client,
            gid,
            steps: Vec::new(),
            query_prepared: None,
            options: Options::default(),
        }
    }

    /// Adds an action that must succeed once the message is submitted.
    pub fn step(mut self, action: impl Into<String>, payload: impl Serialize) -> MsgBuilder {
        self.steps
            .push(json!({"action": action.into(), "payload": to_json(payload)}));
        self
    }

    /// The back-check the coordinator calls when the message is not submitted by its
    /// timeout (without one, the message fails at its timeout).
    pub fn query_prepared(mut self, url: impl Into<String>) -> MsgBuilder {
        self.query_prepared = Some(url.into());
        self
    }

    /// Sets the transaction's options.
    pub fn options(mut self, options: Options) -> MsgBuilder {
        self.options = options;
        self
    }

    /// Stores the message, `prepared`. Commit the local transaction, then
    /// [`Client::submit`] it.
    pub async fn prepare(self) -> Result<TxView, Error> {
        Ok(self.send().await?.view)
    }

    /// [`MsgBuilder::prepare`], also telling whether this request created the message.
    pub async fn send(self) -> Result<Created, Error> {
        let mut body = json!({"gid": self.gid, "kind": "msg", "steps": self.steps});
        if let Some(url) = self.query_prepared {
            body["query_prepared"] = Value::String(url);
        }
        if !self.options.is_empty() {
            body["options"] = to_json(&self.options);
        }
        self.client.post_create(&body).await
    }
}

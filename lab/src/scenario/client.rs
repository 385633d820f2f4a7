//! The client: plays the application (creates transactions, calls the TCC Trys, submits or
//! aborts) and the operator (retries what stalled).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Error, Order, Participant, Settings, branch_id, coordinators::Coordinators};
use idem::core::Kind;

pub(super) struct Client {
    http: reqwest::Client,
    coordinators: Arc<Coordinators>,
    urls: BTreeMap<Participant, String>,
    settings: Settings,
}

/// How long the client keeps retrying one request while coordinators restart.
const REQUEST_PATIENCE: Duration = Duration::from_secs(90);

/// Retries the operator makes for one transaction that keeps stalling (random faults can
/// use up a small budget again after the first retry); past them it is left stalled, and
/// reported so.
const OPERATOR_RETRIES: u32 = 3;

impl Client {
    pub(super) fn new(
        coordinators: Arc<Coordinators>,
        urls: BTreeMap<Participant, String>,
        settings: Settings,
    ) -> Client {
        Client {
            http: reqwest::Client::new(),
            coordinators,
            urls,
            settings,
        }
    }

    /// Sends a request to coordinator `via`, retrying while it is down or restarting. A
    /// request whose coordinator died under it is simply repeated: the gid makes it safe.
    async fn api(
        &self,
        via: usize,
        path: &str,
        body: Option<Value>,
    ) -> Result<(u16, Value), Error> {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        let mut coordinator = via;
        loop {
            let url = format!("{}{path}", self.coordinators.url(coordinator));
            let request = match &body {
                Some(b) => self.http.post(&url).json(b),
                None => self.http.get(&url),
            };
            match request.timeout(Duration::from_secs(30)).send().await {
                Ok(r) if r.status().as_u16() != 503 && r.status().as_u16() < 500 => {
                    let code = r.status().as_u16();
                    return Ok((code, r.json().await.unwrap_or(Value::Null)));
                }
                _ if Instant::now() > deadline => {
                    return Err(format!(
                        "coordinators did not answer {path} for {REQUEST_PATIENCE:?}"
                    )
                    .into());
                }
                _ => {
                    // Down or restarting: try again, on another coordinator if there is one.
                    coordinator += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    async fn call_try(&self, order: &Order, index: usize) -> u16 {
        let branch = &order.branches[index];
        let Ok(mut url) = reqwest::Url::parse(&self.urls[&branch.participant]) else {
            return 0;
        };
        url.query_pairs_mut()
            .append_pair("gid", &order.gid)
            .append_pair("trans_type", "tcc")
            .append_pair("branch_id", &branch_id(index))
            .append_pair("op", "try");
        let result = self
            .http
            .post(url)
            .json(&branch.payload)
            .timeout(Duration::from_millis(self.settings.try_timeout_ms))
            .send()
            .await;
        match result {
            Ok(r) => r.status().as_u16(),
            Err(_) => 0,
        }
    }

    pub(super) async fn wait_settled(&self, via: usize, gid: &str) -> Result<Value, Error> {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        loop {
            let (code, tx) = self
                .api(via, &format!("/api/v1/transactions/{gid}"), None)
                .await?;
            let status = tx["status"].as_str().unwrap_or("");
            if code == 200 && matches!(status, "succeeded" | "failed" | "stalled") {
                return Ok(tx);
            }
            if Instant::now() > deadline {
                return Err(format!("{gid} did not settle: {tx}").into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Plays the application for one order until the transaction ends or stalls.
    pub(super) async fn run(&self, order: &Order, via: usize) -> Result<Settled, Error> {
        let gid = &order.gid;
        let options = serde_json::to_value(order.options.clone().unwrap_or_default())?;
        // TCC: how many branches the client got to (registered and tried).
        let mut tried = 0;
        let tx = match order.kind {
            Kind::Saga => {
                let steps: Vec<Value> = order
                    .branches
                    .iter()
                    .map(|b| {
                        let url = &self.urls[&b.participant];
                        json!({"action": url, "compensate": url, "payload": b.payload})
                    })
                    .collect();
                let body = json!({"gid": gid, "kind": "saga", "steps": steps, "options": options});
                let (code, answer) = self.api(via, "/api/v1/transactions", Some(body)).await?;
                if code >= 400 {
                    return Err(format!("{gid}: create failed: {answer}").into());
                }
                self.wait_settled(via, gid).await?
            }
            Kind::Tcc | Kind::Msg => {
                let (code, answer) = self
                    .api(
                        via,
                        "/api/v1/transactions",
                        Some(json!({"gid": gid, "kind": "tcc", "options": options})),
                    )
                    .await?;
                if code >= 400 {
                    return Err(format!("{gid}: create failed: {answer}").into());
                }
                let mut refused = None;
                for (i, b) in order.branches.iter().enumerate() {
                    tried = i + 1;
                    let url = &self.urls[&b.participant];
                    let body = json!({"branch_id": branch_id(i), "confirm": url, "cancel": url, "payload": b.payload});
                    let (code, answer) = self
                        .api(
                            via,
                            &format!("/api/v1/transactions/{gid}/branches"),
                            Some(body),
                        )
                        .await?;
                    if code != 200 {
                        refused = Some(format!("register {}: {answer}", branch_id(i)));
                        break;
                    }
                    let status = self.call_try(order, i).await;
                    if !(200..300).contains(&status) {
                        refused = Some(format!("Try of {} answered {status}", branch_id(i)));
                        break;
                    }
                }
                let (path, body) = match (&refused, order.abort) {
                    (None, false) => (format!("/api/v1/transactions/{gid}/submit"), json!({})),
                    (why, _) => (
                        format!("/api/v1/transactions/{gid}/abort"),
                        json!({"reason": why.clone().unwrap_or_else(|| "the client aborts".into())}),
                    ),
                };
                let (code, answer) = self.api(via, &path, Some(body)).await?;
                if code >= 400 && code != 409 {
                    return Err(format!("{gid}: {path}: {answer}").into());
                }
                self.wait_settled(via, gid).await?
            }
        };
        Ok(Settled { tx, tried })
    }

    /// Plays the operator once the order's outages have healed: retries the transaction
    /// while it is stalled; returns how many times it did. Then, for `late_try` orders, the
    /// application's late Trys.
    pub(super) async fn operate(
        &self,
        order: &Order,
        via: usize,
        settled: Settled,
    ) -> Result<u32, Error> {
        let gid = &order.gid;
        let mut tx = settled.tx;
        let mut retries = 0;
        while tx["status"] == "stalled" && order.retry_if_stalled && retries < OPERATOR_RETRIES {
            retries += 1;
            self.api(
                via,
                &format!("/api/v1/transactions/{gid}/retry"),
                Some(json!({})),
            )
            .await?;
            tx = self.wait_settled(via, gid).await?;
        }
        if order.late_try && order.kind == Kind::Tcc {
            for i in 0..settled.tried {
                self.call_try(order, i).await;
            }
        }
        Ok(retries)
    }
}

/// An order the application is done with: the transaction as the coordinator showed it
/// (ended or stalled), and how many TCC branches the client got to.
pub(super) struct Settled {
    tx: Value,
    tried: usize,
}

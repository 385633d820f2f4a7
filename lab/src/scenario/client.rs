//! The client: plays the application (creates transactions, calls the TCC Trys, submits or
//! aborts) and the operator (retries what stalled), through `idem-client`: one client per
//! coordinator URL, and this module's own patience around them while coordinators are
//! SIGKILLed and restarted.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::core::{Kind, Status};
use idem_client::{Options, RetryPolicy, TxView};

use super::{Error, Order, Participant, Settings, branch_id, coordinators::Coordinators};

pub(super) struct Client {
    http: reqwest::Client,
    /// What the coordinators get: the timeout of one request, and no retries of the
    /// client's own (this module decides what is sent again, and where).
    coordinator_http: reqwest::Client,
    /// One client per coordinator URL (a restarted coordinator listens on a new port).
    clients: Mutex<HashMap<String, idem_client::Client>>,
    coordinators: Arc<Coordinators>,
    urls: BTreeMap<Participant, String>,
    settings: Settings,
    /// Each operator retry: when it was sent and answered, per gid.
    retries: Mutex<BTreeMap<String, Vec<(idem::core::Millis, idem::core::Millis)>>>,
}

/// How long the client keeps retrying one request while coordinators restart.
const REQUEST_PATIENCE: Duration = Duration::from_secs(90);

/// How long one request to a coordinator may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Retries the operator makes for one transaction that keeps stalling (random faults can
/// use up a small budget again after the first retry); past them it is left stalled, and
/// reported so.
const OPERATOR_RETRIES: u32 = 3;

/// What a coordinator answered: the view (or other answer), or its refusal. What counts
/// is the status: a success whose body did not parse, or any answer whose body broke off,
/// counts as answered with that status.
type Answer<T> = Result<T, idem_client::Error>;

/// The status of an answer that came, unless it was a success.
fn failed_status<T>(answer: &Answer<T>) -> Option<u16> {
    match answer {
        Err(idem_client::Error::Api { status, .. }) => Some(*status),
        Err(idem_client::Error::Transport(t)) => t.answer_status().filter(|s| *s >= 300),
        _ => None,
    }
}

/// A refusal: the coordinator answered with an error status.
fn refusal<T>(answer: &Answer<T>) -> Option<(u16, &idem_client::Error)> {
    let status = failed_status(answer).filter(|s| *s >= 400)?;
    answer.as_ref().err().map(|e| (status, e))
}

/// No answer worth keeping: none at all, the database unavailable, or a server error.
fn worth_repeating<T>(answer: &Answer<T>) -> bool {
    let no_status =
        matches!(answer, Err(idem_client::Error::Transport(t)) if t.answer_status().is_none());
    no_status || failed_status(answer).is_some_and(|s| s >= 500)
}

fn shown<T: serde::Serialize>(answer: &Answer<T>) -> String {
    match answer {
        Ok(value) => serde_json::to_string(value).unwrap_or_default(),
        Err(e) => e.to_string(),
    }
}

impl Client {
    pub(super) fn new(
        coordinators: Arc<Coordinators>,
        urls: BTreeMap<Participant, String>,
        settings: Settings,
    ) -> Client {
        let coordinator_http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("a client with a timeout builds like the default one");
        Client {
            http: reqwest::Client::new(),
            coordinator_http,
            clients: Mutex::new(HashMap::new()),
            coordinators,
            urls,
            settings,
            retries: Mutex::new(BTreeMap::new()),
        }
    }

    /// The operator's retries so far, per gid.
    pub(super) fn operator_retries(
        &self,
    ) -> BTreeMap<String, Vec<(idem::core::Millis, idem::core::Millis)>> {
        self.retries.lock().expect("poisoned").clone()
    }

    fn client_of(&self, url: &str) -> Result<idem_client::Client, Error> {
        let mut clients = self.clients.lock().expect("poisoned");
        if let Some(client) = clients.get(url) {
            return Ok(client.clone());
        }
        let client = idem_client::Client::with_http(url, self.coordinator_http.clone())?
            .retry_policy(RetryPolicy {
                attempts: 1,
                ..RetryPolicy::default()
            });
        clients.insert(url.to_owned(), client.clone());
        Ok(client)
    }

    /// Sends a request (`path` names it) to coordinator `via`, retrying while it is down
    /// or restarting. A request whose coordinator died under it is simply repeated: the
    /// gid makes it safe.
    async fn api<T, F, Fut>(&self, via: usize, path: &str, request: F) -> Result<Answer<T>, Error>
    where
        F: Fn(idem_client::Client) -> Fut,
        Fut: Future<Output = Answer<T>>,
    {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        let mut coordinator = via;
        loop {
            let client = self.client_of(&self.coordinators.url(coordinator))?;
            let answer = request(client).await;
            if !worth_repeating(&answer) {
                return Ok(answer);
            }
            if Instant::now() > deadline {
                return Err(
                    format!("coordinators did not answer {path} for {REQUEST_PATIENCE:?}").into(),
                );
            }
            // Down or restarting: try again, on another coordinator if there is one.
            coordinator += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
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

    pub(super) async fn wait_settled(&self, via: usize, gid: &str) -> Result<TxView, Error> {
        let deadline = Instant::now() + REQUEST_PATIENCE;
        let path = format!("/api/v1/transactions/{gid}");
        loop {
            let answer = self
                .api(via, &path, |c| async move { c.get(gid).await })
                .await?;
            match answer {
                Ok(tx)
                    if matches!(
                        tx.status,
                        Status::Succeeded | Status::Failed | Status::Stalled
                    ) =>
                {
                    return Ok(tx);
                }
                answer if Instant::now() > deadline => {
                    return Err(format!("{gid} did not settle: {}", shown(&answer)).into());
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Plays the application for one order until the transaction ends or stalls.
    pub(super) async fn run(&self, order: &Order, via: usize) -> Result<Settled, Error> {
        let gid = &order.gid;
        let retry = order.options.clone().unwrap_or_default();
        let options = Options {
            max_attempts: retry.max_attempts,
            retry_interval_ms: retry.retry_interval_ms,
            max_retry_interval_ms: retry.max_retry_interval_ms,
            ..Options::default()
        };
        let create = "/api/v1/transactions";
        // TCC: how many branches the client got to (registered and tried).
        let mut tried = 0;
        let tx = match order.kind {
            Kind::Saga => {
                let answer = self
                    .api(via, create, |c| {
                        let saga = order.branches.iter().fold(c.saga(gid), |saga, b| {
                            let url = &self.urls[&b.participant];
                            saga.step(url, url, &b.payload)
                        });
                        saga.options(options.clone()).create()
                    })
                    .await?;
                if let Some((_, e)) = refusal(&answer) {
                    return Err(format!("{gid}: create failed: {e}").into());
                }
                self.wait_settled(via, gid).await?
            }
            Kind::Tcc | Kind::Msg => {
                let answer = self
                    .api(via, create, |c| {
                        let tcc = c.tcc(gid).options(options.clone());
                        async move { Ok(tcc.create().await?.gid().to_owned()) }
                    })
                    .await?;
                if let Some((_, e)) = refusal(&answer) {
                    return Err(format!("{gid}: create failed: {e}").into());
                }
                let mut refused = None;
                let register = format!("/api/v1/transactions/{gid}/branches");
                for (i, b) in order.branches.iter().enumerate() {
                    tried = i + 1;
                    let url = &self.urls[&b.participant];
                    let answer = self
                        .api(via, &register, |c| async move {
                            let tcc = c.existing_tcc(gid);
                            tcc.register(&branch_id(i), url, url, &b.payload).await
                        })
                        .await?;
                    if let Some((_, e)) = refusal(&answer) {
                        refused = Some(format!("register {}: {e}", branch_id(i)));
                        break;
                    }
                    let status = self.call_try(order, i).await;
                    if !(200..300).contains(&status) {
                        refused = Some(format!("Try of {} answered {status}", branch_id(i)));
                        break;
                    }
                }
                let (path, answer) = match (&refused, order.abort) {
                    (None, false) => {
                        let path = format!("/api/v1/transactions/{gid}/submit");
                        let submit =
                            |c: idem_client::Client| async move { c.submit(gid, false).await };
                        let answer = self.api(via, &path, submit).await?;
                        (path, answer)
                    }
                    (why, _) => {
                        let path = format!("/api/v1/transactions/{gid}/abort");
                        let reason = why.clone().unwrap_or_else(|| "the client aborts".into());
                        let reason = reason.as_str();
                        let abort = |c: idem_client::Client| async move {
                            c.abort(gid, Some(reason), false).await
                        };
                        let answer = self.api(via, &path, abort).await?;
                        (path, answer)
                    }
                };
                if let Some((status, e)) = refusal(&answer)
                    && status != 409
                {
                    return Err(format!("{gid}: {path}: {e}").into());
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
        let path = format!("/api/v1/transactions/{gid}/retry");
        while tx.status == Status::Stalled && order.retry_if_stalled && retries < OPERATOR_RETRIES {
            retries += 1;
            // Whatever it answers (a refusal too), what counts is where the transaction
            // ends.
            let sent = crate::faults::now();
            let _ = self
                .api(via, &path, |c| async move { c.retry(gid).await })
                .await?;
            self.retries
                .lock()
                .expect("poisoned")
                .entry(gid.clone())
                .or_default()
                .push((sent, crate::faults::now()));
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
    tx: TxView,
    tried: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, code: &str) -> Answer<()> {
        Err(idem_client::Error::Api {
            status,
            code: code.into(),
            message: String::new(),
        })
    }

    /// What the runner sends again (on the next coordinator) and what it takes as the
    /// answer: the rule it had when it spoke HTTP itself (no answer, or a status of 500 and
    /// up, is sent again; anything else is the answer).
    #[test]
    fn no_answer_and_server_errors_are_sent_again_the_rest_is_the_answer() {
        let no_answer: Answer<()> = Err(idem_client::Error::Transport("reset".into()));
        assert!(worth_repeating(&no_answer));
        for (status, code) in [(503, "unavailable"), (500, "internal"), (502, "http_502")] {
            assert!(worth_repeating(&api(status, code)), "{status}");
        }
        let conflict = api(409, "invalid_state");
        assert!(!worth_repeating(&conflict));
        assert_eq!(refusal(&conflict).map(|(s, _)| s), Some(409));
        assert_eq!(refusal(&api(404, "not_found")).map(|(s, _)| s), Some(404));
        let not_json: Answer<()> = Err(idem_client::Error::Decode {
            status: 201,
            message: "expected value".into(),
            body: String::new(),
        });
        assert!(!worth_repeating(&not_json) && refusal(&not_json).is_none());
        let fine: Answer<()> = Ok(());
        assert!(!worth_repeating(&fine) && refusal(&fine).is_none());
    }
}

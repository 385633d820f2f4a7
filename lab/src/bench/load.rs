//! The load of the timed workloads: clients that run global transactions back to back
//! through `idem-client`, one request per step as an application sends them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use idem::core::Status;
use idem_client::TxView;

use idem_dtm_proto::DtmClient;
use tonic::transport::Channel;

use super::{ACCOUNTS, Coordinator, Error, SKUS, Workload, dtm_doors};

/// A client of the coordinator at `url` that sends each request once: the bench counts a
/// failure as one, and a retry would add a round trip to what it measures.
pub(crate) fn idem_client(url: &str, http: &reqwest::Client) -> Result<idem_client::Client, Error> {
    let client = idem_client::Client::with_http(url, http.clone())?;
    Ok(client.retry_policy(idem_client::RetryPolicy {
        attempts: 1,
        ..idem_client::RetryPolicy::default()
    }))
}

/// One client's work: global transactions of the workload, back to back.
pub(super) struct Client {
    idem: idem_client::Client,
    /// The coordinator's API, for DTM's HTTP door.
    api: String,
    /// DTM's gRPC service, for `empty_grpc`.
    dtm_grpc: Option<DtmClient<Channel>>,
    /// The TCC workload's Trys, which the application calls itself.
    http: reqwest::Client,
    urls: [String; 2],
    workload: Workload,
}

impl Client {
    pub(super) fn new(
        coordinator: &Coordinator,
        http: &reqwest::Client,
        urls: &[String; 2],
        workload: Workload,
    ) -> Result<Client, Error> {
        let dtm_grpc = match &coordinator.grpc {
            Some(address) => {
                let channel = Channel::from_shared(format!("http://{address}"))?.connect_lazy();
                Some(DtmClient::new(channel))
            }
            None => None,
        };
        Ok(Client {
            idem: idem_client(&coordinator.url, http)?,
            api: coordinator.url.clone(),
            dtm_grpc,
            http: http.clone(),
            urls: urls.clone(),
            workload,
        })
    }

    /// One request per step of the workload, as an application makes them: no reads.
    pub(super) async fn one(&self, gid: &str, n: usize) -> Result<(), Error> {
        let sku = format!("sku-{}", n % SKUS);
        // Concurrent transactions touch different rows, as the limit scripts' random
        // choice does: 7,919 is prime, so consecutive n go to accounts far apart (the
        // earlier n / 7 put seven consecutive transactions, most of those in flight at
        // once, on one account, and measured its row lock).
        let account = format!("acct-{}", (n * 7_919) % ACCOUNTS);
        let payloads = [
            json!({"sku": sku, "quantity": 1}),
            json!({"account": account, "amount": 1}),
        ];
        let [first, second] = &self.urls;
        match self.workload {
            Workload::Tcc => {
                let tcc = self
                    .idem
                    .tcc(gid)
                    .branch("01", first, first, &payloads[0])
                    .branch("02", second, second, &payloads[1])
                    .create()
                    .await?;
                let tries = (0..2).map(|i| self.call_try(gid, i, &payloads[i]));
                for r in futures::future::join_all(tries).await {
                    r?;
                }
                expect_succeeded(&tcc.submit(true).await?)
            }
            Workload::EmptyDtm => {
                dtm_doors::one_over_http(&self.http, &self.api, gid, &self.urls, &payloads).await
            }
            Workload::EmptyGrpc => {
                let client = self
                    .dtm_grpc
                    .as_ref()
                    .ok_or("the coordinator has no gRPC listener")?;
                dtm_doors::one_over_grpc(client, gid, &self.urls, n).await
            }
            Workload::Saga
            | Workload::Empty
            | Workload::Inflight
            | Workload::Recovery
            | Workload::Soak
            | Workload::Bodies => {
                let tx = self
                    .idem
                    .saga(gid)
                    .step(first, first, &payloads[0])
                    .step(second, second, &payloads[1])
                    .wait_result(true)
                    .create()
                    .await?;
                expect_succeeded(&tx)
            }
        }
    }

    async fn call_try(&self, gid: &str, i: usize, payload: &Value) -> Result<(), Error> {
        let mut url = reqwest::Url::parse(&self.urls[i])?;
        url.query_pairs_mut()
            .append_pair("gid", gid)
            .append_pair("trans_type", "tcc")
            .append_pair("branch_id", &format!("0{}", i + 1))
            .append_pair("op", "try");
        let r = self.http.post(url).json(payload).send().await?;
        if !r.status().is_success() {
            return Err(format!("Try {i} of {gid}: HTTP {}", r.status()).into());
        }
        Ok(())
    }
}

fn expect_succeeded(tx: &TxView) -> Result<(), Error> {
    match tx.status {
        Status::Succeeded => Ok(()),
        other => Err(format!("ended {other}: {:?}", tx.last_error).into()),
    }
}

/// Runs `clients` clients for `duration` (after `warmup`), client `c` on coordinator
/// `c % coordinators.len()`; returns latencies (µs) and failures.
pub(super) async fn drive(
    coordinators: Vec<Arc<Client>>,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    run: &str,
    bar: Option<indicatif::ProgressBar>,
) -> (Vec<u32>, u64, Duration) {
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = Arc::clone(&coordinators[c % coordinators.len()]);
        let bar = bar.clone();
        let run = run.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0u64;
            let mut n = c;
            while Instant::now() < end {
                let gid = format!("{run}-{c}-{n}");
                let t0 = Instant::now();
                let ok = client.one(&gid, n).await;
                let measured = t0 >= measure_from;
                match ok {
                    Ok(()) if measured => {
                        latencies.push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32)
                    }
                    Err(e) if measured => {
                        if failures < 3 {
                            eprintln!("failure: {e}");
                        }
                        failures += 1;
                    }
                    _ => {}
                }
                if let Some(bar) = &bar {
                    bar.set_position(start.elapsed().as_secs().min(bar.length().unwrap_or(0)));
                }
                n += clients;
            }
            (latencies, failures)
        }));
    }
    let mut all = Vec::new();
    let mut failures = 0;
    for t in tasks {
        if let Ok((l, f)) = t.await {
            all.extend(l);
            failures += f;
        }
    }
    (all, failures, duration)
}

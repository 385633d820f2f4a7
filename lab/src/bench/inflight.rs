//! The inflight and recovery workloads: many sagas held at a participant at once, and
//! (recovery) the coordinator killed under them and restarted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::load::idem_client;
use super::{ACTIVE, BenchConfig, BenchResult, Coordinator, Databases, Error, Workload};

/// A participant with no database that answers after a delay, or not at all while held.
#[derive(Default)]
struct Gate {
    held: std::sync::atomic::AtomicBool,
    released: tokio::sync::Notify,
}

async fn slow_participant(gate: Arc<Gate>, delay: Duration) -> Result<idem_demo::Service, Error> {
    use std::sync::atomic::Ordering;
    let router = axum::Router::new().fallback(move || {
        let gate = Arc::clone(&gate);
        async move {
            loop {
                let released = gate.released.notified();
                if !gate.held.load(Ordering::SeqCst) {
                    break;
                }
                released.await;
            }
            tokio::time::sleep(delay).await;
            axum::Json(json!({"dtm_result": "SUCCESS"}))
        }
    });
    Ok(idem_demo::spawn(router, "127.0.0.1:0").await?)
}

/// Creates `n` sagas (not waiting for them) through `clients` concurrent clients.
async fn create_sagas(
    http: &reqwest::Client,
    api: &str,
    url: &str,
    run: &str,
    n: usize,
    clients: usize,
) -> Result<(), Error> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (idem, url, run, next) = (
            idem_client(api, http)?,
            url.to_owned(),
            run.to_owned(),
            Arc::clone(&next),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if i >= n {
                    return Ok::<(), Error>(());
                }
                let saga = idem
                    .saga(format!("{run}-{i}"))
                    .step(&url, &url, json!({}))
                    .step(&url, &url, json!({}));
                if let Err(e) = saga.create().await {
                    return Err(format!("create answered {e}").into());
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// What the inflight workload saw beyond the peak RSS.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ScaleFigures {
    /// Seconds to create all the transactions.
    pub create_seconds: f64,
    /// Seconds the coordinator was watched after the last create.
    pub observed_seconds: f64,
    /// Transactions that finished while watched (their calls take `--participant-delay-ms`).
    pub finished_while_observed: u64,
    /// Lease renewals per second while watched (`idem_lease_renewals_total`).
    pub lease_renewals_per_second: f64,
    /// Transactions this process drove at the end of the watch (`idem_transactions_driving`).
    pub driving: u64,
    /// Seconds from SIGTERM to the process's exit, everything still in flight.
    pub sigterm_exit_seconds: f64,
}

impl ScaleFigures {
    pub fn table(&self) -> String {
        format!(
            "  created in {:.1} s; watched {:.1} s: {} finished, {:.1} lease renewals/s, {} driven at the end\n  SIGTERM to exit: {:.2} s\n",
            self.create_seconds,
            self.observed_seconds,
            self.finished_while_observed,
            self.lease_renewals_per_second,
            self.driving,
            self.sigterm_exit_seconds
        )
    }
}

/// The inflight and recovery workloads.
pub(super) async fn run_many_in_flight(config: &BenchConfig) -> Result<BenchResult, Error> {
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let store =
        idem::server::open_store(&dbs.coordinator, &idem::store::ConnectOptions::default()).await?;
    let gate = Arc::new(Gate::default());
    let recovery = config.workload == Workload::Recovery;
    gate.held
        .store(recovery, std::sync::atomic::Ordering::SeqCst);
    let delay = if recovery {
        Duration::ZERO
    } else {
        config.participant_delay
    };
    let participant = slow_participant(Arc::clone(&gate), delay).await?;
    let url = participant.url("/slow");
    // Calls wait as long as the participant holds them, instead of timing out and retrying.
    let mut serve_args = config.serve_args.clone();
    serve_args.extend(["--request-timeout-ms".into(), "120000".into()]);
    let mut coordinator =
        Coordinator::start(&config.idem_bin, &dbs.coordinator, false, &serve_args).await?;
    let run_id = format!("f{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let started = Instant::now();
    let api = coordinator.url.clone();
    let creating = create_sagas(&http, &api, &url, &run_id, config.inflight, config.clients);
    // Watch how many are unfinished while they are created and driven.
    let mut most = 0u64;
    tokio::pin!(creating);
    loop {
        tokio::select! {
            done = &mut creating => { done?; break; }
            _ = tokio::time::sleep(Duration::from_millis(250)) => {
                most = most.max(store.count(None, &ACTIVE).await?);
            }
        }
    }
    let created = started.elapsed();
    most = most.max(store.count(None, &ACTIVE).await?);
    let mut result = BenchResult {
        workload: format!("{:?}", config.workload).to_lowercase(),
        backend: config.backend.clone(),
        clients: config.clients,
        transactions: config.inflight as u64,
        ..BenchResult::default()
    };
    if recovery {
        coordinator.kill();
        gate.held.store(false, std::sync::atomic::Ordering::SeqCst);
        gate.released.notify_waiters();
        let unfinished = store.count(None, &ACTIVE).await?;
        let restart = Instant::now();
        coordinator =
            Coordinator::start(&config.idem_bin, &dbs.coordinator, false, &serve_args).await?;
        while store.count(None, &ACTIVE).await? > 0 {
            if restart.elapsed() > Duration::from_secs(600) {
                return Err("recovery did not finish in 10 minutes".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        result.recovery_seconds = Some(restart.elapsed().as_secs_f64());
        result.in_flight = Some(unfinished);
        result.coordinator_peak_rss_mb = coordinator.peak_rss_mb();
        coordinator.stop().await;
    } else {
        // Watched for a while with everything in flight, then stopped with it all still
        // there: the drain itself takes as long as the calls (each `--participant-delay-ms`)
        // and the call slots make it.
        let renewals = "idem_lease_renewals_total";
        let renewed_before = coordinator.counter(&http, renewals).await?;
        let unfinished_before = store.count(None, &ACTIVE).await?;
        let watch = Instant::now();
        while watch.elapsed() < config.observe {
            tokio::time::sleep(Duration::from_millis(500)).await;
            most = most.max(store.count(None, &ACTIVE).await?);
        }
        let observed = watch.elapsed();
        let renewed = coordinator.counter(&http, renewals).await? - renewed_before;
        let driving = coordinator
            .counter(&http, "idem_transactions_driving")
            .await?;
        let unfinished_after = store.count(None, &ACTIVE).await?;
        result.in_flight = Some(most);
        result.coordinator_peak_rss_mb = coordinator.peak_rss_mb();
        let exit = coordinator.terminate(Duration::from_secs(120)).await?;
        result.scale = Some(ScaleFigures {
            create_seconds: created.as_secs_f64(),
            observed_seconds: observed.as_secs_f64(),
            finished_while_observed: unfinished_before.saturating_sub(unfinished_after),
            lease_renewals_per_second: renewed as f64 / observed.as_secs_f64(),
            driving,
            sigterm_exit_seconds: exit.as_secs_f64(),
        });
    }
    result.seconds = started.elapsed().as_secs_f64();
    result.per_second = config.inflight as f64 / result.seconds;
    let failed = store
        .count(
            None,
            &[idem::core::Status::Failed, idem::core::Status::Stalled],
        )
        .await?;
    result.failures = failed;
    let _ = participant.stop().await;
    drop(store);
    dbs.drop().await;
    Ok(result)
}

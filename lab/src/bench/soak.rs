//! The soak workload: sagas at a fixed rate for a long time, 1 % of them at a slow
//! participant and 1 % at a failing one, with the coordinator's resident memory sampled
//! throughout. Memory that only grows shows as an end well above the start.
//!
//! The load is open: a saga starts every `1 / rate` seconds whether or not the earlier ones
//! are done, as a real service's traffic does, so a slow coordinator faces a queue instead
//! of a politely waiting client.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{ACTIVE, BenchConfig, BenchResult, Coordinator, Databases, Error, percentile};
use idem::core::Status;

/// One in this many sagas has a slow second step, and one in this many a failing one.
const ONE_IN: u64 = 100;

/// The memory curve and the outcome of a soak run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SoakFigures {
    pub rate_per_second: f64,
    /// Sagas started, and how many ended as their participant made them end (succeeded, or
    /// failed and compensated where the step fails).
    pub started: u64,
    pub as_expected: u64,
    pub slow: u64,
    pub failing: u64,
    /// Resident memory (VmRSS) of the coordinator at the end of the warm-up, halfway
    /// through the measured time, and at its end, in MB.
    pub rss_start_mb: f64,
    pub rss_middle_mb: f64,
    pub rss_end_mb: f64,
    pub rss_max_mb: f64,
    /// (seconds since the load started, VmRSS MB) every 10 s.
    pub rss_curve: Vec<(f64, f64)>,
    /// Transactions not finished (or stalled) once the load stopped and the slow ones had
    /// their time.
    pub left_unfinished: u64,
    pub stalled: u64,
}

impl SoakFigures {
    /// Largest difference of the middle and the end from the start, as a share of it.
    pub fn drift(&self) -> f64 {
        let start = self.rss_start_mb.max(f64::MIN_POSITIVE);
        [self.rss_middle_mb, self.rss_end_mb]
            .iter()
            .map(|m| (m - start).abs() / start)
            .fold(0.0, f64::max)
    }

    pub(super) fn table(&self, result: &BenchResult) -> String {
        format!(
            "workload soak on {}: {:.0} sagas/s for {:.0} s ({} started: {} slow, {} failing)\n  \
             ended as expected: {}; other outcomes or errors: {}; unfinished after: {}, stalled: {}\n  \
             latency ms: p50 {:.1}  p95 {:.1}  p99 {:.1}  max {:.1}\n  \
             coordinator RSS MB: start {:.1}  middle {:.1}  end {:.1}  (max {:.1}; drift {:.1} %)\n  \
             coordinator CPU {:.2} ms per transaction\n",
            result.backend,
            self.rate_per_second,
            result.seconds,
            self.started,
            self.slow,
            self.failing,
            self.as_expected,
            result.failures,
            self.left_unfinished,
            self.stalled,
            result.p50_ms,
            result.p95_ms,
            result.p99_ms,
            result.max_ms,
            self.rss_start_mb,
            self.rss_middle_mb,
            self.rss_end_mb,
            self.rss_max_mb,
            self.drift() * 100.0,
            1_000.0 * result.coordinator_cpu_seconds / self.started.max(1) as f64,
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Fine,
    Slow,
    Failing,
}

impl Fate {
    fn of(n: u64) -> Fate {
        match n % ONE_IN {
            0 => Fate::Slow,
            1 => Fate::Failing,
            _ => Fate::Fine,
        }
    }

    fn path(self) -> &'static str {
        match self {
            Fate::Fine => "/soak/ok",
            Fate::Slow => "/soak/slow",
            Fate::Failing => "/soak/fail",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Fate::Failing => "failed",
            Fate::Fine | Fate::Slow => "succeeded",
        }
    }
}

/// A participant with no database: answers at once, after a delay, or with FAILURE,
/// depending on the path.
async fn participant(slow: Duration) -> Result<idem_demo::Service, Error> {
    let ok = || async { axum::Json(json!({"dtm_result": "SUCCESS"})) };
    let router = axum::Router::new()
        .route("/soak/ok", axum::routing::post(ok))
        .route("/soak/compensate", axum::routing::post(ok))
        .route(
            "/soak/slow",
            axum::routing::post(move || async move {
                tokio::time::sleep(slow).await;
                axum::Json(json!({"dtm_result": "SUCCESS"}))
            }),
        )
        .route(
            "/soak/fail",
            axum::routing::post(|| async {
                (
                    axum::http::StatusCode::CONFLICT,
                    axum::Json(json!({"dtm_result": "FAILURE"})),
                )
            }),
        );
    Ok(idem_demo::spawn(router, "127.0.0.1:0").await?)
}

/// What one saga's request came to: its latency (µs) and whether it ended as its
/// participant made it end.
struct Done {
    started_at: Instant,
    micros: u32,
    outcome: Result<(), String>,
}

async fn one_saga(idem: idem_client::Client, base: String, gid: String, n: u64) -> Done {
    let started_at = Instant::now();
    let fate = Fate::of(n);
    let saga = [Fate::Fine, fate].iter().fold(idem.saga(&gid), |saga, f| {
        saga.step(
            format!("{base}{}", f.path()),
            format!("{base}/soak/compensate"),
            json!({"n": n}),
        )
    });
    let outcome = match saga.wait_result(true).create().await {
        Ok(tx) if tx.status.as_str() == fate.expected() => Ok(()),
        Ok(tx) => Err(format!(
            "{gid}: status {}, expected {}: {:?}",
            tx.status,
            fate.expected(),
            tx.last_error
        )),
        Err(e) => Err(format!("{gid}: {e}, expected {}", fate.expected())),
    };
    Done {
        started_at,
        micros: started_at.elapsed().as_micros().min(u32::MAX as u128) as u32,
        outcome,
    }
}

/// Runs the soak workload.
pub(super) async fn run(config: &BenchConfig) -> Result<BenchResult, Error> {
    if !(config.rate > 0.0 && config.rate <= 100_000.0) {
        return Err("--rate must be above 0 and at most 100000 sagas per second".into());
    }
    idem::transport::install_crypto_provider();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1_024)
        .tcp_nodelay(true)
        .build()?;
    let dbs = Databases::create(&config.backend).await?;
    let service = participant(config.participant_delay).await?;
    let base = service.url("");
    let coordinator = Coordinator::start(
        &config.idem_bin,
        &dbs.coordinator,
        false,
        &config.serve_args,
    )
    .await?;
    let run_id = format!("s{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let idem = super::load::idem_client(&coordinator.url, &http)?;

    let total = config.warmup + config.duration;
    let started = Instant::now();
    let measure_from = started + config.warmup;
    let middle = measure_from + config.duration / 2;
    let end = started + total;
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / config.rate));
    // Late ticks are made up, so the count of sagas is rate × time even if the load
    // generator stumbles.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sampler = tokio::time::interval(Duration::from_secs(1));
    let mut in_flight = tokio::task::JoinSet::new();
    let mut figures = SoakFigures {
        rate_per_second: config.rate,
        ..SoakFigures::default()
    };
    let mut latencies = Vec::new();
    let mut failures = 0u64;
    let mut record = |done: Done, figures: &mut SoakFigures| {
        if done.started_at < measure_from {
            return;
        }
        match done.outcome {
            Ok(()) => {
                figures.as_expected += 1;
                latencies.push(done.micros);
            }
            Err(e) => {
                if failures < 3 {
                    eprintln!("soak: {e}");
                }
                failures += 1;
            }
        }
    };
    let mut n = 0u64;
    let mut cpu_at_start = None;
    let mut last_curve_point = None::<Instant>;
    let bar = config.progress.then(|| {
        let bar = indicatif::ProgressBar::new(total.as_secs());
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} s")
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar.set_message(format!("soak on {}", config.backend));
        bar
    });
    while Instant::now() < end {
        tokio::select! {
            _ = ticks.tick() => {
                let gid = format!("{run_id}-{n}");
                if Instant::now() >= measure_from {
                    figures.started += 1;
                    match Fate::of(n) {
                        Fate::Slow => figures.slow += 1,
                        Fate::Failing => figures.failing += 1,
                        Fate::Fine => {}
                    }
                }
                in_flight.spawn(one_saga(idem.clone(), base.clone(), gid, n));
                n += 1;
            }
            Some(done) = in_flight.join_next() => {
                if let Ok(done) = done { record(done, &mut figures); }
            }
            _ = sampler.tick() => {
                let now = Instant::now();
                let rss = coordinator.rss_mb();
                if now >= measure_from && cpu_at_start.is_none() {
                    cpu_at_start = Some(coordinator.cpu_seconds());
                    figures.rss_start_mb = rss;
                }
                if now >= middle && figures.rss_middle_mb == 0.0 {
                    figures.rss_middle_mb = rss;
                }
                if now >= measure_from {
                    figures.rss_max_mb = figures.rss_max_mb.max(rss);
                }
                if last_curve_point.is_none_or(|t| now - t >= Duration::from_secs(10)) {
                    figures.rss_curve.push(((now - started).as_secs_f64().round(), rss));
                    last_curve_point = Some(now);
                }
                if let Some(bar) = &bar {
                    bar.set_position((now - started).as_secs());
                }
            }
        }
    }
    figures.rss_end_mb = coordinator.rss_mb();
    figures.rss_max_mb = figures.rss_max_mb.max(figures.rss_end_mb);
    let cpu = coordinator.cpu_seconds() - cpu_at_start.unwrap_or(0.0);
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    // The last requests: each ends within the slow participant's delay plus retries.
    while let Some(done) = in_flight.join_next().await {
        if let Ok(done) = done {
            record(done, &mut figures);
        }
    }
    let store =
        idem::server::open_store(&dbs.coordinator, &idem::store::ConnectOptions::default()).await?;
    figures.left_unfinished = store.count(None, &ACTIVE).await?;
    figures.stalled = store.count(None, &[Status::Stalled]).await?;
    drop(store);

    latencies.sort_unstable();
    let result = BenchResult {
        workload: "soak".into(),
        backend: config.backend.clone(),
        clients: 0,
        seconds: config.duration.as_secs_f64(),
        transactions: figures.as_expected,
        per_second: figures.as_expected as f64 / config.duration.as_secs_f64(),
        p50_ms: percentile(&latencies, 0.50),
        p95_ms: percentile(&latencies, 0.95),
        p99_ms: percentile(&latencies, 0.99),
        max_ms: latencies.last().map_or(0.0, |m| *m as f64 / 1_000.0),
        failures,
        coordinator_peak_rss_mb: coordinator.peak_rss_mb(),
        coordinator_cpu_seconds: cpu,
        soak: Some(figures),
        ..BenchResult::default()
    };
    coordinator.stop().await;
    let _ = service.stop().await;
    dbs.drop().await;
    Ok(result)
}

//! `idem-lab bench`: the load test.

use std::time::Duration;

use clap::Args;

use super::BoxError;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long, value_enum, default_value = "tcc")]
    pub workload: crate::bench::Workload,
    /// sqlite, postgres or mysql (coordinator and participants on the same server).
    #[arg(long, default_value = "sqlite")]
    pub backend: String,
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Seconds run before measuring (default 3; soak: 60, so the start of the memory
    /// curve is a warm process).
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Transactions in the SQL-counting pass (0 skips it).
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// An extra `idem serve` argument for the coordinator (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Inflight and recovery workloads: how many transactions.
    #[arg(long, default_value_t = 10_000)]
    pub inflight: usize,
    /// Inflight workload: how long the participant takes per call; soak: how long the
    /// slow one takes, in ms.
    #[arg(long, default_value_t = 2_000)]
    pub participant_delay_ms: u64,
    /// Inflight workload: seconds to watch the coordinator once every transaction is
    /// created (then it gets SIGTERM, with everything still in flight).
    #[arg(long, default_value_t = 20)]
    pub observe: u64,
    /// Timed workloads: coordinator processes sharing the database (the clients are spread
    /// over them).
    #[arg(long, default_value_t = 1)]
    pub coordinators: usize,
    /// Run the whole benchmark this many times (fresh databases each time) and print the
    /// medians: the machine's speed swings from one run to the next, and a ratio to the
    /// limit is read best from rounds that alternate idem and the limit.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Soak workload: sagas started per second (an open load: they start on time whether
    /// or not the earlier ones are done).
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// Then run the limit script (bench/limit/, PostgreSQL with pgbench) with the same
    /// clients and duration, and print idem's share of it. Run from the checkout root.
    #[arg(long)]
    pub limit: bool,
    /// The coordinator binary to measure (run as `BIN serve ...`). Default: the `idem`
    /// beside this `idem-lab` (cargo builds both into one directory), else `idem-lab`
    /// itself, whose `serve` is the same coordinator.
    #[arg(long)]
    pub idem_bin: Option<std::path::PathBuf>,
    /// The coordinator's `--retention-ms`: finished transactions older than this are
    /// deleted (a short one, such as 2000, makes retention delete as fast as the load
    /// finishes transactions: its cost under load).
    #[arg(long)]
    pub retention_ms: Option<u64>,
    /// The coordinator's `--retention-interval-ms`: how often retention runs.
    #[arg(long)]
    pub retention_interval_ms: Option<u64>,
}

pub(super) async fn bench(mut args: BenchArgs) -> Result<(), BoxError> {
    // A bench's clients never repeat a request: a window as short as asked is no risk, and
    // the coordinator refuses one below the clients' retry period.
    let retry_period = args.retention_ms.filter(|&ms| ms > 0);
    for (flag, value) in [
        ("--retention-ms", args.retention_ms),
        ("--client-retry-period-ms", retry_period),
        ("--retention-interval-ms", args.retention_interval_ms),
    ] {
        if let Some(value) = value {
            args.serve_args.extend([flag.to_owned(), value.to_string()]);
        }
    }
    let config = crate::bench::BenchConfig {
        workload: args.workload,
        backend: args.backend,
        clients: args.clients.max(1),
        duration: Duration::from_secs(args.duration.max(1)),
        warmup: Duration::from_secs(args.warmup.unwrap_or(
            if args.workload == crate::bench::Workload::Soak {
                60
            } else {
                3
            },
        )),
        count: args.count,
        idem_bin: match args.idem_bin {
            Some(bin) => bin,
            None => {
                let me = std::env::current_exe()?;
                let beside = me.with_file_name("idem");
                if beside.is_file() { beside } else { me }
            }
        },
        serve_args: args.serve_args,
        progress: true,
        inflight: args.inflight,
        limit_root: args.limit.then(std::env::current_dir).transpose()?,
        participant_delay: Duration::from_millis(args.participant_delay_ms),
        rate: args.rate,
        observe: Duration::from_secs(args.observe),
        coordinators: args.coordinators.max(1),
    };
    let mut results = Vec::new();
    for round in 1..=args.rounds.max(1) {
        let result = crate::bench::run(&config).await?;
        if args.rounds > 1 {
            println!("round {round} of {}:", args.rounds);
        }
        print!("{}", result.table());
        results.push(result);
    }
    if results.len() > 1 {
        print!("{}", crate::bench::medians(&results));
    }
    if let Some(path) = &args.json {
        let json = match results.as_slice() {
            [one] => serde_json::to_string_pretty(one)?,
            all => serde_json::to_string_pretty(all)?,
        };
        std::fs::write(path, json)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

// The coordinator allocates many small, short-lived objects per request (JSON, HTTP,
// statements); mimalloc serves those with less contention and copying than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = idem::cli::Cli::parse();
    // The server logs its life at info; the tools (bench, chaos, replay) run participants
    // in-process whose info logs would drown their own output.
    let default = match cli.command {
        idem::cli::Command::Serve(_) => "info",
        _ => "warn",
    };
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default)));
    // IDEM_COUNT_SQL=1 counts every statement sqlx runs (served in /metrics); the
    // benchmark turns it on for its counting pass.
    idem::metrics::set_sql_counting(std::env::var("IDEM_COUNT_SQL").is_ok_and(|v| v == "1"));
    let counting = idem::metrics::SqlCountingLayer.with_filter(idem::metrics::counting_filter());
    tracing_subscriber::registry()
        .with(log)
        .with(counting)
        .init();
    let cli = idem::cli::Cli::parse();
    if let Err(e) = idem::cli::run(cli).await {
        eprintln!("idem: {e}");
        std::process::exit(1);
    }
}

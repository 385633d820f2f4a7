use clap::Parser;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

// The same allocator as `idem`, so that the coordinators it starts behave alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = idem_lab::cli::Cli::parse();
    // A coordinator logs its life at info; the tools run participants in-process whose
    // info logs would drown their own output.
    let default = match cli.command {
        idem_lab::cli::Command::Serve(_) => "info",
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
    if let Err(e) = idem_lab::cli::run(cli).await {
        eprintln!("idem-lab: {e}");
        std::process::exit(1);
    }
}

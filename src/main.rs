use clap::Parser;

// The coordinator allocates many small, short-lived objects per request (JSON, HTTP,
// statements); mimalloc serves those with less contention and copying than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let cli = idem::cli::Cli::parse();
    // The server logs its life at info; the operator's commands only what goes wrong.
    let default = match cli.command {
        idem::cli::Command::Serve(_) => "info",
        _ => "warn",
    };
    let endpoint = match &cli.command {
        idem::cli::Command::Serve(args) => args.otlp_endpoint.clone(),
        _ => None,
    };
    let otlp = idem::telemetry::Otlp::start_or_exit(endpoint.as_deref(), "idem");
    idem::cli::init_logging(default, otlp.as_ref());
    let result = idem::cli::run(cli).await;
    // Sends the spans still queued before the process ends.
    drop(otlp);
    if let Err(e) = result {
        eprintln!("idem: {e}");
        std::process::exit(1);
    }
}

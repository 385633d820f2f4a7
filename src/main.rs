// The coordinator allocates many small, short-lived objects per request (JSON, HTTP,
// statements); mimalloc serves those with less contention and copying than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // The configuration first, so that the log takes its format and level from the file.
    let loaded = idem::cli::Cli::load(std::env::args_os()).unwrap_or_else(|e| e.exit("idem"));
    let (format, level) = loaded.cli.logging();
    let endpoint = match &loaded.cli.command {
        idem::cli::Command::Serve(args) => args.otlp_endpoint.clone(),
        _ => None,
    };
    let otlp = idem::telemetry::Otlp::start_or_exit(endpoint.as_deref(), "idem");
    idem::cli::init_logging(format, level, otlp.as_ref());
    let result = idem::cli::run(loaded).await;
    // Sends the spans still queued before the process ends.
    drop(otlp);
    if let Err(e) = result {
        idem::cli::report_fatal("idem", format, &e);
        std::process::exit(1);
    }
}

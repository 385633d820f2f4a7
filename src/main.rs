// The coordinator allocates many small, short-lived objects per request (JSON, HTTP,
// statements); mimalloc serves those with less contention and copying than glibc's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // The configuration first, so that the log takes its format and level from the file.
    let loaded = idem::cli::Cli::load(std::env::args_os()).unwrap_or_else(|e| e.exit("idem"));
    let (format, level) = loaded.cli.logging();
    idem::cli::init_logging(format, level);
    if let Err(e) = idem::cli::run(loaded).await {
        idem::cli::report_fatal("idem", format, &e);
        std::process::exit(1);
    }
}

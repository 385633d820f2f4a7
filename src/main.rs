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
    idem::cli::init_logging(default);
    if let Err(e) = idem::cli::run(cli).await {
        eprintln!("idem: {e}");
        std::process::exit(1);
    }
}

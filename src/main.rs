use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = idem::cli::Cli::parse();
    if let Err(e) = idem::cli::run(cli).await {
        eprintln!("idem: {e}");
        std::process::exit(1);
    }
}

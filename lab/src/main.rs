use clap::Parser;

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
    let endpoint = match &cli.command {
        idem_lab::cli::Command::Serve(args) => args.serve.otlp_endpoint.clone(),
        _ => None,
    };
    let otlp = idem::telemetry::Otlp::start_or_exit(endpoint.as_deref(), "idem-lab");
    idem::cli::init_logging(default, otlp.as_ref());
    let result = idem_lab::cli::run(cli).await;
    drop(otlp);
    if let Err(e) = result {
        eprintln!("idem-lab: {e}");
        std::process::exit(1);
    }
}

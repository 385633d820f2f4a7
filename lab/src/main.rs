// The same allocator as `idem`, so that the coordinators it starts behave alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    // `serve` reads a --config file as `idem serve` does, before the log is set up.
    let loaded = idem::cli::config::load::<idem_lab::cli::Cli>(std::env::args_os())
        .unwrap_or_else(|e| e.exit("idem-lab"));
    let cli = loaded.cli;
    // A coordinator logs as configured; the tools run participants in-process whose info
    // logs would drown their own output.
    let (format, level) = match &cli.command {
        idem_lab::cli::Command::Serve(args) => {
            let log = &args.serve.log;
            (log.log_format, log.log_level.clone())
        }
        _ => (idem::cli::LogFormat::Text, "warn".to_owned()),
    };
    let endpoint = match &cli.command {
        idem_lab::cli::Command::Serve(args) => args.serve.otlp_endpoint.clone(),
        _ => None,
    };
    let otlp = idem::telemetry::Otlp::start_or_exit(endpoint.as_deref(), "idem-lab");
    idem::cli::init_logging(format, &level, otlp.as_ref());
    let result = idem_lab::cli::run(cli).await;
    drop(otlp);
    if let Err(e) = result {
        idem::cli::report_fatal("idem-lab", format, &e);
        std::process::exit(1);
    }
}

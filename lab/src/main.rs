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
    idem::cli::init_logging(default);
    if let Err(e) = idem_lab::cli::run(cli).await {
        eprintln!("idem-lab: {e}");
        std::process::exit(1);
    }
}

//! `idem-demo`: runs one of the example participants.
//!
//! ```text
//! idem-demo inventory --seed apple=10                       # sqlite://idem-inventory.db, 127.0.0.1:8081
//! idem-demo payment --database-url postgres://postgres@127.0.0.1/shop?sslmode=disable --seed alice=100
//! idem-demo coupon --listen 0.0.0.0:9000 --seed WELCOME10=50
//! idem-demo inventory --signing-secret-file keys.txt        # only calls signed by idem
//! ```

mod order_cli;

use clap::{Args, Parser, Subcommand};
use idem_demo::idem_participant::signature::{Keyring, Verifier};
use idem_demo::{coupon, inventory, payment};

#[derive(Parser)]
#[command(
    name = "idem-demo",
    about = "Example idem participants: inventory, payment, coupon"
)]
struct Cli {
    #[command(subcommand)]
    service: Service,
}

#[derive(Subcommand)]
enum Service {
    /// TCC: reserve stock (POST /inventory/reserve). Seeds are `sku=available`.
    Inventory(Common),
    /// TCC: freeze money (POST /payment/freeze). Seeds are `account=balance`.
    Payment(Common),
    /// Saga: issue a coupon (POST /coupon/issue). Seeds are `campaign=remaining`.
    Coupon(Common),
    /// The order service: POST /orders with Idempotency-Key, payment callbacks, "order
    /// paid" events, built on the SDK's idempotency kit.
    Order(order_cli::OrderArgs),
    /// The order service's nightly settlement for one business date (safe to rerun).
    OrderSettle(order_cli::SettleArgs),
}

#[derive(Args)]
struct Common {
    /// Database URL: sqlite://file.db?mode=rwc, postgres://..., mysql://...
    /// [default: sqlite://idem-<service>.db?mode=rwc]
    #[arg(long, env = "IDEM_DEMO_DATABASE_URL")]
    database_url: Option<String>,
    /// Address to listen on [default: 127.0.0.1:8081 / 8082 / 8083]
    #[arg(long)]
    listen: Option<String>,
    /// Initial data, `key=number`, repeatable.
    #[arg(long, value_parser = parse_seed)]
    seed: Vec<(String, i64)>,
    /// Accept only branch calls signed by idem (v2) with one of these keys: `kid:secret`
    /// or `kid:ed25519-pub:<hex>` lines and `[tenant NAME]` sections, what `idem signing
    /// public` prints for `idem serve --signing-secret-file`'s file; reread every minute.
    /// A call without a valid signature gets 401. Not given: calls are not checked.
    #[arg(long, env = "IDEM_DEMO_SIGNING_SECRET_FILE", value_name = "PATH")]
    signing_secret_file: Option<std::path::PathBuf>,
}

fn parse_seed(s: &str) -> Result<(String, i64), String> {
    let (key, n) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not key=number"))?;
    let n = n
        .parse()
        .map_err(|_| format!("`{n}` in `{s}` is not a number"))?;
    Ok((key.to_owned(), n))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    match Cli::parse().service {
        Service::Inventory(a) => serve_participant(Participant::Inventory, a).await,
        Service::Payment(a) => serve_participant(Participant::Payment, a).await,
        Service::Coupon(a) => serve_participant(Participant::Coupon, a).await,
        Service::Order(a) => order_cli::serve(a).await,
        Service::OrderSettle(a) => order_cli::settle(a).await,
    }
}

/// The three branch participants, served alike.
#[derive(Clone, Copy)]
enum Participant {
    Inventory,
    Payment,
    Coupon,
}

async fn serve_participant(
    service: Participant,
    args: Common,
) -> Result<(), Box<dyn std::error::Error>> {
    let (name, port) = match service {
        Participant::Inventory => ("inventory", 8081),
        Participant::Payment => ("payment", 8082),
        Participant::Coupon => ("coupon", 8083),
    };
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://idem-{name}.db?mode=rwc"));
    let listen = args
        .listen
        .clone()
        .unwrap_or_else(|| format!("127.0.0.1:{port}"));
    let pool = match service {
        Participant::Inventory => inventory::open(&url).await?,
        Participant::Payment => payment::open(&url).await?,
        Participant::Coupon => coupon::open(&url).await?,
    };
    for (key, n) in &args.seed {
        match service {
            Participant::Inventory => inventory::seed(&pool, key, *n).await?,
            Participant::Payment => payment::seed(&pool, key, *n).await?,
            Participant::Coupon => coupon::seed(&pool, key, *n).await?,
        }
    }
    let verifier = match &args.signing_secret_file {
        Some(path) => {
            let verifier = Verifier::new(Keyring::from_file(path)?);
            verifier.reload_every(path.clone(), std::time::Duration::from_secs(60));
            Some(verifier)
        }
        None => None,
    };
    let signed = verifier.is_some();
    let router = match service {
        Participant::Inventory => inventory::router_with(pool, verifier),
        Participant::Payment => payment::router_with(pool, verifier),
        Participant::Coupon => coupon::router_with(pool, verifier),
    };
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tracing::info!(service = name, addr = %listener.local_addr()?, database = %redact(&url), signed, "listening");
    axum::serve(listener, router).await?;
    Ok(())
}

/// The URL without its password, for the log.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse() {
        assert_eq!(parse_seed("apple=10"), Ok(("apple".into(), 10)));
        assert!(parse_seed("apple").is_err());
        assert!(parse_seed("apple=x").is_err());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(redact("mysql://root@h/db"), "mysql://root@h/db");
        assert_eq!(redact("sqlite://x.db?mode=rwc"), "sqlite://x.db?mode=rwc");
    }

    #[test]
    fn cli_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "idem-demo",
            "inventory",
            "--seed",
            "apple=3",
            "--listen",
            "127.0.0.1:0",
        ])
        .unwrap();
        let Service::Inventory(a) = cli.service else {
            panic!()
        };
        assert_eq!(a.seed, vec![("apple".to_owned(), 3)]);
        assert_eq!(a.signing_secret_file, None);
        let cli =
            Cli::try_parse_from(["idem-demo", "coupon", "--signing-secret-file", "keys"]).unwrap();
        let Service::Coupon(a) = cli.service else {
            panic!()
        };
        assert_eq!(a.signing_secret_file.as_deref(), Some("keys".as_ref()));
    }
}

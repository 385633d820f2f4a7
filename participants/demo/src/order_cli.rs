//! `idem-demo order` and `idem-demo order-settle`: the order service and its nightly job.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use idem_demo::events::{self, ConsumerConfig, Hooks};
use idem_demo::order::{self, OrderConfig, nightly, outbox, payment, points};
use idem_participant::kit::{SharedClock, system_clock};

/// `idem-demo order`.
#[derive(Args)]
pub struct OrderArgs {
    /// Database URL [default: sqlite://idem-order.db?mode=rwc]
    #[arg(long, env = "IDEM_DEMO_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8084")]
    pub listen: String,
    /// The coordinator's API.
    #[arg(long, default_value = "http://127.0.0.1:8686")]
    pub coordinator: String,
    /// The inventory service the order sagas sell stock at.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub inventory: String,
    /// This shop's merchant id at the payment provider.
    #[arg(long, default_value = "shop-1")]
    pub merchant: String,
    /// The payment provider's name.
    #[arg(long, default_value = "acmepay")]
    pub provider: String,
    /// A file holding the secret the provider signs its callbacks with.
    #[arg(long, env = "IDEM_DEMO_PROVIDER_SECRET_FILE", value_name = "PATH")]
    pub provider_secret_file: std::path::PathBuf,
    /// NATS server for the "order paid" events (outbox relay and points consumer); not
    /// given: events stay in the outbox.
    #[arg(long)]
    pub nats: Option<String>,
}

/// `idem-demo order-settle`.
#[derive(Args)]
pub struct SettleArgs {
    /// Database URL [default: sqlite://idem-order.db?mode=rwc]
    #[arg(long, env = "IDEM_DEMO_DATABASE_URL")]
    pub database_url: Option<String>,
    /// The business date to settle, `YYYY-MM-DD`.
    #[arg(long)]
    pub date: String,
    /// This run's id (a scheduler's execution id) [default: a random one]
    #[arg(long)]
    pub execution_id: Option<String>,
}

fn database(url: &Option<String>) -> String {
    url.clone()
        .unwrap_or_else(|| "sqlite://idem-order.db?mode=rwc".into())
}

/// Runs the order service until it fails.
pub async fn serve(args: OrderArgs) -> Result<(), Box<dyn std::error::Error>> {
    let pool = order::open(&database(&args.database_url)).await?;
    let secret = std::fs::read(&args.provider_secret_file)?;
    let secret = String::from_utf8(secret)?.trim().as_bytes().to_vec();
    let clock: SharedClock = system_clock();
    let config = OrderConfig {
        idem: idem_client::Client::new(&args.coordinator)?,
        inventory_url: args.inventory,
        merchant: args.merchant,
        provider: args.provider,
        provider_secret: secret,
        clock: clock.clone(),
        create_lease: Duration::from_secs(30),
        paid_subject: payment::ORDER_PAID_SUBJECT.into(),
    };
    if let Some(url) = &args.nats {
        let js = async_nats::jetstream::new(async_nats::connect(url).await?);
        let consumer = events::open_consumer(
            &js,
            &ConsumerConfig::new("ORDERS", payment::ORDER_PAID_SUBJECT, points::GROUP),
        )
        .await
        .map_err(|e| e as Box<dyn std::error::Error>)?;
        outbox::spawn_relay(pool.clone(), js, clock, Duration::from_millis(200));
        let (pool, log) = (pool.clone(), points::log());
        tokio::spawn(async move {
            let done =
                events::run(consumer, pool, log, points::credit_points, Hooks::default()).await;
            tracing::error!(result = ?done, "the points consumer stopped");
        });
    }
    let router = order::router(pool, config)?;
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(service = "order", addr = %listener.local_addr()?, "listening");
    axum::serve(listener, router).await?;
    Ok(())
}

/// Runs the nightly settlement once and prints what it did.
pub async fn settle(args: SettleArgs) -> Result<(), Box<dyn std::error::Error>> {
    let pool = order::open(&database(&args.database_url)).await?;
    let execution = args
        .execution_id
        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
    let report = nightly::settle(
        &pool,
        Arc::new(idem_participant::SystemClock),
        &args.date,
        &execution,
    )
    .await?;
    println!(
        "settled {}: {} units done by this run, {} already done, {} busy",
        args.date, report.done, report.skipped, report.busy
    );
    Ok(())
}

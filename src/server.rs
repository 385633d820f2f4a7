//! Running a coordinator: store, engine, recovery loop and HTTP API together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::AuthMode;
use crate::auth::cache::TokenCache;
use crate::engine::{Engine, EngineConfig, EventLog, Observer, Observers, SyncedClock};
use crate::http_server::{self, HttpLimits};
use crate::store::{self, ConnectOptions, Store};
use crate::transport::{HttpTransport, Transport};

/// How long `idem serve` waits for its database at start unless told otherwise.
pub const DEFAULT_DATABASE_WAIT: Duration = Duration::from_secs(60);

/// Everything `idem serve` needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub database_url: String,
    pub listen: SocketAddr,
    pub engine: EngineConfig,
    pub connect: ConnectOptions,
    /// At start, how long to keep trying a database that does not answer yet.
    pub database_wait: Duration,
    pub wait_timeout: Duration,
    /// How long a stopping server lets calls in flight finish before it stops them.
    pub shutdown_grace: Duration,
    /// A deliberate error in this process's wall clock, for tests of skewed hosts; idem
    /// reads time on the database's clock, so it must not matter.
    pub clock_skew_ms: i64,
    /// How often the offset to the database's clock is measured again.
    pub clock_sync_interval: Duration,
    /// Timeouts and the connection cap of the API's HTTP server.
    pub http: HttpLimits,
    /// How much of a participant's answer is read (see `transport`).
    pub max_answer_bytes: usize,
    /// Deleting finished transactions (see `retention`).
    pub retention: crate::retention::RetentionConfig,
    /// How often the database-derived gauges of `/metrics` are sampled.
    pub metrics_sample_interval: Duration,
    /// The key that signs every branch call; `None`: calls go unsigned.
    pub signing_key: Option<idem_signing::Key>,
    /// Who may call the API.
    pub auth: crate::auth::AuthConfig,
    /// Listen beyond loopback without tokens (refused otherwise).
    pub insecure: bool,
    /// Unfinished transactions one tenant may have; 0: no cap.
    pub max_active_per_tenant: u64,
    /// Bytes of one branch's payload, at most (`400 payload_too_large` past it).
    pub max_branch_payload_bytes: usize,
    /// Requests per second and tenant through the API (`429 rate_limited` past it).
    pub rate_limit: api::rate_limit::RateLimitConfig,
    /// Where participant calls may go, per tenant (`--outbound-policy`; see `outbound`).
    pub outbound_policy: Arc<crate::outbound::OutboundPolicy>,
    /// The API's certificate and key; `None`: plain HTTP.
    pub tls: Option<crate::tls::ServerTls>,
    /// Extra roots and a client certificate for calls to participants.
    pub outbound_tls: crate::tls::OutboundTls,
    /// The console's settings (its trace links).
    pub console: crate::console::ConsoleConfig,
}

impl ServerConfig {
    pub fn new(database_url: impl Into<String>, listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            database_url: database_url.into(),
            listen,
            engine: EngineConfig::default(),
            connect: ConnectOptions::default(),
            database_wait: DEFAULT_DATABASE_WAIT,
            wait_timeout: api::native::DEFAULT_WAIT,
            shutdown_grace: Duration::from_secs(10),
            clock_skew_ms: 0,
            clock_sync_interval: Duration::from_secs(30),
            http: HttpLimits::default(),
            max_answer_bytes: crate::transport::DEFAULT_MAX_ANSWER_BYTES,
            retention: crate::retention::RetentionConfig::default(),
            metrics_sample_interval: crate::metrics::sampler::DEFAULT_INTERVAL,
            signing_key: None,
            auth: crate::auth::AuthConfig::default(),
            insecure: false,
            max_active_per_tenant: 0,
            max_branch_payload_bytes: api::validate::DEFAULT_MAX_BRANCH_PAYLOAD_BYTES,
            rate_limit: api::rate_limit::RateLimitConfig::default(),
            outbound_policy: Arc::default(),
            tls: None,
            outbound_tls: crate::tls::OutboundTls::default(),
            console: crate::console::ConsoleConfig::default(),
        }
    }
}

/// A coordinator running in this process.
pub struct RunningServer {
    pub addr: SocketAddr,
    https: bool,
    pub engine: Arc<Engine>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<()>,
    grace: Duration,
    clock_sync: CancellationToken,
    retention: CancellationToken,
    token_refresh: Option<JoinHandle<()>>,
}

impl RunningServer {
    /// The base URL of the HTTP API, e.g. `http://127.0.0.1:8686` (`https://` with TLS).
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops gracefully: no new claims or rounds, open `wait_result` requests answered at
    /// once, no new connections; then calls in flight get the grace to finish (and be
    /// stored), the rest are stopped, and only then are the leases handed back.
    pub async fn stop(self) -> std::io::Result<()> {
        self.engine.begin_shutdown();
        self.clock_sync.cancel();
        self.retention.cancel();
        if let Some(refresh) = &self.token_refresh {
            refresh.abort();
        }
        let _ = self.shutdown.send(());
        self.task.await.map_err(std::io::Error::other)?;
        self.engine.finish_shutdown(self.grace).await;
        Ok(())
    }
}

/// Opens and migrates the store.
pub async fn open_store(
    url: &str,
    options: &ConnectOptions,
) -> Result<Arc<dyn Store>, store::StoreError> {
    let store = store::connect(url, options).await?;
    store.migrate().await?;
    Ok(store)
}

/// Starts a coordinator with the real HTTP transport.
pub async fn start(
    config: ServerConfig,
) -> Result<RunningServer, Box<dyn std::error::Error + Send + Sync>> {
    let transport: Arc<dyn Transport> = Arc::new(HttpTransport::for_server(&config)?);
    start_with(config, transport, Vec::new()).await
}

/// Starts a coordinator with the given transport and observers besides the metrics: the
/// hooks through which the lab (`idem-lab serve`) injects faults and records timelines,
/// and an embedding application watches.
pub async fn start_with(
    config: ServerConfig,
    transport: Arc<dyn Transport>,
    observers: Vec<Arc<dyn Observer>>,
) -> Result<RunningServer, Box<dyn std::error::Error + Send + Sync>> {
    crate::transport::install_crypto_provider();
    check_exposure(&config)?;
    // Unusable certificate files fail the start before anything else is opened.
    let certs = config
        .tls
        .clone()
        .map(crate::tls::CertResolver::load)
        .transpose()?;
    let store =
        store::open_when_ready(&config.database_url, &config.connect, config.database_wait).await?;
    crate::metrics::install();
    let mut all: Vec<Arc<dyn Observer>> = vec![
        Arc::new(crate::metrics::MetricsObserver),
        Arc::new(EventLog),
    ];
    all.extend(observers);
    let observer: Arc<dyn Observer> = Arc::new(Observers(all));
    let clock = SyncedClock::new(config.clock_skew_ms);
    if let Err(e) = clock.sync(store.as_ref()).await {
        tracing::warn!(error = %e, "cannot read the database's clock yet; using this host's");
    }
    let clock_sync = CancellationToken::new();
    tokio::spawn(Arc::clone(&clock).keep_in_sync(
        Arc::clone(&store),
        config.clock_sync_interval,
        clock_sync.clone(),
    ));
    let retention = CancellationToken::new();
    crate::retention::spawn(Arc::clone(&store), config.retention, retention.clone());
    let engine =
        Engine::new(store, transport, clock, config.engine.clone()).with_observer(observer);
    let (auth, token_refresh) = authentication(&config, &engine).await?;
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(AppState {
        engine: Arc::clone(&engine),
        wait_timeout: config.wait_timeout,
        limits: api::validate::Limits {
            max_branches: config.connect.max_branches,
            max_payload_bytes: config.max_branch_payload_bytes,
        },
        rate_limit: api::rate_limit::TenantRateLimit::new(config.rate_limit).map(Arc::new),
        auth,
        active_cap: api::active_cap::ActiveCap::new(config.max_active_per_tenant),
        outbound_policy: Arc::clone(&config.outbound_policy),
        console: config.console.clone(),
    });
    let app = api::router(state);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    engine.release_own_leases().await?;
    tokio::spawn(Arc::clone(&engine).run_recovery());
    // Stopped with the clock's sync: both are this server's background tasks.
    tokio::spawn(crate::metrics::sampler::run(
        Arc::clone(&engine),
        config.metrics_sample_interval,
        clock_sync.clone(),
    ));
    let acceptor = certs.map(|certs| {
        tokio::spawn(Arc::clone(&certs).keep_reloading(clock_sync.clone()));
        certs.acceptor()
    });
    let https = acceptor.is_some();
    let serving = http_server::serve(listener, app, config.http, acceptor, async move {
        let _ = rx.await;
    });
    let task = tokio::spawn(serving);
    tracing::info!(%addr, database = engine.database(), node = engine.config().node, "idem is serving");
    Ok(RunningServer {
        addr,
        https,
        engine,
        shutdown: tx,
        task,
        grace: config.shutdown_grace,
        clock_sync,
        retention,
        token_refresh,
    })
}

/// Without tokens anyone who reaches the port is the default tenant's admin: that is only
/// allowed on loopback, or when `--insecure` says so.
fn check_exposure(config: &ServerConfig) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if config.auth.mode != AuthMode::None || config.listen.ip().is_loopback() {
        return Ok(());
    }
    if !config.insecure {
        return Err(format!(
            "refusing to listen on {} without API tokens: anyone reaching it could read and              force-stop every transaction; use --auth tokens (see `idem token issue`), listen              on loopback, or pass --insecure",
            config.listen
        )
        .into());
    }
    tracing::warn!(listen = %config.listen, "--insecure: serving beyond loopback without API tokens; every caller is an admin");
    Ok(())
}

/// The authentication layer's state: the token cache, loaded now and refreshed in the
/// background, when tokens are required.
async fn authentication(
    config: &ServerConfig,
    engine: &Arc<Engine>,
) -> Result<(Arc<api::auth::Auth>, Option<JoinHandle<()>>), store::StoreError> {
    if config.auth.mode == AuthMode::None {
        return Ok((api::auth::Auth::off(), None));
    }
    let cache = TokenCache::load(Arc::clone(engine.store())).await?;
    if cache.live_tokens() == 0 {
        tracing::warn!(
            "API tokens are required but none is issued: every request is refused until `idem token issue` makes one"
        );
    }
    let refresh = cache.spawn_refresh(config.auth.refresh);
    let auth = Arc::new(api::auth::Auth {
        config: config.auth.clone(),
        cache: Some(cache),
    });
    Ok((auth, Some(refresh)))
}

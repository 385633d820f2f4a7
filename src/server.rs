//! Running a coordinator: store, engine, recovery loop and HTTP API together.
//!
//! [`start`] runs one in-process (the tests' coordinators); [`start_with`] takes another
//! transport and more observers (the lab's fault injection and recording). Besides wiring,
//! it makes the start-up decisions that need the whole configuration: the outbound policy
//! in force, the refusal to listen beyond loopback without tokens, the warning about DTM's
//! token-less door.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AppState};
use crate::auth::cache::TokenCache;
use crate::auth::{AuthMode, TokenAdmin};
use crate::engine::{Engine, EngineConfig, EventLog, Observer, Observers, SyncedClock};
use crate::http_server::{self, HttpLimits};
use crate::store::{self, ConnectOptions, Store};
use crate::transport::{HttpTransport, Transport};

/// Why a coordinator did not start: one variant per cause, each with a stable
/// [`code`](StartError::code), so that a program embedding idem can tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Without tokens beyond loopback, and no `--insecure` (see `check_exposure`).
    #[error(
        "refusing to listen on {listen} without API tokens: anyone reaching it could read and \
         force-stop every transaction; use --auth tokens (see `idem token issue`), listen \
         on loopback, or pass --insecure"
    )]
    Exposed { listen: SocketAddr },
    /// The API's certificate or key files cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The client for participant calls cannot be built (its TLS settings).
    #[error("cannot build the client for participant calls: {0}")]
    Transport(#[from] reqwest::Error),
    /// The database cannot be opened and migrated, or did not answer in time.
    #[error(transparent)]
    Database(#[from] store::OpenError),
    /// The API tokens cannot be read (with `--auth tokens`).
    #[error("cannot read the API tokens: {0}")]
    Tokens(#[source] store::StoreError),
    /// The API's address cannot be bound.
    #[error("cannot listen on {listen}: {source}")]
    Listen {
        listen: SocketAddr,
        source: std::io::Error,
    },
    /// The leases of this node's previous process cannot be handed back.
    #[error("cannot hand back the leases of this node's previous process: {0}")]
    Leases(#[source] store::StoreError),
}

impl StartError {
    /// A short stable name of the cause.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::Exposed { .. } => "exposed_without_tokens",
            StartError::Tls(_) => "tls_files",
            StartError::Transport(_) => "participant_client",
            StartError::Database(_) => "database",
            StartError::Tokens(_) => "tokens",
            StartError::Listen { .. } => "listen",
            StartError::Leases(_) => "leases",
        }
    }
}

/// How long `idem serve` waits for its database at start unless told otherwise.
pub const DEFAULT_DATABASE_WAIT: Duration = Duration::from_secs(60);

/// Everything `idem serve` needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub database_url: String,
    pub listen: SocketAddr,
    /// Where DTM's gRPC door listens (`--grpc-listen`); `None`: no gRPC.
    pub grpc_listen: Option<SocketAddr>,
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
    /// The keys that sign branch calls, per tenant; `None`: calls go unsigned.
    pub signing: Option<Arc<crate::signing::Signer>>,
    /// Who may call the API.
    pub auth: crate::auth::AuthConfig,
    /// Listen beyond loopback without tokens (refused otherwise).
    pub insecure: bool,
    /// Unfinished transactions one tenant may have; 0: no cap.
    pub max_active_per_tenant: u64,
    /// Bytes of one branch's payload, at most (`400 payload_too_large` past it).
    pub max_branch_payload_bytes: usize,
    /// What a request's options may ask for (`400 option_limit` past it).
    pub option_limits: api::validate::OptionLimits,
    /// Requests per second and tenant through the API (`429 rate_limited` past it).
    pub rate_limit: api::rate_limit::RateLimitConfig,
    /// Requests in flight and the body bytes they hold, at most (`503 overloaded` past
    /// them).
    pub in_flight: api::in_flight::InFlightConfig,
    /// Where participant calls may go, per tenant (`--outbound-policy`; see `outbound`).
    /// The default is the built-in entry; [`ServerConfig::outbound_policy_in_force`] is what
    /// the server enforces.
    pub outbound_policy: Arc<crate::outbound::OutboundPolicy>,
    /// The server's listeners, once bound: no participant URL reaches them. Clones of the
    /// configuration share them, so a transport made from it before the start sees them.
    pub own_listeners: crate::outbound::OwnListeners,
    /// The API's certificate and key; `None`: plain HTTP.
    pub tls: Option<crate::tls::ServerTls>,
    /// Extra roots and a client certificate for calls to participants.
    pub outbound_tls: crate::tls::OutboundTls,
    /// The console's settings (its trace links).
    pub console: crate::api::console::ConsoleConfig,
}

impl ServerConfig {
    pub fn new(database_url: impl Into<String>, listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            database_url: database_url.into(),
            listen,
            grpc_listen: None,
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
            signing: None,
            auth: crate::auth::AuthConfig::default(),
            insecure: false,
            max_active_per_tenant: 0,
            max_branch_payload_bytes: api::validate::DEFAULT_MAX_BRANCH_PAYLOAD_BYTES,
            option_limits: api::validate::OptionLimits::default(),
            rate_limit: api::rate_limit::RateLimitConfig::default(),
            in_flight: api::in_flight::InFlightConfig::default(),
            outbound_policy: Arc::default(),
            own_listeners: crate::outbound::OwnListeners::default(),
            tls: None,
            outbound_tls: crate::tls::OutboundTls::default(),
            console: crate::api::console::ConsoleConfig::default(),
        }
    }
}

impl ServerConfig {
    /// The outbound policy the server enforces: the file's, or the built-in entry (public
    /// addresses only, but for `--auth none` on loopback, the developer's quick start,
    /// where this host's and private addresses are allowed too); either way refusing the
    /// server's own listeners.
    pub fn outbound_policy_in_force(&self) -> Arc<crate::outbound::OutboundPolicy> {
        let quick_start = self.auth.mode == AuthMode::None && self.listen.ip().is_loopback();
        Arc::new(
            self.outbound_policy
                .in_force(quick_start, &self.own_listeners),
        )
    }

    /// The transport this configuration describes: its answer bound, the outbound policy
    /// in force (which refuses the server's own listeners) and TLS, and signing keys.
    pub fn transport(&self) -> Result<HttpTransport, reqwest::Error> {
        let transport = HttpTransport::with_policy(
            self.max_answer_bytes,
            self.outbound_policy_in_force(),
            &self.outbound_tls,
        )?;
        Ok(transport.with_signer(self.signing.clone()))
    }
}

/// A coordinator running in this process.
pub struct RunningServer {
    pub addr: SocketAddr,
    /// The gRPC listener's address, when there is one.
    pub grpc_addr: Option<SocketAddr>,
    https: bool,
    pub engine: Arc<Engine>,
    shutdown: tokio::sync::watch::Sender<()>,
    task: JoinHandle<()>,
    grpc_task: Option<JoinHandle<()>>,
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
        if let Some(grpc) = self.grpc_task {
            grpc.await.map_err(std::io::Error::other)?;
        }
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
pub async fn start(config: ServerConfig) -> Result<RunningServer, StartError> {
    let transport: Arc<dyn Transport> = Arc::new(config.transport()?);
    start_with(config, transport, Vec::new()).await
}

/// Starts a coordinator with the given transport and observers besides the metrics: the
/// hooks through which the lab (`idem-lab serve`) injects faults and records timelines,
/// and an embedding application watches.
pub async fn start_with(
    config: ServerConfig,
    transport: Arc<dyn Transport>,
    observers: Vec<Arc<dyn Observer>>,
) -> Result<RunningServer, StartError> {
    crate::tls::install_crypto_provider();
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
    let tokens = TokenAdmin::new(Arc::clone(&store));
    let engine =
        Engine::new(store, transport, clock, engine_config(&config)).with_observer(observer);
    let (auth, token_refresh) = authentication(&config, &tokens)
        .await
        .map_err(StartError::Tokens)?;
    let (listener, addr) = bind(config.listen).await?;
    config.own_listeners.add(addr);
    let grpc_listener = match config.grpc_listen {
        Some(listen) => {
            let (listener, local) = bind(listen).await?;
            config.own_listeners.add(local);
            Some((listener, local))
        }
        None => None,
    };
    let outbound = config.outbound_policy_in_force();
    let state = Arc::new(AppState {
        engine: Arc::clone(&engine),
        wait_timeout: config.wait_timeout,
        limits: api::validate::Limits {
            max_branches: config.connect.max_branches,
            max_payload_bytes: config.max_branch_payload_bytes,
            options: config.option_limits,
        },
        rate_limit: api::rate_limit::TenantRateLimit::new(config.rate_limit).map(Arc::new),
        auth,
        tokens,
        active_cap: api::active_cap::ActiveCap::new(config.max_active_per_tenant),
        in_flight: Arc::new(api::in_flight::InFlight::new(config.in_flight)),
        outbound_policy: Arc::clone(&outbound),
        console: config.console.clone(),
    });
    let app = api::router(state);
    let (tx, rx) = tokio::sync::watch::channel(());
    engine
        .release_own_leases()
        .await
        .map_err(StartError::Leases)?;
    tokio::spawn(Arc::clone(&engine).run_recovery());
    // Stopped with the clock's sync: both are this server's background tasks.
    tokio::spawn(crate::metrics::sampler::run(
        Arc::clone(&engine),
        config.metrics_sample_interval,
        clock_sync.clone(),
    ));
    if let Some(reloading) = config
        .signing
        .as_ref()
        .and_then(|s| s.keep_reloading(clock_sync.clone()))
    {
        tokio::spawn(reloading);
    }
    if let Some(certs) = &certs {
        tokio::spawn(Arc::clone(certs).keep_reloading(clock_sync.clone()));
    }
    let grpc_addr = grpc_listener.as_ref().map(|(_, local)| *local);
    let grpc_task = grpc_listener.map(|(listener, local)| {
        let listener = api::dtm_grpc::GrpcListener {
            listener,
            tls: certs.as_ref().map(|certs| certs.grpc_acceptor()),
        };
        let door = api::dtm_grpc::DtmGrpc::new(app.clone(), local);
        let mut stop = rx.clone();
        let limits = config.http;
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.changed().await;
            };
            if let Err(e) = api::dtm_grpc::serve(listener, door, limits, stopped).await {
                tracing::error!(error = %e, "the gRPC listener stopped");
            }
        })
    });
    let acceptor = certs.map(|certs| certs.acceptor());
    let https = acceptor.is_some();
    let mut stop = rx;
    let serving = http_server::serve(listener, app, config.http, acceptor, async move {
        let _ = stop.changed().await;
    });
    let task = tokio::spawn(serving);
    tracing::info!(%addr, database = engine.reads().database(), node = engine.config().node, "idem is serving");
    if let Some(grpc) = grpc_addr {
        tracing::info!(%grpc, "DTM's gRPC door (dtmgimp.Dtm) is serving");
    }
    if !outbound.from_file() {
        let reach = if outbound.allows_non_public() {
            "public, private and this host's addresses (--auth none on loopback), not idem's own port"
        } else {
            "public addresses only (list private participants' networks in a policy file)"
        };
        tracing::info!("no --outbound-policy: participant URLs may name {reach}");
    }
    Ok(RunningServer {
        addr,
        grpc_addr,
        https,
        engine,
        shutdown: tx,
        task,
        grpc_task,
        grace: config.shutdown_grace,
        clock_sync,
        retention,
        token_refresh,
    })
}

/// A listener on `listen` and the address it got (the port, when `listen` asks for 0).
async fn bind(listen: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| StartError::Listen { listen, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Listen { listen, source })?;
    Ok((listener, local))
}

/// The engine's settings. Without tokens every transaction is the default tenant's, so a
/// tenant's share of the slots would only hold back the one tenant there is: it gets
/// them all.
fn engine_config(config: &ServerConfig) -> EngineConfig {
    let mut engine = config.engine.clone();
    if config.auth.mode == AuthMode::None {
        engine.tenant_share_percent = 100;
    }
    engine
}

/// Without tokens anyone who reaches the port is the default tenant's admin: that is only
/// allowed on loopback, or when `--insecure` says so.
fn check_exposure(config: &ServerConfig) -> Result<(), StartError> {
    let exposed = std::iter::once(config.listen)
        .chain(config.grpc_listen)
        .find(|listen| !listen.ip().is_loopback());
    let Some(listen) = exposed else {
        return Ok(());
    };
    if config.auth.mode != AuthMode::None {
        return Ok(());
    }
    if !config.insecure {
        return Err(StartError::Exposed { listen });
    }
    tracing::warn!(%listen, "--insecure: serving beyond loopback without API tokens; every caller is an admin");
    Ok(())
}

/// DTM's door without a token beyond this host is the operator's choice, but one to be
/// reminded of: whoever reaches it from the listed networks acts as `--dtm-tenant`.
fn warn_of_tokenless_door(config: &ServerConfig) {
    let Some(tenant) = &config.auth.dtm_tenant else {
        return;
    };
    let nets = &config.auth.dtm_tokenless_from;
    let beyond = std::iter::once(config.listen)
        .chain(config.grpc_listen)
        .any(|listen| !listen.ip().is_loopback());
    if beyond && !nets.is_empty() {
        let from: Vec<String> = nets.iter().map(ToString::to_string).collect();
        tracing::warn!(
            listen = %config.listen,
            tenant,
            from = from.join(","),
            "DTM's door takes requests without a token (as a client of --dtm-tenant, for the transactions created that way) from --dtm-tokenless-from, on a listener beyond loopback"
        );
    }
}

/// The authentication layer's state: the token cache, loaded now and refreshed in the
/// background, when tokens are required.
async fn authentication(
    config: &ServerConfig,
    tokens: &TokenAdmin,
) -> Result<(Arc<api::auth::Auth>, Option<JoinHandle<()>>), store::StoreError> {
    if config.auth.mode == AuthMode::None {
        return Ok((api::auth::Auth::without_tokens(config.auth.clone()), None));
    }
    warn_of_tokenless_door(config);
    let cache = TokenCache::load(tokens.clone()).await?;
    if cache.live_tokens() == 0 {
        tracing::warn!(
            "API tokens are required but none is issued: every request that needs one is refused until `idem token issue` makes one"
        );
    }
    let refresh = cache.spawn_refresh(config.auth.refresh);
    let auth = Arc::new(api::auth::Auth {
        config: config.auth.clone(),
        cache: Some(cache),
    });
    Ok((auth, Some(refresh)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each cause of a failed start comes back as its own variant, before or after the
    /// database was opened.
    #[tokio::test]
    async fn a_failed_start_says_which_cause() {
        let exposed = ServerConfig::new("sqlite::memory:", "0.0.0.0:0".parse().unwrap());
        let e = start(exposed).await.err().expect("refused");
        assert!(matches!(e, StartError::Exposed { .. }), "{e}");
        assert_eq!(e.code(), "exposed_without_tokens");
        // The gRPC listener is judged the same way.
        let mut grpc = ServerConfig::new("sqlite::memory:", "127.0.0.1:0".parse().unwrap());
        grpc.grpc_listen = Some("0.0.0.0:0".parse().unwrap());
        let e = start(grpc).await.err().expect("refused");
        assert!(
            matches!(e, StartError::Exposed { listen } if listen.ip().is_unspecified()),
            "{e}"
        );

        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = taken.local_addr().unwrap();
        let e = start(ServerConfig::new("sqlite::memory:", listen))
            .await
            .err()
            .expect("the port is taken");
        assert!(
            matches!(e, StartError::Listen { listen: l, .. } if l == listen),
            "{e}"
        );
        assert_eq!(e.code(), "listen");

        let e = start(ServerConfig::new(
            "nosuch://x",
            "127.0.0.1:0".parse().unwrap(),
        ))
        .await
        .err()
        .expect("no such database");
        assert!(matches!(e, StartError::Database(_)), "{e}");
    }
}

//! Running a coordinator: store, engine, recovery loop and HTTP API together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use std::path::PathBuf;

use crate::api::{self, AppState};
use crate::engine::{Engine, EngineConfig, Observer, SystemClock};
use crate::faults::{CrashOnPlan, FaultPlan, FaultyTransport, Observers, Timeline};
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
    /// Faults to inject into calls and crash points (testing and failure replay).
    pub fault_plan: Option<Arc<FaultPlan>>,
    /// Where to append the timeline of calls, faults and status changes (JSON lines).
    pub record: Option<PathBuf>,
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
            fault_plan: None,
            record: None,
        }
    }
}

/// A coordinator running in this process.
pub struct RunningServer {
    pub addr: SocketAddr,
    pub engine: Arc<Engine>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl RunningServer {
    /// The base URL of the HTTP API, e.g. `http://127.0.0.1:8686`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting requests, hands driven transactions back and waits for the server.
    pub async fn stop(self) -> std::io::Result<()> {
        let _ = self.shutdown.send(());
        self.engine.shutdown().await;
        self.task.await.unwrap_or(Ok(()))
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
    let transport: Arc<dyn Transport> = Arc::new(HttpTransport::new()?);
    start_with(config, transport).await
}

/// Starts a coordinator with the given transport (fault injection wraps the real one).
pub async fn start_with(
    config: ServerConfig,
    transport: Arc<dyn Transport>,
) -> Result<RunningServer, Box<dyn std::error::Error + Send + Sync>> {
    crate::transport::install_crypto_provider();
    let store =
        store::open_when_ready(&config.database_url, &config.connect, config.database_wait).await?;
    let node = config.engine.node.clone();
    let timeline = match &config.record {
        Some(path) => Some(Timeline::to_file(&node, path)?),
        None => None,
    };
    crate::metrics::install();
    let mut observers: Vec<Arc<dyn Observer>> = vec![Arc::new(crate::metrics::MetricsObserver)];
    if let Some(t) = &timeline {
        observers.push(Arc::clone(t) as Arc<dyn Observer>);
    }
    let transport = match &config.fault_plan {
        Some(plan) => {
            observers.push(Arc::new(CrashOnPlan::new(
                Arc::clone(plan),
                &node,
                timeline.clone(),
            )));
            Arc::new(FaultyTransport::new(transport, Arc::clone(plan))) as Arc<dyn Transport>
        }
        None => transport,
    };
    let observer: Arc<dyn Observer> = Arc::new(Observers(observers));
    let engine = Engine::new(
        store,
        transport,
        Arc::new(SystemClock),
        config.engine.clone(),
    )
    .with_observer(observer);
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(AppState {
        engine: Arc::clone(&engine),
        wait_timeout: config.wait_timeout,
    });
    let app = api::router(state);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    engine.release_own_leases().await?;
    tokio::spawn(Arc::clone(&engine).run_recovery());
    let task = tokio::spawn(async move {
        use axum::serve::ListenerExt;
        // Small JSON answers go out at once instead of waiting for Nagle's timer.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    tracing::info!(%addr, database = engine.store().backend(), node = engine.config().node, "idem is serving");
    Ok(RunningServer {
        addr,
        engine,
        shutdown: tx,
        task,
    })
}

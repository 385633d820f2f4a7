//! `idem serve`: the coordinator.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use std::future::Future;

use super::{BoxError, DatabaseArgs, LogArgs, redact};
use crate::server::{self, RunningServer, ServerConfig};

/// Every option is also an environment variable `IDEM_<NAME>` and a key `<name>` of the
/// `--config` file (see [`super::config`]); `tests/config.rs` holds new ones to that.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A TOML file of settings: keys are these options in snake_case (`lease_ms = 5000`).
    /// A flag or an environment variable overrides the file.
    #[arg(long, env = "IDEM_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Address and port of the HTTP API.
    #[arg(long, env = "IDEM_LISTEN", default_value = "127.0.0.1:8686")]
    pub listen: SocketAddr,
    /// Name of this coordinator in owner tokens and logs (default: host name and port).
    /// Give it only when no other live process uses the same name (a StatefulSet's pod
    /// name, one systemd unit per name): a restarted process then resumes its
    /// predecessor's transactions at once instead of after their leases.
    #[arg(long, env = "IDEM_NODE")]
    pub node: Option<String>,
    /// Lease of a transaction being driven, in ms: how soon another coordinator takes
    /// over after this one dies.
    #[arg(long, env = "IDEM_LEASE_MS", default_value_t = 15_000)]
    pub lease_ms: i64,
    /// How often to look for transactions nobody drives, in ms.
    #[arg(long, env = "IDEM_RECOVERY_INTERVAL_MS", default_value_t = 1_000)]
    pub recovery_interval_ms: u64,
    /// Calls to participants in flight at once, over all transactions (each holds a
    /// connection to its participant).
    #[arg(long, env = "IDEM_MAX_CONCURRENT_CALLS", default_value_t = 1_024)]
    pub max_concurrent_calls: usize,
    /// Transactions this process drives at once. Past it, new and due transactions wait
    /// in the database, unowned, and are claimed in order as drivers finish: memory and
    /// lease renewals grow with the work under way, not with the work in flight.
    #[arg(long, env = "IDEM_MAX_DRIVING", default_value_t = 2_048)]
    pub max_driving: usize,
    /// Default timeout of one call to a participant, in ms.
    #[arg(long, env = "IDEM_REQUEST_TIMEOUT_MS", default_value_t = 5_000)]
    pub request_timeout_ms: u64,
    /// Default first retry delay, in ms (doubled per attempt).
    #[arg(long, env = "IDEM_RETRY_INTERVAL_MS", default_value_t = 1_000)]
    pub retry_interval_ms: u64,
    /// Default cap on the retry delay, in ms.
    #[arg(long, env = "IDEM_MAX_RETRY_INTERVAL_MS", default_value_t = 60_000)]
    pub max_retry_interval_ms: u64,
    /// Default attempts per branch operation before it stalls (or a saga compensates).
    #[arg(long, env = "IDEM_MAX_ATTEMPTS", default_value_t = 12)]
    pub max_attempts: u32,
    /// Default longest time one branch operation may keep answering "in progress" (425
    /// or DTM's ONGOING), in ms; past it the call counts as failed for good (a saga
    /// compensates, a Confirm or Cancel stalls).
    #[arg(long, env = "IDEM_MAX_IN_PROGRESS_MS", default_value_t = crate::core::DEFAULT_MAX_IN_PROGRESS_MS)]
    pub max_in_progress_ms: u64,
    /// Default global timeout of a prepared TCC or msg transaction, in ms.
    #[arg(long, env = "IDEM_PREPARED_TIMEOUT_MS", default_value_t = 60_000)]
    pub prepared_timeout_ms: u64,
    /// Database connections.
    #[arg(long, env = "IDEM_MAX_CONNECTIONS", default_value_t = 16)]
    pub max_connections: u32,
    /// At start, how long to wait for a database that does not answer yet (retrying with
    /// backoff, logging why), in ms; then idem exits non-zero. 0 tries once.
    #[arg(long, env = "IDEM_DATABASE_WAIT_MS", default_value_t = 60_000)]
    pub database_wait_ms: u64,
    /// Opening one database connection, in ms (PostgreSQL, MySQL).
    #[arg(
        long,
        env = "IDEM_DATABASE_CONNECT_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub database_connect_timeout_ms: u64,
    /// Waiting for a pooled database connection, opening included, in ms.
    #[arg(
        long,
        env = "IDEM_DATABASE_ACQUIRE_TIMEOUT_MS",
        default_value_t = 5_000
    )]
    pub database_acquire_timeout_ms: u64,
    /// Longest one database call may take, in ms (statements on an open connection
    /// included); past it the call fails as the database being unavailable, so a network
    /// partition fails requests in bounded time.
    #[arg(long, env = "IDEM_DATABASE_CALL_TIMEOUT_MS", default_value_t = 10_000)]
    pub database_call_timeout_ms: u64,
    /// SQLite: fsync at every commit (off: a machine crash may lose the last commits;
    /// a crash of idem alone loses nothing).
    #[arg(long, env = "IDEM_SQLITE_FULL_SYNC", default_value_t = true, action = clap::ArgAction::Set)]
    pub sqlite_full_sync: bool,
    /// How long a wait_result request waits at most, in ms.
    #[arg(long, env = "IDEM_WAIT_TIMEOUT_MS", default_value_t = 30_000)]
    pub wait_timeout_ms: u64,
    /// On SIGTERM, how long calls in flight may take to finish, in ms, before they are
    /// stopped and the leases handed back.
    #[arg(long, env = "IDEM_SHUTDOWN_TIMEOUT_MS", default_value_t = 10_000)]
    pub shutdown_timeout_ms: u64,
    /// Testing only: shifts this process's wall clock (idem reads time on the database's
    /// clock, so a skewed host must not matter).
    #[arg(
        long,
        env = "IDEM_TEST_CLOCK_OFFSET_MS",
        default_value_t = 0,
        hide = true,
        allow_hyphen_values = true
    )]
    pub test_clock_offset_ms: i64,
    /// Bytes of a participant's answer that are read; the rest is not (a DTM answer's
    /// FAILURE or ONGOING must be within them).
    #[arg(long, env = "IDEM_MAX_ANSWER_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..=16 << 20))]
    pub max_answer_bytes: u64,
    /// How long a client may take to send one request, head and body, in ms: from its
    /// first byte, or from the accept for a connection's first request. Past it, a head
    /// still arriving closes the connection and a body still arriving is refused (400).
    #[arg(long, env = "IDEM_REQUEST_READ_TIMEOUT_MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_read_timeout_ms: u64,
    /// How long a keep-alive connection may wait for its next request, in ms.
    #[arg(long, env = "IDEM_IDLE_TIMEOUT_MS", default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,
    /// Open HTTP connections at most; more wait in the listen backlog until one closes.
    #[arg(long, env = "IDEM_MAX_HTTP_CONNECTIONS", default_value_t = 4_096, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_http_connections: u32,
    /// Steps of a saga or msg, and branches of a TCC transaction (however they are
    /// registered), at most; a request past it is refused (400 too_many_branches).
    #[arg(long, env = "IDEM_MAX_BRANCHES", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_branches: u32,
    /// Bytes of one branch's payload as stored and sent (a saga step's, a compensation's,
    /// a TCC branch's, a msg step's; DTM's `payloads[i]`, `steps[i].data` and
    /// registerBranch `data`), at most; a request past it is refused (400
    /// payload_too_large).
    #[arg(long, env = "IDEM_MAX_BRANCH_PAYLOAD_BYTES", default_value_t = 65_536, value_parser = clap::value_parser!(u32).range(1..=1 << 20))]
    pub max_branch_payload_bytes: u32,
    /// API requests per second per tenant, at most (both doors; not health, metrics or the
    /// OpenAPI document); past it 429 rate_limited with Retry-After. Per process. 0: no
    /// limit.
    #[arg(long, env = "IDEM_RATE_LIMIT_PER_SECOND", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub rate_limit_per_second: u32,
    /// Requests of one tenant that may arrive at once under `--rate-limit-per-second`;
    /// 0: one second's worth.
    #[arg(long, env = "IDEM_RATE_LIMIT_BURST", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub rate_limit_burst: u32,
    /// Export spans over OTLP/HTTP (protobuf) to this collector, e.g.
    /// `http://127.0.0.1:4318` (its `/v1/traces`); none: nothing is exported.
    #[arg(long, env = "IDEM_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// How long a finished (succeeded or failed) transaction is kept, with its branch and
    /// attempt rows, after it finished, in ms; then retention deletes it. 0 keeps every
    /// transaction for ever. A stalled or unfinished one is never deleted. A client that
    /// repeats a request after this creates a new transaction under the same gid, so it may
    /// not be shorter than `--client-retry-period-ms`.
    #[arg(long, env = "IDEM_RETENTION_MS", default_value_t = crate::retention::DEFAULT_RETENTION_MS)]
    pub retention_ms: u64,
    /// The longest time your clients keep repeating a request, in ms (from its first
    /// sending to its last retry, a Try they call themselves included). idem refuses to
    /// start with a `--retention-ms` below it, other than 0.
    #[arg(long, env = "IDEM_CLIENT_RETRY_PERIOD_MS", default_value_t = crate::retention::DEFAULT_CLIENT_RETRY_PERIOD_MS)]
    pub client_retry_period_ms: u64,
    /// How often retention looks for finished transactions past `--retention-ms`, in ms.
    #[arg(long, env = "IDEM_RETENTION_INTERVAL_MS", default_value_t = crate::retention::DEFAULT_RETENTION_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub retention_interval_ms: u64,
    /// Transactions retention deletes per database transaction, at most.
    #[arg(long, env = "IDEM_RETENTION_BATCH", default_value_t = crate::retention::DEFAULT_RETENTION_BATCH,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub retention_batch: u32,
    /// Sign every branch call (an `Idem-Signature` header, HMAC-SHA256; see the README's
    /// "Signed calls") with the first key of this file: `kid:secret` lines, newest first;
    /// participants verify with every key listed. Neither this nor `--signing-secret`:
    /// calls go unsigned.
    #[arg(
        long,
        env = "IDEM_SIGNING_SECRET_FILE",
        value_name = "PATH",
        hide_env_values = true
    )]
    pub signing_secret_file: Option<PathBuf>,
    /// The signing keys themselves, `kid:secret[,kid:secret…]` (the first signs), instead
    /// of `--signing-secret-file`.
    #[arg(
        long,
        env = "IDEM_SIGNING_SECRET",
        value_name = "KID:SECRET",
        hide_env_values = true
    )]
    pub signing_secret: Option<String>,
    /// `tokens`: every API request needs `Authorization: Bearer <token>` (issued with
    /// `idem token issue`), scoped to the token's tenant and role. `none`: every caller is
    /// the default tenant's admin, so idem refuses to listen beyond loopback unless
    /// `--insecure` is given too.
    #[arg(long, env = "IDEM_AUTH", value_enum, default_value_t = crate::auth::AuthMode::None)]
    pub auth: crate::auth::AuthMode,
    /// Serve beyond loopback with `--auth none` (a warning is logged): only behind
    /// something else that authenticates.
    #[arg(long, env = "IDEM_INSECURE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub insecure: bool,
    /// With `--auth tokens`: DTM's door (`/api/dtmsvr`) takes requests without a token as
    /// a client of this tenant, so DTM's own clients, which send none, keep working.
    #[arg(long, env = "IDEM_DTM_TENANT", value_parser = parse_tenant)]
    pub dtm_tenant: Option<String>,
    /// With `--auth tokens`: `/metrics` needs an operator's or admin's token.
    #[arg(long, env = "IDEM_PROTECT_METRICS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub protect_metrics: bool,
    /// With `--auth tokens`: `/health` and `/health/ready` need an operator's or admin's
    /// token (`/health/live` never does).
    #[arg(long, env = "IDEM_PROTECT_READINESS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub protect_readiness: bool,
    /// How often the token table is read again, in ms: a token revoked on another
    /// coordinator stops working here within this time.
    #[arg(long, env = "IDEM_TOKEN_REFRESH_MS", default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub token_refresh_ms: u64,
    /// Unfinished (not succeeded or failed) transactions one tenant may have; a create
    /// past it is refused (429 tenant_active_limit). 0: no cap.
    #[arg(long, env = "IDEM_MAX_ACTIVE_PER_TENANT", default_value_t = 0)]
    pub max_active_per_tenant: u64,
    /// Where participant calls may go, per tenant: a TOML file with a `[default]` table
    /// and `[tenants.<name>]` tables of `schemes`, `hosts`, `host_suffixes`, `cidrs` and
    /// `ports` (docs/security.md). URLs are checked when registered (400
    /// url_not_allowed) and the addresses they resolve to when called. None: every
    /// http(s) URL but link-local and cloud metadata addresses.
    #[arg(long, env = "IDEM_OUTBOUND_POLICY", value_name = "PATH")]
    pub outbound_policy: Option<PathBuf>,
    /// Serve the API over HTTPS with this certificate (PEM: the server's certificate, then
    /// any intermediates); needs `--tls-key`. Neither: plain HTTP.
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// How often the certificate and key files are reread, in ms (they are on SIGHUP
    /// too); new connections get what was read, open ones keep theirs, and files that
    /// cannot be used are logged and the certificate served stays. 0: on SIGHUP only.
    #[arg(long, env = "IDEM_TLS_RELOAD_INTERVAL_MS", default_value_t = 300_000)]
    pub tls_reload_interval_ms: u64,
    /// Trust the CA certificates of this PEM bundle for calls to participants, besides
    /// the system's roots.
    #[arg(long, env = "IDEM_OUTBOUND_CA_FILE", value_name = "PATH")]
    pub outbound_ca_file: Option<PathBuf>,
    /// Present this client certificate (PEM) to participants that ask for one (mutual
    /// TLS); needs `--outbound-client-key`.
    #[arg(long, env = "IDEM_OUTBOUND_CLIENT_CERT", value_name = "PATH")]
    pub outbound_client_cert: Option<PathBuf>,
    /// The private key of `--outbound-client-cert` (PEM).
    #[arg(long, env = "IDEM_OUTBOUND_CLIENT_KEY", value_name = "PATH")]
    pub outbound_client_key: Option<PathBuf>,
    /// The console links a transaction's trace id to this tracing UI address, with
    /// `{trace_id}` where the id goes (such as `https://jaeger.example/trace/{trace_id}`).
    /// None: the console shows the id without a link.
    #[arg(
        long,
        env = "IDEM_CONSOLE_TRACE_URL",
        value_name = "PATTERN",
        value_parser = crate::console::check_trace_url,
        hide_env_values = true
    )]
    pub console_trace_url: Option<String>,
}

impl ServeArgs {
    /// Refuses settings that contradict each other; `idem serve` checks them before it
    /// starts (exit status 2, as for a bad flag).
    pub fn check(&self) -> Result<(), String> {
        crate::retention::check_window(self.retention_ms, self.client_retry_period_ms)
    }
}

fn parse_tenant(name: &str) -> Result<String, String> {
    crate::tenant::check_tenant(name).map(|()| name.to_owned())
}

/// Runs `idem serve`: the coordinator the flags describe, until SIGTERM or Ctrl-C.
pub async fn run(args: ServeArgs) -> Result<(), BoxError> {
    run_with(args, |config| async move { server::start(config).await }).await
}

/// Runs the coordinator that `start` makes from the configuration the flags describe,
/// until SIGTERM or Ctrl-C, then stops it gracefully. The lab's `serve` passes a `start`
/// that puts a fault plan in front of the transport.
pub async fn run_with<F, Fut>(args: ServeArgs, start: F) -> Result<(), BoxError>
where
    F: FnOnce(ServerConfig) -> Fut,
    Fut: Future<Output = Result<RunningServer, BoxError>>,
{
    let config = server_config(&args)?;
    let running = start(config).await?;
    println!(
        "idem listening on {} ({})",
        running.url(),
        redact(&args.db.database_url)
    );
    shutdown_signal().await;
    tracing::info!("shutting down");
    running.stop().await?;
    Ok(())
}

/// The server configuration the flags describe; fails on an unreadable or invalid
/// signing key, outbound policy, outbound CA bundle or client certificate, or on half a
/// TLS pair (the API's certificate files are read when the server starts).
pub fn server_config(args: &ServeArgs) -> Result<ServerConfig, BoxError> {
    args.check()?;
    let mut config = ServerConfig::new(args.db.database_url.clone(), args.listen);
    config.engine.node_is_unique = args.node.is_some();
    config.engine.node = args
        .node
        .clone()
        .unwrap_or_else(|| default_node(args.listen));
    config.engine.lease_ms = args.lease_ms.max(1_000);
    config.engine.recovery_interval = Duration::from_millis(args.recovery_interval_ms.max(10));
    config.engine.max_concurrent_calls = args.max_concurrent_calls.max(1);
    config.engine.max_driving = args.max_driving.max(1);
    config.engine.defaults.request_timeout_ms = args.request_timeout_ms;
    config.engine.defaults.retry_interval_ms = args.retry_interval_ms;
    config.engine.defaults.max_retry_interval_ms = args.max_retry_interval_ms;
    config.engine.defaults.max_attempts = args.max_attempts.max(1);
    config.engine.defaults.max_in_progress_ms = args.max_in_progress_ms.max(1);
    config.engine.prepared_timeout_ms = args.prepared_timeout_ms;
    config.connect.max_connections = args.max_connections.max(1);
    config.connect.sqlite_full_sync = args.sqlite_full_sync;
    config.database_wait = Duration::from_millis(args.database_wait_ms);
    config.connect.connect_timeout = Duration::from_millis(args.database_connect_timeout_ms.max(1));
    config.connect.acquire_timeout = Duration::from_millis(args.database_acquire_timeout_ms.max(1));
    config.connect.call_timeout = Duration::from_millis(args.database_call_timeout_ms.max(1));
    config.wait_timeout = Duration::from_millis(args.wait_timeout_ms);
    config.shutdown_grace = Duration::from_millis(args.shutdown_timeout_ms);
    config.clock_skew_ms = args.test_clock_offset_ms;
    config.max_answer_bytes = args.max_answer_bytes as usize;
    config.http.read_timeout = Duration::from_millis(args.request_read_timeout_ms);
    config.http.idle_timeout = Duration::from_millis(args.idle_timeout_ms);
    config.http.max_connections = args.max_http_connections;
    config.connect.max_branches = args.max_branches as usize;
    config.max_branch_payload_bytes = args.max_branch_payload_bytes as usize;
    config.rate_limit = crate::api::rate_limit::RateLimitConfig {
        per_second: args.rate_limit_per_second,
        burst: args.rate_limit_burst,
    };
    config.retention = crate::retention::RetentionConfig::from_flags(
        args.retention_ms,
        args.retention_interval_ms,
        args.retention_batch,
    );
    config.signing_key = crate::signing::signing_key(
        args.signing_secret_file.as_deref(),
        args.signing_secret.as_deref(),
    )?;
    config.auth = crate::auth::AuthConfig {
        mode: args.auth,
        dtm_tenant: args.dtm_tenant.clone(),
        protect_metrics: args.protect_metrics,
        protect_readiness: args.protect_readiness,
        refresh: Duration::from_millis(args.token_refresh_ms),
    };
    config.insecure = args.insecure;
    config.max_active_per_tenant = args.max_active_per_tenant;
    config.console.trace_url = args.console_trace_url.clone();
    if let Some(path) = &args.outbound_policy {
        config.outbound_policy = Arc::new(crate::outbound::OutboundPolicy::load(path)?);
    }
    let pair = crate::tls::both(
        ("--tls-cert", args.tls_cert.as_deref()),
        ("--tls-key", args.tls_key.as_deref()),
    )?;
    config.tls = pair.map(|(cert, key)| crate::tls::ServerTls {
        cert_file: cert.to_owned(),
        key_file: key.to_owned(),
        reload_interval: (args.tls_reload_interval_ms > 0)
            .then(|| Duration::from_millis(args.tls_reload_interval_ms)),
    });
    config.outbound_tls = crate::tls::OutboundTls::load(
        args.outbound_ca_file.as_deref(),
        args.outbound_client_cert.as_deref(),
        args.outbound_client_key.as_deref(),
    )?;
    Ok(config)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("can listen for SIGTERM");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The host's name (not `$HOSTNAME`, which systemd does not export) and the port. Not
/// unique across pods of one Deployment: owner tokens add an instance id per process.
fn default_node(listen: SocketAddr) -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let host = if host.is_empty() { "idem".into() } else { host };
    format!("{host}-{}", listen.port())
}

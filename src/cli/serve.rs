//! `idem serve`: the coordinator.
//!
//! Its flags become a [`crate::server::ServerConfig`], after the checks that refuse
//! settings that contradict each other; `run_with` is how `idem-lab serve` starts the same
//! coordinator with its faults.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use std::future::Future;

use super::{BoxError, DatabaseArgs, LogArgs, redact};
use crate::server::{self, RunningServer, ServerConfig};

/// Every option is also an environment variable `IDEM_<NAME>` and a key `<name>` of the
/// `--config` file (see [`super::config`]); `tests/it/config.rs` holds new ones to that.
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
    /// Address and port of DTM's gRPC door (the `dtmgimp.Dtm` service DTM's gRPC clients
    /// call; DTM's own port is 36790). Off unless given. It shares the HTTP API's tokens,
    /// limits and TLS certificate.
    #[arg(long, env = "IDEM_GRPC_LISTEN", value_name = "ADDR")]
    pub grpc_listen: Option<SocketAddr>,
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
    /// The share, in per cent, of `--max-concurrent-calls` and of `--max-driving` one
    /// tenant may hold: a tenant whose participants hang keeps the others from the rest
    /// no longer. 100: one tenant may take them all. With `--auth none` there is one
    /// tenant, which gets them all.
    #[arg(long, env = "IDEM_TENANT_SHARE_PERCENT", default_value_t = crate::engine::DEFAULT_TENANT_SHARE_PERCENT,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub tenant_share_percent: u8,
    /// Calls one transaction may make by itself (every branch call but a Try) before it
    /// stalls, whatever its options: counted from its creation or an operator's last
    /// retry, which gives it a new budget.
    #[arg(long, env = "IDEM_MAX_CALLS_PER_TRANSACTION", default_value_t = crate::engine::DEFAULT_MAX_CALLS_PER_TRANSACTION,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_calls_per_transaction: u64,
    /// Records of calls that did not simply succeed kept per transaction, the newest; the
    /// older ones are deleted as new ones come, and counted.
    #[arg(long, env = "IDEM_MAX_HISTORY_PER_TRANSACTION", default_value_t = crate::engine::DEFAULT_MAX_HISTORY_PER_TRANSACTION,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_history_per_transaction: u32,
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
    /// The most attempts per branch operation a request may ask for (`max_attempts`,
    /// DTM's `retry_limit`); past it 400 option_limit.
    #[arg(long, env = "IDEM_MAX_ATTEMPTS_LIMIT", default_value_t = crate::api::validate::DEFAULT_MAX_ATTEMPTS_LIMIT,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_attempts_limit: u32,
    /// The shortest first retry delay a request may ask for, in ms (`retry_interval_ms`,
    /// DTM's `retry_interval`); shorter is 400 option_limit.
    #[arg(long, env = "IDEM_MIN_RETRY_INTERVAL_MS", default_value_t = crate::api::validate::DEFAULT_MIN_RETRY_INTERVAL_MS,
          value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    pub min_retry_interval_ms: u64,
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
    /// API requests being answered at once, at most (both doors' transaction routes; not
    /// health, metrics or the OpenAPI document): a request counts from its arrival until
    /// its answer; past it 503 overloaded with Retry-After, nothing read.
    #[arg(long, env = "IDEM_MAX_REQUESTS_IN_FLIGHT", default_value_t = crate::api::in_flight::DEFAULT_MAX_REQUESTS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_requests_in_flight: u32,
    /// Bytes of request bodies those requests may hold at once, each counted by its
    /// Content-Length (1 MiB when it gives none), at least 1 MiB (one full body); past it
    /// 503 overloaded with Retry-After.
    #[arg(long, env = "IDEM_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = crate::api::in_flight::DEFAULT_MAX_BODY_BYTES, value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 40))]
    pub max_body_bytes_in_flight: u64,
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
    /// Sign every branch call (an `Idem-Signature` header, v2; see docs/signing.md) with the
    /// keys of this file: `kid:secret` (HMAC-SHA256) or `kid:ed25519:<hex seed>` lines,
    /// newest first, and `[tenant NAME]` sections for a tenant's own keys; a tenant's calls
    /// are signed with the first key of its section, else of the default list. Reread on
    /// SIGHUP and every `--signing-reload-interval-ms`.
    /// Neither this nor `--signing-secret`: calls go unsigned.
    #[arg(
        long,
        env = "IDEM_SIGNING_SECRET_FILE",
        value_name = "PATH",
        hide_env_values = true
    )]
    pub signing_secret_file: Option<PathBuf>,
    /// The signing keys themselves, as in `--signing-secret-file` (`kid:secret[,…]`, the
    /// first signs), instead of the file; read once.
    #[arg(
        long,
        env = "IDEM_SIGNING_SECRET",
        value_name = "KID:SECRET",
        hide_env_values = true
    )]
    pub signing_secret: Option<String>,
    /// Also sign every call with v1 (HMAC keys only), beside v2, for participants that
    /// predate v2 and check v1 alone; v1 binds neither the host, the tenant nor the call,
    /// so turn it off once every participant checks v2.
    #[arg(long, env = "IDEM_SIGNING_LEGACY_V1", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub signing_legacy_v1: bool,
    /// How often `--signing-secret-file` is reread, in ms (it is on SIGHUP too); calls
    /// from then on are signed with what was read, and a file that cannot be used is
    /// logged and the keys in use stay. 0: on SIGHUP only.
    #[arg(
        long,
        env = "IDEM_SIGNING_RELOAD_INTERVAL_MS",
        default_value_t = 60_000
    )]
    pub signing_reload_interval_ms: u64,
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
    /// With `--dtm-tenant`: the networks whose callers DTM's door takes without a token
    /// (comma-separated CIDRs); a caller from elsewhere needs a token (401 token_missing).
    /// Such a caller reads and changes only the transactions created without a token,
    /// never those of the tenant's token holders. A warning is logged at start when the
    /// API listens beyond loopback.
    #[arg(long, env = "IDEM_DTM_TOKENLESS_FROM", value_name = "CIDR,...", value_delimiter = ',',
          default_values_t = crate::auth::loopback())]
    pub dtm_tokenless_from: Vec<ipnet::IpNet>,
    /// This coordinator's names besides IP addresses and localhost (comma-separated
    /// `name` or `name:port`): the `Host` a proxy passes on, the origin browsers show. A
    /// request's `Origin`, when present, must be the one it was sent to or one of these
    /// (a name without a port: 80 or 443); with `--auth none`, and through DTM's door
    /// without a token, its `Host` must be an IP address, localhost or one of these
    /// (against DNS rebinding). 403 host_not_allowed or origin_not_allowed otherwise.
    #[arg(
        long,
        env = "IDEM_ALLOWED_HOSTS",
        value_name = "NAME[:PORT],...",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<crate::auth::AllowedHost>,
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
    /// `ports` (docs/outbound-policy.md). URLs are checked when registered (400
    /// url_not_allowed) and the addresses they resolve to when called. None: every
    /// http(s) URL to a public address; with `--auth none` on loopback (a developer's
    /// machine), this host's and private addresses too. Never: idem's own listeners, nor
    /// link-local, NAT64 and cloud metadata addresses unless an entry lists them.
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
        value_parser = crate::api::console::check_trace_url,
        hide_env_values = true
    )]
    pub console_trace_url: Option<String>,
}

impl ServeArgs {
    /// Refuses settings that contradict each other; `idem serve` checks them before it
    /// starts (exit status 2, as for a bad flag).
    pub fn check(&self) -> Result<(), String> {
        crate::retention::check_window(self.retention_ms, self.client_retry_period_ms)?;
        // The server's own defaults are held to the limits it sets its clients.
        if self.max_attempts > self.max_attempts_limit {
            return Err(format!(
                "--max-attempts (max_attempts) is {}, above --max-attempts-limit \
                 (max_attempts_limit), {}: the default would be more than any request may ask",
                self.max_attempts, self.max_attempts_limit
            ));
        }
        // A round calls at most every branch at once; a budget below it would stall such a
        // transaction before its first call, after every retry too.
        if self.max_calls_per_transaction < u64::from(self.max_branches) {
            return Err(format!(
                "--max-calls-per-transaction (max_calls_per_transaction) is {}, below \
                 --max-branches (max_branches), {}: a transaction's first round could call \
                 more than its whole budget and never be sent",
                self.max_calls_per_transaction, self.max_branches
            ));
        }
        if self.retry_interval_ms < self.min_retry_interval_ms {
            return Err(format!(
                "--retry-interval-ms (retry_interval_ms) is {} ms, below \
                 --min-retry-interval-ms (min_retry_interval_ms), {} ms: the default would be \
                 less than any request may ask",
                self.retry_interval_ms, self.min_retry_interval_ms
            ));
        }
        Ok(())
    }
}

fn parse_tenant(name: &str) -> Result<String, String> {
    crate::tenant::check_tenant(name).map(|()| name.to_owned())
}

/// Runs `idem serve`: the coordinator the flags describe, until SIGTERM or Ctrl-C.
pub async fn run(args: ServeArgs) -> Result<(), BoxError> {
    run_with(
        args,
        |config| async move { Ok(server::start(config).await?) },
    )
    .await
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
    // Before the HTTP line, which tools wait for: once it is out, so is this one.
    if let Some(grpc) = running.grpc_addr {
        println!("idem gRPC (dtmgimp.Dtm) listening on {grpc}");
    }
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

/// Why the flags describe no server (the API's certificate files are read later, when the
/// server starts: `server::StartError`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Settings that contradict each other (see [`ServeArgs::check`]).
    #[error("{0}")]
    Flags(String),
    /// The signing keys are unreadable, invalid, or given twice.
    #[error("{0}")]
    Signing(String),
    /// The outbound policy file is unreadable or invalid.
    #[error("{0}")]
    OutboundPolicy(String),
    /// Half a TLS pair, or an unusable outbound CA bundle or client certificate.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
}

/// The server configuration the flags describe; fails on an unreadable or invalid
/// signing key, outbound policy, outbound CA bundle or client certificate, or on half a
/// TLS pair.
pub fn server_config(args: &ServeArgs) -> Result<ServerConfig, ConfigError> {
    args.check().map_err(ConfigError::Flags)?;
    let mut config = ServerConfig::new(args.db.database_url.clone(), args.listen);
    config.grpc_listen = args.grpc_listen;
    config.engine.node_is_unique = args.node.is_some();
    config.engine.node = args
        .node
        .clone()
        .unwrap_or_else(|| default_node(args.listen));
    config.engine.lease_ms = args.lease_ms.max(1_000);
    config.engine.recovery_interval = Duration::from_millis(args.recovery_interval_ms.max(10));
    config.engine.max_concurrent_calls = args.max_concurrent_calls.max(1);
    config.engine.max_driving = args.max_driving.max(1);
    config.engine.tenant_share_percent = args.tenant_share_percent;
    config.engine.max_calls_per_transaction = args.max_calls_per_transaction;
    config.engine.max_history_per_transaction = args.max_history_per_transaction;
    config.option_limits = crate::api::validate::OptionLimits {
        max_attempts: args.max_attempts_limit,
        min_retry_interval_ms: args.min_retry_interval_ms,
    };
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
    config.in_flight = crate::api::in_flight::InFlightConfig {
        max_requests: args.max_requests_in_flight,
        max_body_bytes: args.max_body_bytes_in_flight,
    };
    config.retention = crate::retention::RetentionConfig::from_flags(
        args.retention_ms,
        args.retention_interval_ms,
        args.retention_batch,
    );
    config.signing = crate::signing::Signer::from_options(&crate::signing::SigningOptions {
        file: args.signing_secret_file.clone(),
        inline: args.signing_secret.clone(),
        legacy_v1: args.signing_legacy_v1,
        reload_interval: (args.signing_reload_interval_ms > 0)
            .then(|| Duration::from_millis(args.signing_reload_interval_ms)),
    })
    .map_err(ConfigError::Signing)?;
    config.auth = crate::auth::AuthConfig {
        mode: args.auth,
        dtm_tenant: args.dtm_tenant.clone(),
        dtm_tokenless_from: args.dtm_tokenless_from.clone(),
        allowed_hosts: args.allowed_hosts.clone(),
        protect_metrics: args.protect_metrics,
        protect_readiness: args.protect_readiness,
        refresh: Duration::from_millis(args.token_refresh_ms),
    };
    config.insecure = args.insecure;
    config.max_active_per_tenant = args.max_active_per_tenant;
    config.console.trace_url = args.console_trace_url.clone();
    if let Some(path) = &args.outbound_policy {
        let policy =
            crate::outbound::OutboundPolicy::load(path).map_err(ConfigError::OutboundPolicy)?;
        config.outbound_policy = Arc::new(policy);
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

//! Who is calling: API tokens, their tenants and roles.
//!
//! The authentication layer puts a [`Principal`] in every request's extensions before any
//! handler runs; handlers and other layers (rate limits) read it from there.

use std::fmt;

use crate::tenant::DEFAULT_TENANT;

/// What a token may do. Each role includes the ones before it; every role acts only
/// within its token's tenant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Create, submit, abort and read its tenant's transactions.
    Client,
    /// Also retry and force-stop them, and read `/metrics` and readiness when protected.
    Operator,
    /// Also issue, list and revoke tokens.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Role, String> {
        match s {
            "client" => Ok(Role::Client),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            other => Err(format!(
                "unknown role {other:?} (one of client, operator, admin)"
            )),
        }
    }
}

/// The caller of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub tenant: String,
    pub role: Role,
    /// The public id of the token that authenticated the request; `None` when
    /// authentication is off, or through DTM's door without a token.
    pub token_id: Option<String>,
    /// Through DTM's door without a token (`--dtm-tenant`): it may read and change only
    /// the transactions created that way, never those of the tenant's token holders.
    pub tokenless: bool,
}

impl Principal {
    /// The caller when no tokens are required: the default tenant, every right.
    pub fn anonymous() -> Principal {
        Principal {
            tenant: DEFAULT_TENANT.to_owned(),
            role: Role::Admin,
            token_id: None,
            tokenless: false,
        }
    }
}

pub mod admin;
pub mod allowed_host;
pub mod cache;
pub mod tokens;

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

pub use admin::TokenAdmin;
pub use allowed_host::AllowedHost;

/// Whether requests must carry a token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMode {
    /// Every caller is the default tenant's admin: only for loopback (or `--insecure`).
    #[default]
    None,
    /// Every API request carries `Authorization: Bearer <token>` (see `idem token`).
    Tokens,
}

/// How the API authenticates: what `idem serve`'s flags say.
#[derive(Clone, Debug)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// DTM's door without a token acts as a client of this tenant (DTM clients send none).
    pub dtm_tenant: Option<String>,
    /// The networks whose callers DTM's door takes without a token; others need one.
    pub dtm_tokenless_from: Vec<IpNet>,
    /// Names of this coordinator besides IP addresses and `localhost`, for the `Host` and
    /// `Origin` checks (see `api::same_origin`).
    pub allowed_hosts: Vec<AllowedHost>,
    /// `/metrics` needs an operator's token.
    pub protect_metrics: bool,
    /// `/health` and `/health/ready` need an operator's token (`/health/live` never does).
    pub protect_readiness: bool,
    /// How often the token table is read again.
    pub refresh: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            mode: AuthMode::None,
            dtm_tenant: None,
            dtm_tokenless_from: loopback(),
            allowed_hosts: Vec::new(),
            protect_metrics: false,
            protect_readiness: false,
            refresh: Duration::from_secs(5),
        }
    }
}

/// The default of [`AuthConfig::dtm_tokenless_from`]: this host only.
pub fn loopback() -> Vec<IpNet> {
    DEFAULT_TOKENLESS_FROM
        .iter()
        .map(|n| n.parse().expect("a valid network"))
        .collect()
}

/// `--dtm-tokenless-from`'s default, as the flag spells it.
pub const DEFAULT_TOKENLESS_FROM: [&str; 2] = ["127.0.0.0/8", "::1/128"];

impl AuthConfig {
    /// Whether DTM's door takes a request without a token from `peer` (an IPv4 caller
    /// of a dual-stack listener arrives as an IPv4-mapped IPv6 address).
    pub fn takes_tokenless_from(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.dtm_tokenless_from
            .iter()
            .any(|net| net.contains(&peer))
    }
}

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
    /// authentication is off.
    pub token_id: Option<String>,
}

impl Principal {
    /// The caller when no tokens are required: the default tenant, every right.
    pub fn anonymous() -> Principal {
        Principal {
            tenant: DEFAULT_TENANT.to_owned(),
            role: Role::Admin,
            token_id: None,
        }
    }
}

pub mod cache;
pub mod tokens;

use std::time::Duration;

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
            protect_metrics: false,
            protect_readiness: false,
            refresh: Duration::from_secs(5),
        }
    }
}

//! The call-time check: a DNS resolver for reqwest that hands the connector only the
//! addresses the tenant's entry allows. The check runs on the addresses the connection
//! is made to, so a name that passed at registration and resolves elsewhere now (DNS
//! rebinding) is refused without a connection.

use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::policy::{Refusal, Rule};

/// Resolves with the system's resolver, then keeps the allowed addresses; none left is
/// a [`Refusal`] (found again in the call's error by `transport`).
pub struct PolicyResolver {
    rule: Arc<Rule>,
}

impl PolicyResolver {
    pub fn new(rule: Arc<Rule>) -> PolicyResolver {
        PolicyResolver { rule }
    }
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let rule = Arc::clone(&self.rule);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = filter(&rule, &host, resolved)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The allowed addresses of `resolved`; a refusal naming the first denied one when none
/// is allowed. Filtering rather than refusing on any denied address lets `localhost`
/// (`127.0.0.1` and `::1`) through an entry that lists only `127.0.0.0/8`: no denied
/// address is ever connected to either way.
pub fn filter(
    rule: &Rule,
    host: &str,
    resolved: Vec<SocketAddr>,
) -> Result<Vec<SocketAddr>, Refusal> {
    let mut first_refusal = None;
    let mut allowed = Vec::new();
    for addr in resolved {
        match rule.check_addr(addr.ip()) {
            Ok(()) => allowed.push(addr),
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    if allowed.is_empty() {
        let why = first_refusal.map_or("it resolves to no address".into(), |r| r.0);
        return Err(Refusal(format!("host {host}: {why}")));
    }
    Ok(allowed)
}

//! The call-time check: a DNS resolver for reqwest that hands the connector only the
//! addresses the tenant's entry allows. The check runs on the addresses the connection
//! is made to, so a name that passed at registration and resolves elsewhere now (DNS
//! rebinding) is refused without a connection. Every entry's addresses are checked, one
//! that lists only names included: the non-public and always-denied networks apply to
//! every address, whatever the name.

use std::net::SocketAddr;
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use super::own::is_local;
use super::policy::{Refusal, Rule};

/// Resolves with the system's resolver, then keeps the allowed addresses; none left is
/// a [`Refusal`] (found again in the call's error by `transport`).
pub struct PolicyResolver {
    rule: Arc<Rule>,
    /// The client calls one of idem's own ports, so this host's addresses are dropped too
    /// (a resolver is not told the port; the transport picks this client for URLs on
    /// those ports).
    own_port: bool,
}

impl PolicyResolver {
    pub fn new(rule: Arc<Rule>, own_port: bool) -> PolicyResolver {
        PolicyResolver { rule, own_port }
    }
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let rule = Arc::clone(&self.rule);
        let own_port = self.own_port;
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed = filter(&rule, &host, resolved, own_port)?;
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// The allowed addresses of `resolved` (without this host's when `own_port`); a
/// refusal when none is allowed. Filtering rather than refusing on any denied address lets
/// `localhost` (`127.0.0.1` and `::1`) through an entry that lists only `127.0.0.0/8`: no
/// denied address is ever connected to either way.
///
/// The refusal names the host and the entry, not the addresses: they would tell the
/// client how names resolve inside idem's network. The log has the first refused one.
pub fn filter(
    rule: &Rule,
    host: &str,
    resolved: Vec<SocketAddr>,
    own_port: bool,
) -> Result<Vec<SocketAddr>, Refusal> {
    let mut first_refusal = None;
    let mut allowed = Vec::new();
    for addr in resolved {
        let checked = if own_port && is_local(addr.ip()) {
            Err(Refusal(format!(
                "address {} is this host's, on a port of idem's own API",
                addr.ip()
            )))
        } else {
            rule.check_addr(addr.ip())
        };
        match checked {
            Ok(()) => allowed.push(addr),
            Err(refusal) => {
                first_refusal.get_or_insert(refusal);
            }
        }
    }
    if !allowed.is_empty() {
        return Ok(allowed);
    }
    let Some(refusal) = first_refusal else {
        return Err(Refusal(format!("host {host} resolves to no address")));
    };
    tracing::warn!(host, entry = rule.name, reason = %refusal, "outbound call refused");
    Err(Refusal(format!(
        "host {host}: none of its addresses is allowed by [{}] (idem's log names the first)",
        rule.name
    )))
}

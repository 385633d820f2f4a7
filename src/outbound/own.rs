//! idem's own listeners: no participant URL reaches them, under any policy.
//!
//! A call to idem's own API would run with idem's network position (and, without tokens,
//! as an admin) and hand the answer to whoever registered the URL. A listener on
//! `0.0.0.0` or `::` answers on every address of the host, and one on `127.0.0.1` also
//! answers `0.0.0.0`; so a URL is refused when its port is one idem listens on and its
//! address is one of this host's: loopback, unspecified, or one a socket can be bound to.
//! A participant on another of the host's addresses that happens to use idem's port is
//! refused too: the price of not guessing which address a kernel delivers where.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, RwLock};

use reqwest::Url;

use super::policy::{Host, Refusal, url_host};

/// The addresses idem listens on, filled once each listener is bound (its port may be
/// chosen by the system); clones share them.
#[derive(Clone, Debug, Default)]
pub struct OwnListeners(Arc<RwLock<Vec<SocketAddr>>>);

impl OwnListeners {
    /// Records a bound listener.
    pub fn add(&self, addr: SocketAddr) {
        let mut listeners = self.0.write().unwrap_or_else(|e| e.into_inner());
        if !listeners.contains(&addr) {
            listeners.push(addr);
        }
    }

    /// Whether idem listens on `port` (on any address).
    pub fn has_port(&self, port: u16) -> bool {
        let listeners = self.0.read().unwrap_or_else(|e| e.into_inner());
        listeners.iter().any(|l| l.port() == port)
    }

    /// The registration and call-time check of a URL: refused when it names one of idem's
    /// ports on an address or a name of this host. Other names are judged on the addresses
    /// they resolve to when called (`resolve`).
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        let Some(port) = url.port_or_known_default() else {
            return Ok(());
        };
        if !self.has_port(port) {
            return Ok(());
        }
        let local = match url_host(url) {
            Some(Host::Ip(ip)) => is_local(ip),
            Some(Host::Name(name)) => is_local_name(name),
            None => false,
        };
        if local {
            return Err(own_api(port));
        }
        Ok(())
    }
}

/// The refusal of a call to idem's own port on this host.
pub fn own_api(port: u16) -> Refusal {
    Refusal(format!(
        "port {port} on this host is idem's own API, never a participant"
    ))
}

/// Whether a connection to `ip` stays on this host: loopback, unspecified (which the
/// kernel reads as this host), or an address of one of its interfaces (one a socket can
/// be bound to; checked each time, so addresses that come and go are seen).
pub fn is_local(ip: IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() {
        return true;
    }
    std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Names that are this host without asking DNS: `localhost` and its subdomains (RFC 6761
/// reserves them for loopback) and the host's own name.
fn is_local_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") || name == "localhost.localdomain" {
        return true;
    }
    let host = gethostname::gethostname()
        .to_string_lossy()
        .to_ascii_lowercase();
    !host.is_empty() && name == host.trim_end_matches('.')
}

//! The outbound policy: which participant URLs and addresses each tenant's transactions
//! may call. Read from `--outbound-policy`'s TOML file; without one, a built-in entry
//! (public addresses only, or also this host's and private networks for the developer's
//! quick start: see [`OutboundPolicy::in_force`]). The networks no entry reaches unless it
//! lists them are in `special`, idem's own listeners in `own`. Semantics: docs/outbound-policy.md.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use ipnet::IpNet;
use reqwest::Url;
use serde::Deserialize;

use super::own::OwnListeners;
use super::special::{DENIED_NAMES, Denied, denied, embedded_v4};

/// Why a URL or an address is refused: the rule, never the URL's credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal(pub String);

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// One entry: `[default]` or `[tenants.<name>]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Where the entry came from, for messages: `default`, `tenants.acme`, or `built-in`.
    pub name: String,
    schemes: Vec<String>,
    hosts: Vec<String>,
    host_suffixes: Vec<String>,
    cidrs: Vec<IpNet>,
    ports: Vec<u16>,
    /// Whether the non-public networks (loopback, private...) need a listing; off only in
    /// the quick start's built-in entry.
    non_public_denied: bool,
}

/// The whole policy: the default entry and the tenants' own.
#[derive(Clone, Debug)]
pub struct OutboundPolicy {
    /// Index 0 is the default entry; then the tenants' entries in name order. The
    /// transport keeps one HTTP client per index.
    rules: Vec<Arc<Rule>>,
    tenants: BTreeMap<String, usize>,
    /// Read from a file (else the built-in entry).
    from_file: bool,
    /// idem's own listeners, refused whatever the entries say.
    own: OwnListeners,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    default: Option<EntryFile>,
    #[serde(default)]
    tenants: BTreeMap<String, EntryFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    schemes: Option<Vec<String>>,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(default)]
    host_suffixes: Vec<String>,
    #[serde(default)]
    cidrs: Vec<String>,
    #[serde(default)]
    ports: Vec<u16>,
}

impl Default for OutboundPolicy {
    /// No file: every http(s) URL to a public address (see [`OutboundPolicy::in_force`]
    /// for the quick start's).
    fn default() -> OutboundPolicy {
        OutboundPolicy::built_in(true)
    }
}

impl OutboundPolicy {
    /// The entry of a server without a policy file: every http(s) URL, except the
    /// always-denied addresses and names and, when `non_public_denied`, the non-public
    /// ones.
    fn built_in(non_public_denied: bool) -> OutboundPolicy {
        let rule = Rule {
            name: "built-in".into(),
            schemes: vec!["http".into(), "https".into()],
            hosts: Vec::new(),
            host_suffixes: Vec::new(),
            cidrs: Vec::new(),
            ports: Vec::new(),
            non_public_denied,
        };
        OutboundPolicy {
            rules: vec![Arc::new(rule)],
            tenants: BTreeMap::new(),
            from_file: false,
            own: OwnListeners::default(),
        }
    }

    /// The policy a server enforces: this one, refusing `own`'s listeners too. Without a
    /// file, the built-in entry refuses non-public addresses (loopback, private, shared,
    /// unique local...) unless `quick_start` (`--auth none` on loopback: the developer's
    /// own machine, where participants run on loopback too).
    pub fn in_force(&self, quick_start: bool, own: &OwnListeners) -> OutboundPolicy {
        let mut policy = if self.from_file {
            self.clone()
        } else {
            OutboundPolicy::built_in(!quick_start)
        };
        policy.own = own.clone();
        policy
    }

    /// Whether the entries come from a policy file (else the built-in entry).
    pub fn from_file(&self) -> bool {
        self.from_file
    }

    /// Whether the built-in entry lets this host's and private addresses through (the
    /// quick start's).
    pub fn allows_non_public(&self) -> bool {
        !self.from_file && !self.rules[0].non_public_denied
    }

    /// idem's own listeners, which this policy refuses.
    pub fn own(&self) -> &OwnListeners {
        &self.own
    }

    /// Reads and checks a policy file; the error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<OutboundPolicy, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the outbound policy {}: {e}", path.display()))?;
        OutboundPolicy::parse(&text)
            .map_err(|e| format!("invalid outbound policy {}: {e}", path.display()))
    }

    /// Parses a policy file's text.
    pub fn parse(text: &str) -> Result<OutboundPolicy, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| located(text, &e))?;
        let default = file.default.ok_or(
            "a [default] table is required: it applies to every tenant without its own entry \
             (an empty [default] allows every URL to a public address)",
        )?;
        let mut rules = vec![Arc::new(Rule::from_file("default", default)?)];
        let mut tenants = BTreeMap::new();
        for (tenant, entry) in file.tenants {
            crate::tenant::check_tenant(&tenant).map_err(|e| format!("[tenants.{tenant}]: {e}"))?;
            let rule = Rule::from_file(&format!("tenants.{tenant}"), entry)?;
            tenants.insert(tenant, rules.len());
            rules.push(Arc::new(rule));
        }
        Ok(OutboundPolicy {
            rules,
            tenants,
            from_file: true,
            own: OwnListeners::default(),
        })
    }

    /// How many entries the policy has: their indexes are `0..entries()`.
    pub fn entries(&self) -> usize {
        self.rules.len()
    }

    /// The entry that applies to `tenant`, with its index (stable for this policy).
    pub fn rule_for(&self, tenant: &str) -> (usize, &Arc<Rule>) {
        let index = self.tenants.get(tenant).copied().unwrap_or(0);
        (index, &self.rules[index])
    }

    /// The registration check of a URL that `validate::check_url` accepted: parsing it
    /// again cannot fail, but a failure is a refusal, not a panic.
    pub fn check_url(&self, tenant: &str, url: &str) -> Result<(), Refusal> {
        if let Some(target) = super::GrpcTarget::parse(url) {
            return self.check_parsed(tenant, &target.http_url());
        }
        let parsed = Url::parse(url).map_err(|_| Refusal("the URL does not parse".into()))?;
        self.check_parsed(tenant, &parsed)
    }

    /// The check of a parsed URL, at registration and before each call: idem's own
    /// listeners, then the tenant's entry.
    pub fn check_parsed(&self, tenant: &str, url: &Url) -> Result<(), Refusal> {
        self.own.check_url(url)?;
        let (_, rule) = self.rule_for(tenant);
        rule.check_url(url)
    }
}

impl Rule {
    fn from_file(name: &str, entry: EntryFile) -> Result<Rule, String> {
        let at = |what: &str| format!("[{name}] {what}");
        let schemes = entry
            .schemes
            .unwrap_or_else(|| vec!["http".into(), "https".into()]);
        let mut checked_schemes = Vec::new();
        for scheme in schemes {
            let scheme = scheme.to_ascii_lowercase();
            if !matches!(scheme.as_str(), "http" | "https") {
                return Err(at(&format!(
                    "schemes: {scheme:?} is not http or https, the only schemes idem calls"
                )));
            }
            checked_schemes.push(scheme);
        }
        let hosts = entry
            .hosts
            .iter()
            .map(|h| normal_host(h).ok_or_else(|| at("hosts: an empty host name")))
            .collect::<Result<_, _>>()?;
        let mut host_suffixes = Vec::new();
        for suffix in &entry.host_suffixes {
            let suffix = suffix.trim_end_matches('.').to_ascii_lowercase();
            if !suffix.starts_with('.') || suffix.len() < 2 {
                return Err(at(&format!(
                    "host_suffixes: {suffix:?} must start with a dot (\".svc.cluster.local\"); \
                     an exact name goes in hosts"
                )));
            }
            host_suffixes.push(suffix);
        }
        let cidrs = entry
            .cidrs
            .iter()
            .map(|c| parse_cidr(c).map_err(|e| at(&format!("cidrs: {e}"))))
            .collect::<Result<_, _>>()?;
        if entry.ports.contains(&0) {
            return Err(at("ports: 0 is not a port"));
        }
        Ok(Rule {
            name: name.to_owned(),
            schemes: checked_schemes,
            hosts,
            host_suffixes,
            cidrs,
            ports: entry.ports,
            non_public_denied: true,
        })
    }

    /// Whether the entry lists host names (`hosts` or `host_suffixes`). One that lists
    /// neither and no `cidrs` lets any host through (scheme, port and the always-denied
    /// addresses still apply).
    fn lists_names(&self) -> bool {
        !(self.hosts.is_empty() && self.host_suffixes.is_empty())
    }

    /// The check of a URL: scheme, port, and its host (a name against the names, an IP
    /// literal against the addresses).
    pub fn check_url(&self, url: &Url) -> Result<(), Refusal> {
        let name = &self.name;
        let scheme = url.scheme();
        if !self.schemes.iter().any(|s| s == scheme) {
            return Err(Refusal(format!(
                "scheme {scheme} is not in [{name}] schemes {:?}",
                self.schemes
            )));
        }
        if !self.ports.is_empty() {
            let port = url.port_or_known_default().unwrap_or(0);
            if !self.ports.contains(&port) {
                return Err(Refusal(format!(
                    "port {port} is not in [{name}] ports {:?}",
                    self.ports
                )));
            }
        }
        match url_host(url) {
            Some(Host::Ip(ip)) => self.check_literal(ip),
            Some(Host::Name(host)) => self.check_name(host),
            None => Err(Refusal("the URL has no host".into())),
        }
    }

    fn check_name(&self, host: &str) -> Result<(), Refusal> {
        let name = &self.name;
        let host = normal_host(host).unwrap_or_default();
        let listed = self.hosts.contains(&host);
        if DENIED_NAMES.contains(&host.as_str()) && !listed {
            return Err(Refusal(format!(
                "host {host} is a metadata service, denied unless [{name}] hosts lists it"
            )));
        }
        if !self.lists_names() {
            // No names listed: any name, its addresses checked when it is called.
            return Ok(());
        }
        let suffixed = self
            .host_suffixes
            .iter()
            .any(|s| host.ends_with(s.as_str()));
        if listed || suffixed {
            return Ok(());
        }
        Err(Refusal(format!(
            "host {host} is not in [{name}] hosts and ends with none of its host_suffixes"
        )))
    }

    /// The check of one address: each address a name resolves to when it is called, and
    /// (through [`Rule::check_url`]) an IP literal. An IPv6 address that carries an IPv4
    /// one (6to4, Teredo, NAT64, IPv4-compatible) must pass as that too.
    pub fn check_addr(&self, ip: IpAddr) -> Result<(), Refusal> {
        // An IPv4-mapped IPv6 address reaches the IPv4 host: judge it as that.
        let ip = ip.to_canonical();
        // The carried address first: its refusal says more than the IPv6 form's.
        if let IpAddr::V6(v6) = ip
            && let Some(v4) = embedded_v4(v6)
        {
            self.check_special(ip, IpAddr::V4(v4))?;
        }
        self.check_special(ip, ip)?;
        if !self.cidrs.is_empty() && !self.cidrs.iter().any(|net| net.contains(&ip)) {
            return Err(Refusal(format!(
                "address {ip} is not in [{}] cidrs",
                self.name
            )));
        }
        Ok(())
    }

    /// Refuses `ip` (carried by `shown`, the address of the URL or of the resolution) when
    /// it is in a network of `special` that this entry does not unlock: only a CIDR inside
    /// that network does, never a wide one.
    fn check_special(&self, shown: IpAddr, ip: IpAddr) -> Result<(), Refusal> {
        let Some(Denied { net, what }) = denied(ip, self.non_public_denied) else {
            return Ok(());
        };
        let unlocked = self
            .cidrs
            .iter()
            .any(|listed| listed.contains(&ip) && net.contains(listed));
        if unlocked {
            return Ok(());
        }
        let carried = if shown == ip {
            String::new()
        } else {
            format!(" carries {ip}, which")
        };
        Err(Refusal(format!(
            "address {shown}{carried} is {what} ({net}), denied unless [{}] cidrs lists a \
             network inside {net}",
            self.name
        )))
    }

    /// An IP-literal URL host: with names listed and no CIDRs it would bypass the names,
    /// so it is refused.
    fn check_literal(&self, ip: IpAddr) -> Result<(), Refusal> {
        if self.cidrs.is_empty() && self.lists_names() {
            return Err(Refusal(format!(
                "host {ip} is an IP address and [{}] lists no cidrs",
                self.name
            )));
        }
        self.check_addr(ip)
    }
}

/// A TOML error on one line: its number and text (which names the key), then what is
/// wrong.
fn located(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        return e.message().to_owned();
    };
    let line = text[..span.start.min(text.len())].matches('\n').count();
    let shown = text.lines().nth(line).unwrap_or("").trim();
    format!("line {} (`{shown}`): {}", line + 1, e.message())
}

/// A URL's host: an IP literal or a name.
pub enum Host<'a> {
    Ip(IpAddr),
    Name(&'a str),
}

/// The host of `url`. The URL parser writes every IPv4 form as dotted decimal and an
/// IPv6 literal in brackets, so a name never parses as an address.
pub fn url_host(url: &Url) -> Option<Host<'_>> {
    let host = url.host_str()?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Some(match bare.parse::<IpAddr>() {
        Ok(ip) => Host::Ip(ip),
        Err(_) => Host::Name(host),
    })
}

/// A CIDR, or a bare address as its one-address network; host bits are cleared.
fn parse_cidr(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    text.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 network (10.0.0.0/8, fd00::/8)"))
}

/// Host names compare case-insensitively and without a trailing dot.
fn normal_host(host: &str) -> Option<String> {
    let host = host.trim().trim_end_matches('.').to_ascii_lowercase();
    (!host.is_empty()).then_some(host)
}

//! The outbound policy: which participant URLs and addresses each tenant's transactions
//! may call. Read from `--outbound-policy`'s TOML file; without one, every http(s) URL is
//! allowed except the always-denied addresses. Semantics: docs/security.md.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, LazyLock};

use ipnet::IpNet;
use reqwest::Url;
use serde::Deserialize;

/// Link-local networks and cloud metadata addresses: no URL reaches them unless the
/// tenant's entry lists a CIDR inside them (a wider one, such as `0.0.0.0/0`, does not
/// count), because they hand out a node's credentials to whoever asks.
const ALWAYS_DENIED: [&str; 5] = [
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    // Inside 169.254.0.0/16, but listing that network does not unlock it: only a CIDR
    // inside the narrowest denied network holding an address does.
    "169.254.169.254/32",
];

/// Host names of metadata services: refused unless listed in `hosts` exactly.
const DENIED_NAMES: [&str; 2] = ["metadata.google.internal", "metadata"];

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
}

/// The whole policy: the default entry and the tenants' own.
#[derive(Clone, Debug)]
pub struct OutboundPolicy {
    /// Index 0 is the default entry; then the tenants' entries in name order. The
    /// transport keeps one HTTP client per index.
    rules: Vec<Arc<Rule>>,
    tenants: BTreeMap<String, usize>,
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
    /// No file: every http(s) URL, except the always-denied addresses and names.
    fn default() -> OutboundPolicy {
        let rule = Rule {
            name: "built-in".into(),
            schemes: vec!["http".into(), "https".into()],
            hosts: Vec::new(),
            host_suffixes: Vec::new(),
            cidrs: Vec::new(),
            ports: Vec::new(),
        };
        OutboundPolicy {
            rules: vec![Arc::new(rule)],
            tenants: BTreeMap::new(),
        }
    }
}

impl OutboundPolicy {
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
             (an empty [default] allows every URL but the always-denied addresses)",
        )?;
        let mut rules = vec![Arc::new(Rule::from_file("default", default)?)];
        let mut tenants = BTreeMap::new();
        for (tenant, entry) in file.tenants {
            crate::tenant::check_tenant(&tenant).map_err(|e| format!("[tenants.{tenant}]: {e}"))?;
            let rule = Rule::from_file(&format!("tenants.{tenant}"), entry)?;
            tenants.insert(tenant, rules.len());
            rules.push(Arc::new(rule));
        }
        Ok(OutboundPolicy { rules, tenants })
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
        let parsed = Url::parse(url).map_err(|_| Refusal("the URL does not parse".into()))?;
        let (_, rule) = self.rule_for(tenant);
        rule.check_url(&parsed)
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
    /// (through [`Rule::check_url`]) an IP literal.
    pub fn check_addr(&self, ip: IpAddr) -> Result<(), Refusal> {
        let name = &self.name;
        // An IPv4-mapped IPv6 address reaches the IPv4 host: judge it as that.
        let ip = ip.to_canonical();
        if let Some(denied) = always_denied(ip) {
            // Only a CIDR inside the denied network unlocks it, not a wide one.
            let unlocked = self
                .cidrs
                .iter()
                .any(|net| net.contains(&ip) && denied.contains(net));
            if unlocked {
                return Ok(());
            }
            return Err(Refusal(format!(
                "address {ip} is link-local or a cloud metadata address ({denied}), denied \
                 unless [{name}] cidrs lists a network inside {denied}"
            )));
        }
        if !self.cidrs.is_empty() && !self.cidrs.iter().any(|net| net.contains(&ip)) {
            return Err(Refusal(format!("address {ip} is not in [{name}] cidrs")));
        }
        Ok(())
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

/// The narrowest always-denied network holding `ip`.
fn always_denied(ip: IpAddr) -> Option<IpNet> {
    static DENIED: LazyLock<Vec<IpNet>> = LazyLock::new(|| {
        ALWAYS_DENIED
            .iter()
            .map(|net| net.parse().expect("a valid CIDR"))
            .collect()
    });
    DENIED
        .iter()
        .filter(|net| net.contains(&ip))
        .max_by_key(|net| net.prefix_len())
        .copied()
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

//! The names of idem's that `--allowed-hosts` lists: what the API's `Host` and `Origin`
//! checks (`api::same_origin`) accept beyond IP addresses and `localhost`.

use std::str::FromStr;

use axum::http::uri::Authority;

/// A name of idem's beyond IP addresses and `localhost` (`--allowed-hosts`): what a proxy
/// or a load balancer passes on as the `Host`, or what browsers show as the origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedHost {
    /// Lowercase, without a trailing dot; an IPv6 address in brackets.
    name: String,
    /// For an `Origin`: this port, or when `None` the scheme's default (80, 443). A
    /// `Host` matches the name on any port.
    port: Option<u16>,
}

impl AllowedHost {
    /// The name as compared (see the field).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The port an `Origin` must have; `None`: the scheme's default.
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

impl FromStr for AllowedHost {
    type Err = String;

    fn from_str(s: &str) -> Result<AllowedHost, String> {
        let bad = || {
            format!(
                "{s:?} is not a host name with an optional port (idem.example.com, idem.example.com:8443)"
            )
        };
        if s.is_empty() || s.contains(['@', '/', '?', '#', '*']) {
            return Err(bad());
        }
        let authority = Authority::from_str(s).map_err(|_| bad())?;
        // `http` takes a port that is no number as none.
        let after_brackets = s.rsplit_once(']').map_or(s, |(_, rest)| rest);
        if after_brackets.contains(':') && authority.port_u16().is_none() {
            return Err(bad());
        }
        Ok(AllowedHost {
            name: normalized(authority.host()),
            port: authority.port_u16(),
        })
    }
}

impl std::fmt::Display for AllowedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A host name as compared: lowercase, without a trailing dot.
pub fn normalized(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_hosts_parse() {
        let a: AllowedHost = "Idem.Example.com:8443".parse().unwrap();
        assert_eq!(a.to_string(), "idem.example.com:8443");
        for bad in ["", "user@host", "http://host", "*.example.com", "host:port"] {
            assert!(bad.parse::<AllowedHost>().is_err(), "{bad}");
        }
    }
}

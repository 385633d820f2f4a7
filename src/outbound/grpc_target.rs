//! DTM's gRPC branch addresses: a branch URL without `http://` or `https://` is called
//! over gRPC, as DTM calls it: `host:port/package.Service/Method`, or the same after
//! gRPC's `dns:///`. The host and port name the server; the rest is the method's path.
//!
//! A target is judged by the outbound policy as the plain-HTTP URL of the same host, port
//! and path ([`GrpcTarget::http_url`]: gRPC without TLS is HTTP/2 over that connection),
//! so every check of an HTTP branch URL, idem's own listeners included, holds for it.

use reqwest::Url;

/// A parsed gRPC branch address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcTarget {
    /// `host:port` as written (`[::1]:50051` for IPv6).
    pub authority: String,
    /// `/package.Service/Method`.
    pub path: String,
}

impl GrpcTarget {
    /// `None` for an HTTP URL or anything that is not a gRPC target: a host, an explicit
    /// port, and a method path of two parts, the service's full name and the method's,
    /// in letters, digits, `_` and (in the service) `.`; no userinfo, query or fragment.
    pub fn parse(url: &str) -> Option<GrpcTarget> {
        if url.contains("://") && !url.starts_with("dns:///") {
            return None;
        }
        let rest = url.strip_prefix("dns:///").unwrap_or(url);
        let (authority, method) = rest.split_once('/')?;
        let (service, name) = method.split_once('/')?;
        let word = |s: &str, dots: bool| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || (dots && c == '.'))
        };
        if !word(service, true) || !word(name, false) {
            return None;
        }
        // The port must be written: a gRPC server has no well-known one.
        let (_, port) = authority.rsplit_once(':')?;
        port.parse::<u16>().ok().filter(|p| *p != 0)?;
        let target = GrpcTarget {
            authority: authority.to_owned(),
            path: format!("/{service}/{name}"),
        };
        let url = Url::parse(&format!("http://{}{}", target.authority, target.path)).ok()?;
        let plain = url.username().is_empty() && url.password().is_none() && url.host().is_some();
        plain.then_some(target)
    }

    /// The plain-HTTP URL of the same host, port and path, which the outbound policy
    /// judges.
    pub fn http_url(&self) -> Url {
        Url::parse(&format!("http://{}{}", self.authority, self.path))
            .expect("checked by GrpcTarget::parse")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtm_style_targets_parse_and_http_urls_do_not() {
        let t = GrpcTarget::parse("localhost:58081/busi.Busi/TransOut").unwrap();
        assert_eq!(
            (t.authority.as_str(), t.path.as_str()),
            ("localhost:58081", "/busi.Busi/TransOut")
        );
        assert_eq!(
            t.http_url().as_str(),
            "http://localhost:58081/busi.Busi/TransOut"
        );
        let dns = GrpcTarget::parse("dns:///svc.ns:9000/pkg.v1.Svc/Do_It").unwrap();
        assert_eq!(dns.authority, "svc.ns:9000");
        assert!(GrpcTarget::parse("[::1]:50051/a.B/C").is_some());
        for not in [
            "http://localhost:58081/busi.Busi/TransOut",
            "https://h:1/a.B/C",
            "etcd://h:1/a.B/C",
            "localhost/busi.Busi/TransOut",
            "localhost:0/a.B/C",
            "localhost:99999/a.B/C",
            "localhost:1/a.B",
            "localhost:1/a.B/C/D",
            "localhost:1/a.B/C?x=1",
            "user:pw@localhost:1/a.B/C",
            "localhost:1/a B/C",
            ":1/a.B/C",
            "",
        ] {
            assert_eq!(GrpcTarget::parse(not), None, "{not}");
        }
    }
}

//! What keeps a web page the developer visits from using idem: a page can make a browser
//! send requests to a loopback port, but not choose their headers freely.
//!
//! - A write (any method but GET, HEAD and OPTIONS) needs `Content-Type: application/json`
//!   (415 `unsupported_media_type`): a form or a `no-cors` fetch cannot send it, and a
//!   script that sets it must first ask with a preflight, which idem never grants.
//! - A request whose `Origin` is present and neither the origin it was sent to (its
//!   `Host`) nor one the operator lists is refused (403 `origin_not_allowed`).
//! - A request that no token authorises (every request with `--auth none`; DTM's door
//!   without a token) needs a `Host` that cannot be a page's own name through DNS
//!   rebinding: an IP address, `localhost` (or `*.localhost`, which browsers resolve
//!   themselves), or a name the operator lists with `--allowed-hosts` (403
//!   `host_not_allowed`). A request with a valid token needs none of this: a page cannot
//!   make the browser send the token.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::Auth;
use super::error::ApiError;
use crate::auth::allowed_host::normalized;
use crate::auth::{AllowedHost, AuthMode};

/// Why a request was refused before anything else looked at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    Host,
    Origin,
    MediaType,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            Refusal::Host => (
                StatusCode::FORBIDDEN,
                "host_not_allowed",
                "the Host header is not one of this coordinator's names: an IP address, \
                 localhost, or a name given to --allowed-hosts",
            ),
            Refusal::Origin => (
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "requests from another origin are refused; a name behind a proxy can be \
                 given to --allowed-hosts",
            ),
            Refusal::MediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "a write needs Content-Type: application/json",
            ),
        };
        ApiError::new(status, code, message).into_response()
    }
}

/// The request's `Host` (its URI's authority when it has no header).
fn host_of(headers: &HeaderMap, uri: &axum::http::Uri) -> Option<Authority> {
    match headers.get(header::HOST) {
        Some(value) => value.to_str().ok()?.parse().ok(),
        None => uri.authority().cloned(),
    }
}

/// Whether `host` cannot be a web page's own name: no DNS answer makes a browser send an
/// IP address or `localhost` as the `Host` of a page it loaded from elsewhere.
fn is_own_host(allowed: &[AllowedHost], host: &Authority) -> bool {
    let name = normalized(host.host());
    let literal = name.trim_start_matches('[').trim_end_matches(']');
    literal.parse::<IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed.iter().any(|a| a.name() == name)
}

/// [`is_own_host`] for a request's headers: `Err(Refusal::Host)` when it is not.
pub fn check_host(
    allowed: &[AllowedHost],
    headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Result<(), Refusal> {
    match host_of(headers, uri) {
        Some(host) if is_own_host(allowed, &host) => Ok(()),
        _ => Err(Refusal::Host),
    }
}

/// An `Origin` is accepted when it is the origin the request went to (the browser sent it
/// to its own origin: the `Host` names it, with the origin scheme's default port when the
/// `Host` has none) or one the operator lists.
fn check_origin(
    allowed: &[AllowedHost],
    headers: &HeaderMap,
    uri: &axum::http::Uri,
) -> Result<(), Refusal> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    // `null` (a sandboxed or local page) and anything unparsable are foreign.
    let origin = origin
        .to_str()
        .ok()
        .and_then(|o| reqwest::Url::parse(o).ok())
        .ok_or(Refusal::Origin)?;
    let (Some(name), Some(port)) = (origin.host_str(), origin.port_or_known_default()) else {
        return Err(Refusal::Origin);
    };
    let name = normalized(name);
    let default_port = match origin.scheme() {
        "https" => 443,
        _ => 80,
    };
    let same = host_of(headers, uri).is_some_and(|host| {
        normalized(host.host()) == name && host.port_u16().unwrap_or(default_port) == port
    });
    let listed = allowed
        .iter()
        .any(|a| a.name() == name && a.port().unwrap_or(default_port) == port);
    if same || listed {
        Ok(())
    } else {
        Err(Refusal::Origin)
    }
}

/// Whether a request with this method may change something.
fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// The layer in front of everything else (authentication included): the checks above,
/// the `Host` one for every request when no token is required.
pub async fn guard(State(auth): State<Arc<Auth>>, request: Request, next: Next) -> Response {
    let (headers, uri) = (request.headers(), request.uri());
    let allowed = &auth.config.allowed_hosts;
    let checked = (|| {
        if auth.config.mode == AuthMode::None {
            check_host(allowed, headers, uri)?;
        }
        check_origin(allowed, headers, uri)?;
        if is_write(request.method()) && !is_json(headers) {
            return Err(Refusal::MediaType);
        }
        Ok(())
    })();
    match checked {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    fn allowed(names: &[&str]) -> Vec<AllowedHost> {
        names.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn hosts_that_no_dns_answer_can_make_are_own() {
        let uri = axum::http::Uri::from_static("/api/v1/transactions");
        let listed = allowed(&["idem.example.com"]);
        for own in [
            "127.0.0.1:8686",
            "localhost:8686",
            "LOCALHOST",
            "[::1]:8686",
            "10.1.2.3",
            "app.localhost:1",
            "idem.example.com",
            "Idem.Example.Com.:443",
        ] {
            let h = headers(&[("host", own)]);
            assert_eq!(check_host(&listed, &h, &uri), Ok(()), "{own}");
        }
        for foreign in [
            "evil.example:8686",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            let h = headers(&[("host", foreign)]);
            assert_eq!(
                check_host(&listed, &h, &uri),
                Err(Refusal::Host),
                "{foreign}"
            );
        }
        assert_eq!(
            check_host(&listed, &HeaderMap::new(), &uri),
            Err(Refusal::Host)
        );
    }

    #[test]
    fn an_origin_is_the_one_the_request_went_to_or_a_listed_one() {
        let uri = axum::http::Uri::from_static("/");
        let listed = allowed(&["idem.example.com", "ops.example.com:8443"]);
        let ok = |host: &str, origin: &str| {
            check_origin(
                &listed,
                &headers(&[("host", host), ("origin", origin)]),
                &uri,
            )
        };
        assert_eq!(ok("127.0.0.1:8686", "http://127.0.0.1:8686"), Ok(()));
        assert_eq!(ok("idem.internal", "https://idem.internal"), Ok(()));
        // A proxy that passes its upstream's address as the Host.
        assert_eq!(ok("10.0.0.5:8686", "https://idem.example.com"), Ok(()));
        assert_eq!(ok("10.0.0.5:8686", "https://ops.example.com:8443"), Ok(()));
        for foreign in [
            "http://localhost:3000",
            "http://127.0.0.1:8687",
            "https://evil.example",
            "https://idem.example.com:8443",
            "null",
            "not a url",
        ] {
            assert_eq!(
                ok("127.0.0.1:8686", foreign),
                Err(Refusal::Origin),
                "{foreign}"
            );
        }
        assert_eq!(
            check_origin(&listed, &headers(&[("host", "x")]), &uri),
            Ok(())
        );
    }

    #[test]
    fn writes_need_json() {
        assert!(is_json(&headers(&[("content-type", "application/json")])));
        assert!(is_json(&headers(&[(
            "content-type",
            "Application/JSON; charset=utf-8"
        )])));
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/jsonx",
        ] {
            assert!(!is_json(&headers(&[("content-type", other)])), "{other}");
        }
        assert!(!is_json(&HeaderMap::new()));
        assert!(is_write(&Method::POST) && is_write(&Method::DELETE));
        assert!(!is_write(&Method::GET) && !is_write(&Method::OPTIONS));
    }
}

//! What a web page could make a developer's browser send to idem, over real HTTP on
//! SQLite, PostgreSQL and MariaDB (issue 28, point 6): a write that is not JSON, a request
//! from another origin, and one through DNS rebinding (a foreign `Host`) are refused and
//! store nothing; idem's own origin, and a proxy's name given to `--allowed-hosts`, pass.

use crate::common;

use common::auth::{Setup, code, loopback_participants};
use idem::auth::Role;
use idem::server::RunningServer;
use idem_participant::testing;
use reqwest::Method;
use serde_json::{Value, json};

/// One request with these headers (and `body` as its raw bytes, if any).
async fn send(
    server: &RunningServer,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Value) {
    idem::transport::install_crypto_provider();
    let mut request = reqwest::Client::new().request(method, format!("{}{path}", server.url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn saga(gid: &str) -> String {
    json!({"gid": gid, "kind": "saga",
           "steps": [{"action": "http://127.0.0.1:9/a", "compensate": "http://127.0.0.1:9/c"}]})
    .to_string()
}

fn dtm_saga(gid: &str) -> String {
    json!({"gid": gid, "trans_type": "saga",
           "steps": [{"action": "http://127.0.0.1:9/a", "compensate": "http://127.0.0.1:9/c"}],
           "payloads": ["{}"]})
    .to_string()
}

const JSON: (&str, &str) = ("content-type", "application/json");

async fn stored(server: &RunningServer, key: &str) -> bool {
    server.engine.reads().find(key).await.unwrap().is_some()
}

#[tokio::test]
async fn without_auth_only_json_from_idems_own_origin_and_names_is_taken() {
    for db in testing::all("same_origin_no_auth").await {
        let name = db.name().to_owned();
        let server = common::coordinator_with(&db.url, |c| {
            c.auth.allowed_hosts = vec!["idem.example.com".parse().unwrap()];
            c.outbound_policy = loopback_participants();
        })
        .await;
        let own = server.url();
        let port = server.addr.port();
        let (localhost, rebound) = (format!("localhost:{port}"), format!("evil.example:{port}"));
        let (localhost_origin, rebound_origin) =
            (format!("http://{localhost}"), format!("http://{rebound}"));
        let refused = |code| (403, code);
        for (gid, headers, answered) in [
            // A form or a no-cors fetch: text/plain, a form's type, or no type at all.
            (
                "plain",
                vec![("content-type", "text/plain")],
                (415, "unsupported_media_type"),
            ),
            (
                "form",
                vec![("content-type", "application/x-www-form-urlencoded")],
                (415, "unsupported_media_type"),
            ),
            ("bare", vec![], (415, "unsupported_media_type")),
            // JSON from another origin (a fetch that never got past its preflight, an
            // old browser's form), another local port and a sandboxed page included.
            (
                "evil",
                vec![JSON, ("origin", "http://evil.example")],
                refused("origin_not_allowed"),
            ),
            (
                "port",
                vec![JSON, ("origin", "http://localhost:3000")],
                refused("origin_not_allowed"),
            ),
            (
                "null",
                vec![JSON, ("origin", "null")],
                refused("origin_not_allowed"),
            ),
            // DNS rebinding: the page's own name resolves to 127.0.0.1, so its origin is
            // "the same" as the request's; the Host gives it away.
            (
                "rebound",
                vec![JSON, ("host", &rebound), ("origin", &rebound_origin)],
                refused("host_not_allowed"),
            ),
            (
                "other",
                vec![JSON, ("host", "other.example.com")],
                refused("host_not_allowed"),
            ),
            // idem's own origin (the console's fetches), by address or as localhost; tools
            // that send no Origin; a charset.
            ("own", vec![JSON, ("origin", own.as_str())], (201, "")),
            (
                "local",
                vec![JSON, ("host", &localhost), ("origin", &localhost_origin)],
                (201, ""),
            ),
            ("tool", vec![JSON], (201, "")),
            (
                "charset",
                vec![("content-type", "application/json; charset=utf-8")],
                (201, ""),
            ),
            // Behind a proxy: the name given to --allowed-hosts, as Host and as Origin.
            (
                "proxied",
                vec![
                    JSON,
                    ("host", "idem.example.com"),
                    ("origin", "https://idem.example.com"),
                ],
                (201, ""),
            ),
        ] {
            let body = saga(gid);
            let (status, answer) = send(
                &server,
                Method::POST,
                "/api/v1/transactions",
                &headers,
                Some(&body),
            )
            .await;
            assert_eq!((status, code(&answer)), answered, "{name}: {gid}: {answer}");
            // DTM's door answers the same.
            let body = dtm_saga(&format!("dtm-{gid}"));
            let (dtm, _) = send(
                &server,
                Method::POST,
                "/api/dtmsvr/submit",
                &headers,
                Some(&body),
            )
            .await;
            assert_eq!(
                dtm,
                if status == 201 { 200 } else { status },
                "{name}: {gid}"
            );
            // Refused: nothing stored. Reads from a foreign origin or host are refused too.
            assert_eq!(stored(&server, gid).await, status == 201, "{name}: {gid}");
            if status == 403 {
                let read = send(&server, Method::GET, "/api/v1/transactions", &headers, None).await;
                assert_eq!(read.0, 403, "{name}: {gid}: {read:?}");
            }
        }
        let plain = [("content-type", "text/plain")];
        let tokens = send(&server, Method::POST, "/api/v1/tokens", &plain, Some("{}")).await;
        assert_eq!(tokens.0, 415, "{name}: {tokens:?}");
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// With tokens, a request carrying one needs no particular Host (a load balancer's names
/// are its own business; a page cannot send the token), but DTM's door without a token,
/// which nothing else vouches for, does; a foreign Origin and a write that is not JSON
/// are refused whatever the token.
#[tokio::test]
async fn with_tokens_the_host_matters_only_where_no_token_vouches() {
    for db in testing::all("same_origin_tokens").await {
        let name = db.name().to_owned();
        let s = Setup::with(db, |c| {
            c.auth.dtm_tenant = Some("legacy".into());
            c.outbound_policy = loopback_participants();
        })
        .await;
        let token = s.token("legacy", Role::Client).await;
        let bearer = format!("Bearer {token}");
        let bearer = ("authorization", bearer.as_str());
        for (gid, headers, answered) in [
            // Behind a load balancer, under a name idem was not told.
            (
                "with-token",
                vec![JSON, ("host", "idem.internal.example"), bearer],
                (200, ""),
            ),
            (
                "rebound",
                vec![JSON, ("host", "evil.example")],
                (403, "host_not_allowed"),
            ),
            (
                "foreign",
                vec![JSON, ("origin", "http://evil.example"), bearer],
                (403, "origin_not_allowed"),
            ),
            (
                "plain",
                vec![("content-type", "text/plain"), bearer],
                (415, "unsupported_media_type"),
            ),
        ] {
            let path = "/api/dtmsvr/submit";
            let body = dtm_saga(gid);
            let (status, answer) = send(&s.server, Method::POST, path, &headers, Some(&body)).await;
            assert_eq!((status, code(&answer)), answered, "{name}: {gid}: {answer}");
            let key = format!("legacy/{gid}");
            assert_eq!(
                stored(&s.server, &key).await,
                status == 200,
                "{name}: {gid}"
            );
        }
        s.finish().await;
    }
}

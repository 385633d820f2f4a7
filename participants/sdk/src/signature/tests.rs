//! The middleware over real HTTP on loopback: what reaches the handler, what is refused.

use axum::routing::post;
use axum::{Extension, Router};

use super::*;

const SECRET: &str = "0123456789abcdef0123";
const TARGET: &str = "/inventory/reserve?gid=g1&op=try";

async fn serve(verifier: Verifier) -> (String, u16) {
    // Nested, so the handler's router sees a shortened path; the signature covers the
    // path as called.
    let inner = Router::new().route(
        "/reserve",
        post(
            |Extension(signed): Extension<SignedCall>, body: String| async move {
                format!("{}:{}:{body}", signed.kid, signed.tenant)
            },
        ),
    );
    let app = Router::new()
        .nest("/inventory", inner)
        .layer(axum::middleware::from_fn_with_state(
            verifier.max_body_bytes(64),
            require_signature,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), addr.port())
}

fn verifier(keys: &str) -> Verifier {
    Verifier::new(Keyring::parse(keys).unwrap())
}

type Headers = Vec<(&'static str, String)>;

/// A call as idem makes it: its headers for `port` on 127.0.0.1.
struct Signed {
    headers: Headers,
}

fn signed(keys: &str, port: u16, tenant: &str, body: &str, at: u64) -> Signed {
    let key = Keyring::parse(keys).unwrap();
    let key = key.for_tenant(tenant).unwrap().signing_key().clone();
    let call_id = new_call_id();
    let call = Call {
        method: "POST",
        scheme: "http",
        host: "127.0.0.1",
        port,
        target: TARGET,
        body: body.as_bytes(),
        tenant,
        call_id: &call_id,
    };
    let signature = sign_call(&key, at, &call, false).unwrap();
    Signed {
        headers: vec![
            (HEADER, signature),
            (TENANT_HEADER, tenant.to_owned()),
            (CALL_ID_HEADER, call_id),
        ],
    }
}

async fn call(base: &str, target: &str, body: &str, headers: &[(&str, String)]) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{target}"))
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn code(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["error"].as_str().unwrap().to_owned()
}

fn now() -> u64 {
    unix_seconds(std::time::SystemTime::now())
}

fn with(headers: &Signed, name: &str, value: &str) -> Headers {
    let mut out = headers.headers.clone();
    for (n, v) in &mut out {
        if n.eq_ignore_ascii_case(name) {
            *v = value.to_owned();
        }
    }
    out
}

#[tokio::test]
async fn a_signed_call_reaches_the_handler_once_with_its_key_and_tenant() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = format!("k1:{SECRET}");
    let (base, port) = serve(verifier(&keys)).await;
    let good = signed(&keys, port, "acme", "{\"n\":1}", now());
    assert_eq!(
        call(&base, TARGET, "{\"n\":1}", &good.headers).await,
        (200, "k1:acme:{\"n\":1}".into())
    );
    // The same call again: its id was seen.
    let (status, answer) = call(&base, TARGET, "{\"n\":1}", &good.headers).await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (401, "signature_replayed")
    );
}

#[tokio::test]
async fn bad_signatures_are_refused_with_401_and_their_codes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = format!("k1:{SECRET}");
    let (base, port) = serve(verifier(&keys)).await;
    let fresh = || signed(&keys, port, "default", "{}", now());
    let headers_of = |s: Signed| s.headers;
    let v1 = sign_v1(
        &Key::new("k1", SECRET).unwrap(),
        now(),
        "POST",
        TARGET,
        b"{}",
    )
    .unwrap();
    let cases: Vec<(&str, &str, Headers, &str)> = vec![
        (TARGET, "{}", vec![], "signature_missing"),
        (
            TARGET,
            "{}",
            vec![(HEADER, "t=1".into())],
            "signature_malformed",
        ),
        (
            TARGET,
            "{}",
            with(&fresh(), CALL_ID_HEADER, "nope"),
            "signature_malformed",
        ),
        (
            TARGET,
            "{}",
            headers_of(signed(
                "k2:another-secret-0000",
                port,
                "default",
                "{}",
                now(),
            )),
            "signature_unknown_key",
        ),
        (
            TARGET,
            "{}",
            headers_of(signed(
                "k1:another-secret-0000",
                port,
                "default",
                "{}",
                now(),
            )),
            "signature_mismatch",
        ),
        (
            TARGET,
            "{\"n\":2}",
            headers_of(fresh()),
            "signature_mismatch",
        ),
        (
            "/inventory/reserve?gid=g2&op=try",
            "{}",
            headers_of(fresh()),
            "signature_mismatch",
        ),
        (
            TARGET,
            "{}",
            with(&fresh(), TENANT_HEADER, "beta"),
            "signature_mismatch",
        ),
        (
            TARGET,
            "{}",
            with(&fresh(), CALL_ID_HEADER, &new_call_id()),
            "signature_mismatch",
        ),
        // Signed for another port of the same host: another service.
        (
            TARGET,
            "{}",
            headers_of(signed(&keys, port.wrapping_add(1), "default", "{}", now())),
            "signature_mismatch",
        ),
        (
            TARGET,
            "{}",
            headers_of(signed(&keys, port, "default", "{}", now() - 600)),
            "signature_expired",
        ),
        (
            TARGET,
            "{}",
            headers_of(signed(&keys, port, "default", "{}", now() + 600)),
            "signature_expired",
        ),
        (TARGET, "{}", vec![(HEADER, v1)], "signature_v2_required"),
    ];
    for (target, body, headers, expected) in cases {
        let (status, answer) = call(&base, target, body, &headers).await;
        assert_eq!(status, 401, "{headers:?}: {answer}");
        assert_eq!(code(&answer), expected, "{headers:?}: {answer}");
    }
    let long = "x".repeat(65);
    let (status, answer) = call(&base, TARGET, &long, &[]).await;
    assert_eq!((status, code(&answer).as_str()), (413, "body_too_large"));
}

#[tokio::test]
async fn an_external_url_binds_the_target_whatever_the_host_header() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = format!("k1:{SECRET}");
    let public = "https://inventory.shop.example";
    let (base, port) = serve(verifier(&keys).external_url(public).unwrap()).await;
    let for_public = |tenant: &str| {
        let ring = Keyring::parse(&keys).unwrap();
        let call_id = new_call_id();
        let call = Call {
            method: "POST",
            scheme: "https",
            host: "inventory.shop.example",
            port: 443,
            target: TARGET,
            body: b"{}",
            tenant,
            call_id: &call_id,
        };
        let key = ring.for_tenant(tenant).unwrap().signing_key();
        vec![
            (HEADER, sign_call(key, now(), &call, false).unwrap()),
            (TENANT_HEADER, tenant.to_owned()),
            (CALL_ID_HEADER, call_id),
        ]
    };
    // Through a proxy that changed Host: still the public URL that was signed.
    assert_eq!(call(&base, TARGET, "{}", &for_public("acme")).await.0, 200);
    // A call signed for the address it arrived at (another service's URL) is refused,
    // even with that Host.
    let local = signed(&keys, port, "acme", "{}", now());
    let (status, answer) = call(&base, TARGET, "{}", &local.headers).await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (401, "signature_mismatch")
    );
    assert!(
        verifier(&keys)
            .external_url("https://x.example/base")
            .is_err()
    );
    assert!(verifier(&keys).external_url("ftp://x.example").is_err());
}

#[tokio::test]
async fn v1_is_accepted_only_when_asked_and_keys_reload_while_serving() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let old = format!("old:{SECRET}");
    let new = "new:a-brand-new-secret-0001";
    let v = verifier(&old).accept_v1(true);
    let keyring = v.keyring();
    let (base, port) = serve(v).await;
    let v1 = sign_v1(
        &Key::new("old", SECRET).unwrap(),
        now(),
        "POST",
        TARGET,
        b"{}",
    )
    .unwrap();
    assert_eq!(call(&base, TARGET, "{}", &[(HEADER, v1)]).await.0, 200);
    // Replaced while serving: the new key passes, the old one no more.
    keyring.replace(Keyring::parse(new).unwrap());
    let (status, answer) = call(
        &base,
        TARGET,
        "{}",
        &signed(&old, port, "default", "{}", now()).headers,
    )
    .await;
    assert_eq!(
        (status, code(&answer).as_str()),
        (401, "signature_unknown_key")
    );
    let (status, answer) = call(
        &base,
        TARGET,
        "{}",
        &signed(new, port, "default", "{}", now()).headers,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, "new:default:{}");
}

#[tokio::test]
async fn a_key_file_is_reread_at_its_interval() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = std::env::temp_dir().join(format!("idem-sdk-reload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    let old = format!("old:{SECRET}");
    let new = "new:a-brand-new-secret-0001";
    std::fs::write(&file, &old).unwrap();
    let v = Verifier::new(Keyring::from_file(&file).unwrap());
    let reloading = v.reload_every(file.clone(), std::time::Duration::from_millis(20));
    let keyring = v.keyring();
    let (base, port) = serve(v).await;
    let next = dir.join("keys.next");
    std::fs::write(&next, new).unwrap();
    std::fs::rename(&next, &file).unwrap();
    // The reload runs on its own: wait for the new keyring, then a call signed with it.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while keyring
        .current()
        .for_tenant("default")
        .unwrap()
        .get("new")
        .is_none()
    {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let headers = signed(new, port, "default", "{}", now()).headers;
    assert_eq!(call(&base, TARGET, "{}", &headers).await.0, 200);
    reloading.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

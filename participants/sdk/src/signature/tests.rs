//! The middleware over real HTTP on loopback: what reaches the handler, what is refused.

use axum::routing::post;
use axum::{Extension, Router};

use super::*;

const SECRET: &str = "0123456789abcdef0123";

async fn serve(keys: &str) -> String {
    let keys = Keys::parse(keys).unwrap();
    // Nested, so the handler's router sees a shortened path; the signature covers the
    // path as called.
    let inner = Router::new().route(
        "/reserve",
        post(
            |Extension(SignedBy(kid)): Extension<SignedBy>, body: String| async move {
                format!("{kid}:{body}")
            },
        ),
    );
    let app = Router::new()
        .nest("/inventory", inner)
        .layer(axum::middleware::from_fn_with_state(
            Verifier::new(keys).max_body_bytes(64),
            require_signature,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

async fn call(base: &str, target: &str, body: &str, signature: Option<String>) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{base}{target}"))
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header(HEADER, signature);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn signed(keys: &str, target: &str, body: &str, at: u64) -> String {
    let keys = Keys::parse(keys).unwrap();
    sign(keys.signing_key(), at, "POST", target, body.as_bytes())
}

fn code(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["error"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_signed_call_reaches_the_handler_with_its_body_and_key_id() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = serve(&format!("k1:{SECRET}")).await;
    let target = "/inventory/reserve?gid=g1&op=try";
    let now = unix_seconds(std::time::SystemTime::now());
    let header = signed(&format!("k1:{SECRET}"), target, "{\"n\":1}", now);
    assert_eq!(
        call(&base, target, "{\"n\":1}", Some(header)).await,
        (200, "k1:{\"n\":1}".into())
    );
}

#[tokio::test]
async fn bad_signatures_are_refused_with_401_and_their_codes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = serve(&format!("k1:{SECRET}")).await;
    let target = "/inventory/reserve?gid=g1&op=try";
    let now = unix_seconds(std::time::SystemTime::now());
    let good = signed(&format!("k1:{SECRET}"), target, "{}", now);
    let cases = [
        (target, "{}", None, "signature_missing"),
        (target, "{}", Some("t=1".to_owned()), "signature_malformed"),
        (
            target,
            "{}",
            Some(signed("k2:another-secret-0000", target, "{}", now)),
            "signature_unknown_key",
        ),
        (
            target,
            "{}",
            Some(signed("k1:another-secret-0000", target, "{}", now)),
            "signature_mismatch",
        ),
        (
            target,
            "{\"n\":2}",
            Some(good.clone()),
            "signature_mismatch",
        ),
        (
            "/inventory/reserve?gid=g2&op=try",
            "{}",
            Some(good),
            "signature_mismatch",
        ),
        (
            target,
            "{}",
            Some(signed(&format!("k1:{SECRET}"), target, "{}", now - 600)),
            "signature_expired",
        ),
        (
            target,
            "{}",
            Some(signed(&format!("k1:{SECRET}"), target, "{}", now + 600)),
            "signature_expired",
        ),
    ];
    for (path, body, header, expected) in cases {
        let (status, answer) = call(&base, path, body, header.clone()).await;
        assert_eq!(status, 401, "{header:?}: {answer}");
        assert_eq!(code(&answer), expected, "{header:?}: {answer}");
    }
    let long = "x".repeat(65);
    let (status, answer) = call(&base, target, &long, None).await;
    assert_eq!((status, code(&answer).as_str()), (413, "body_too_large"));
}

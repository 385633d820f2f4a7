//! The caps on a router with a handler that holds its requests until told: what is past
//! a cap is refused at once with `503 overloaded` and `Retry-After`, in the door's body,
//! its body read and dropped; a request that ends gives its share back.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::middleware::from_fn_with_state;
use axum::routing::post;
use serde_json::Value;
use tokio::sync::Notify;
use tower::ServiceExt;

use super::*;

/// Requests that reached the handler, and what lets them finish.
#[derive(Default)]
struct Held {
    arrived: AtomicUsize,
    arrival: Notify,
    release: Notify,
}

fn app(config: InFlightConfig, held: &Arc<Held>) -> Router {
    let cap = Arc::new(InFlight::new(config));
    let handler = {
        let held = Arc::clone(held);
        move |body: Bytes| async move {
            let released = held.release.notified();
            held.arrived.fetch_add(1, Ordering::SeqCst);
            held.arrival.notify_waiters();
            released.await;
            body.len().to_string()
        }
    };
    let native = Router::new()
        .route("/native", post(handler.clone()))
        .route_layer(from_fn_with_state(Arc::clone(&cap), super::native));
    let dtm = Router::new()
        .route("/dtm", post(handler))
        .route_layer(from_fn_with_state(cap, super::dtm));
    native.merge(dtm)
}

fn post_body(path: &str, body: Body) -> Request<Body> {
    Request::post(path).body(body).unwrap()
}

/// Sends `request` in the background; the answer's status and body when it comes.
fn send(app: &Router, request: Request<Body>) -> tokio::task::JoinHandle<(StatusCode, Bytes)> {
    let app = app.clone();
    tokio::spawn(async move {
        let response = app.oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, body)
    })
}

/// Waits until `n` requests are held in the handler.
async fn until_held(held: &Held, n: usize) {
    loop {
        let arrival = held.arrival.notified();
        if held.arrived.load(Ordering::SeqCst) >= n {
            return;
        }
        arrival.await;
    }
}

async fn refused(app: &Router, request: Request<Body>) -> (Value, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry = response.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .to_owned();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (serde_json::from_slice(&body).unwrap(), retry)
}

#[tokio::test]
async fn a_request_past_the_cap_is_refused_until_one_in_flight_ends() {
    let held = Arc::new(Held::default());
    let config = InFlightConfig {
        max_requests: 2,
        ..InFlightConfig::default()
    };
    let app = app(config, &held);
    let first = send(&app, post_body("/native", Body::from("a")));
    let second = send(&app, post_body("/dtm", Body::from("b")));
    until_held(&held, 2).await;

    let (body, retry) = refused(&app, post_body("/native", Body::from("c"))).await;
    assert_eq!(retry, "1");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 requests"),
        "{body}"
    );
    // DTM's door: its envelope, without `dtm_result`.
    let (body, _) = refused(&app, post_body("/dtm", Body::from("c"))).await;
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(body.get("dtm_result").is_none() && body["message"].is_string());
    assert_eq!(
        held.arrived.load(Ordering::SeqCst),
        2,
        "refused ones never ran"
    );

    held.release.notify_waiters();
    assert_eq!(first.await.unwrap().0, StatusCode::OK);
    assert_eq!(second.await.unwrap().0, StatusCode::OK);
    let third = send(&app, post_body("/native", Body::from("d")));
    until_held(&held, 3).await;
    held.release.notify_waiters();
    assert_eq!(third.await.unwrap(), (StatusCode::OK, Bytes::from("1")));
}

#[tokio::test]
async fn bodies_count_by_their_length_against_the_byte_cap() {
    let held = Arc::new(Held::default());
    let config = InFlightConfig {
        max_requests: 100,
        max_body_bytes: MAX_BODY as u64 + 10,
    };
    let app = app(config, &held);
    let big = send(&app, post_body("/native", Body::from(vec![b' '; MAX_BODY])));
    until_held(&held, 1).await;
    // Ten bytes are left: an eleven-byte body is refused, a ten-byte one and an empty
    // one are not.
    let (body, _) = refused(&app, post_body("/native", Body::from(vec![b' '; 11]))).await;
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bytes of bodies"),
        "{body}"
    );
    let small = send(&app, post_body("/native", Body::from(vec![b' '; 10])));
    let empty = send(&app, post_body("/dtm", Body::empty()));
    until_held(&held, 3).await;
    // A body of unknown length counts as the body limit: refused while any is held.
    let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from("x"))]);
    refused(&app, post_body("/native", Body::from_stream(stream))).await;

    held.release.notify_waiters();
    for request in [big, small, empty] {
        assert_eq!(request.await.unwrap().0, StatusCode::OK);
    }
    let stream = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from("x"))]);
    let unknown = send(&app, post_body("/native", Body::from_stream(stream)));
    until_held(&held, 4).await;
    held.release.notify_waiters();
    assert_eq!(unknown.await.unwrap(), (StatusCode::OK, Bytes::from("1")));
}

/// The refused body is read to its end (so the client, still sending, gets the answer
/// instead of a reset connection), unless the client waits for `100 Continue`.
#[tokio::test]
async fn a_refused_body_is_read_and_dropped_unless_the_client_awaits_continue() {
    let held = Arc::new(Held::default());
    let config = InFlightConfig {
        max_requests: 1,
        ..InFlightConfig::default()
    };
    let app = app(config, &held);
    let holder = send(&app, post_body("/native", Body::empty()));
    until_held(&held, 1).await;

    let counted = |read: &Arc<AtomicUsize>| {
        let read = Arc::clone(read);
        let chunks = (0..64).map(move |_| {
            read.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 1_024]))
        });
        Body::from_stream(futures::stream::iter(chunks))
    };
    let read = Arc::new(AtomicUsize::new(0));
    refused(&app, post_body("/native", counted(&read))).await;
    assert_eq!(read.load(Ordering::SeqCst), 64);

    let unread = Arc::new(AtomicUsize::new(0));
    let request = Request::post("/native")
        .header(header::EXPECT, "100-continue")
        .body(counted(&unread))
        .unwrap();
    refused(&app, request).await;
    assert_eq!(unread.load(Ordering::SeqCst), 0);

    held.release.notify_waiters();
    assert_eq!(holder.await.unwrap().0, StatusCode::OK);
}

//! The client against canned answers on a loopback socket: what it sends, and what it
//! makes of answers a coordinator would not give.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

#[test]
fn urls_keep_a_path_prefix_and_escape_the_gid() {
    let c = Client::new("http://host:8686").unwrap();
    assert_eq!(
        c.transactions_url(&["g-1", "retry"]).as_str(),
        "http://host:8686/api/v1/transactions/g-1/retry"
    );
    // Behind a proxy that serves idem under a prefix.
    let c = Client::new("https://host/idem/").unwrap();
    assert_eq!(c.base_url(), "https://host/idem");
    assert_eq!(
        c.transactions_url(&["a/b?c"]).as_str(),
        "https://host/idem/api/v1/transactions/a%2Fb%3Fc"
    );
    assert_eq!(
        c.transactions_url(&[]).as_str(),
        "https://host/idem/api/v1/transactions"
    );
}

#[test]
fn base_urls_that_cannot_take_a_path_are_refused() {
    for bad in ["not a url", "mailto:x@y", "data:text/plain,x"] {
        let err = Client::new(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidUrl(_)), "{bad}: {err:?}");
    }
}
/// Answers every connection with `answer` (a whole HTTP response), once per connection;
/// sends back each request's head and body as it read them.
async fn canned(
    status: &str,
    body: &str,
) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    canned_raw(format!(
        "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ))
    .await
}

async fn canned_raw(answer: String) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (seen, requests) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            // Enough for the small requests these tests make: head and body in one go.
            while let Ok(n) = socket.read(&mut buf).await {
                request.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if body.len() >= length || n == 0 {
                        break;
                    }
                }
            }
            let _ = seen.send(String::from_utf8_lossy(&request).into_owned());
            let _ = socket.write_all(answer.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    (url, requests)
}

fn once(url: &str) -> Client {
    Client::new(url).unwrap().retry_policy(RetryPolicy {
        attempts: 1,
        ..RetryPolicy::default()
    })
}

#[tokio::test]
async fn a_success_that_is_not_the_apis_json_is_a_decode_error_with_its_status_and_body() {
    let (url, _) = canned("200 OK", "<html></html>").await;
    let err = once(&url).get("g-1").await.unwrap_err();
    let Error::Decode { status, body, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!((*status, body.as_str()), (200, "<html></html>"));
    assert!(!err.may_succeed_on_retry());
    // Unparsed, it is still not JSON.
    assert!(matches!(
        once(&url).raw().get("g-1").await,
        Err(Error::Decode { .. })
    ));
}

#[tokio::test]
async fn raw_answers_keep_fields_the_views_do_not_know() {
    let (url, mut requests) = canned("200 OK", "{\"gid\":\"g-1\",\"newer\":true}").await;
    let client = once(&url);
    let value = client.raw().get("g-1").await.unwrap();
    assert_eq!(value, json!({"gid": "g-1", "newer": true}));
    assert!(
        requests
            .recv()
            .await
            .unwrap()
            .starts_with("GET /api/v1/transactions/g-1 HTTP/1.1")
    );
    // The typed view wants its fields.
    assert!(matches!(client.get("g-1").await, Err(Error::Decode { .. })));
    requests.recv().await.unwrap();

    client.raw().abort("g-1", Some("no"), false).await.unwrap();
    let request = requests.recv().await.unwrap();
    let request = request.replace("\r\n", "\n");
    assert!(
        request.starts_with("POST /api/v1/transactions/g-1/abort HTTP/1.1"),
        "{request}"
    );
    assert!(request.ends_with("\n\n{\"reason\":\"no\"}"), "{request}");
    client.raw().retry("g-1").await.unwrap();
    assert!(requests.recv().await.unwrap().ends_with("\r\n\r\n{}"));
    client.abort("g-1", None, true).await.unwrap_err();
    assert!(
        requests
            .recv()
            .await
            .unwrap()
            .ends_with("\r\n\r\n{\"wait_result\":true}")
    );
    let query = ListQuery {
        kind: Some(Kind::Tcc),
        limit: Some(2),
        cursor: Some("a b&c".into()),
        ..ListQuery::default()
    };
    client.raw().list(&query).await.unwrap();
    assert!(
        requests
            .recv()
            .await
            .unwrap()
            .starts_with("GET /api/v1/transactions?kind=tcc&limit=2&cursor=a+b%26c HTTP/1.1")
    );
    client.raw().list(&ListQuery::default()).await.unwrap();
    assert!(
        requests
            .recv()
            .await
            .unwrap()
            .starts_with("GET /api/v1/transactions HTTP/1.1")
    );
}

#[tokio::test]
async fn an_error_page_from_something_else_keeps_its_status_and_text() {
    let (url, _) = canned("404 Not Found", "not here\n").await;
    let err = once(&url).raw().get("g").await.unwrap_err();
    assert!(!err.is_from_api());
    assert_eq!(
        err,
        Error::Api {
            status: 404,
            code: "http_404".into(),
            message: "not here\n".into()
        }
    );
}

#[tokio::test]
async fn no_answer_says_which_kind_of_failure_it_was() {
    // A port nothing listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let err = once(&format!("http://127.0.0.1:{port}"))
        .get("g")
        .await
        .unwrap_err();
    let Error::Transport(t) = &err else {
        panic!("{err:?}")
    };
    assert!(
        t.is_connect() && !t.is_timeout() && !t.while_reading_answer(),
        "{t:?}"
    );
    assert!(t.cause().contains("onnection refused"), "{t:?}");
    assert!(err.to_string().contains(t.cause()), "{err}");

    // A server that accepts and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let client = Client::with_http(&url, http)
        .unwrap()
        .retry_policy(RetryPolicy {
            attempts: 1,
            ..RetryPolicy::default()
        });
    let err = client.get("g").await.unwrap_err();
    let Error::Transport(t) = &err else {
        panic!("{err:?}")
    };
    assert!(t.is_timeout() && !t.while_reading_answer(), "{t:?}");
    drop(silent);

    // An answer whose body breaks off.
    let (url, _) =
        canned_raw("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"gid\"".into()).await;
    let err = once(&url).get("g").await.unwrap_err();
    let Error::Transport(t) = &err else {
        panic!("{err:?}")
    };
    assert!(t.while_reading_answer() && !t.is_connect(), "{t:?}");
    assert_eq!(t.answer_status(), Some(200));
}

#[tokio::test]
async fn what_may_not_have_been_applied_is_sent_again_and_the_rest_once() {
    let (url, mut requests) = canned(
        "503 Service Unavailable",
        "{\"error\":{\"code\":\"unavailable\",\"message\":\"the db\"}}",
    )
    .await;
    let client = Client::new(&url).unwrap().retry_policy(RetryPolicy {
        attempts: 3,
        first_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
    });
    let err = client.retry("g").await.unwrap_err();
    assert_eq!(err.code(), Some("unavailable"));
    for _ in 0..3 {
        requests.recv().await.unwrap();
    }
    assert!(requests.try_recv().is_err(), "three tries in all");

    let (url, mut requests) = canned(
        "409 Conflict",
        "{\"error\":{\"code\":\"invalid_state\",\"message\":\"done\"}}",
    )
    .await;
    let client = Client::new(&url).unwrap();
    assert_eq!(
        client.retry("g").await.unwrap_err().code(),
        Some("invalid_state")
    );
    requests.recv().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(requests.try_recv().is_err(), "a refusal is not sent again");
}

#[tokio::test]
async fn metrics_are_the_text_as_served() {
    let (url, mut requests) = canned("200 OK", "idem_transactions 1\n#\n").await;
    let client = once(&format!("{url}/"));
    assert_eq!(client.metrics().await.unwrap(), "idem_transactions 1\n#\n");
    assert!(
        requests
            .recv()
            .await
            .unwrap()
            .starts_with("GET /metrics HTTP/1.1")
    );
}

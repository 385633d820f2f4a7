//! What a participant answers is untrusted: a real `idem serve` process reads only the head
//! of a huge answer (its memory stays flat) and never follows a redirect.

use crate::common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::Response;
use common::{Api, Child};
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// The huge answer: 300 MB, streamed from one static chunk so that the participant
/// allocates none of it.
const BIG: u64 = 300 * 1024 * 1024;
const CHUNK: usize = 64 * 1024;
static ZEROS: [u8; CHUNK] = [0; CHUNK];

#[derive(Default)]
struct Seen {
    paths: Mutex<Vec<String>>,
    /// Bytes of huge answers the participant produced, which is at most what was read
    /// plus what the socket buffers hold.
    big_bytes: AtomicU64,
    base: Mutex<String>,
}

/// A participant: `/ok` succeeds, `/big` fails with 300 MB of NULs, `/redirect` sends a
/// 307 to `/target`, which would succeed.
struct Participant {
    base: String,
    seen: Arc<Seen>,
}

async fn handle(State(seen): State<Arc<Seen>>, uri: Uri) -> Response {
    let path = uri.path().to_owned();
    seen.paths.lock().unwrap().push(path.clone());
    let mut response = Response::builder();
    match path.as_str() {
        "/big" => {
            let produced = Arc::clone(&seen);
            let chunks = futures::stream::iter((0..BIG / CHUNK as u64).map(move |_| {
                produced
                    .big_bytes
                    .fetch_add(CHUNK as u64, Ordering::Relaxed);
                Ok::<_, Infallible>(Bytes::from_static(&ZEROS))
            }));
            response = response
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header(header::CONTENT_LENGTH, BIG);
            response.body(Body::from_stream(chunks)).unwrap()
        }
        "/redirect" => {
            let target = format!("{}/target", seen.base.lock().unwrap());
            response
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header(header::LOCATION, target)
                .body(Body::empty())
                .unwrap()
        }
        _ => response.body(Body::from("{}")).unwrap(),
    }
}

impl Participant {
    async fn start() -> Participant {
        let seen = Arc::new(Seen::default());
        let app = Router::new().fallback(handle).with_state(Arc::clone(&seen));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        *seen.base.lock().unwrap() = base.clone();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Participant { base, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn count(&self, path: &str) -> usize {
        let paths = self.seen.paths.lock().unwrap();
        paths.iter().filter(|p| *p == path).count()
    }
}

fn saga(p: &Participant, gid: &str, action: &str, attempts: u32) -> Value {
    json!({"gid": gid, "kind": "saga",
           "steps": [{"action": p.url(action), "compensate": p.url("/ok")}],
           "options": {"max_attempts": attempts}})
}

/// The history entries of the saga step's action.
fn action_history(tx: &Value) -> Vec<Value> {
    tx["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["action"] == "action")
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_huge_answer_is_read_only_up_to_the_bound_and_memory_stays_flat() {
    let db = TestDatabase::create(Backend::Sqlite, "huge_answer").await;
    let p = Participant::start().await;
    let idem = Child::serve(&db.url, "huge", &[]).await;
    let api = Api::new(idem.url.clone());
    // One ordinary transaction first, so that the client, the pools and the caches exist
    // before the baseline is taken.
    let (status, _) = api
        .post("/api/v1/transactions", saga(&p, "warm", "/ok", 2))
        .await;
    assert_eq!(status, 201);
    api.wait_status("warm", &["succeeded"], WAIT).await;
    let (rss_before, peak_before) = idem.memory_kib();

    let (status, _) = api
        .post("/api/v1/transactions", saga(&p, "huge", "/big", 2))
        .await;
    assert_eq!(status, 201);
    api.wait_status("huge", &["failed"], WAIT).await;
    let (rss_after, peak_after) = idem.memory_kib();
    let produced = p.seen.big_bytes.load(Ordering::Relaxed);
    eprintln!(
        "idem serve: VmRSS {rss_before} KiB before, {rss_after} KiB after; VmHWM (peak) \
         {peak_before} KiB before, {peak_after} KiB after; the participant produced \
         {produced} bytes for 2 answers of {BIG}"
    );

    // The peak during the two 300 MB answers, against the memory in use before them.
    let growth_kib = peak_after.saturating_sub(rss_before);
    assert!(
        growth_kib < 50 * 1024,
        "peak RSS grew by {growth_kib} KiB reading two 300 MB answers"
    );
    // The coordinator stopped reading: the participant could not even produce a tenth.
    assert_eq!(p.count("/big"), 2);
    assert!(produced < 2 * BIG / 10, "{produced} bytes were produced");

    let (_, tx) = api.get("/api/v1/transactions/huge").await;
    let history = action_history(&tx);
    assert_eq!(history.len(), 2, "{tx:#}");
    for h in &history {
        let detail = h["detail"].as_str().unwrap();
        assert_eq!(h["outcome"], "unknown", "{h}");
        // The status and the cut, none of the body (which clients would read).
        assert_eq!(
            detail, "HTTP 500 (answer over 65536 bytes, read no further)",
            "{detail}"
        );
    }
    drop(idem);
    db.drop_database().await;
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_the_call_is_unknown() {
    for db in testing::all("redirect_not_followed").await {
        let b = db.backend;
        let p = Participant::start().await;
        let idem = Child::serve(&db.url, "redirect", &[]).await;
        let api = Api::new(idem.url.clone());
        let (status, _) = api
            .post("/api/v1/transactions", saga(&p, "moved", "/redirect", 2))
            .await;
        assert_eq!(status, 201, "{b}");
        // Followed, the call would have reached /target and the saga succeeded.
        let tx = api.wait_status("moved", &["failed"], WAIT).await;
        assert_eq!((p.count("/redirect"), p.count("/target")), (2, 0), "{b}");
        let (_, tx) = api
            .get(&format!(
                "/api/v1/transactions/{}",
                tx["gid"].as_str().unwrap()
            ))
            .await;
        let history = action_history(&tx);
        assert_eq!(history.len(), 2, "{b}: {tx:#}");
        // Where it pointed is the participant's text, kept out of what clients read.
        let expected = "HTTP 307: redirect not followed";
        for h in &history {
            assert_eq!(h["outcome"], "unknown", "{b}: {h}");
            assert_eq!(h["detail"], expected, "{b}");
        }
        drop(idem);
        db.drop_database().await;
    }
}

//! idem cannot be pointed at the network behind it (issue 28, point 2), on SQLite,
//! PostgreSQL and MariaDB over real HTTP: idem's own API refused as a participant in every
//! mode (the issue's probe: a Try at `http://0.0.0.0:<idem's port>/api/v1/tokens`); with
//! tokens and no policy file, this host's, private, shared, NAT64 and metadata addresses
//! refused at registration and a name that resolves to loopback at call time; a names-only
//! entry judged on its addresses when called, and an explicit CIDR that opens loopback; a
//! participant's answer text (a 500's body, DTM's message, a redirect's target) never in
//! what a client reads, and its first bytes in the operator's debug log (SQLite only).
//!
//! Traffic goes to loopback only: refused addresses elsewhere are registered and the 400
//! expected; nothing ever calls them, and no refusal is checked by connecting.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::auth::{Setup, code, get, post, wait_status};
use idem::auth::Role;
use idem::outbound::OutboundPolicy;
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

/// A public address nobody calls: the TCCs that name it are never submitted.
const NEVER_CALLED: &str = "http://203.0.113.9/never";

fn port_of(base: &str) -> &str {
    base.rsplit(':').next().unwrap()
}

fn policy(text: &str) -> Arc<OutboundPolicy> {
    Arc::new(OutboundPolicy::parse(text).unwrap())
}

/// A 400 `url_not_allowed` whose message says `says`.
fn refused(what: &str, (status, answer): &(u16, Value), says: &str) {
    assert_eq!(
        (*status, code(answer)),
        (400, "url_not_allowed"),
        "{what}: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(says), "{what}: {message}");
}

/// The issue's probe, through the native API (a TCC branch's Try, a saga's step) and
/// DTM's door (a saga): every way of naming idem's own port on this host is refused at
/// registration, and nothing is stored. `ok`: a URL the policy allows, never called.
async fn own_api_is_refused(base: &str, token: Option<&str>, ok: &str, what: &str) {
    let port = port_of(base);
    let auth = token.map(|t| format!("Bearer {t}"));
    let call = async |method, path: &str, body| {
        common::auth::call(method, format!("{base}{path}"), auth.as_deref(), body).await
    };
    let post = async |path: &str, body: Value| call(reqwest::Method::POST, path, Some(body)).await;
    let tcc = json!({"gid": "own", "kind": "tcc"});
    assert_eq!(post("/api/v1/transactions", tcc).await.0, 201, "{what}");
    for host in [
        "0.0.0.0",
        "127.0.0.1",
        "[::]",
        "localhost",
        "[::ffff:127.0.0.1]",
        "127.0.0.2",
    ] {
        let url = format!("http://{host}:{port}/api/v1/tokens");
        let what = format!("{what}: {url}");
        let says = format!("port {port} on this host is idem's own API");
        let branch = json!({"branch_id": "01", "confirm": ok, "cancel": ok, "try": &url});
        let answer = post("/api/v1/transactions/own/branches", branch).await;
        refused(
            &what,
            &answer,
            &format!("branch 01 try is not allowed by the outbound policy: {says}"),
        );
        let saga = json!({"gid": "own-saga", "kind": "saga",
                          "steps": [{"action": &url, "compensate": ok}]});
        refused(&what, &post("/api/v1/transactions", saga).await, &says);
        let dtm = json!({"gid": "own-dtm", "trans_type": "saga", "payloads": ["{}"],
                         "steps": [{"action": ok, "compensate": &url}]});
        refused(&what, &post("/api/dtmsvr/submit", dtm).await, &says);
    }
    let (_, tx) = call(reqwest::Method::GET, "/api/v1/transactions/own", None).await;
    assert_eq!(tx["branches"], json!([]), "{what}: {tx}");
    for gid in ["own-saga", "own-dtm"] {
        let path = format!("/api/v1/transactions/{gid}");
        assert_eq!(
            call(reqwest::Method::GET, &path, None).await.0,
            404,
            "{what}"
        );
    }
}

#[tokio::test]
async fn idems_own_api_is_refused_as_a_participant_in_every_mode() {
    for db in testing::all("reach_own_api").await {
        let (backend, b) = (db.backend, db.backend.name());
        // Tokens: the built-in entry, and a file that opens loopback (never idem's port).
        let s = Setup::with(db, |c| c.outbound_policy = Arc::default()).await;
        let token = s.token("acme", Role::Client).await;
        let what = format!("{b} tokens");
        own_api_is_refused(&s.server.url(), Some(&token), NEVER_CALLED, &what).await;
        s.finish().await;
        let s = Setup::new(another(backend).await, |_| {}).await;
        let token = s.token("acme", Role::Client).await;
        let what = format!("{b} tokens, loopback allowed");
        let ok = s.recorder.url("/never");
        own_api_is_refused(&s.server.url(), Some(&token), &ok, &what).await;
        s.finish().await;
        let db = another(backend).await;
        // No tokens on loopback, the quick start: loopback participants stay allowed, the
        // API's own port does not.
        let server = common::coordinator(&db.url).await;
        let what = format!("{b} no tokens");
        own_api_is_refused(&server.url(), None, NEVER_CALLED, &what).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// A second database on the backend a test runs on, for its next coordinator.
async fn another(backend: Backend) -> TestDatabase {
    TestDatabase::create(backend, "outbound_reach").await
}

#[tokio::test]
async fn with_tokens_and_no_policy_only_public_addresses_are_registered() {
    for db in testing::all("reach_default_deny").await {
        let b = db.backend.name();
        let s = Setup::with(db, |c| c.outbound_policy = Arc::default()).await;
        let acme = s.token("acme", Role::Client).await;
        let here = port_of(&s.recorder.base).to_owned();
        for (i, (url, says)) in [
            (
                format!("http://127.0.0.1:{here}/ok"),
                "is loopback (127.0.0.0/8)",
            ),
            (
                format!("http://0.0.0.0:{here}/ok"),
                "is this host's network (0.0.0.0/8)",
            ),
            (format!("http://[::1]:{here}/ok"), "is loopback (::1/128)"),
            (format!("http://[::]:{here}/ok"), "is unspecified (::/128)"),
            (
                format!("http://[::ffff:127.0.0.1]:{here}/ok"),
                "address 127.0.0.1 is loopback",
            ),
            (
                format!("http://[2002:7f00:1::]:{here}/ok"),
                "carries 127.0.0.1, which is loopback",
            ),
            ("http://10.0.0.1/".into(), "is private (10.0.0.0/8)"),
            (
                "http://192.168.1.1:8080/".into(),
                "is private (192.168.0.0/16)",
            ),
            (
                "http://100.64.0.1/".into(),
                "is shared address space (CGNAT)",
            ),
            ("http://[fd00::1]/".into(), "is unique local (fc00::/7)"),
            ("http://[64:ff9b::7f00:1]/".into(), "carries 127.0.0.1"),
            ("http://[64:ff9b::cb00:7109]/".into(), "is NAT64"),
            (
                "http://169.254.170.2/v2/credentials".into(),
                "is a cloud metadata address",
            ),
            (
                "http://[fd20:ce::254]/".into(),
                "is a cloud metadata address",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let gid = format!("deny-{i}");
            let saga = json!({"gid": &gid, "kind": "saga",
                              "steps": [{"action": &url, "compensate": NEVER_CALLED}]});
            let answer = post(&s, "/api/v1/transactions", Some(&acme), saga).await;
            refused(&format!("{b} {url}"), &answer, says);
            let path = format!("/api/v1/transactions/{gid}");
            assert_eq!(get(&s, &path, Some(&acme)).await.0, 404, "{b}: {url}");
        }
        // A name passes registration; what it resolves to (loopback) is refused when
        // called.
        localhost_is_refused_when_called(&s, &acme, b).await;
        s.finish().await;
    }
}

/// A saga on `http://localhost:<the recorder's port>` registers, and every call is refused
/// by the policy before any connection: the saga stalls, the recorder sees nothing, and
/// each attempt says why without the addresses `localhost` resolved to.
async fn localhost_is_refused_when_called(s: &Setup, token: &str, b: &str) {
    let url = format!("http://localhost:{}/ok", port_of(&s.recorder.base));
    let saga = json!({"gid": "by-name", "kind": "saga", "options": {"max_attempts": 2},
                      "steps": [{"action": &url, "compensate": &url}]});
    let (status, answer) = post(s, "/api/v1/transactions", Some(token), saga).await;
    assert_eq!(status, 201, "{b}: {answer}");
    let tx = wait_status(s, token, "by-name", "stalled").await;
    let history = tx["history"].as_array().unwrap();
    assert!(!history.is_empty(), "{b}: {tx:#}");
    for attempt in history {
        let detail = attempt["detail"].as_str().unwrap();
        let says = "outbound_denied: host localhost: none of its addresses is allowed";
        assert!(detail.starts_with(says), "{b}: {detail}");
        assert!(!detail.contains("127.0.0.1"), "{b}: {detail}");
    }
    let calls = s.recorder.calls();
    assert!(calls.is_empty(), "{b}: {calls:?}");
}

#[tokio::test]
async fn a_names_only_entry_is_judged_on_its_addresses_and_a_cidr_opens_them() {
    for db in testing::all("reach_names_only").await {
        let (backend, b) = (db.backend, db.backend.name());
        let names_only = policy("[default]\nhosts = [\"localhost\"]\n");
        let s = Setup::with(db, |c| c.outbound_policy = names_only).await;
        let acme = s.token("acme", Role::Client).await;
        localhost_is_refused_when_called(&s, &acme, b).await;
        s.finish().await;

        // The operator opens loopback on purpose: a CIDR inside it.
        let opened =
            policy("[default]\nhosts = [\"localhost\"]\ncidrs = [\"127.0.0.0/8\", \"::1\"]\n");
        let s = Setup::with(another(backend).await, |c| c.outbound_policy = opened).await;
        let acme = s.token("acme", Role::Client).await;
        let url = format!("http://localhost:{}/ok", port_of(&s.recorder.base));
        let saga = json!({"gid": "n2", "kind": "saga",
                          "steps": [{"action": &url, "compensate": &url}]});
        let (status, answer) = post(&s, "/api/v1/transactions", Some(&acme), saga).await;
        assert_eq!(status, 201, "{b}: {answer}");
        wait_status(&s, &acme, "n2", "succeeded").await;
        assert_eq!(s.recorder.count("n2", "/ok"), 1, "{b}");
        s.finish().await;
    }
}

const SECRET: &str = "s3cret-db-password";

/// A participant that answers every call with a redirect to `location`.
async fn redirecting(location: String) -> String {
    let app = axum::Router::new().fallback(move || {
        let location = location.clone();
        async move {
            (
                axum::http::StatusCode::FOUND,
                [(axum::http::header::LOCATION, location)],
            )
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

/// Fails if `text` shows the participant's secret or where it redirected (idem's own API).
fn assert_hidden(what: &str, text: &str) {
    for hidden in [SECRET, "/api/v1/tokens"] {
        assert!(!text.contains(hidden), "{what} shows {hidden:?}: {text}");
    }
}

#[tokio::test]
async fn a_participants_answer_never_reaches_the_client() {
    for db in testing::all("reach_answers").await {
        let b = db.backend.name();
        let s = Setup::new(db, |_| {}).await;
        let acme = s.token("acme", Role::Client).await;
        let p = &s.recorder;
        let secret = format!("{{\"error\":\"internal\",\"dsn\":\"postgres://app:{SECRET}@db\"}}");
        p.answer_body("/try", 1, 500, &secret);
        p.answer_body("/action", 10, 500, &secret);
        let dtm_failure = format!("{{\"dtm_result\":\"FAILURE\",\"message\":\"{SECRET}\"}}");
        p.answer_body("/dtm-action", 10, 200, &dtm_failure);

        // The issue's probe, its answer part: the Try's error is the status, not the body.
        let tcc = json!({"gid": "t", "kind": "tcc"});
        assert_eq!(
            post(&s, "/api/v1/transactions", Some(&acme), tcc).await.0,
            201
        );
        let branch = json!({"branch_id": "01", "try": p.url("/try"),
                            "confirm": p.url("/c"), "cancel": p.url("/x")});
        let (status, answer) =
            post(&s, "/api/v1/transactions/t/branches", Some(&acme), branch).await;
        assert_eq!(
            (status, code(&answer)),
            (502, "try_unknown"),
            "{b}: {answer}"
        );
        assert_eq!(answer["error"]["message"], "HTTP 500", "{b}: {answer}");
        assert_eq!(answer["try"]["detail"], "HTTP 500", "{b}: {answer}");
        assert_hidden("the Try's answer", &answer.to_string());

        // A saga step that answers 500, one that answers 302 to idem's own API (not
        // followed), and a DTM step whose FAILURE carries a message.
        let own = format!("{}/api/v1/tokens", s.server.url());
        let moved = redirecting(own).await;
        let saga = json!({"gid": "s", "kind": "saga", "options": {"max_attempts": 2},
                          "steps": [{"action": p.url("/action"), "compensate": p.url("/undo")}]});
        assert_eq!(
            post(&s, "/api/v1/transactions", Some(&acme), saga).await.0,
            201
        );
        let to_idem = json!({"gid": "r", "kind": "saga", "options": {"max_attempts": 2},
                             "steps": [{"action": format!("{moved}/elsewhere"), "compensate": p.url("/undo")}]});
        assert_eq!(
            post(&s, "/api/v1/transactions", Some(&acme), to_idem)
                .await
                .0,
            201
        );
        let dtm = json!({"gid": "d", "trans_type": "saga", "payloads": ["{}"],
                         "steps": [{"action": p.url("/dtm-action"), "compensate": p.url("/undo")}]});
        assert_eq!(
            post(&s, "/api/dtmsvr/submit", Some(&acme), dtm).await.0,
            200
        );
        for (gid, detail) in [
            ("s", "HTTP 500"),
            ("r", "HTTP 302: redirect not followed"),
            ("d", "HTTP 200: FAILURE"),
        ] {
            let tx = wait_status(&s, &acme, gid, "failed").await;
            let history = tx["history"].as_array().unwrap();
            assert!(!history.is_empty(), "{b}: {tx:#}");
            for attempt in history {
                assert_eq!(attempt["detail"], detail, "{b} {gid}: {attempt}");
            }
            assert_hidden(&format!("{b}: {gid}"), &tx.to_string());
            let (_, query) = get(&s, &format!("/api/dtmsvr/query?gid={gid}"), Some(&acme)).await;
            assert_eq!(query["transaction"]["gid"], gid, "{b}: {query}");
            assert_hidden(&format!("{b}: DTM's query of {gid}"), &query.to_string());
        }
        let (_, tx) = get(&s, "/api/v1/transactions/t", Some(&acme)).await;
        assert_hidden(&format!("{b}: the TCC"), &tx.to_string());
        let (_, listed) = get(&s, "/api/v1/transactions", Some(&acme)).await;
        assert_hidden(&format!("{b}: the list"), &listed.to_string());
        let (_, all) = get(&s, "/api/dtmsvr/all", Some(&acme)).await;
        assert_hidden(&format!("{b}: DTM's all"), &all.to_string());
        s.finish().await;
    }
}

/// Log lines written by this test's thread.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What clients do not see, the operator does: the answer's first bytes in the debug log
/// of `idem::transport`, bounded. Logging is not storage: SQLite only.
#[tokio::test]
async fn the_operators_debug_log_has_the_answers_first_bytes() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("idem::transport=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    // A current-thread runtime: the coordinator's calls run on this thread, under it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let db = TestDatabase::create(Backend::Sqlite, "reach_log").await;
    let server = common::coordinator(&db.url).await;
    let p = common::recorder::Recorder::start().await;
    let body = format!("visible-to-operators {} past-the-bound", "x".repeat(400));
    p.answer_body("/action", 10, 500, &body);
    let api = common::Api::new(server.url());
    let saga = json!({"gid": "logged", "kind": "saga", "options": {"max_attempts": 1},
                      "steps": [{"action": p.url("/action"), "compensate": p.url("/undo")}]});
    assert_eq!(api.post("/api/v1/transactions", saga).await.0, 201);
    let tx = api
        .wait_status("logged", &["failed"], Duration::from_secs(30))
        .await;
    assert!(!tx.to_string().contains("visible-to-operators"), "{tx}");
    let logged = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("visible-to-operators"))
        .unwrap_or_else(|| panic!("no answer in the debug log: {logged}"));
    assert!(
        line.contains("gid=\"logged\"") && line.contains("status=500"),
        "{line}"
    );
    assert!(
        !line.contains("past-the-bound"),
        "the log line is not bounded: {line}"
    );
    server.stop().await.unwrap();
    db.drop_database().await;
}

//! The outbound policy and userinfo redaction, on SQLite, PostgreSQL and MariaDB: URLs
//! refused at registration through both doors (nothing stored), the always-denied
//! metadata address without any policy, host-suffix, port and scheme rules, the
//! call-time check of resolved addresses (DNS rebinding) and of a policy tightened after
//! registration, allowed loopback calls, and `user:password@` shown as `***@` in every
//! view while the participant still gets its Basic credentials.
//!
//! Traffic goes to loopback only: a refused remote URL is registered and the 400 is
//! expected there; nothing ever calls it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::Api;
use common::recorder::Recorder;
use idem::outbound::OutboundPolicy;
use idem::server::{RunningServer, ServerConfig};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

/// One backend's coordinator with `policy` (`None`: no file), its two doors and a
/// participant.
struct Doors {
    server: RunningServer,
    native: Api,
    dtm: Api,
    p: Recorder,
    b: &'static str,
}

fn with_policy(policy: Option<&str>) -> impl Fn(&mut ServerConfig) + Clone {
    let policy = policy.map(|text| Arc::new(OutboundPolicy::parse(text).expect("a valid policy")));
    move |config: &mut ServerConfig| {
        if let Some(policy) = &policy {
            config.outbound_policy = Arc::clone(policy);
        }
        // A prepared TCC in these tests must not time out (and be cancelled) mid-test.
        config.engine.prepared_timeout_ms = 600_000;
    }
}

async fn each_backend<F, Fut>(test: &str, policy: Option<&str>, body: F)
where
    F: Fn(Doors, String) -> Fut,
    Fut: std::future::Future<Output = RunningServer>,
{
    for db in idem_participant::testing::all(test).await {
        let server = common::coordinator_with(&db.url, with_policy(policy)).await;
        let doors = Doors {
            native: Api::new(server.url()),
            dtm: Api::new(format!("{}/api/dtmsvr", server.url())),
            p: Recorder::start().await,
            b: db.backend.name(),
            server,
        };
        let server = body(doors, db.url.clone()).await;
        server.stop().await.unwrap();
        db.drop_database().await;
    }
}

/// A 400 `url_not_allowed` whose message says `says`.
fn refused(what: &str, (status, answer): (u16, Value), says: &str) {
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (400, Some("url_not_allowed")),
        "{what}: {answer}"
    );
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(says), "{what}: {message}");
    assert!(answer.get("dtm_result").is_none(), "{what}: {answer}");
}

async fn assert_absent(d: &Doors, gid: &str) {
    let (status, answer) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
    assert_eq!(status, 404, "{}: {gid} was stored: {answer}", d.b);
}

fn saga(gid: &str, action: &str, compensate: &str) -> Value {
    json!({
        "gid": gid,
        "kind": "saga",
        "steps": [{"action": action, "compensate": compensate, "payload": {"n": 1}}],
        "options": {"max_attempts": 2},
    })
}

fn dtm_saga(gid: &str, action: &str, compensate: &str) -> Value {
    json!({
        "gid": gid,
        "trans_type": "saga",
        "steps": [{"action": action, "compensate": compensate}],
        "payloads": ["{}"],
    })
}

fn tcc(gid: &str, confirm: &str, cancel: &str) -> Value {
    json!({
        "gid": gid,
        "kind": "tcc",
        "branches": [{"branch_id": "01", "confirm": confirm, "cancel": cancel}],
    })
}

const LOOPBACK_ONLY: &str = "[default]\ncidrs = [\"127.0.0.0/8\"]\n";
/// A public address outside the policy's CIDRs (TEST-NET-3: nothing ever calls it).
const REMOTE: &str = "http://203.0.113.9:9/x";

#[tokio::test]
async fn a_remote_address_is_refused_at_registration_through_both_doors() {
    each_backend("outbound_remote", Some(LOOPBACK_ONLY), |d, _| async move {
        let b = d.b;
        let ok = d.p.url("/ok");
        let says = "address 203.0.113.9 is not in [default] cidrs";
        let native = d.native.post("/api/v1/transactions", saga("n1", REMOTE, &ok)).await;
        refused(b, native, &format!("steps[0].action is not allowed by the outbound policy: {says}"));
        assert_absent(&d, "n1").await;
        let native = d.native.post("/api/v1/transactions", saga("n2", &ok, REMOTE)).await;
        refused(b, native, "steps[0].compensate");
        assert_absent(&d, "n2").await;
        let native = d.native.post("/api/v1/transactions", tcc("n3", &ok, REMOTE)).await;
        refused(b, native, "branch 01 cancel");
        assert_absent(&d, "n3").await;
        let msg = json!({"gid": "n4", "kind": "msg", "steps": [{"action": &ok}], "query_prepared": REMOTE});
        refused(b, d.native.post("/api/v1/transactions", msg).await, "query_prepared");
        assert_absent(&d, "n4").await;

        // A branch registered later: refused, and the transaction keeps only its own.
        let (status, _) = d.native.post("/api/v1/transactions", tcc("n5", &ok, &ok)).await;
        assert_eq!(status, 201, "{b}");
        let late = json!({"branch_id": "02", "confirm": &ok, "cancel": &ok, "try": REMOTE});
        let answer = d.native.post("/api/v1/transactions/n5/branches", late).await;
        refused(b, answer, "branch 02 try");
        let (_, tx) = d.native.get("/api/v1/transactions/n5").await;
        let ids: Vec<&str> = tx["branches"].as_array().unwrap().iter().map(|b| b["branch_id"].as_str().unwrap()).collect();
        assert_eq!(ids, ["01", "01"], "{b}: {tx}");

        // DTM's door: submit, prepare, registerBranch.
        refused(b, d.dtm.post("/submit", dtm_saga("d1", REMOTE, &ok)).await, says);
        assert_absent(&d, "d1").await;
        let prepare = json!({"gid": "d2", "trans_type": "msg", "steps": [{"action": REMOTE}], "payloads": ["{}"]});
        refused(b, d.dtm.post("/prepare", prepare).await, "steps[0].action");
        assert_absent(&d, "d2").await;
        let (status, _) = d.dtm.post("/prepare", json!({"gid": "d3", "trans_type": "tcc"})).await;
        assert_eq!(status, 200, "{b}");
        let branch = json!({"gid": "d3", "branch_id": "01", "trans_type": "tcc", "confirm": REMOTE, "cancel": &ok, "data": "{}"});
        refused(b, d.dtm.post("/registerBranch", branch).await, "branch 01 confirm");
        let (_, tx) = d.native.get("/api/v1/transactions/d3").await;
        assert_eq!(tx["branches"], json!([]), "{b}: {tx}");
        let (_, query) = d.dtm.get("/query?gid=d1").await;
        assert_eq!(query["transaction"], Value::Null, "{b}");
        assert!(d.p.calls().is_empty(), "{b}: nothing was called");
        d.server
    })
    .await;
}

#[tokio::test]
async fn the_metadata_address_is_refused_without_any_policy() {
    each_backend("outbound_metadata", None, |d, _| async move {
        let b = d.b;
        let ok = d.p.url("/ok");
        let metadata = "http://169.254.169.254/latest/meta-data/iam";
        let says = "address 169.254.169.254 is a cloud metadata address";
        refused(
            b,
            d.native
                .post("/api/v1/transactions", saga("m1", metadata, &ok))
                .await,
            says,
        );
        assert_absent(&d, "m1").await;
        refused(
            b,
            d.dtm.post("/submit", dtm_saga("m2", &ok, metadata)).await,
            says,
        );
        assert_absent(&d, "m2").await;
        let named = saga(
            "m3",
            "http://metadata.google.internal/computeMetadata/v1/",
            &ok,
        );
        refused(
            b,
            d.native.post("/api/v1/transactions", named).await,
            "metadata service",
        );
        assert_absent(&d, "m3").await;
        // A public address stays allowed without a policy (and, with --auth none on
        // loopback, this host's and private ones: tests/it/outbound_reach.rs has tokens).
        let (status, tx) = d
            .native
            .post("/api/v1/transactions", tcc("m4", &ok, REMOTE))
            .await;
        assert_eq!(status, 201, "{b}: {tx}");
        d.server
    })
    .await;
}

#[tokio::test]
async fn host_suffix_port_and_scheme_rules() {
    // Only what the participant is: http on localhost, on its port.
    let p = Recorder::start().await;
    let port = p.base.rsplit(':').next().unwrap().to_owned();
    let policy = format!(
        "[default]\nschemes = [\"http\"]\nhosts = [\"localhost\"]\n\
         host_suffixes = [\".svc.cluster.local\"]\nports = [{port}]\ncidrs = [\"127.0.0.0/8\"]\n"
    );
    let (p, port) = (&p, port.as_str());
    each_backend("outbound_rules", Some(&policy), |d, _| async move {
        let b = d.b;
        let here = format!("http://localhost:{port}");
        let ok = format!("{here}/ok");
        // Registered, not called: the TCC waits for a submit the test never sends.
        let suffixed = format!("http://orders.shop.svc.cluster.local:{port}/x");
        let (status, tx) = d.native.post("/api/v1/transactions", tcc("r1", &suffixed, &ok)).await;
        assert_eq!(status, 201, "{b}: {tx}");
        for (gid, url, says) in [
            ("r2", format!("http://orders.example.com:{port}/x"), "host orders.example.com is not in [default] hosts and ends with none of its host_suffixes".to_owned()),
            ("r3", format!("http://evilsvc.cluster.local:{port}/x"), "host evilsvc.cluster.local is not in [default] hosts".to_owned()),
            ("r4", "http://localhost:1/x".to_owned(), format!("port 1 is not in [default] ports [{port}]")),
            ("r5", "http://localhost/x".to_owned(), format!("port 80 is not in [default] ports [{port}]")),
            ("r6", format!("https://localhost:{port}/x"), "scheme https is not in [default] schemes [\"http\"]".to_owned()),
            ("r7", format!("http://10.0.0.1:{port}/x"), "address 10.0.0.1 is private (10.0.0.0/8), denied unless [default] cidrs lists a network inside 10.0.0.0/8".to_owned()),
        ] {
            refused(&format!("{b} {url}"), d.native.post("/api/v1/transactions", saga(gid, &url, &ok)).await, &says);
            assert_absent(&d, gid).await;
            refused(&format!("{b} {url}"), d.dtm.post("/submit", dtm_saga(gid, &ok, &url)).await, &says);
            assert_absent(&d, gid).await;
        }
        // The allowed URL is called.
        // (One participant serves every backend's run: a gid per backend.)
        let gid = format!("r8-{b}");
        let (status, _) = d.native.post("/api/v1/transactions", saga(&gid, &ok, &ok)).await;
        assert_eq!(status, 201, "{b}");
        d.native.wait_status(&gid, &["succeeded"], WAIT).await;
        assert_eq!(p.count(&gid, "/ok"), 1, "{b}");
        d.server
    })
    .await;
}

/// The branch views of a transaction, by action.
fn branch<'a>(tx: &'a Value, action: &str) -> &'a Value {
    tx["branches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["action"] == action)
        .unwrap_or_else(|| panic!("no {action} branch: {tx}"))
}

/// Waits until the saga ends (it cannot succeed) and checks that every call was refused
/// before any connection: the participant saw nothing, and the branch's last error and
/// each attempt's detail say why.
async fn assert_refused_at_call_time(d: &Doors, gid: &str, says: &str) {
    let b = d.b;
    let tx = d
        .native
        .wait_status(gid, &["stalled", "failed"], WAIT)
        .await;
    let (_, tx) = d
        .native
        .get(&format!(
            "/api/v1/transactions/{}",
            tx["gid"].as_str().unwrap()
        ))
        .await;
    let action = branch(&tx, "action");
    // The core says the attempts ran out before the last answer's detail.
    let error = action["last_error"].as_str().unwrap_or("");
    assert!(
        error.starts_with("exhausted 2 attempts: outbound_denied: "),
        "{b}: {tx:#}"
    );
    assert!(error.contains(says), "{b}: {error}");
    let history = tx["history"].as_array().unwrap();
    assert!(!history.is_empty(), "{b}: {tx:#}");
    for attempt in history {
        assert_eq!(attempt["outcome"], "unknown", "{b}: {attempt}");
        let detail = attempt["detail"].as_str().unwrap();
        assert!(detail.starts_with("outbound_denied: "), "{b}: {detail}");
    }
    assert!(
        d.p.calls().is_empty(),
        "{b}: the participant was called: {:?}",
        d.p.calls()
    );
}

#[tokio::test]
async fn a_name_resolving_outside_the_cidrs_is_refused_at_call_time() {
    // DNS rebinding in one step: `localhost` passes by name, and what it resolves to now
    // (loopback) is outside the only network the policy lists.
    let policy = "[default]\nhosts = [\"localhost\"]\ncidrs = [\"10.0.0.0/8\"]\n";
    each_backend("outbound_rebinding", Some(policy), |d, _| async move {
        let port = d.p.base.rsplit(':').next().unwrap().to_owned();
        let url = format!("http://localhost:{port}/x");
        let (status, tx) = d
            .native
            .post("/api/v1/transactions", saga("rb1", &url, &url))
            .await;
        assert_eq!(status, 201, "{}: registration passes: {tx}", d.b);
        assert_refused_at_call_time(&d, "rb1", "host localhost: none of its addresses").await;
        // The must-succeed compensation was refused the same way, so it stalled.
        let (_, tx) = d.native.get("/api/v1/transactions/rb1").await;
        assert_eq!(tx["status"], "stalled", "{}: {tx:#}", d.b);
        let compensate = branch(&tx, "compensate");
        assert!(
            compensate["last_error"]
                .as_str()
                .unwrap()
                .starts_with("outbound_denied: "),
            "{}: {tx:#}",
            d.b
        );
        d.server
    })
    .await;
}

#[tokio::test]
async fn a_policy_tightened_after_registration_refuses_the_call() {
    // Registered under one coordinator without a policy; driven by one whose policy no
    // longer allows the address: the IP literal is checked before the call too.
    for db in idem_participant::testing::all("outbound_tightened").await {
        let p = Recorder::start().await;
        let b = db.backend.name();
        let first = common::coordinator_with(&db.url, with_policy(None)).await;
        let api = Api::new(first.url());
        let (status, _) = api
            .post(
                "/api/v1/transactions",
                tcc("t1", &p.url("/c"), &p.url("/x")),
            )
            .await;
        assert_eq!(status, 201, "{b}");
        first.stop().await.unwrap();
        let second = common::coordinator_with(
            &db.url,
            with_policy(Some("[default]\ncidrs = [\"10.0.0.0/8\"]\n")),
        )
        .await;
        let d = Doors {
            native: Api::new(second.url()),
            dtm: Api::new(format!("{}/api/dtmsvr", second.url())),
            p,
            b,
            server: second,
        };
        let (status, tx) = d
            .native
            .post("/api/v1/transactions/t1/submit", json!({}))
            .await;
        assert_eq!(status, 200, "{b}: {tx}");
        let tx = d.native.wait_status("t1", &["stalled"], WAIT).await;
        let confirm = branch(&tx, "confirm");
        let error = confirm["last_error"].as_str().unwrap();
        assert!(
            error.starts_with("outbound_denied: address 127.0.0.1 is loopback (127.0.0.0/8)"),
            "{b}: {error}"
        );
        assert!(d.p.calls().is_empty(), "{b}: the participant was called");
        d.server.stop().await.unwrap();
        db.drop_database().await;
    }
}

#[tokio::test]
async fn allowed_loopback_urls_are_called() {
    each_backend("outbound_allowed", Some(LOOPBACK_ONLY), |d, _| async move {
        let b = d.b;
        let port = d.p.base.rsplit(':').next().unwrap().to_owned();
        // By address, and by a name that resolves to 127.0.0.1 (and ::1, dropped).
        for (gid, base) in [
            ("a1", d.p.base.clone()),
            ("a2", format!("http://localhost:{port}")),
        ] {
            let url = format!("{base}/ok");
            let (status, _) = d
                .native
                .post("/api/v1/transactions", saga(gid, &url, &url))
                .await;
            assert_eq!(status, 201, "{b}");
            d.native.wait_status(gid, &["succeeded"], WAIT).await;
            assert_eq!(d.p.count(gid, "/ok"), 1, "{b} {gid}");
        }
        let mut dtm = dtm_saga("a3", &d.p.url("/ok"), &d.p.url("/ok"));
        dtm["wait_result"] = json!(true);
        let (status, answer) = d.dtm.post("/submit", dtm).await;
        assert_eq!(
            (status, &answer["dtm_result"]),
            (200, &json!("SUCCESS")),
            "{b}: {answer}"
        );
        d.server
    })
    .await;
}

/// A participant that answers every call with a redirect to a URL with credentials.
async fn redirecting() -> String {
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::TEMPORARY_REDIRECT,
            [(
                axum::http::header::LOCATION,
                "http://k:hidden@127.0.0.1:1/y",
            )],
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("127.0.0.1:{}", addr.port())
}

/// Fails if `text` holds a credential of the test's URLs.
fn assert_no_secret(what: &str, text: &str) {
    for secret in ["secret", "hidden", "user:", "k:"] {
        assert!(!text.contains(secret), "{what} shows {secret:?}: {text}");
    }
}

#[tokio::test]
async fn userinfo_is_redacted_in_every_view_and_still_sent() {
    each_backend("outbound_userinfo", None, |d, db_url| async move {
        let b = d.b;
        let here = d.p.base.trim_start_matches("http://").to_owned();
        let moved = redirecting().await;
        let with = |host: &str, path: &str| format!("http://user:secret@{host}{path}");
        let body = json!({
            "gid": "u1",
            "kind": "saga",
            "steps": [
                {"action": with(&here, "/ok"), "compensate": with(&here, "/undo")},
                {"action": format!("http://k:hidden@{moved}/moved"), "compensate": with(&here, "/undo2")},
            ],
            "options": {"max_attempts": 2},
        });
        let (status, created) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(status, 201, "{b}: {created}");
        assert_no_secret("the create answer", &created.to_string());
        d.native.wait_status("u1", &["failed"], WAIT).await;

        // The participant got the credentials, as Basic auth.
        let ok = d.p.calls().into_iter().find(|c| c.path == "/ok").expect("the step was called");
        assert_eq!(ok.authorization.as_deref(), Some("Basic dXNlcjpzZWNyZXQ="), "{b}");

        let (_, shown) = d.native.get("/api/v1/transactions/u1").await;
        assert_no_secret("show", &shown.to_string());
        assert_eq!(branch(&shown, "action")["url"], format!("http://***@{here}/ok"), "{b}");
        let redirected = shown["history"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["branch_id"] == "02")
            .unwrap_or_else(|| panic!("{b}: no attempt of step 2: {shown:#}"));
        // Where it redirected is the participant's text: not shown at all.
        assert_eq!(redirected["detail"], "HTTP 307: redirect not followed", "{b}");
        let (_, listed) = d.native.get("/api/v1/transactions").await;
        assert_no_secret("list", &listed.to_string());
        let (_, query) = d.dtm.get("/query?gid=u1").await;
        assert_no_secret("DTM query", &query.to_string());
        assert_eq!(query["transaction"]["steps"][0]["action"], format!("http://***@{here}/ok"), "{b}");
        let (_, all) = d.dtm.get("/all").await;
        assert_no_secret("DTM all", &all.to_string());
        assert_eq!(all["transactions"][0]["gid"], "u1", "{b}: {all}");

        // `idem tx show` through the API and on the database.
        let server = d.server.url();
        // Off the runtime's thread: this coordinator answers the command from it.
        let cli = |args: Vec<String>| async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                common::idem_cli(&args)
            })
            .await
            .unwrap()
        };
        let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let through = cli(args(&["tx", "show", "--server", &server, "u1"])).await;
        assert_no_secret("idem tx show", &through);
        assert!(through.contains("***@"), "{b}: {through}");
        let direct = cli(args(&["tx", "show", "--database-url", &db_url, "u1", "--json"])).await;
        assert_no_secret("idem tx show --database-url", &direct);
        assert!(direct.contains("***@"), "{b}: {direct}");
        d.server
    })
    .await;
}

#[test]
fn serve_refuses_a_bad_policy_file_and_names_the_key() {
    let dir = std::env::temp_dir().join(format!("idem-outbound-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbound.toml");
    std::fs::write(
        &file,
        "[default]
cidrs = [\"127.0.0.0/8\"]
hots = [\"h\"]
",
    )
    .unwrap();
    let database = format!("sqlite:{}?mode=rwc", dir.join("idem.db").display());
    let out = common::idem_run(
        &[
            "serve",
            "--database-url",
            &database,
            "--listen",
            "127.0.0.1:0",
            "--outbound-policy",
            file.to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("invalid outbound policy"), "{stderr}");
    assert!(
        stderr.contains("line 3 (`hots = [\"h\"]`): unknown field `hots`"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

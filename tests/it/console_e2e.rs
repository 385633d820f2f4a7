//! The console in a real headless Chromium: an operator signs in with a token, finds a
//! stalled transaction, reads its failed calls, retries it after the participant healed and
//! sees it succeed without reloading; a client-role token is offered no operator actions.
//! An operator retries every stalled transaction of the filtered list at once, after a dry
//! run that lists them; a client is offered no bulk action.
//! On SQLite: the console only calls the API, whose behaviour the other tests check on every
//! backend.
//!
//! Needs /usr/bin/chromium and /usr/bin/chromedriver (`scripts/test` installs them); without
//! them it fails with the reason. `IDEM_CONSOLE_SCREENSHOTS=1` also writes
//! docs/console-overview.png and docs/console-detail.png.

mod browser;
use crate::common;

use std::time::Duration;

use common::auth::{Setup, code, get, post, wait_status};
use idem::auth::Role;
use idem_participant::Backend;
use idem_participant::testing::TestDatabase;
use serde_json::{Value, json};

use browser::Browser;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
/// Never visited: the test reads the link only.
const TRACE_URL: &str = "http://127.0.0.1:9/trace/{trace_id}";

fn tcc(s: &Setup, gid: &str) -> Value {
    json!({"gid": gid, "kind": "tcc", "branches": [{
        "branch_id": "a",
        "confirm": s.recorder.url("/a/confirm"),
        "cancel": s.recorder.url("/a/cancel"),
        "payload": {"sku": "book-42", "quantity": 2},
    }]})
}

async fn post_traced(s: &Setup, path: &str, token: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", s.server.url()))
        .bearer_auth(token)
        .header("traceparent", format!("00-{TRACE_ID}-00f067aa0ba902b7-01"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// A TCC whose Confirm keeps failing on a coordinator that tries twice: it stalls.
async fn stalled(s: &Setup, token: &str, gid: &str) {
    s.recorder.answer("/a/confirm", Some(gid), 1_000, 500);
    let (status, body) = post_traced(s, "/api/v1/transactions", token, tcc(s, gid)).await;
    assert_eq!(status, 201, "{body}");
    let submit = format!("/api/v1/transactions/{gid}/submit");
    let (status, body) = post_traced(s, &submit, token, json!({"wait_result": true})).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("stalled")),
        "{body}"
    );
}

/// The coordinator's own console: open (no token), under a CSP that refuses inline scripts
/// and styles, so the page works only if the console has none.
async fn console_url(api: &str) -> String {
    let index = reqwest::get(format!("{api}/ui")).await.unwrap();
    assert_eq!(index.status(), 200);
    let csp = index.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("style-src 'self'"),
        "{csp}"
    );
    api.to_owned()
}

async fn sign_in(b: &Browser, base: &str, token: &str, role: &str) {
    b.goto(&format!("{base}/ui")).await;
    b.type_into("#token", token).await;
    b.click("#login-submit").await;
    b.text_until("#who-role", |t| t == role).await;
    b.text_until("#who-tenant", |t| t.contains("acme")).await;
}

async fn open_by_search(b: &Browser, gid: &str, status: &str) {
    b.type_into("#search-gid", gid).await;
    b.click("#search-go").await;
    b.text_until("#tx-gid", |t| t == gid).await;
    b.text_until("#tx-status", |t| t == status).await;
}

/// A one-step saga created through DTM's gRPC door, its payload the protobuf message
/// `{1: "alice", 2: 300}`, which is not UTF-8; waits until it succeeded.
async fn binary_saga(s: &Setup, token: &str, gid: &str) {
    let grpc = s.server.grpc_addr.expect("a gRPC listener");
    let mut client = idem_dtm_proto::DtmClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let url = s.recorder.url("/bytes");
    let mut request = tonic::Request::new(idem_dtm_proto::DtmRequest {
        gid: gid.into(),
        trans_type: "saga".into(),
        steps: json!([{"action": url, "compensate": url}]).to_string(),
        bin_payloads: vec![b"\x0a\x05alice\x10\xac\x02".to_vec()],
        ..Default::default()
    });
    let bearer = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    client.submit(request).await.unwrap();
    wait_status(s, token, gid, "succeeded").await;
}

/// A fresh SQLite database.
async fn sqlite(test: &str) -> TestDatabase {
    TestDatabase::create(Backend::Sqlite, test).await
}

/// Waits until the coordinator's token cache accepts each of `tokens`.
async fn accepted(s: &Setup, tokens: &[&str]) {
    let deadline = tokio::time::Instant::now() + common::auth::WAIT;
    for token in tokens {
        while get(s, "/api/v1/transactions", Some(token)).await.0 != 200 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new tokens are never accepted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn screenshots() -> bool {
    std::env::var("IDEM_CONSOLE_SCREENSHOTS").is_ok_and(|v| v == "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_retries_a_stalled_transaction_and_a_client_sees_no_operator_actions() {
    let db = sqlite("console_e2e").await;
    let s = Setup::with(db, |c| {
        c.auth.refresh = Duration::from_millis(100);
        c.engine.defaults.max_attempts = 2;
        c.console.trace_url = Some(TRACE_URL.into());
        c.grpc_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let operator = s.token("acme", Role::Operator).await;
    let client = s.token("acme", Role::Client).await;
    accepted(&s, &[&operator, &client]).await;

    // Some history to look at, then the stalled one.
    for i in 1..=3 {
        let gid = format!("order-{i}");
        let (status, body) = post_traced(&s, "/api/v1/transactions", &client, tcc(&s, &gid)).await;
        assert_eq!(status, 201, "{body}");
        let submit = format!("/api/v1/transactions/{gid}/submit");
        let (_, body) = post_traced(&s, &submit, &client, json!({"wait_result": true})).await;
        assert_eq!(body["status"], "succeeded", "{body}");
    }
    let gid = "order-stuck";
    stalled(&s, &operator, gid).await;
    let failed_calls = s.recorder.count(gid, "/a/confirm");
    assert!(failed_calls >= 2, "{failed_calls}");

    let base = console_url(&s.server.url()).await;
    let b = Browser::start().await;

    // A token the API refuses is refused by the form.
    b.goto(&format!("{base}/ui")).await;
    b.type_into("#token", "idem_not-a-token").await;
    b.click("#login-submit").await;
    b.text_until("#login-error", |t| !t.is_empty()).await;
    assert_eq!(b.count("#who:not([hidden])").await, 0);

    sign_in(&b, &base, &operator, "operator").await;

    // Overview: the counts, the stalled one, the chart; the coordinator itself (operators
    // see the coordinators).
    let row = format!("tr[data-gid=\"{gid}\"]");
    b.text_until("[data-testid=count-stalled] strong", |t| t == "1")
        .await;
    b.text_until("[data-testid=count-succeeded] strong", |t| t == "3")
        .await;
    b.shown(&format!("#stalled-table {row}")).await;
    b.shown("#throughput-chart").await;
    b.shown("#coordinators [data-testid=coordinator]").await;
    if screenshots() {
        b.client.set_window_size(1280, 1100).await.unwrap();
        b.screenshot("docs/console-overview.png").await;
        b.client.set_window_size(1280, 900).await.unwrap();
    }

    // The list filtered by status holds only the stalled one.
    b.click("#nav-list").await;
    b.shown("#tx-rows tr").await;
    b.shown("#f-status")
        .await
        .select_by_value("stalled")
        .await
        .unwrap();
    b.click("#f-apply").await;
    b.text_until("#list-status", |t| t.starts_with("1 shown"))
        .await;
    b.shown(&format!("#tx-rows {row}")).await;
    assert_eq!(b.count("#tx-rows tr").await, 1);

    // Pages of two: "More" follows next_cursor until the last of the four.
    b.goto(&format!("{base}/ui#/list?limit=2")).await;
    b.text_until("#list-status", |t| t == "2 shown").await;
    b.click("#more").await;
    b.text_until("#list-status", |t| t.starts_with("4 shown"))
        .await;
    // A full last page may still carry a cursor, to an empty page.
    if b.count("#more:not([hidden])").await == 1 {
        b.click("#more").await;
    }
    b.text_until("#list-status", |t| t == "4 shown, no more")
        .await;
    assert_eq!(b.count("#more:not([hidden])").await, 0);
    let mut shown = b.attrs("#tx-rows tr", "data-gid").await;
    shown.sort();
    assert_eq!(shown, ["order-1", "order-2", "order-3", gid], "each once");

    // A gid that does not exist says so.
    b.type_into("#search-gid", "no-such-order").await;
    b.click("#search-go").await;
    b.text_until("[data-testid=error]", |t| t.contains("no-such-order"))
        .await;

    // An exact gid opens its detail; the failed Confirms are on the timeline.
    open_by_search(&b, gid, "stalled").await;
    let attempts = b.count("#timeline [data-testid=attempt]").await;
    assert_eq!(attempts, failed_calls, "one timeline entry per failed call");
    // A 500 may have been applied: the coordinator counts it as an unknown outcome.
    let entries = b
        .client
        .find_all(fantoccini::Locator::Css("[data-testid=attempt]"))
        .await
        .unwrap();
    for entry in entries {
        let text = entry.text().await.unwrap();
        assert!(
            text.contains("a confirm") && text.contains("unknown") && text.contains("500"),
            "{text}"
        );
    }
    let branch = b
        .text_until("[data-testid=branch-row][data-action=confirm]", |t| {
            t.contains("stalled")
        })
        .await;
    assert!(branch.contains(&s.recorder.url("/a/confirm")), "{branch}");
    let (_, view) = get(&s, &format!("/api/v1/transactions/{gid}"), Some(&operator)).await;
    assert_eq!(view["trace_id"], TRACE_ID, "{view}");
    b.text_until("#trace-id", |t| t == TRACE_ID).await;
    let link = b.shown("#trace-link").await.attr("href").await.unwrap();
    let want = TRACE_URL.replace("{trace_id}", TRACE_ID);
    assert_eq!(link.as_deref(), Some(want.as_str()));
    if screenshots() {
        b.client.set_window_size(1280, 1100).await.unwrap();
        b.screenshot("docs/console-detail.png").await;
        b.client.set_window_size(1280, 900).await.unwrap();
    }

    // Force-stop says what it will not do; cancelling it changes nothing.
    b.js("window.stillTheSamePage = true").await;
    b.click("#action-force-stop").await;
    let does = b.text_until("#confirm-does", |t| !t.is_empty()).await;
    assert!(
        does.contains("calls nothing more: what was applied stays applied"),
        "{does}"
    );
    b.click("#confirm-cancel").await;
    assert_eq!(b.count("#confirm[open]").await, 0);
    let (_, view) = get(&s, &format!("/api/v1/transactions/{gid}"), Some(&operator)).await;
    assert_eq!(view["status"], "stalled");

    // Retry after the participant healed: it succeeds, shown on the same page.
    s.recorder.heal();
    b.click("#action-retry").await;
    let does = b.text_until("#confirm-does", |t| !t.is_empty()).await;
    assert!(does.contains("fresh attempts"), "{does}");
    b.click("#confirm-ok").await;
    b.text_until("#tx-status", |t| t == "succeeded").await;
    b.text_until("#action-result", |t| t.starts_with("Retry: done"))
        .await;
    assert_eq!(
        b.js("return window.stillTheSamePage === true").await,
        json!(true)
    );
    assert_eq!(
        b.count("#action-retry").await,
        0,
        "nothing to retry any more"
    );
    let (_, view) = get(&s, &format!("/api/v1/transactions/{gid}"), Some(&operator)).await;
    assert_eq!(view["status"], "succeeded", "{view}");

    // A payload that is not text (a protobuf message from DTM's gRPC client) is shown as
    // base64, and said to be.
    binary_saga(&s, &client, "order-grpc").await;
    open_by_search(&b, "order-grpc", "succeeded").await;
    let payload = b
        .text_until("[data-testid=payload]", |t| t.contains("as base64"))
        .await;
    assert!(payload.contains("CgVhbGljZRCsAg=="), "{payload}");

    // A phone-sized window: nothing wider than the screen.
    b.client.set_window_size(390, 844).await.unwrap();
    b.shown("#search-gid").await;
    let fits = "return document.documentElement.scrollWidth <= window.innerWidth";
    assert_eq!(
        b.js(fits).await,
        json!(true),
        "the detail page overflows a phone's width"
    );
    b.click("#nav-overview").await;
    b.shown("#view h1").await;
    assert_eq!(
        b.js(fits).await,
        json!(true),
        "the overview overflows a phone's width"
    );
    b.client.set_window_size(1280, 900).await.unwrap();

    // Signing out forgets the token.
    b.click("#signout").await;
    b.shown("#login").await;
    assert_eq!(b.js("return sessionStorage.length").await, json!(0));

    // A client-role token: a stalled transaction offers no retry or force-stop; a prepared
    // one offers abort, which clients may do.
    let other = "order-stuck-2";
    stalled(&s, &operator, other).await;
    let prepared = "order-open";
    let (status, body) = post_traced(&s, "/api/v1/transactions", &client, tcc(&s, prepared)).await;
    assert_eq!(status, 201, "{body}");
    sign_in(&b, &base, &client, "client").await;
    open_by_search(&b, other, "stalled").await;
    b.shown("#timeline [data-testid=attempt]").await;
    assert_eq!(b.count("#action-retry").await, 0);
    assert_eq!(b.count("#action-force-stop").await, 0);
    open_by_search(&b, prepared, "prepared").await;
    assert_eq!(b.count("#action-force-stop").await, 0);
    b.click("#action-abort").await;
    let does = b.text_until("#confirm-does", |t| !t.is_empty()).await;
    assert!(does.contains("ancels"), "{does}");
    b.click("#confirm-ok").await;
    b.text_until("#tx-status", |t| t == "failed").await;

    b.close().await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_authentication_there_is_no_sign_in_and_every_action_is_offered() {
    let db = sqlite("console_no_auth").await;
    let server = common::coordinator(&db.url).await;
    let p = common::recorder::Recorder::start().await;
    let api = common::Api::new(server.url());
    let gid = "open-order";
    p.answer("/a/confirm", Some(gid), 1_000, 500);
    let body = json!({"gid": gid, "kind": "tcc", "branches": [{
        "branch_id": "a", "confirm": p.url("/a/confirm"), "cancel": p.url("/a/cancel"),
    }]});
    assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);

    let base = console_url(&server.url()).await;
    let b = Browser::start().await;
    b.goto(&format!("{base}/ui")).await;
    b.text_until("#who-role", |t| t == "admin").await;
    b.text_until("#who-tenant", |t| t == "no authentication")
        .await;
    assert_eq!(b.count("#login:not([hidden])").await, 0);
    assert_eq!(b.count("#signout:not([hidden])").await, 0);
    // The list of prepared ones offers the admin the bulk actions that apply to them.
    b.goto(&format!("{base}/ui#/list?status=prepared")).await;
    b.text_until("#list-status", |t| t.starts_with("1 shown"))
        .await;
    b.shown("#bulk-abort").await;
    b.shown("#bulk-force-stop").await;
    assert_eq!(b.count("#bulk-retry").await, 0, "only stalled ones");
    open_by_search(&b, gid, "prepared").await;
    b.shown("#action-force-stop").await;
    b.shown("#action-abort").await;
    assert_eq!(
        b.count("#action-retry").await,
        0,
        "only a stalled one is retried"
    );

    // Force-stop ends it without calling the participant.
    b.click("#action-force-stop").await;
    b.type_into("#confirm-reason", "stuck in the test").await;
    b.click("#confirm-ok").await;
    b.text_until("#tx-status", |t| t == "failed").await;
    b.text_until("[data-testid=field-reason]", |t| t == "stuck in the test")
        .await;
    assert!(p.paths(gid).is_empty(), "{:?}", p.paths(gid));

    b.close().await;
    server.stop().await.unwrap();
    db.drop_database().await;
}

/// TCCs whose Confirm answers 503 to both attempts their options allow: submitted, each
/// stalls while committing.
async fn create_stalled(s: &Setup, token: &str, gids: &[&str]) {
    for gid in gids {
        s.recorder.answer("/a/confirm", Some(gid), 1_000, 503);
        let mut tx = tcc(s, gid);
        tx["options"] = json!({"max_attempts": 2, "retry_interval_ms": 100});
        let (status, body) = post(s, "/api/v1/transactions", Some(token), tx).await;
        assert_eq!(status, 201, "{body}");
        let submit = format!("/api/v1/transactions/{gid}/submit");
        let (_, body) = post(s, &submit, Some(token), json!({"wait_result": true})).await;
        assert_eq!(body["status"], "stalled", "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_retries_all_stalled_at_once_and_a_client_gets_no_bulk_action() {
    let db = sqlite("console_bulk").await;
    let s = Setup::with(db, |c| c.auth.refresh = Duration::from_millis(100)).await;
    let operator = s.token("acme", Role::Operator).await;
    let client = s.token("acme", Role::Client).await;
    accepted(&s, &[&operator, &client]).await;
    let stalled = ["stuck-1", "stuck-2", "stuck-3"];
    create_stalled(&s, &client, &stalled).await;

    let base = console_url(&s.server.url()).await;
    let b = Browser::start().await;
    sign_in(&b, &base, &operator, "operator").await;

    // No status filter, no bulk action; filtered by stalled: retry and force-stop them all.
    b.click("#nav-list").await;
    b.text_until("#list-status", |t| t.starts_with("3 shown"))
        .await;
    assert_eq!(b.count("#bulk-bar").await, 0);
    b.shown("#f-status")
        .await
        .select_by_value("stalled")
        .await
        .unwrap();
    b.click("#f-apply").await;
    b.text_until("#list-status", |t| t.starts_with("3 shown"))
        .await;
    b.shown("#bulk-retry").await;
    b.shown("#bulk-force-stop").await;
    assert_eq!(b.count("#bulk-abort").await, 0, "only prepared ones");

    // The dry run lists the three and changes nothing; cancelling closes it.
    b.click("#bulk-retry").await;
    let title = b.text_until("#bulk-count", |t| !t.is_empty()).await;
    assert_eq!(title, "Retry 3 stalled transactions?");
    let mut previewed = b.attrs("[data-testid=bulk-item]", "data-gid").await;
    previewed.sort();
    assert_eq!(previewed, stalled);
    assert_eq!(b.count("#bulk-more").await, 0, "all three fit in one run");
    b.click("#bulk-cancel").await;
    assert_eq!(b.count("#bulk-panel:not([hidden])").await, 0);
    for gid in stalled {
        let (_, view) = get(&s, &format!("/api/v1/transactions/{gid}"), Some(&operator)).await;
        assert_eq!(view["status"], "stalled", "the dry run changed {view}");
    }

    // The participant heals; confirmed, each one is retried and its outcome shown, the list
    // refreshes without them, and each then succeeds.
    s.recorder.heal();
    b.click("#bulk-retry").await;
    b.text_until("#bulk-count", |t| t.starts_with("Retry 3"))
        .await;
    b.click("#bulk-confirm").await;
    let summary = b.text_until("#bulk-summary", |t| !t.is_empty()).await;
    assert_eq!(summary, "Retry: 3 selected, 3 done, 0 refused.");
    b.shown("#bulk-result").await;
    let mut outcomes = b.attrs("[data-testid=bulk-outcome]", "data-gid").await;
    outcomes.sort();
    assert_eq!(outcomes, stalled);
    let after = b.attrs("[data-testid=bulk-outcome]", "data-after").await;
    assert_eq!(after.len(), 3, "each one's new status: {after:?}");
    assert!(after.iter().all(|a| a != "stalled"), "{after:?}");
    assert_eq!(b.count("[data-testid=bulk-outcome][data-error]").await, 0);
    b.text_until("#list-status", |t| t == "None match.").await;
    for gid in stalled {
        wait_status(&s, &operator, gid, "succeeded").await;
        assert_eq!(s.recorder.count(gid, "/a/cancel"), 0, "{gid} went forward");
    }

    // Creation-time filters are not what the API selects by: no bulk action then.
    b.goto(&format!("{base}/ui#/list?status=stalled&created_from=1"))
        .await;
    b.shown("#bulk-note").await;
    assert_eq!(b.count("#bulk-retry").await, 0);

    // A client sees the stalled one but is offered no bulk action, which the API refuses it.
    create_stalled(&s, &client, &["stuck-late"]).await;
    b.click("#signout").await;
    b.shown("#login").await;
    sign_in(&b, &base, &client, "client").await;
    b.goto(&format!("{base}/ui#/list?status=stalled")).await;
    b.text_until("#list-status", |t| t.starts_with("1 shown"))
        .await;
    b.shown("#tx-rows tr[data-gid=\"stuck-late\"]").await;
    assert_eq!(b.count("#bulk-bar").await, 0);
    let dry = json!({"operation": "retry", "status": "stalled", "dry_run": true});
    let (status, body) = post(&s, "/api/v1/bulk", Some(&client), dry).await;
    assert_eq!((status, code(&body)), (403, "forbidden"), "{body}");

    b.close().await;
    s.finish().await;
}

//! Texts a client sends: URLs, reasons, header names and values, payloads and
//! `custom_data`, each within its length and free of what a database cannot store.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, Uri};
use serde_json::{Value, json};

use super::{assert_absent, code, dtm_saga, each_backend, refused, saga, short};

#[tokio::test]
async fn a_url_over_the_limit_is_refused_and_nothing_is_stored() {
    each_backend("validation_long_url", |d| async move {
        // 65 KB: over MariaDB's TEXT, where this used to be a 500 "Data too long".
        let long = d.p.url(&format!("/{}", "a".repeat(65 * 1024)));
        let b = d.b;
        let answer = d.native.post("/api/v1/transactions", saga(&d.p, "long-url", &long)).await;
        refused(b, answer.clone(), "too_long");
        let message = answer.1["error"]["message"].as_str().unwrap();
        assert!(message.contains("steps[0].action") && message.contains("4096"), "{message}");
        assert_absent(&d, "long-url").await;

        let tcc = json!({"gid": "long-confirm", "kind": "tcc",
                         "branches": [{"branch_id": "a", "confirm": long, "cancel": d.p.url("/x")}]});
        refused(b, d.native.post("/api/v1/transactions", tcc).await, "too_long");
        assert_absent(&d, "long-confirm").await;
        let msg = json!({"gid": "long-qp", "kind": "msg", "steps": [{"action": d.p.url("/m")}],
                         "query_prepared": long});
        refused(b, d.native.post("/api/v1/transactions", msg).await, "too_long");
        assert_absent(&d, "long-qp").await;

        // Registered later, to a transaction that exists: it stays without branches.
        let (status, _) = d.native.post("/api/v1/transactions", json!({"gid": "t", "kind": "tcc"})).await;
        assert_eq!(status, 201, "{b}");
        for field in ["confirm", "cancel", "try"] {
            let mut reg = json!({"branch_id": "a", "confirm": d.p.url("/c"), "cancel": d.p.url("/x")});
            reg[field] = json!(long);
            refused(b, d.native.post("/api/v1/transactions/t/branches", reg).await, "too_long");
        }
        let (_, tx) = d.native.get("/api/v1/transactions/t").await;
        assert_eq!(tx["branches"], json!([]), "{b}");

        // Through the DTM door.
        refused(b, d.dtm.post("/submit", dtm_saga(&d.p, "dtm-long", &long)).await, "too_long");
        assert_absent(&d, "dtm-long").await;
        let (status, _) = d.dtm.post("/prepare", json!({"gid": "dtm-t", "trans_type": "tcc"})).await;
        assert_eq!(status, 200, "{b}");
        let reg = json!({"gid": "dtm-t", "branch_id": "01", "trans_type": "tcc", "data": "",
                         "confirm": long, "cancel": d.p.url("/x")});
        refused(b, d.dtm.post("/registerBranch", reg).await, "too_long");
        let (_, q) = d.dtm.get("/query?gid=dtm-t").await;
        assert_eq!(q["branches"], json!([]), "{b}");
    })
    .await;
}

#[tokio::test]
async fn a_url_at_the_limit_is_accepted_and_called() {
    each_backend("validation_url_at_limit", |d| async move {
        let base = d.p.url("/");
        let path = "u".repeat(4_096 - base.len());
        let url = format!("{base}{path}");
        assert_eq!(url.len(), 4_096);
        let mut body = saga(&d.p, "url-4k", &url);
        body["wait_result"] = json!(true);
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{}: {}",
            d.b,
            short(&tx)
        );
        assert_eq!(d.p.paths("url-4k"), [format!("/{path}")], "{}", d.b);
        let mut body = dtm_saga(&d.p, "dtm-url-4k", &url);
        body["wait_result"] = json!(true);
        let (status, answer) = d.dtm.post("/submit", body).await;
        assert_eq!(
            (status, answer["dtm_result"].as_str()),
            (200, Some("SUCCESS")),
            "{}",
            d.b
        );
    })
    .await;
}

#[tokio::test]
async fn a_reason_over_the_limit_leaves_the_transaction_as_it_was() {
    each_backend("validation_reason", |d| async move {
        let b = d.b;
        let tcc = json!({"gid": "r", "kind": "tcc", "branches": [
            {"branch_id": "a", "confirm": d.p.url("/a/confirm"), "cancel": d.p.url("/a/cancel")}]});
        assert_eq!(
            d.native.post("/api/v1/transactions", tcc).await.0,
            201,
            "{b}"
        );
        let (_, before) = d.native.get("/api/v1/transactions/r").await;
        let over = "r".repeat(1_025);
        for op in ["abort", "force-stop"] {
            let path = format!("/api/v1/transactions/r/{op}");
            refused(
                b,
                d.native.post(&path, json!({"reason": over})).await,
                "too_long",
            );
            // PostgreSQL cannot store a NUL; it used to answer 500.
            refused(
                b,
                d.native.post(&path, json!({"reason": "a\u{0}b"})).await,
                "invalid_text",
            );
        }
        let over_dtm = json!({"gid": "r", "trans_type": "tcc", "rollback_reason": over});
        refused(b, d.dtm.post("/abort", over_dtm.clone()).await, "too_long");
        refused(b, d.dtm.post("/forceStop", over_dtm).await, "too_long");
        let (_, after) = d.native.get("/api/v1/transactions/r").await;
        assert_eq!(
            after, before,
            "{b}: a refused request changed the transaction"
        );
        assert!(d.p.calls().is_empty(), "{b}: nothing was cancelled");

        let exact = "é".repeat(512);
        let (status, tx) = d
            .native
            .post(
                "/api/v1/transactions/r/abort",
                json!({"reason": exact, "wait_result": true}),
            )
            .await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (200, Some("failed")),
            "{b}: {tx}"
        );
        assert_eq!(tx["reason"], json!(exact), "{b}");
    })
    .await;
}

/// A participant that records the headers of every call.
#[derive(Clone, Default)]
struct HeaderSink(Arc<Mutex<Vec<HeaderMap>>>);

impl HeaderSink {
    async fn start() -> (HeaderSink, String) {
        let sink = HeaderSink::default();
        let seen = sink.clone();
        let app = Router::new().fallback(move |_: Uri, headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                seen.0.lock().unwrap().push(headers);
                "{}"
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/h", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (sink, url)
    }
}

#[tokio::test]
async fn bad_branch_headers_are_refused_before_anything_is_stored() {
    each_backend("validation_headers", |d| async move {
        let b = d.b;
        let many: serde_json::Map<String, Value> =
            (0..33).map(|i| (format!("x-{i}"), json!("v"))).collect();
        let cases: Vec<(Value, &str)> = vec![
            (json!({"x-a": "one\r\nx-injected: two"}), "invalid_header"),
            (json!({"x-a": "line\nbreak"}), "invalid_header"),
            (json!({"x-a": "caf\u{e9}"}), "invalid_header"),
            (json!({"x-a": "nul\u{0}"}), "invalid_header"),
            (json!({"x-a": " padded"}), "invalid_header"),
            (json!({"bad name": "v"}), "invalid_header"),
            (json!({"x-\u{e9}": "v"}), "invalid_header"),
            (json!({"": "v"}), "invalid_header"),
            (json!({"Host": "elsewhere"}), "invalid_header"),
            (json!({"content-length": "0"}), "invalid_header"),
            (json!({"Transfer-Encoding": "chunked"}), "invalid_header"),
            (json!({"Connection": "close"}), "invalid_header"),
            (json!({"X-Tenant": "a", "x-tenant": "b"}), "invalid_header"),
            (json!({"x-a": "v".repeat(4_097)}), "too_long"),
            (json!({"n".repeat(129): "v"}), "too_long"),
            (Value::Object(many), "invalid_header"),
        ];
        for (i, (headers, expected)) in cases.into_iter().enumerate() {
            let gid = format!("h{i}");
            let what = format!("{b} {headers}");
            let native = json!({"gid": gid, "kind": "tcc", "options": {"branch_headers": headers}});
            refused(
                &what,
                d.native.post("/api/v1/transactions", native).await,
                expected,
            );
            let dtm = json!({"gid": gid, "trans_type": "tcc", "branch_headers": headers});
            refused(&what, d.dtm.post("/prepare", dtm).await, expected);
            assert_absent(&d, &gid).await;
        }

        // What is accepted reaches the participant as sent.
        let (sink, url) = HeaderSink::start().await;
        let value = format!("Bearer {}\tend", "t".repeat(4_000));
        let mut ok = saga(&d.p, "h-ok", &url);
        ok["options"] = json!({"branch_headers": {"Authorization": value, "x-empty": ""}});
        ok["wait_result"] = json!(true);
        let (status, tx) = d.native.post("/api/v1/transactions", ok).await;
        assert_eq!(
            (status, tx["status"].as_str()),
            (201, Some("succeeded")),
            "{b}: {}",
            short(&tx)
        );
        let seen = sink.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{b}");
        assert_eq!(seen[0]["authorization"].to_str().unwrap(), value, "{b}");
        assert_eq!(seen[0]["x-empty"].to_str().unwrap(), "", "{b}");
    })
    .await;
}

#[tokio::test]
async fn texts_postgresql_cannot_store_are_refused_on_every_backend() {
    each_backend("validation_nul", |d| async move {
        let b = d.b;
        let nul_url = d.p.url("/a\u{0}b");
        refused(
            b,
            d.native
                .post("/api/v1/transactions", saga(&d.p, "nul-url", &nul_url))
                .await,
            "invalid_url",
        );
        assert_absent(&d, "nul-url").await;
        let mut body = dtm_saga(&d.p, "nul-payload", &d.p.url("/a"));
        body["payloads"] = json!(["x\u{0}y"]);
        refused(b, d.dtm.post("/submit", body).await, "invalid_text");
        assert_absent(&d, "nul-payload").await;
        assert_eq!(
            d.dtm
                .post("/prepare", json!({"gid": "tn", "trans_type": "tcc"}))
                .await
                .0,
            200
        );
        let reg = json!({"gid": "tn", "branch_id": "01", "trans_type": "tcc", "data": "\u{0}",
                         "confirm": d.p.url("/c"), "cancel": d.p.url("/x")});
        refused(b, d.dtm.post("/registerBranch", reg).await, "invalid_text");
        // Reads too: a gid or cursor reaches the database.
        refused(b, d.dtm.get("/query?gid=%00").await, "invalid_gid");
        refused(b, d.dtm.get("/all?position=1:%00").await, "invalid_query");
        refused(
            b,
            d.native.get("/api/v1/transactions?cursor=1:%00").await,
            "invalid_query",
        );
        assert_eq!(
            d.native.get("/api/v1/transactions?cursor=1:a").await.0,
            200,
            "{b}"
        );
    })
    .await;
}

#[tokio::test]
async fn payloads_and_custom_data_have_limits() {
    each_backend("validation_payloads", |d| async move {
        let b = d.b;
        // Under the 1 MiB body limit but over the default 64 KiB a branch payload may have
        // (tests/it/limits.rs has the cap through every field that holds one).
        let mut body = saga(&d.p, "big", &d.p.url("/a"));
        body["steps"][0]["payload"] = json!("x".repeat(65_536));
        refused(
            b,
            d.native.post("/api/v1/transactions", body).await,
            "payload_too_large",
        );
        assert_absent(&d, "big").await;

        let mut body = dtm_saga(&d.p, "cd", &d.p.url("/a"));
        body["custom_data"] = json!(format!(
            "{{\"concurrent\": true, \"pad\": \"{}\"}}",
            "x".repeat(65_536)
        ));
        refused(b, d.dtm.post("/submit", body).await, "too_long");
        assert_absent(&d, "cd").await;
        let mut body = dtm_saga(&d.p, "cd-ok", &d.p.url("/a"));
        body["custom_data"] = json!(json!({"concurrent": true, "orders": {}}).to_string());
        body["wait_result"] = json!(true);
        assert_eq!(d.dtm.post("/submit", body).await.0, 200, "{b}");

        // Over the body limit: 413 from both doors.
        let huge = "x".repeat(1 << 20);
        let (status, answer) = d
            .dtm
            .post(
                "/submit",
                json!({"gid": "huge", "trans_type": "saga", "payloads": [huge]}),
            )
            .await;
        assert_eq!(
            (status, code(&answer)),
            (413, Some("payload_too_large")),
            "{b}"
        );
        assert_absent(&d, "huge").await;
    })
    .await;
}

//! The numeric options and the list's page size: one set of bounds through both doors,
//! refused past it (never clamped), the maxima accepted as given.

use idem::server::ServerConfig;
use serde_json::{Value, json};

use super::{WAIT, assert_absent, dtm_saga, each_backend, each_backend_with, refused, saga};

#[tokio::test]
async fn timeouts_beyond_thirty_days_are_refused_not_wrapped() {
    each_backend("validation_timeouts", |d| async move {
        let b = d.b;
        let native_bad = [
            json!(18_446_744_073_709_551_615u64),
            json!(9_223_372_036_854_775_808u64),
            json!(2_592_000_001u64),
            json!(0),
            json!(-1),
            json!(1.5),
            json!(1e30),
            json!("60000"),
        ];
        for (i, timeout) in native_bad.into_iter().enumerate() {
            let gid = format!("t{i}");
            let body = json!({"gid": gid, "kind": "tcc", "options": {"timeout_ms": timeout}});
            let expected = if timeout.is_string() {
                "invalid_json"
            } else {
                "invalid_options"
            };
            refused(
                &format!("{b} {timeout}"),
                d.native.post("/api/v1/transactions", body).await,
                expected,
            );
            assert_absent(&d, &gid).await;
        }
        let body =
            json!({"gid": "t-max", "kind": "tcc", "options": {"timeout_ms": 2_592_000_000u64}});
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(status, 201, "{b}: {tx}");
        let deadline = tx["timeout_at"].as_i64().unwrap() - tx["created_at"].as_i64().unwrap();
        assert_eq!(deadline, 2_592_000_000, "{b}: {tx}");

        for (gid, seconds) in [
            ("d1", json!(9_223_372_036_854_775_807i64)),
            ("d2", json!(2_592_001)),
            ("d3", json!(18_446_744_073_709_551_615u64)),
        ] {
            let body = json!({"gid": gid, "trans_type": "tcc", "timeout_to_fail": seconds});
            refused(
                &format!("{b} {seconds}"),
                d.dtm.post("/prepare", body).await,
                "invalid_options",
            );
            assert_absent(&d, gid).await;
        }
        let mut saga = dtm_saga(&d.p, "d4", &d.p.url("/a"));
        saga["timeout_to_fail"] = json!(i64::MAX);
        refused(b, d.dtm.post("/submit", saga).await, "invalid_options");
        assert_absent(&d, "d4").await;
        let body = json!({"gid": "d-max", "trans_type": "tcc", "timeout_to_fail": 2_592_000});
        assert_eq!(d.dtm.post("/prepare", body).await.0, 200, "{b}");
        let (_, tx) = d.native.get("/api/v1/transactions/d-max").await;
        assert_eq!(tx["options"]["timeout_ms"], 2_592_000_000u64, "{b}");
    })
    .await;
}

#[tokio::test]
async fn dtm_retry_limit_above_the_cap_is_refused_not_clamped() {
    each_backend("validation_retry_limit", |d| async move {
        let mut body = dtm_saga(&d.p, "rl", &d.p.url("/a"));
        body["retry_limit"] = json!(20_000);
        let answer = d.dtm.post("/submit", body.clone()).await;
        refused(d.b, answer.clone(), "invalid_options");
        assert!(
            answer.1["message"]
                .as_str()
                .unwrap()
                .contains("retry_limit"),
            "{}",
            answer.1
        );
        assert_absent(&d, "rl").await;
        body["retry_limit"] = json!(10_000);
        body["wait_result"] = json!(true);
        assert_eq!(d.dtm.post("/submit", body).await.0, 200, "{}", d.b);
        let (_, tx) = d.native.get("/api/v1/transactions/rl").await;
        assert_eq!(tx["options"]["max_attempts"], 10_000, "{}", d.b);
    })
    .await;
}

/// One option through both doors: native field, DTM field (if any), how many of idem's
/// units one DTM unit is, and idem's upper bound.
const BOUNDS: [(&str, Option<&str>, u64, u64); 6] = [
    (
        "request_timeout_ms",
        Some("request_timeout"),
        1_000,
        600_000,
    ),
    (
        "retry_interval_ms",
        Some("retry_interval"),
        1_000,
        3_600_000,
    ),
    ("max_attempts", Some("retry_limit"), 1, 10_000),
    ("timeout_ms", Some("timeout_to_fail"), 1_000, 2_592_000_000),
    ("max_retry_interval_ms", None, 1, 86_400_000),
    ("max_in_progress_ms", None, 1, 2_592_000_000),
];

#[tokio::test]
async fn both_doors_agree_on_every_bound() {
    each_backend("validation_doors_agree", |d| async move {
        let b = d.b;
        let mut n = 0;
        for (native_field, dtm_field, factor, max) in BOUNDS {
            // In the DTM door's unit; the native door gets the same amount in idem's.
            let dtm_max = max / factor;
            let cases = [
                (1, true),
                (dtm_max, true),
                (dtm_max + 1, false),
                (i64::MAX as u64, false),
                (u64::MAX, false),
            ];
            for (value, accepted) in cases {
                n += 1;
                let ms = value.saturating_mul(factor);
                let gid = format!("n{n}");
                let native = json!({"gid": gid, "kind": "tcc", "options": {native_field: ms}});
                let (status, answer) = d.native.post("/api/v1/transactions", native).await;
                let what = format!("{b}: {native_field}={ms}");
                if accepted {
                    assert_eq!(status, 201, "{what}: {answer}");
                    assert_eq!(answer["options"][native_field], ms, "{what}");
                } else {
                    refused(&what, (status, answer), "invalid_options");
                    assert_absent(&d, &gid).await;
                }
                let Some(dtm_field) = dtm_field else { continue };
                let gid = format!("d{n}");
                let dtm = json!({"gid": gid, "trans_type": "tcc", dtm_field: value});
                let (status, answer) = d.dtm.post("/prepare", dtm).await;
                let what = format!("{b}: {dtm_field}={value}");
                if accepted {
                    assert_eq!(status, 200, "{what}: {answer}");
                    let (_, tx) = d.native.get(&format!("/api/v1/transactions/{gid}")).await;
                    assert_eq!(
                        tx["options"][native_field], ms,
                        "{what}: the same option as native"
                    );
                } else {
                    refused(&what, (status, answer), "invalid_options");
                    assert_absent(&d, &gid).await;
                }
            }
            // Where the doors differ by design: DTM reads 0 and below as "not set".
            if let Some(dtm_field) = dtm_field {
                for (i, unset) in [json!(0), json!(-5), Value::Null].into_iter().enumerate() {
                    let gid = format!("z{n}-{i}");
                    let dtm = json!({"gid": gid, "trans_type": "tcc", dtm_field: unset});
                    assert_eq!(
                        d.dtm.post("/prepare", dtm).await.0,
                        200,
                        "{b}: {dtm_field}={unset}"
                    );
                }
                let fraction = json!({"gid": format!("f{n}"), "trans_type": "tcc", dtm_field: 1.5});
                refused(b, d.dtm.post("/prepare", fraction).await, "invalid_options");
            }
            let native =
                json!({"gid": format!("zero{n}"), "kind": "tcc", "options": {native_field: 0}});
            refused(
                b,
                d.native.post("/api/v1/transactions", native).await,
                "invalid_options",
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_long_chain_of_orders_is_refused_without_crashing_the_server() {
    // Past the default cap on steps, which would refuse it before the orders are read.
    let no_cap = |c: &mut ServerConfig| c.connect.max_branches = 20_000;
    each_backend_with("validation_orders_chain", no_cap, |d| async move {
        // 15,000 steps, each waiting for the one before, and the first for the last: the
        // recursive cycle check this replaced overflowed the stack and aborted the process.
        let n = 15_000;
        let steps: Vec<Value> = (0..n)
            .map(|_| json!({"action": "http://a/x", "compensate": "http://a/y"}))
            .collect();
        let mut orders: serde_json::Map<String, Value> =
            (1..n).map(|k| (k.to_string(), json!([k - 1]))).collect();
        orders.insert("0".into(), json!([n - 1]));
        let body = json!({"gid": "chain", "kind": "saga", "steps": steps,
                          "options": {"concurrent": true, "orders": orders}});
        assert!(body.to_string().len() < 1 << 20);
        let answer = d.native.post("/api/v1/transactions", body).await;
        refused(d.b, answer.clone(), "invalid_options");
        assert!(
            answer.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cycle")
        );
        assert_absent(&d, "chain").await;
        assert_eq!(d.native.get("/health").await.0, 200);
    })
    .await;
}

#[tokio::test]
async fn max_in_progress_ms_is_a_native_option_that_bounds_an_ongoing_step() {
    each_backend("validation_max_in_progress", |d| async move {
        // A step that keeps answering 425 is given up once max_in_progress_ms has passed
        // since its first such answer: the saga compensates.
        d.p.answer("/slow", None, 1_000, 425);
        let mut body = saga(&d.p, "ongoing", &d.p.url("/slow"));
        body["options"] = json!({"max_in_progress_ms": 300});
        let (status, tx) = d.native.post("/api/v1/transactions", body).await;
        assert_eq!(status, 201, "{}: {tx}", d.b);
        assert_eq!(tx["options"]["max_in_progress_ms"], 300);
        d.native.wait_status("ongoing", &["failed"], WAIT).await;
        assert!(d.p.paths("ongoing").contains(&"/c".to_string()), "{}", d.b);
    })
    .await;
}

/// The bounds the tests above hold the doors to are the server's table, field for field:
/// a bound changed in one place and not the other fails here, not in a client.
#[test]
fn the_bounds_tested_are_the_servers_table() {
    use idem::api::validate::{OPTIONS, Unit};
    let mut table: Vec<(&str, Option<&str>, u64, u64)> = OPTIONS
        .iter()
        .map(|o| {
            let factor = match o.dtm {
                Some((_, Unit::Seconds)) => 1_000,
                _ => 1,
            };
            assert_eq!(o.min, 1, "{}", o.name);
            (o.name, o.dtm.map(|(field, _)| field), factor, o.max)
        })
        .collect();
    let mut tested = BOUNDS.to_vec();
    table.sort();
    tested.sort();
    assert_eq!(table, tested);
}

#[tokio::test]
async fn both_doors_refuse_past_a_bound_alike_and_store_the_same_maxima() {
    each_backend("validation_same_maxima", |d| async move {
        let b = d.b;
        let mut native_options = serde_json::Map::new();
        let mut dtm_fields = serde_json::Map::new();
        for (native_field, dtm_field, factor, max) in BOUNDS {
            native_options.insert(native_field.into(), json!(max));
            let Some(dtm_field) = dtm_field else { continue };
            dtm_fields.insert(dtm_field.into(), json!(max / factor));

            // One past the bound: the same code from both doors, each message naming the
            // door's own field and the same bound in the door's unit.
            let native = json!({"gid": format!("over-{native_field}"), "kind": "tcc",
                                "options": {native_field: max + factor}});
            let answer = d.native.post("/api/v1/transactions", native).await;
            refused(b, answer.clone(), "invalid_options");
            let message = answer.1["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(native_field) && message.contains(&max.to_string()),
                "{b}: {message}"
            );
            let mut saga = dtm_saga(&d.p, &format!("over-{dtm_field}"), &d.p.url("/a"));
            saga[dtm_field] = json!(max / factor + 1);
            let answer = d.dtm.post("/submit", saga).await;
            refused(b, answer.clone(), "invalid_options");
            let message = answer.1["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(dtm_field) && message.contains(&(max / factor).to_string()),
                "{b}: {message}"
            );
            assert_absent(&d, &format!("over-{dtm_field}")).await;
        }

        // Every maximum at once is accepted by both doors, and stored alike.
        let native = json!({"gid": "all-max", "kind": "tcc", "options": native_options});
        let (status, tx) = d.native.post("/api/v1/transactions", native).await;
        assert_eq!(status, 201, "{b}: {tx}");
        let mut dtm = Value::Object(dtm_fields);
        dtm["gid"] = json!("dtm-all-max");
        dtm["trans_type"] = json!("tcc");
        assert_eq!(d.dtm.post("/prepare", dtm).await.0, 200, "{b}");
        let (_, dtm_tx) = d.native.get("/api/v1/transactions/dtm-all-max").await;
        for (native_field, dtm_field, _, max) in BOUNDS {
            assert_eq!(tx["options"][native_field], max, "{b}: {native_field}");
            if dtm_field.is_some() {
                assert_eq!(
                    dtm_tx["options"][native_field], tx["options"][native_field],
                    "{b}: {native_field}"
                );
            }
        }
    })
    .await;
}

#[tokio::test]
async fn both_doors_bound_the_list_page_alike() {
    each_backend("validation_list_limit", |d| async move {
        let b = d.b;
        for gid in ["l1", "l2"] {
            let tcc = json!({"gid": gid, "kind": "tcc"});
            assert_eq!(
                d.native.post("/api/v1/transactions", tcc).await.0,
                201,
                "{b}"
            );
        }
        for limit in ["0", "1001", "4294967295"] {
            refused(
                &format!("{b} native limit={limit}"),
                d.native
                    .get(&format!("/api/v1/transactions?limit={limit}"))
                    .await,
                "invalid_query",
            );
            // The DTM door cut these to 1..=1000; now it refuses them too.
            refused(
                &format!("{b} DTM limit={limit}"),
                d.dtm.get(&format!("/all?limit={limit}")).await,
                "invalid_query",
            );
        }
        let (status, page) = d.native.get("/api/v1/transactions?limit=1").await;
        assert_eq!(status, 200, "{b}: {page}");
        assert_eq!(page["transactions"].as_array().unwrap().len(), 1, "{b}");
        assert!(page["next_cursor"].is_string(), "{b}: {page}");
        let (status, page) = d.dtm.get("/all?limit=1").await;
        assert_eq!(status, 200, "{b}: {page}");
        assert_eq!(page["transactions"].as_array().unwrap().len(), 1, "{b}");
        assert_ne!(page["next_position"], "", "{b}: {page}");
        for (door, path) in [
            (&d.native, "/api/v1/transactions?limit=1000"),
            (&d.dtm, "/all?limit=1000"),
        ] {
            let (status, page) = door.get(path).await;
            assert_eq!(status, 200, "{b} {path}: {page}");
            assert_eq!(page["transactions"].as_array().unwrap().len(), 2, "{b}");
        }
    })
    .await;
}

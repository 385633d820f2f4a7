//! A participant written the way the `http` module's documentation says, served over real
//! HTTP: the extractor, the payload, the status mapping and the msg back-check.

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use idem_participant::testing::{Backend, TestDatabase};
use idem_participant::{
    Barrier, BranchCall, MsgState, Op, Outcome, ParticipantError, Payload, barrier_records,
    create_barrier_table, query_prepared,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::AnyPool;

#[derive(Deserialize)]
struct Deposit {
    amount: i64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    amount: i64,
    note: String,
}

/// The whole participant: a guarded step in a few lines.
async fn deposit(
    State(pool): State<AnyPool>,
    call: BranchCall,
    Payload(req): Payload<Deposit>,
) -> Result<Outcome<Receipt>, ParticipantError> {
    if req.amount <= 0 {
        return Err(ParticipantError::refused("amount must be positive"));
    }
    let amount = req.amount;
    call.barrier()
        .run(&pool, |tx| async move {
            sqlx::query(tx.sql("UPDATE wallet SET total = total + ?"))
                .bind(amount)
                .execute(&mut *tx.conn())
                .await?;
            // A result that happens to contain DTM's keywords must not confuse DTM.
            Ok(Receipt {
                amount,
                note: "no FAILURE, nothing ONGOING".into(),
            })
        })
        .await
}

/// The two-phase message back-check (`GET ...?op=msg`).
async fn back_check(
    State(pool): State<AnyPool>,
    call: BranchCall,
) -> Result<MsgState, axum::response::Response> {
    use axum::response::IntoResponse;
    call.expect_op(&[Op::Msg])
        .map_err(IntoResponse::into_response)?;
    query_prepared(&pool, call.tenant(), call.gid())
        .await
        .map_err(IntoResponse::into_response)
}

async fn send(client: &reqwest::Client, url: &str, body: &str) -> (u16, String) {
    let r = client.post(url).body(body.to_owned()).send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The participant above on a fresh SQLite database, served on 127.0.0.1:0.
struct Served {
    db: TestDatabase,
    pool: AnyPool,
    base: String,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
    client: reqwest::Client,
}

impl Served {
    async fn start(test: &str) -> Served {
        let db = TestDatabase::create(Backend::Sqlite, test).await;
        let pool = idem_participant::connect(&db.url, 4).await.unwrap();
        create_barrier_table(&pool).await.unwrap();
        sqlx::query("CREATE TABLE wallet (total BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO wallet (total) VALUES (0)")
            .execute(&pool)
            .await
            .unwrap();
        let app = Router::new()
            .route("/deposit", post(deposit))
            .route("/check", get(back_check))
            .with_state(pool.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let _ = rustls::crypto::ring::default_provider().install_default();
        Served {
            db,
            pool,
            base,
            server,
            client: reqwest::Client::new(),
        }
    }

    async fn total(&self) -> i64 {
        sqlx::query_scalar("SELECT total FROM wallet")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.server.abort();
        self.pool.close().await;
        self.db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_documented_handler_over_http() {
    let served = Served::start("sdk_http_handler").await;
    let (pool, base, client) = (&served.pool, &served.base, &served.client);
    let url = |q: &str| format!("{base}/deposit?{q}");

    let (s, body) = send(
        client,
        &url("gid=g1&trans_type=saga&branch_id=01&op=action"),
        r#"{"amount":5}"#,
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert!(body.starts_with(r#"{"dtm_result":"SUCCESS","#), "{body}");
    assert!(
        !body.contains("FAILURE") && !body.contains("ONGOING"),
        "{body}"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["outcome"], "executed");
    assert_eq!(v["result"]["note"], "no FAILURE, nothing ONGOING");

    let (s, body) = send(
        client,
        &url("gid=g1&trans_type=saga&branch_id=01&op=action"),
        r#"{"amount":5}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert!(body.contains(r#""outcome":"duplicate""#), "{body}");

    let (s, body) = send(
        client,
        &url("gid=g1&trans_type=saga&op=action"),
        r#"{"amount":5}"#,
    )
    .await;
    assert_eq!(s, 400);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "invalid_callback");
    assert_eq!(v["message"], "missing query parameter `branch_id`");

    let (s, body) = send(
        client,
        &url("gid=g2&trans_type=saga&branch_id=01&op=action"),
        "not json",
    )
    .await;
    assert_eq!(s, 409, "{body}");
    assert!(body.starts_with(r#"{"dtm_result":"FAILURE","#));
    let (s, _) = send(
        client,
        &url("gid=g2&trans_type=saga&branch_id=01&op=action"),
        r#"{"amount":-1}"#,
    )
    .await;
    assert_eq!(s, 409);

    let (s, body) = send(
        client,
        &url("gid=g3&trans_type=saga&branch_id=01&op=compensate"),
        r#"{"amount":5}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert!(body.contains("empty_rollback"), "{body}");
    let (s, body) = send(
        client,
        &url("gid=g3&trans_type=saga&branch_id=01&op=action"),
        r#"{"amount":5}"#,
    )
    .await;
    assert_eq!(s, 409, "{body}");
    assert!(body.contains(r#""outcome":"rejected""#));

    // Two-phase message: a committed local transaction, and one that never ran.
    Barrier::msg("m1")
        .unwrap()
        .run(pool, |_tx| async { Ok(()) })
        .await
        .unwrap();
    let check = |gid: &str| format!("{base}/check?gid={gid}&trans_type=msg&branch_id=00&op=msg");
    let r = client.get(check("m1")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client.get(check("m2")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
    assert!(r.text().await.unwrap().contains("FAILURE"));

    assert_eq!(served.total().await, 5);
    served.stop().await;
}

/// A TCC Confirm that arrives before its Try has committed: 503 (the coordinator retries),
/// not 2xx (it would be "confirmed" with nothing reserved) and not 409 (the coordinator
/// would stop retrying a Confirm that a retry will get through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirm_before_its_try_answers_503_and_its_retry_runs() {
    let served = Served::start("sdk_http_confirm_before_try").await;
    let url = |op: &str| {
        format!(
            "{}/deposit?gid=t1&trans_type=tcc&branch_id=01&op={op}",
            served.base
        )
    };
    let (s, body) = send(&served.client, &url("confirm"), r#"{"amount":7}"#).await;
    assert_eq!(s, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "confirm_without_try", "{body}");
    assert!(v.get("dtm_result").is_none(), "{body}");
    assert!(
        barrier_records(&served.pool, "t1")
            .await
            .unwrap()
            .is_empty(),
        "the refused Confirm leaves no barrier row"
    );
    assert_eq!(served.total().await, 0);

    let (s, body) = send(&served.client, &url("try"), r#"{"amount":5}"#).await;
    assert_eq!(s, 200, "{body}");
    let (s, body) = send(&served.client, &url("confirm"), r#"{"amount":7}"#).await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains(r#""outcome":"executed""#), "{body}");
    let (s, body) = send(&served.client, &url("confirm"), r#"{"amount":7}"#).await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains(r#""outcome":"duplicate""#), "{body}");
    assert_eq!(served.total().await, 12);
    served.stop().await;
}

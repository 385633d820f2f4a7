//! Payment callbacks on every backend: 20 concurrent deliveries over real HTTP credit once;
//! a bad signature is refused before any database read; a mismatch credits nothing; a
//! second transaction for a paid order is a conflict, never a second credit; retention.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use idem_participant::callback::{
    DEFAULT_CALLBACK_TABLE, MIN_CALLBACK_RETENTION, OnCredit, SIGNATURE_HEADER,
    create_callback_tables, create_callback_tables_named, purge_payment_callbacks,
};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{
    CallbackOutcome, LocalTx, ManualClock, OrderTable, PaymentCallbacks, PaymentNotice, SharedClock,
};
use sqlx::{Any, AnyPool, Row};

async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 24)
        .await
        .expect("connect");
    create_callback_tables(&pool).await.expect("callback table");
    for ddl in [
        "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(24) NOT NULL, \
         paid_txn VARCHAR(128), amount_minor BIGINT NOT NULL, currency VARCHAR(8) NOT NULL, \
         merchant VARCHAR(64) NOT NULL)",
        "CREATE TABLE outbox (event_id VARCHAR(160) PRIMARY KEY, order_ref VARCHAR(64) NOT NULL)",
    ] {
        sqlx::query(ddl)
            .execute(&pool)
            .await
            .expect("business tables");
    }
    pool
}

async fn add_order(pool: &AnyPool, id: &str, status: &str) {
    sqlx::query(
        pool_sql(pool, "INSERT INTO orders (id, status, amount_minor, currency, merchant) VALUES (?, ?, 1250, 'EUR', 'm-1')"),
    )
    .bind(id.to_owned())
    .bind(status.to_owned())
    .execute(pool)
    .await
    .expect("order");
}

fn pool_sql(pool: &AnyPool, text: &str) -> sqlx::AssertSqlSafe<String> {
    let url = pool.connect_options().database_url.to_string();
    idem_participant::Backend::from_url(&url).unwrap().sql(text)
}

async fn order(pool: &AnyPool, id: &str) -> (String, Option<String>) {
    let row = sqlx::query(pool_sql(
        pool,
        "SELECT status, paid_txn FROM orders WHERE id = ?",
    ))
    .bind(id.to_owned())
    .fetch_one(pool)
    .await
    .unwrap();
    (row.get(0), row.get(1))
}

async fn count(pool: &AnyPool, sql: &str) -> i64 {
    sqlx::query(pool_sql(pool, sql))
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0)
}

/// The service's outbox row, written in the crediting transaction.
fn outbox_hook() -> OnCredit<Any> {
    Arc::new(|tx: LocalTx<'static, Any>, n: PaymentNotice| {
        Box::pin(async move {
            sqlx::query(tx.sql("INSERT INTO outbox (event_id, order_ref) VALUES (?, ?)"))
                .bind(format!("paid:{}", n.order_ref))
                .bind(n.order_ref.clone())
                .execute(&mut *tx.conn())
                .await?;
            Ok(())
        })
    })
}

fn callbacks(clock: SharedClock) -> PaymentCallbacks<Any> {
    PaymentCallbacks::new(
        "acmepay",
        b"provider-secret".to_vec(),
        OrderTable::new("orders").unwrap(),
    )
    .unwrap()
    .with_clock(clock)
    .on_credit(outbox_hook())
}

fn notice(order_ref: &str, txn: &str) -> PaymentNotice {
    PaymentNotice {
        provider_txn_id: txn.into(),
        order_ref: order_ref.into(),
        amount_minor: 1250,
        currency: "EUR".into(),
        merchant: "m-1".into(),
    }
}

fn body(n: &PaymentNotice) -> Vec<u8> {
    serde_json::to_vec(n).unwrap()
}

async fn deliver(cb: &PaymentCallbacks<Any>, pool: &AnyPool, n: &PaymentNotice) -> CallbackOutcome {
    let body = body(n);
    cb.handle(pool, &body, &cb.sign(&body))
        .await
        .expect("no database error")
}

struct App {
    cb: PaymentCallbacks<Any>,
    pool: AnyPool,
}

async fn callback_route(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    app.cb.respond(&app.pool, &headers, &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_deliveries_over_http_credit_once_and_all_succeed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    for db in testing::all("callback_twenty").await {
        let pool = setup(&db).await;
        add_order(&pool, "o-20", "WAIT_PAY").await;
        let cb = callbacks(idem_participant::system_clock());
        let n = notice("o-20", "txn-20");
        let payload = body(&n);
        let signature = cb.sign(&payload);
        let app = Arc::new(App {
            cb,
            pool: pool.clone(),
        });
        let router = axum::Router::new()
            .route("/pay/callback", axum::routing::post(callback_route))
            .with_state(app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/pay/callback", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, router).await });
        let client = reqwest::Client::new();
        let start = Arc::new(tokio::sync::Barrier::new(20));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (client, url, payload, signature, start) = (
                client.clone(),
                url.clone(),
                payload.clone(),
                signature.clone(),
                start.clone(),
            );
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let resp = client
                    .post(&url)
                    .header(SIGNATURE_HEADER, signature)
                    .header("content-type", "application/json")
                    .body(payload)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let json: serde_json::Value = resp.json().await.unwrap();
                (status, json)
            }));
        }
        let mut credited = 0;
        for task in tasks {
            let (status, json) = task.await.unwrap();
            assert_eq!(status, 200, "{}: {json}", db.backend);
            assert_eq!(json["result"], "SUCCESS");
            match json["outcome"].as_str().unwrap() {
                "credited" => credited += 1,
                "duplicate" => {}
                other => panic!("{}: {other}", db.backend),
            }
        }
        assert_eq!(credited, 1, "{}", db.backend);
        assert_eq!(
            order(&pool, "o-20").await,
            ("PAID".into(), Some("txn-20".into()))
        );
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM outbox").await,
            1,
            "{}: one credit event",
            db.backend
        );
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM idem_payment_callback").await,
            1
        );
        // A forged signature over the same real HTTP path: 401, stable code.
        let resp = client
            .post(&url)
            .header(SIGNATURE_HEADER, "00".repeat(32))
            .body(payload.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        let json: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(json["error"], "invalid_signature");
        server.abort();
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_refused_before_any_database_read() {
    for db in testing::all("callback_bad_signature").await {
        let pool = setup(&db).await;
        add_order(&pool, "o-s", "WAIT_PAY").await;
        let cb = callbacks(idem_participant::system_clock());
        let payload = body(&notice("o-s", "txn-s"));
        let tampered = body(&PaymentNotice {
            amount_minor: 1,
            ..notice("o-s", "txn-s")
        });
        let sig = cb.sign(&payload);
        assert_eq!(
            cb.handle(&pool, &tampered, &sig).await.unwrap(),
            CallbackOutcome::BadSignature
        );
        assert_eq!(order(&pool, "o-s").await.0, "WAIT_PAY");
        // On a closed pool any read fails; a bad signature still gets its answer, so it
        // read nothing. (A good one on the same pool does fail: the control.)
        let closed = pool.clone();
        closed.close().await;
        assert_eq!(
            cb.handle(&closed, &payload, "not-hex").await.unwrap(),
            CallbackOutcome::BadSignature,
            "{}",
            db.backend
        );
        assert!(cb.handle(&closed, &payload, &sig).await.is_err());
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_or_an_unknown_order_credits_nothing() {
    for db in testing::all("callback_mismatch").await {
        let pool = setup(&db).await;
        add_order(&pool, "o-m", "WAIT_PAY").await;
        let cb = callbacks(idem_participant::system_clock());
        let n = notice("o-m", "txn-m");
        for (wrong, field) in [
            (
                PaymentNotice {
                    amount_minor: 1249,
                    ..n.clone()
                },
                "amount",
            ),
            (
                PaymentNotice {
                    currency: "USD".into(),
                    ..n.clone()
                },
                "currency",
            ),
            (
                PaymentNotice {
                    merchant: "m-2".into(),
                    ..n.clone()
                },
                "merchant",
            ),
        ] {
            assert_eq!(
                deliver(&cb, &pool, &wrong).await,
                CallbackOutcome::Mismatch(field),
                "{}",
                db.backend
            );
        }
        assert_eq!(order(&pool, "o-m").await, ("WAIT_PAY".into(), None));
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM idem_payment_callback").await,
            0,
            "{}",
            db.backend
        );
        assert_eq!(
            deliver(&cb, &pool, &notice("o-none", "txn-x")).await,
            CallbackOutcome::UnknownOrder
        );
        let long = PaymentNotice {
            provider_txn_id: "t".repeat(129),
            ..n.clone()
        };
        assert!(matches!(
            deliver(&cb, &pool, &long).await,
            CallbackOutcome::Invalid(_)
        ));
        let junk = b"{not json".to_vec();
        assert!(matches!(
            cb.handle(&pool, &junk, &cb.sign(&junk)).await.unwrap(),
            CallbackOutcome::Invalid(_)
        ));
        // The refused deliveries did not use the transaction id up: the right one credits.
        assert_eq!(deliver(&cb, &pool, &n).await, CallbackOutcome::Credited);
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 1);
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_transaction_for_a_paid_order_is_a_conflict_never_a_second_credit() {
    for db in testing::all("callback_conflict").await {
        let pool = setup(&db).await;
        add_order(&pool, "o-c", "WAIT_PAY").await;
        add_order(&pool, "o-closed", "CLOSED").await;
        add_order(&pool, "o-other", "WAIT_PAY").await;
        let cb = callbacks(idem_participant::system_clock());
        assert_eq!(
            deliver(&cb, &pool, &notice("o-c", "txn-1")).await,
            CallbackOutcome::Credited
        );
        let second = deliver(&cb, &pool, &notice("o-c", "txn-2")).await;
        assert!(
            matches!(&second, CallbackOutcome::Conflict(why) if why.contains("txn-1")),
            "{}: {second:?}",
            db.backend
        );
        // Redelivered, it stays a conflict; the first stays a duplicate.
        assert!(matches!(
            deliver(&cb, &pool, &notice("o-c", "txn-2")).await,
            CallbackOutcome::Conflict(_)
        ));
        assert_eq!(
            deliver(&cb, &pool, &notice("o-c", "txn-1")).await,
            CallbackOutcome::Duplicate
        );
        assert_eq!(
            order(&pool, "o-c").await,
            ("PAID".into(), Some("txn-1".into())),
            "{}",
            db.backend
        );
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM outbox").await,
            1,
            "{}: one credit",
            db.backend
        );
        assert_eq!(
            count(
                &pool,
                "SELECT COUNT(*) FROM idem_payment_callback WHERE outcome = 'CONFLICT'"
            )
            .await,
            1
        );
        // A closed order, and a transaction id reused for another order.
        assert!(matches!(
            deliver(&cb, &pool, &notice("o-closed", "txn-3")).await,
            CallbackOutcome::Conflict(_)
        ));
        assert!(matches!(
            deliver(&cb, &pool, &notice("o-other", "txn-1")).await,
            CallbackOutcome::Conflict(_)
        ));
        assert_eq!(order(&pool, "o-other").await.0, "WAIT_PAY");
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 1);
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_young_and_conflict_rows_and_a_purged_txn_is_still_no_second_credit() {
    for db in testing::all("callback_retention").await {
        let pool = setup(&db).await;
        add_order(&pool, "o-r", "WAIT_PAY").await;
        add_order(&pool, "o-y", "WAIT_PAY").await;
        let clock = ManualClock::at(1_700_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let cb = callbacks(shared.clone());
        assert_eq!(
            deliver(&cb, &pool, &notice("o-r", "txn-r")).await,
            CallbackOutcome::Credited
        );
        assert!(matches!(
            deliver(&cb, &pool, &notice("o-r", "txn-late")).await,
            CallbackOutcome::Conflict(_)
        ));
        let short =
            purge_payment_callbacks(&pool, cb.table(), Duration::from_secs(3600), 100, &shared)
                .await;
        assert!(short.is_err(), "a window under the minimum is refused");
        clock.advance(i64::try_from(MIN_CALLBACK_RETENTION.as_millis()).unwrap() + 1);
        assert_eq!(
            deliver(&cb, &pool, &notice("o-y", "txn-y")).await,
            CallbackOutcome::Credited
        );
        let purged = purge_payment_callbacks(&pool, cb.table(), MIN_CALLBACK_RETENTION, 1, &shared)
            .await
            .unwrap();
        assert_eq!(purged, 1, "{}: only the old credited row", db.backend);
        assert_eq!(
            count(&pool, "SELECT COUNT(*) FROM idem_payment_callback").await,
            2
        );
        // The provider redelivers the purged transaction: the order remembers it.
        assert_eq!(
            deliver(&cb, &pool, &notice("o-r", "txn-r")).await,
            CallbackOutcome::Duplicate,
            "{}",
            db.backend
        );
        assert_eq!(count(&pool, "SELECT COUNT(*) FROM outbox").await, 2);
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_honours_a_custom_callback_table() {
    for db in testing::all("callback_purge_custom_table").await {
        let b = db.backend;
        let pool = setup(&db).await;
        create_callback_tables_named(&pool, "shop_callbacks")
            .await
            .expect("custom table");
        add_order(&pool, "o-c", "WAIT_PAY").await;
        add_order(&pool, "o-d", "WAIT_PAY").await;
        let clock = ManualClock::at(1_700_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let custom = callbacks(shared.clone())
            .with_table("shop_callbacks")
            .unwrap();
        let default = callbacks(shared.clone());
        assert_eq!(custom.table(), "shop_callbacks");
        assert_eq!(
            deliver(&custom, &pool, &notice("o-c", "txn-c")).await,
            CallbackOutcome::Credited
        );
        assert_eq!(
            deliver(&default, &pool, &notice("o-d", "txn-d")).await,
            CallbackOutcome::Credited
        );
        clock.advance(i64::try_from(MIN_CALLBACK_RETENTION.as_millis()).unwrap() + 1);
        let rows = |table: &'static str| {
            let pool = pool.clone();
            async move { count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await }
        };
        assert_eq!(
            (
                rows("shop_callbacks").await,
                rows(DEFAULT_CALLBACK_TABLE).await
            ),
            (1, 1),
            "{b}"
        );
        let purged =
            purge_payment_callbacks(&pool, custom.table(), MIN_CALLBACK_RETENTION, 10, &shared)
                .await
                .unwrap();
        assert_eq!(purged, 1, "{b}: the custom table's old row");
        assert_eq!(
            (
                rows("shop_callbacks").await,
                rows(DEFAULT_CALLBACK_TABLE).await
            ),
            (0, 1),
            "{b}: only the named table was purged"
        );
        assert!(
            purge_payment_callbacks(
                &pool,
                "x; DROP TABLE orders",
                MIN_CALLBACK_RETENTION,
                10,
                &shared
            )
            .await
            .is_err(),
            "{b}: a malformed table name is refused"
        );
        pool.close().await;
        db.drop_database().await;
    }
}

//! The order service (participants/demo, `idem_demo::order`) end to end, on SQLite,
//! PostgreSQL and MariaDB: a coordinator in this process, the inventory service and the
//! order service over real HTTP, NATS JetStream at 127.0.0.1:4222. Every kind of repeat a
//! participant service meets, each absorbed by the SDK's kit: 50 concurrent identical order
//! POSTs make one order and one saga; the same key with another body is refused; a payment
//! callback delivered 20 times at once credits once; the "order paid" event published twice
//! credits points once; the nightly settlement rerun with a new execution id settles
//! nothing twice.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use common::typed::{self, wait_status};
use idem_client::Status;
use idem_demo::events::{self, ConsumerConfig, Hooks, Outcome};
use idem_demo::inventory;
use idem_demo::order::{self, OrderConfig, create, nightly, outbox, payment, points, store};
use idem_participant::callback::SIGNATURE_HEADER;
use idem_participant::idempotency::{ExpiredClaim, Recovery, RecoveryHook};
use idem_participant::kit::{SharedClock, system_clock};
use idem_participant::testing;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);
const SECRET: &[u8] = b"provider-secret-for-tests";

fn nats_url() -> String {
    std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Option<String>, Value) {
    let mut request = http.post(url).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the order service answers");
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotency-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json().await.unwrap_or(Value::Null);
    (status, replayed, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_service_turns_every_repeat_into_one_effect() {
    let nats = async_nats::connect(nats_url())
        .await
        .unwrap_or_else(|e| panic!("NATS JetStream at {} is required: {e}", nats_url()));
    let js = jetstream::new(nats);
    for db in testing::all("the_order_service_turns_every_repeat_into_one_effect").await {
        let name = db.backend.name();
        let clock: SharedClock = system_clock();
        let idem = common::coordinator(&db.url).await;
        let client = typed::client(&idem.url());
        let stock = inventory::open(&db.url).await.unwrap();
        inventory::seed(&stock, "apple", 100).await.unwrap();
        let inventory_service = inventory::start(stock.clone(), "127.0.0.1:0")
            .await
            .unwrap();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let subject = format!("test.orders.paid.{run}");
        let pool = order::open(&db.url).await.unwrap();
        let config = OrderConfig {
            idem: client.clone(),
            inventory_url: inventory_service.url(""),
            merchant: "shop-1".into(),
            provider: "acmepay".into(),
            provider_secret: SECRET.to_vec(),
            clock: clock.clone(),
            create_lease: Duration::from_secs(30),
            paid_subject: subject.clone(),
        };
        let service = order::start(pool.clone(), config, "127.0.0.1:0")
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let orders_url = service.url("/orders");

        // 50 identical POSTs at once, one key: one order, one saga, one answer.
        let body = json!({"customer": "alice", "sku": "apple", "quantity": 3,
                          "amount_minor": 4_250, "currency": "EUR"});
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (http, url, body, start) = (
                http.clone(),
                orders_url.clone(),
                body.clone(),
                start.clone(),
            );
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                post(&http, &url, &[("Idempotency-Key", "order-key-1")], &body).await
            }));
        }
        let mut answers = HashSet::new();
        let mut replayed = 0;
        for task in tasks {
            let (status, replay, answer) = task.await.unwrap();
            assert_eq!(status, 201, "{name}: {answer}");
            replayed += usize::from(replay.as_deref() == Some("true"));
            answers.insert(answer.to_string());
        }
        assert_eq!(
            answers.len(),
            1,
            "{name}: all 50 got the first answer: {answers:?}"
        );
        assert_eq!(
            replayed, 49,
            "{name}: every answer but the first is a replay"
        );
        let orders = store::orders(&pool).await.unwrap();
        assert_eq!(orders.len(), 1, "{name}: one order for one key: {orders:?}");
        let first = orders[0].clone();
        let created: Value = serde_json::from_str(answers.iter().next().unwrap()).unwrap();
        assert_eq!(created["order_id"], first.order_id.as_str());
        wait_status(&client, &first.saga_gid, &[Status::Succeeded], WAIT).await;
        let apple = inventory::stock(&stock, "apple").await.unwrap().unwrap();
        assert_eq!(
            (apple.available, apple.sold),
            (97, 3),
            "{name}: the saga sold once"
        );

        // The fact source of an interrupted POST: the key's order exists → the first answer
        // (its saga re-submitted under the same gid, which starts nothing new); no order →
        // safe to run.
        let app = order::OrderApp {
            pool: pool.clone(),
            idem: client.clone(),
            inventory_url: inventory_service.url(""),
            merchant: "shop-1".into(),
            clock: clock.clone(),
            callbacks: payment::callbacks("acmepay", SECRET, &subject, clock.clone()).unwrap(),
        };
        let hook = create::OrderRecovery { app };
        let expired = |key: &str| ExpiredClaim {
            scope: format!("{}:{}", order::DEFAULT_TENANT, create::OPERATION),
            key: key.into(),
            request_hash: String::new(),
            owner_token: "0".repeat(32),
            attempt: 1,
            status: idem_participant::idempotency::Status::Unknown,
            lease_until_ms: None,
            answered: Some(503),
            since_ms: 0,
        };
        match hook.recover(&expired("order-key-1")).await {
            Recovery::Succeeded(result) => {
                assert_eq!(result.status, 201, "{name}");
                assert_eq!(
                    serde_json::from_slice::<Value>(&result.body).unwrap(),
                    created,
                    "{name}"
                );
            }
            other => panic!("{name}: the order exists, so the POST happened: {other:?}"),
        }
        assert_eq!(
            hook.recover(&expired("never-sent")).await,
            Recovery::NotHappened,
            "{name}"
        );
        assert_eq!(
            store::orders(&pool).await.unwrap().len(),
            1,
            "{name}: recovery made nothing"
        );
        let apple = inventory::stock(&stock, "apple").await.unwrap().unwrap();
        assert_eq!(
            apple.sold, 3,
            "{name}: the re-submitted saga sold nothing more"
        );

        // The same key with another body is refused, and changes nothing.
        let other = json!({"customer": "alice", "sku": "apple", "quantity": 4,
                           "amount_minor": 5_000, "currency": "EUR"});
        let (status, _, answer) = post(
            &http,
            &orders_url,
            &[("Idempotency-Key", "order-key-1")],
            &other,
        )
        .await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (409, Some("idempotency_key_conflict")),
            "{name}: {answer}"
        );
        let (status, _, answer) = post(&http, &orders_url, &[], &body).await;
        assert_eq!(status, 400, "{name}: the key is required: {answer}");
        assert_eq!(store::orders(&pool).await.unwrap().len(), 1);

        // A second order that nobody pays: the settlement must not count it.
        let (status, _, _) = post(
            &http,
            &orders_url,
            &[("Idempotency-Key", "order-key-2")],
            &other,
        )
        .await;
        assert_eq!(status, 201, "{name}");

        // The provider calls back 20 times at once: credited once, 20 successes.
        let callbacks = payment::callbacks("acmepay", SECRET, &subject, clock.clone()).unwrap();
        let notice = json!({"provider_txn_id": "pay-777", "order_ref": first.order_id,
                            "amount_minor": 4_250, "currency": "EUR", "merchant": "shop-1"});
        let raw = serde_json::to_vec(&notice).unwrap();
        let signature = callbacks.sign(&raw);
        let callback_url = service.url("/payments/callback");
        let start = Arc::new(tokio::sync::Barrier::new(20));
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let (http, url, raw, signature, start) = (
                http.clone(),
                callback_url.clone(),
                raw.clone(),
                signature.clone(),
                start.clone(),
            );
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                let response = http
                    .post(&url)
                    .header(SIGNATURE_HEADER, signature)
                    .header("content-type", "application/json")
                    .body(raw)
                    .send()
                    .await
                    .unwrap();
                let status = response.status().as_u16();
                (status, response.json::<Value>().await.unwrap())
            }));
        }
        let mut credited = 0;
        for task in tasks {
            let (status, answer) = task.await.unwrap();
            assert_eq!(status, 200, "{name}: {answer}");
            credited += usize::from(answer["outcome"] == "credited");
        }
        assert_eq!(
            credited, 1,
            "{name}: one of the 20 credited, the rest were duplicates"
        );
        let paid = store::order(&pool, &first.order_id).await.unwrap().unwrap();
        assert_eq!(
            (paid.status.as_str(), paid.paid_txn.as_deref()),
            ("PAID", Some("pay-777"))
        );
        let forged = http
            .post(&callback_url)
            .header(SIGNATURE_HEADER, "00".repeat(32))
            .body(raw.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            forged.status().as_u16(),
            401,
            "{name}: a forged callback is refused"
        );
        assert_eq!(
            outbox::pending(&pool).await.unwrap(),
            1,
            "{name}: one event for one credit"
        );

        // The event goes out, then out again (a relay that died before marking its row),
        // and the consumer credits points once.
        let consumer = events::open_consumer(
            &js,
            &ConsumerConfig::new(&format!("ORDERS_{run}"), &subject, &format!("points-{run}")),
        )
        .await
        .unwrap();
        assert_eq!(
            outbox::relay_once(&pool, &js, &clock, 100).await.unwrap(),
            1
        );
        assert_eq!(
            outbox::relay_once(&pool, &js, &clock, 100).await.unwrap(),
            0,
            "{name}: marked"
        );
        let event_id = payment::paid_event_id(&first.order_id);
        let mut again = async_nats::HeaderMap::new();
        // Another message id: JetStream's own duplicate window does not hide this copy.
        again.insert("Nats-Msg-Id", format!("{event_id}-republished").as_str());
        let body = json!({"event_id": event_id, "order_id": first.order_id, "customer": "alice",
                          "amount_minor": 4_250, "currency": "EUR"});
        js.publish_with_headers(subject.clone(), again, body.to_string().into())
            .await
            .unwrap()
            .await
            .unwrap();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let hooks = Hooks {
            on_done: Some(Arc::new(move |_event: &events::Event, outcome: Outcome| {
                let _ = done_tx.send(outcome);
            })),
            ..Hooks::default()
        };
        let consuming = tokio::spawn(events::run(
            consumer,
            pool.clone(),
            points::log(),
            points::credit_points,
            hooks,
        ));
        let mut outcomes = Vec::new();
        while outcomes.len() < 2 {
            let outcome = tokio::time::timeout(WAIT, done_rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{name}: both copies delivered: {outcomes:?}"))
                .expect("the consumer runs");
            outcomes.push(outcome);
        }
        consuming.abort();
        assert_eq!(outcomes, [Outcome::Processed, Outcome::Duplicate], "{name}");
        assert_eq!(
            store::points(&pool).await.unwrap(),
            [(first.order_id.clone(), points::points_for(4_250))],
            "{name}: points once"
        );

        // The nightly job, run twice for the same day under two execution ids.
        let day = paid.business_date.clone();
        let run1 = nightly::settle(&pool, clock.clone(), &day, "exec-1")
            .await
            .unwrap();
        assert_eq!(
            (run1.done, run1.skipped),
            (order::SETTLEMENT_SHARDS, 0),
            "{name}"
        );
        let run2 = nightly::settle(&pool, clock.clone(), &day, "exec-2")
            .await
            .unwrap();
        assert_eq!(
            (run2.done, run2.skipped),
            (0, order::SETTLEMENT_SHARDS),
            "{name}: a rerun skips"
        );
        let lines = store::settlement(&pool, &day).await.unwrap();
        assert_eq!(
            lines.len() as u64,
            order::SETTLEMENT_SHARDS,
            "{name}: one line per shard: {lines:?}"
        );
        assert!(
            lines.iter().all(|l| l.execution_id == "exec-1"),
            "{name}: {lines:?}"
        );
        let (count, total) = lines
            .iter()
            .fold((0, 0), |(n, t), l| (n + l.orders, t + l.amount_minor));
        assert_eq!(
            (count, total),
            (1, 4_250),
            "{name}: only the paid order, once"
        );

        service.stop().await.unwrap();
        inventory_service.stop().await.unwrap();
        idem.stop().await.unwrap();
        let _ = js.delete_stream(format!("ORDERS_{run}")).await;
        db.drop_database().await;
        println!("order service on {name}: every repeat absorbed");
    }
}

//! An example NATS JetStream consumer that applies each business event once (seed §16, §17):
//! a durable pull consumer with explicit acks, whose handler runs under the SDK's
//! [`ConsumerLog`] and acks only after the log row and the business change committed.
//!
//! JetStream redelivers a message that is not acked within the consumer's `ack_wait`: a
//! consumer killed between its commit and its ack gets the event again after a restart,
//! and the consumer log answers it as a duplicate. A producer that retried its publish
//! puts the same event in the stream twice, under two stream sequences; the key is the
//! event's own `event_id`, so the second copy is a duplicate too. The stream sequence is
//! recorded in the log as `broker_message_id` (`<stream>:<sequence>`), for diagnosis only.
//!
//! Events are JSON objects with a string `event_id` (1 to 128 characters); the rest of the
//! object is the handler's. A message that is not such an object, or that the handler
//! refuses for good, is terminated (`AckKind::Term`), not redelivered for ever; a handler or
//! database failure is nacked and comes back.
//!
//! The example's business change ([`record_payment`]) inserts an "order paid" event into
//! `demo_payment_received`, a table with deliberately no unique key on the event: the
//! consumer log alone keeps it to one row per event.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer};
use futures_util::StreamExt;
use idem_participant::consumer::{ConsumerLog, Handled, create_consumer_tables};
use idem_participant::{LocalTx, ParticipantError};
use serde::Deserialize;
use sqlx::{Any, AnyPool};

/// An event as delivered: its business id, the whole JSON body, and where it came from.
#[derive(Clone, Debug)]
pub struct Event {
    /// The producer's business event id: the consumer log's key.
    pub event_id: String,
    /// The whole event.
    pub body: serde_json::Value,
    /// The stream sequence of this copy.
    pub stream_sequence: u64,
    /// How many times JetStream has delivered this copy (1 the first time).
    pub delivered: i64,
}

/// What became of one delivery, reported to [`Hooks::on_done`] after it was acked (or
/// terminated, or nacked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// First application: committed, then acked.
    Processed,
    /// Applied before: acked, nothing ran.
    Duplicate,
    /// Malformed or refused for good: terminated.
    Rejected,
    /// Failed (database, handler): nacked, JetStream redelivers.
    Retry,
}

/// Called around a delivery; both optional.
#[derive(Clone, Default)]
pub struct Hooks {
    /// After the log row and the business change committed, before the ack (where a crash
    /// is the interesting one; the crash test aborts here).
    #[allow(clippy::type_complexity)]
    pub after_commit: Option<Arc<dyn Fn(&Event, Outcome) + Send + Sync>>,
    /// After the delivery was acked, terminated or nacked.
    #[allow(clippy::type_complexity)]
    pub on_done: Option<Arc<dyn Fn(&Event, Outcome) + Send + Sync>>,
}

/// Where the consumer reads.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// The stream (created if absent, over `subject`).
    pub stream: String,
    /// The subject events are published on.
    pub subject: String,
    /// The durable consumer's name: the consumer group.
    pub durable: String,
    /// How long JetStream waits for an ack before it redelivers.
    pub ack_wait: Duration,
    /// Deliveries of one message before JetStream gives it up.
    pub max_deliver: i64,
}

impl ConsumerConfig {
    /// The stream `stream` over `subject`, read by durable consumer `durable`, with a 30 s
    /// ack wait and up to 20 deliveries.
    pub fn new(stream: &str, subject: &str, durable: &str) -> ConsumerConfig {
        ConsumerConfig {
            stream: stream.to_owned(),
            subject: subject.to_owned(),
            durable: durable.to_owned(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 20,
        }
    }
}

/// Anything the consumer loop stops on.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The example's tables: the consumer log and `demo_payment_received`.
pub async fn create_tables(pool: &AnyPool) -> Result<(), sqlx::Error> {
    create_consumer_tables(pool).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS demo_payment_received (event_id VARCHAR(128) NOT NULL, order_id VARCHAR(128) NOT NULL, amount_minor BIGINT NOT NULL)",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// The stream and the durable pull consumer of `config`, created if absent (explicit acks).
pub async fn open_consumer(
    js: &jetstream::Context,
    config: &ConsumerConfig,
) -> Result<consumer::PullConsumer, Error> {
    let stream = js
        .get_or_create_stream(jetstream::stream::Config {
            name: config.stream.clone(),
            subjects: vec![config.subject.clone()],
            ..Default::default()
        })
        .await?;
    let consumer = stream
        .get_or_create_consumer(
            &config.durable,
            consumer::pull::Config {
                durable_name: Some(config.durable.clone()),
                ack_policy: consumer::AckPolicy::Explicit,
                ack_wait: config.ack_wait,
                max_deliver: config.max_deliver,
                ..Default::default()
            },
        )
        .await?;
    Ok(consumer)
}

#[derive(Deserialize)]
struct Envelope {
    event_id: String,
}

/// Consumes `consumer` for ever (until the broker connection fails), applying each event
/// with `handler` under `log` on `pool`: the handler's writes and the log row commit in one
/// local transaction, and only then is the message acked.
pub async fn run<H, Fut>(
    consumer: consumer::PullConsumer,
    pool: AnyPool,
    log: ConsumerLog,
    handler: H,
    hooks: Hooks,
) -> Result<(), Error>
where
    H: Fn(LocalTx<'static, Any>, Event) -> Fut,
    Fut: Future<Output = Result<(), ParticipantError>>,
{
    let mut messages = consumer.messages().await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        let (stream_name, stream_sequence, delivered) = {
            let info = message.info()?;
            (info.stream.to_owned(), info.stream_sequence, info.delivered)
        };
        let parsed = serde_json::from_slice::<serde_json::Value>(&message.payload)
            .ok()
            .and_then(|body| {
                let envelope = Envelope::deserialize(&body).ok()?;
                Some(Event {
                    event_id: envelope.event_id,
                    body,
                    stream_sequence,
                    delivered,
                })
            });
        let Some(event) = parsed else {
            tracing::warn!(
                stream_sequence,
                "not an event with a string event_id; terminated"
            );
            message.ack_with(AckKind::Term).await?;
            continue;
        };
        let broker_id = format!("{stream_name}:{stream_sequence}");
        let handled = log
            .handle(&pool, &event.event_id, Some(&broker_id), |tx| {
                handler(tx, event.clone())
            })
            .await;
        let outcome = match handled {
            Ok(Handled::Processed(())) => Outcome::Processed,
            Ok(Handled::Duplicate) => Outcome::Duplicate,
            Err(e) if e.is_refusal() => {
                tracing::warn!(event_id = %event.event_id, error = %e, "event refused for good; terminated");
                Outcome::Rejected
            }
            Err(e) => {
                tracing::warn!(event_id = %event.event_id, error = %e, "event failed; redelivered later");
                Outcome::Retry
            }
        };
        if matches!(outcome, Outcome::Processed | Outcome::Duplicate)
            && let Some(hook) = &hooks.after_commit
        {
            hook(&event, outcome);
        }
        // Acked only now: a crash before this line redelivers the event, which the log
        // then answers as a duplicate.
        match outcome {
            // A double ack waits for the server's confirmation, so a "done" report is true.
            Outcome::Processed | Outcome::Duplicate => message.double_ack().await?,
            Outcome::Rejected => message.ack_with(AckKind::Term).await?,
            Outcome::Retry => {
                let later = AckKind::Nak(Some(Duration::from_millis(200)));
                message.ack_with(later).await?
            }
        }
        if let Some(hook) = &hooks.on_done {
            hook(&event, outcome);
        }
    }
    Ok(())
}

#[derive(Deserialize)]
struct Payment {
    order_id: String,
    amount_minor: i64,
}

/// The example's business change for an "order paid" event (`{"event_id", "order_id",
/// "amount_minor"}`): one row in `demo_payment_received`. An event without those fields is
/// refused (terminated, not redelivered).
pub async fn record_payment(
    tx: LocalTx<'static, Any>,
    event: Event,
) -> Result<(), ParticipantError> {
    let payment = Payment::deserialize(&event.body)
        .map_err(|e| ParticipantError::refused(format!("not an order-paid event: {e}")))?;
    sqlx::query(tx.sql(
        "INSERT INTO demo_payment_received (event_id, order_id, amount_minor) VALUES (?, ?, ?)",
    ))
    .bind(event.event_id)
    .bind(payment.order_id)
    .bind(payment.amount_minor)
    .execute(&mut *tx.conn())
    .await?;
    Ok(())
}

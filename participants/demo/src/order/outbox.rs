//! The outbox: an event row written in the same local transaction as the change it
//! announces (the payment), published to NATS JetStream after commit.
//!
//! Publishing inside the transaction would announce payments that then roll back;
//! publishing after commit without a row would lose the event when the process dies in
//! between. With the row, a crash only delays the event: the next relay pass publishes it
//! again, and a row published but not yet marked is published twice. That repeat is why
//! the consumer dedups by the business event id in its own log (§16, §17); the
//! `Nats-Msg-Id` header (JetStream's duplicate window) only thins out repeats, it is not
//! relied on.

use std::time::Duration;

use async_nats::jetstream;
use sqlx::{AnyPool, Row};

use crate::dialect_of;
use idem_participant::LocalTx;
use idem_participant::kit::SharedClock;

/// Writes an event into the outbox inside `tx` (the transaction of the change it announces).
/// The same event id twice is one event: the second insert is a no-op.
pub async fn stage(
    tx: &LocalTx<'_, sqlx::Any>,
    event_id: &str,
    subject: &str,
    body: &serde_json::Value,
    now_ms: i64,
) -> Result<(), sqlx::Error> {
    // ON CONFLICT DO NOTHING where there is one (a failed statement would abort a
    // PostgreSQL transaction); on MySQL a duplicate-key error leaves the transaction usable.
    let conflict = match tx.dialect() {
        idem_participant::Backend::Mysql => "",
        _ => " ON CONFLICT (event_id) DO NOTHING",
    };
    let sql = format!(
        "INSERT INTO order_outbox (event_id, subject, body, created_at_ms) VALUES (?, ?, ?, ?){conflict}"
    );
    let inserted = sqlx::query(tx.sql(&sql))
        .bind(event_id)
        .bind(subject)
        .bind(body.to_string())
        .bind(now_ms)
        .execute(&mut *tx.conn())
        .await;
    match inserted {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Why a relay pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Reading or marking the outbox failed.
    #[error("outbox: {0}")]
    Database(#[from] sqlx::Error),
    /// JetStream did not acknowledge a publish.
    #[error("publish: {0}")]
    Publish(String),
}

/// Publishes up to `batch` unpublished events, oldest first, each acknowledged by the
/// stream before its row is marked; returns how many went out.
pub async fn relay_once(
    pool: &AnyPool,
    js: &jetstream::Context,
    clock: &SharedClock,
    batch: u32,
) -> Result<usize, RelayError> {
    let dialect = dialect_of(pool);
    let sql = format!(
        "SELECT event_id, subject, body FROM order_outbox WHERE published_at_ms IS NULL \
         ORDER BY created_at_ms, event_id LIMIT {}",
        batch.max(1)
    );
    let rows = sqlx::query(dialect.sql(&sql)).fetch_all(pool).await?;
    for row in &rows {
        let event_id: String = row.try_get("event_id")?;
        let subject: String = row.try_get("subject")?;
        let body: String = row.try_get("body")?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", event_id.as_str());
        js.publish_with_headers(subject, headers, body.into_bytes().into())
            .await
            .map_err(|e| RelayError::Publish(e.to_string()))?
            .await
            .map_err(|e| RelayError::Publish(e.to_string()))?;
        sqlx::query(dialect.sql(
            "UPDATE order_outbox SET published_at_ms = ? WHERE event_id = ? AND published_at_ms IS NULL",
        ))
        .bind(clock.now_ms())
        .bind(event_id.as_str())
        .execute(pool)
        .await?;
    }
    Ok(rows.len())
}

/// Events still waiting to be published.
pub async fn pending(pool: &AnyPool) -> Result<i64, sqlx::Error> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM order_outbox WHERE published_at_ms IS NULL")
        .fetch_one(pool)
        .await?;
    row.try_get("n")
}

/// Runs [`relay_once`] every `every` until the task is dropped; a failed pass is logged and
/// retried on the next tick (the rows stay unpublished).
pub fn spawn_relay(
    pool: AnyPool,
    js: jetstream::Context,
    clock: SharedClock,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = relay_once(&pool, &js, &clock, 100).await {
                tracing::warn!(error = %e, "outbox relay pass failed; retrying on the next tick");
            }
        }
    })
}

//! The consumer of "order paid" events: loyalty points, credited once per order.
//!
//! It runs under the SDK's consumer log (group `order-points`, handler version `v1`) through
//! the example JetStream loop ([`crate::events::run`]): the log row and the points row
//! commit together, and the message is acked only after. A redelivery (the consumer died
//! between its commit and its ack) or a second publish of the same event by the outbox is
//! answered from the log; the key is the event's own `event_id`, never JetStream's
//! sequence. Bumping the handler version re-applies every event (a new handler's own log).

use idem_participant::consumer::ConsumerLog;
use idem_participant::{LocalTx, ParticipantError};
use serde::Deserialize;
use sqlx::Any;

use crate::events::Event;

/// The consumer group (the durable consumer's name too).
pub const GROUP: &str = "order-points";
/// The handler's version: part of the log's key.
pub const HANDLER_VERSION: &str = "v1";

/// The consumer log of this handler.
pub fn log() -> ConsumerLog {
    ConsumerLog::new(GROUP, HANDLER_VERSION).expect("constant names are valid")
}

#[derive(Deserialize)]
struct OrderPaid {
    order_id: String,
    customer: String,
    amount_minor: i64,
}

/// One point per whole currency unit paid.
pub fn points_for(amount_minor: i64) -> i64 {
    amount_minor / 100
}

/// The business change of one "order paid" event, inside the consumer log's transaction.
pub async fn credit_points(
    tx: LocalTx<'static, Any>,
    event: Event,
) -> Result<(), ParticipantError> {
    let paid = OrderPaid::deserialize(&event.body)
        .map_err(|e| ParticipantError::refused(format!("not an order-paid event: {e}")))?;
    sqlx::query(tx.sql("INSERT INTO order_points (order_id, customer, points) VALUES (?, ?, ?)"))
        .bind(paid.order_id)
        .bind(paid.customer)
        .bind(points_for(paid.amount_minor))
        .execute(&mut *tx.conn())
        .await?;
    Ok(())
}

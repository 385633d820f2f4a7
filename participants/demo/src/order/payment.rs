//! `POST /payments/callback`: the payment provider's notification, credited once.
//!
//! The SDK's [`PaymentCallbacks`] does the protocol (signature first, then amount,
//! currency and merchant against the order, then the provider transaction id's unique row
//! and the conditional `WAIT_PAY → PAID` update in one local transaction). The service adds
//! one thing to that transaction: the "order paid" event in its outbox, so the event exists
//! if and only if the credit committed.

use std::sync::Arc;

use idem_participant::callback::{OrderTable, PaymentCallbacks, PaymentNotice};
use idem_participant::{LocalTx, ParticipantError};
use serde_json::json;
use sqlx::{Any, Row};

use super::outbox;
use idem_participant::kit::SharedClock;

/// The default subject "order paid" events are published on.
pub const ORDER_PAID_SUBJECT: &str = "orders.paid";

/// The business event id of an order's payment: one per order, whichever callback
/// credited it and however often the outbox publishes it.
pub fn paid_event_id(order_id: &str) -> String {
    format!("order-paid-{order_id}")
}

/// The callbacks of `provider` signed with `secret`, crediting the `orders` table and
/// staging the "order paid" event (on `subject`) with the credit.
pub fn callbacks(
    provider: &str,
    secret: &[u8],
    subject: &str,
    clock: SharedClock,
) -> Result<PaymentCallbacks<Any>, String> {
    let orders = OrderTable::new("orders")?.columns([
        "order_id",
        "status",
        "paid_txn",
        "amount_minor",
        "currency",
        "merchant",
    ])?;
    let stamp = clock.clone();
    let subject = subject.to_owned();
    Ok(PaymentCallbacks::new(provider, secret.to_vec(), orders)?
        .with_clock(clock)
        .on_credit(Arc::new(move |tx, notice| {
            let now = stamp.now_ms();
            Box::pin(stage_paid_event(tx, notice, subject.clone(), now))
        })))
}

async fn stage_paid_event(
    tx: LocalTx<'static, Any>,
    notice: PaymentNotice,
    subject: String,
    now_ms: i64,
) -> Result<(), ParticipantError> {
    let customer: String = sqlx::query(tx.sql("SELECT customer FROM orders WHERE order_id = ?"))
        .bind(&notice.order_ref)
        .fetch_one(&mut *tx.conn())
        .await?
        .try_get("customer")?;
    let event_id = paid_event_id(&notice.order_ref);
    let body = json!({
        "event_id": event_id,
        "order_id": notice.order_ref,
        "customer": customer,
        "amount_minor": notice.amount_minor,
        "currency": notice.currency,
        "provider_txn_id": notice.provider_txn_id,
    });
    outbox::stage(&tx, &event_id, &subject, &body, now_ms).await?;
    Ok(())
}

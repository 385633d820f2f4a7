//! The order service's own tables (`participants/demo/sql/order.*.sql`) and the reads the
//! tests and the API use.

use serde::{Deserialize, Serialize};
use sqlx::{AnyPool, Row};

use crate::dialect_of;

/// Waiting for the payment provider's callback.
pub const WAIT_PAY: &str = "WAIT_PAY";
/// Paid, by exactly one provider transaction.
pub const PAID: &str = "PAID";

/// One order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub tenant: String,
    pub customer: String,
    pub sku: String,
    pub quantity: i64,
    pub amount_minor: i64,
    pub currency: String,
    /// The merchant the customer pays.
    pub merchant: String,
    /// [`WAIT_PAY`] or [`PAID`].
    pub status: String,
    /// The saga that reserves the stock.
    pub saga_gid: String,
    /// The provider transaction that paid it.
    pub paid_txn: Option<String>,
    /// The day the order counts for in the nightly settlement (`YYYY-MM-DD`, UTC).
    pub business_date: String,
}

/// Creates the order tables and every kit table the service uses, if missing.
pub async fn migrate(pool: &AnyPool) -> Result<(), sqlx::Error> {
    idem_participant::idempotency::create_idempotency_tables(pool).await?;
    idem_participant::callback::create_callback_tables(pool).await?;
    idem_participant::consumer::create_consumer_tables(pool).await?;
    idem_participant::jobs::create_job_tables(pool).await?;
    crate::run_script(
        pool,
        include_str!("../../sql/order.sqlite.sql"),
        include_str!("../../sql/order.postgres.sql"),
        include_str!("../../sql/order.mysql.sql"),
    )
    .await
}

const COLUMNS: &str = "order_id, tenant, customer, sku, quantity, amount_minor, currency, merchant, \
                       status, saga_gid, paid_txn, business_date";

fn order_from(row: &sqlx::any::AnyRow) -> Result<Order, sqlx::Error> {
    Ok(Order {
        order_id: row.try_get("order_id")?,
        tenant: row.try_get("tenant")?,
        customer: row.try_get("customer")?,
        sku: row.try_get("sku")?,
        quantity: row.try_get("quantity")?,
        amount_minor: row.try_get("amount_minor")?,
        currency: row.try_get("currency")?,
        merchant: row.try_get("merchant")?,
        status: row.try_get("status")?,
        saga_gid: row.try_get("saga_gid")?,
        paid_txn: row.try_get("paid_txn")?,
        business_date: row.try_get("business_date")?,
    })
}

/// One order by id.
pub async fn order(pool: &AnyPool, order_id: &str) -> Result<Option<Order>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM orders WHERE order_id = ?");
    let row = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(order_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(order_from).transpose()
}

/// The order an Idempotency-Key made, if it made one: the fact source of the order POST.
pub async fn order_by_key(
    pool: &AnyPool,
    tenant: &str,
    key: &str,
) -> Result<Option<Order>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM orders WHERE tenant = ? AND idem_key = ?");
    let row = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(tenant)
        .bind(key)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(order_from).transpose()
}

/// Every order, oldest id first.
pub async fn orders(pool: &AnyPool) -> Result<Vec<Order>, sqlx::Error> {
    let sql = format!("SELECT {COLUMNS} FROM orders ORDER BY order_id");
    let rows = sqlx::query(dialect_of(pool).sql(&sql))
        .fetch_all(pool)
        .await?;
    rows.iter().map(order_from).collect()
}

/// Loyalty points credited per order: `(order_id, points)`.
pub async fn points(pool: &AnyPool) -> Result<Vec<(String, i64)>, sqlx::Error> {
    let rows = sqlx::query("SELECT order_id, points FROM order_points ORDER BY order_id, points")
        .fetch_all(pool)
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("order_id")?, r.try_get("points")?)))
        .collect()
}

/// One shard's line of the nightly settlement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettlementLine {
    pub business_date: String,
    pub shard: i64,
    pub orders: i64,
    pub amount_minor: i64,
    /// The run of the job that wrote the line.
    pub execution_id: String,
}

/// The settlement of a business date, by shard.
pub async fn settlement(
    pool: &AnyPool,
    business_date: &str,
) -> Result<Vec<SettlementLine>, sqlx::Error> {
    let rows = sqlx::query(dialect_of(pool).sql(
        "SELECT business_date, shard, orders, amount_minor, execution_id FROM order_settlement \
         WHERE business_date = ? ORDER BY shard, execution_id",
    ))
    .bind(business_date)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(SettlementLine {
                business_date: r.try_get("business_date")?,
                shard: r.try_get("shard")?,
                orders: r.try_get("orders")?,
                amount_minor: r.try_get("amount_minor")?,
                execution_id: r.try_get("execution_id")?,
            })
        })
        .collect()
}

/// The UTC calendar day of a Unix-millisecond time, `YYYY-MM-DD`. The time is the order
/// service's clock; one outside what a date can hold is a broken clock.
pub fn business_date(unix_ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ms) * 1_000_000)
        .expect("the order service's clock reads a time within the years a date can hold");
    let day = at.date();
    format!(
        "{:04}-{:02}-{:02}",
        day.year(),
        u8::from(day.month()),
        day.day()
    )
}

#[cfg(test)]
mod tests {
    use super::business_date;

    #[test]
    fn business_dates_are_utc_calendar_days() {
        assert_eq!(business_date(0), "1970-01-01");
        assert_eq!(business_date(951_782_400_000), "2000-02-29");
        assert_eq!(business_date(1_764_547_199_999), "2025-11-30");
        assert_eq!(business_date(1_764_547_200_000), "2025-12-01");
        assert_eq!(business_date(-1), "1969-12-31");
    }
}

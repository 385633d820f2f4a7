//! `POST /orders`: one order per `Idempotency-Key`, and the saga that takes its stock.
//!
//! The route sits behind the SDK's Idempotency-Key layer in its lease mode (the claim
//! commits `PROCESSING` before the handler runs), because the handler calls another
//! service: the coordinator, to start the saga. So every way a request can be repeated is
//! covered twice over, by design:
//!
//! * a repeat after the answer is the layer's replay of the stored answer;
//! * a repeat while the first still runs is the layer's 202;
//! * a repeat after the first's process died mid-way (lease expired), or after it answered
//!   a 5xx (an unknown outcome: the order may exist), goes to [`OrderRecovery`], which
//!   reads the fact source — the `orders` row the key made — instead of running the
//!   handler blindly; when the row exists it re-submits the saga under the same gid (the
//!   coordinator's own key: a second submit starts nothing) and answers as the first
//!   would have;
//! * the handler itself inserts the order if absent by `(tenant, idem_key)` and reads it
//!   back, so even a re-run (after the hook found no order) reuses the first order id.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use idem_participant::idempotency::{
    BoxFuture, ExpiredClaim, Recovery, RecoveryHook, StoredResult,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::store::{self, Order, WAIT_PAY};
use super::{OrderApp, SETTLEMENT_SHARDS, tenant_of};
use crate::{dialect_of, inventory};

/// The operation name of the route: the record's scope is `<tenant>:create_order`.
pub const OPERATION: &str = "create_order";

/// The body of `POST /orders`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateOrder {
    pub customer: String,
    pub sku: String,
    pub quantity: i64,
    pub amount_minor: i64,
    pub currency: String,
}

impl CreateOrder {
    fn check(&self) -> Result<(), String> {
        for (name, value, max) in [("customer", &self.customer, 64), ("sku", &self.sku, 64)] {
            if value.is_empty()
                || value.chars().count() > max
                || value.chars().any(char::is_control)
            {
                return Err(format!("`{name}` must be 1 to {max} printable characters"));
            }
        }
        if !(1..=1_000).contains(&self.quantity) {
            return Err("`quantity` must be 1 to 1000".into());
        }
        if self.amount_minor <= 0 {
            return Err("`amount_minor` must be positive".into());
        }
        if self.currency.len() != 3 || !self.currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err("`currency` must be three capital letters (ISO 4217)".into());
        }
        Ok(())
    }
}

/// The answer of a created order (201), replayed to every repeat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Created {
    pub order_id: String,
    pub status: String,
    pub saga_gid: String,
    pub amount_minor: i64,
    pub currency: String,
}

impl From<&Order> for Created {
    fn from(o: &Order) -> Created {
        Created {
            order_id: o.order_id.clone(),
            status: o.status.clone(),
            saga_gid: o.saga_gid.clone(),
            amount_minor: o.amount_minor,
            currency: o.currency.clone(),
        }
    }
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

/// The handler. The layer has checked the key (required on this route) before it runs.
pub async fn create_order(
    State(app): State<OrderApp>,
    headers: HeaderMap,
    body: Result<Json<CreateOrder>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(request) = match body {
        Ok(body) => body,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_order", e.body_text()),
    };
    if let Err(why) = request.check() {
        return error(StatusCode::BAD_REQUEST, "invalid_order", why);
    }
    let Some(key) = headers
        .get(idem_participant::idempotency::http::KEY_HEADER)
        .and_then(|v| v.to_str().ok())
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "idempotency_key_required",
            "Idempotency-Key is required",
        );
    };
    let tenant = tenant_of(&headers);
    let order = match insert_if_absent(&app, &tenant, key, &request).await {
        Ok(order) => order,
        Err(e) => return error(StatusCode::SERVICE_UNAVAILABLE, "database", e.to_string()),
    };
    match submit_saga(&app, &order).await {
        Ok(()) => (StatusCode::CREATED, Json(Created::from(&order))).into_response(),
        // 5xx: the order exists, the saga may or may not: the layer records an unknown
        // outcome, and the client's retry is settled by `OrderRecovery`, which finds this
        // order and re-submits the same saga.
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "coordinator_unavailable",
            e,
        ),
    }
}

/// Inserts the order of `(tenant, key)` unless it exists, and reads it back: the first
/// request's order, whoever inserted it.
async fn insert_if_absent(
    app: &OrderApp,
    tenant: &str,
    key: &str,
    request: &CreateOrder,
) -> Result<Order, sqlx::Error> {
    let pool = &app.pool;
    let order_id = uuid::Uuid::new_v4().simple().to_string();
    let now = app.clock.now_ms();
    // Insert-if-absent by (tenant, idem_key): ON CONFLICT DO NOTHING where there is one; on
    // MySQL a plain INSERT whose duplicate-key error means "exists" (INSERT IGNORE would
    // also hide truncations and other errors).
    let conflict = match dialect_of(pool) {
        idem_participant::Backend::Mysql => "",
        _ => " ON CONFLICT (tenant, idem_key) DO NOTHING",
    };
    let sql = format!(
        "INSERT INTO orders (order_id, tenant, idem_key, customer, sku, quantity, amount_minor, \
         currency, merchant, status, saga_gid, business_date, shard, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?){conflict}"
    );
    let inserted = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(&order_id)
        .bind(tenant)
        .bind(key)
        .bind(&request.customer)
        .bind(&request.sku)
        .bind(request.quantity)
        .bind(request.amount_minor)
        .bind(&request.currency)
        .bind(&app.merchant)
        .bind(WAIT_PAY)
        .bind(format!("order-{order_id}"))
        .bind(store::business_date(now))
        .bind(shard_of(&order_id))
        .bind(now)
        .execute(pool)
        .await;
    match inserted {
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {}
        other => {
            other?;
        }
    }
    store::order_by_key(pool, tenant, key)
        .await?
        .ok_or_else(|| sqlx::Error::RowNotFound)
}

/// The settlement shard of an order: a stable hash of its id (FNV-1a), so the nightly job's
/// units partition the orders the same way on every run.
pub fn shard_of(order_id: &str) -> i64 {
    let hash = order_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    i64::try_from(hash % SETTLEMENT_SHARDS).expect("a shard number is small")
}

/// Submits the order's saga: one step that sells the stock at the inventory service and
/// takes the sale back if the saga compensates. The gid is the order's, so a re-submit
/// (a retry, a recovery) is answered with the saga already there.
async fn submit_saga(app: &OrderApp, order: &Order) -> Result<(), String> {
    let step = format!("{}{}", app.inventory_url, inventory::RESERVE_PATH);
    let payload = inventory::ReserveRequest {
        sku: order.sku.clone(),
        quantity: order.quantity,
    };
    app.idem
        .saga(order.saga_gid.clone())
        .step(step.clone(), step, payload)
        .send()
        .await
        .map(|_| ())
        .map_err(|e| format!("the saga could not be submitted: {e}"))
}

/// The fact source of an interrupted `POST /orders`: the order the key made, if any.
pub struct OrderRecovery {
    pub app: OrderApp,
}

impl RecoveryHook for OrderRecovery {
    fn recover<'a>(&'a self, expired: &'a ExpiredClaim) -> BoxFuture<'a, Recovery> {
        Box::pin(async move {
            // The scope is `<tenant>:create_order`.
            let tenant = expired
                .scope
                .rsplit_once(':')
                .map_or(expired.scope.as_str(), |(tenant, _)| tenant);
            match store::order_by_key(&self.app.pool, tenant, &expired.key).await {
                Ok(None) => Recovery::NotHappened,
                Ok(Some(order)) => match submit_saga(&self.app, &order).await {
                    Ok(()) => Recovery::Succeeded(created_result(&order)),
                    Err(e) => {
                        tracing::warn!(order_id = %order.order_id, error = %e, "recovered order: saga not confirmed yet");
                        Recovery::Unknown
                    }
                },
                Err(e) => {
                    tracing::warn!(error = %e, "recovery could not read the orders table");
                    Recovery::Unknown
                }
            }
        })
    }
}

fn created_result(order: &Order) -> StoredResult {
    let body = serde_json::to_string(&Created::from(order)).expect("a Created is JSON");
    StoredResult {
        headers: vec![("content-type".into(), "application/json".into())],
        resource_id: Some(order.order_id.clone()),
        ..StoredResult::new(201, body)
    }
}

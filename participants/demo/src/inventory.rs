//! Inventory: a TCC participant that reserves stock.
//!
//! * Try: `available -= n, reserved += n`, only if `available >= n` (else 409), and a
//!   reservation row keyed by (tenant, gid, branch_id): one inventory serves several
//!   tenants of the coordinator, each of which may use the same gid.
//! * Confirm: `reserved -= n, sold += n` for that reservation. The barrier runs it only after
//!   the Try executed and committed; a Confirm that gets there first is refused as retryable
//!   (503, `confirm_without_try`) and the coordinator retries it.
//! * Cancel: `reserved -= n, available += n` for that reservation; nothing at all when the Try
//!   never ran (the barrier's empty rollback, which also turns the late Try away).
//!
//! Confirm and Cancel receive the same payload as Try but ignore it: they act on the
//! reservation row, so they release exactly what was reserved even if the payload were
//! different. `available + reserved + sold` only changes through [`seed`].
//!
//! All branch ops are served by one URL, [`RESERVE_PATH`], dispatching on the `op` query
//! parameter; `RESERVE_PATH/{op}` also works for coordinators that register one URL per op.

use std::io;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem_participant::signature::Verifier;
use idem_participant::{
    BranchCall, DEFAULT_TENANT, Dialect, LeanPool, Op, ParticipantError, StepTx,
};
use serde::{Deserialize, Serialize};
use sqlx::{Any, AnyPool, Row};

use crate::{OfTenant, QueryError, Service, StepResponse, dialect_of, err_response, parse_payload};

/// The TCC branch URL (path) for try, confirm and cancel.
pub const RESERVE_PATH: &str = "/inventory/reserve";

/// The Try payload: `{"sku":"apple","quantity":2}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReserveRequest {
    pub sku: String,
    pub quantity: i64,
}

/// A reservation: the ledger row of one TCC branch, and the result each step returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub gid: String,
    pub branch_id: String,
    pub sku: String,
    pub quantity: i64,
    /// `reserved`, `confirmed` or `cancelled`.
    pub status: String,
}

/// One SKU's stock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stock {
    pub sku: String,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

impl Stock {
    /// `available + reserved + sold`: constant under Try, Confirm and Cancel.
    pub fn total(&self) -> i64 {
        self.available + self.reserved + self.sold
    }
}

/// Sums over all SKUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StockTotals {
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

impl StockTotals {
    pub fn total(&self) -> i64 {
        self.available + self.reserved + self.sold
    }
}

/// Connects to the inventory database and creates its tables (and the barrier table).
pub async fn open(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let pool = crate::connect(database_url).await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// Creates the inventory tables and the barrier table if missing.
pub async fn migrate(pool: &AnyPool) -> Result<(), sqlx::Error> {
    crate::run_script(
        pool,
        include_str!("../sql/inventory.sqlite.sql"),
        include_str!("../sql/inventory.postgres.sql"),
        include_str!("../sql/inventory.mysql.sql"),
    )
    .await
}

/// Sets the available stock of `sku` (creating it); reserved and sold stay as they are.
pub async fn seed(pool: &AnyPool, sku: &str, available: i64) -> Result<(), sqlx::Error> {
    let sql = match dialect_of(pool) {
        Dialect::Mysql => {
            "INSERT INTO inventory_stock (sku, available) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE available = VALUES(available)"
        }
        _ => {
            "INSERT INTO inventory_stock (sku, available) VALUES (?, ?) \
             ON CONFLICT (sku) DO UPDATE SET available = excluded.available"
        }
    };
    sqlx::query(dialect_of(pool).sql(sql))
        .bind(sku)
        .bind(available)
        .execute(pool)
        .await?;
    Ok(())
}

fn stock_from(row: &sqlx::any::AnyRow) -> Result<Stock, sqlx::Error> {
    Ok(Stock {
        sku: row.try_get("sku")?,
        available: row.try_get("available")?,
        reserved: row.try_get("reserved")?,
        sold: row.try_get("sold")?,
    })
}

/// The stock of one SKU.
pub async fn stock(pool: &AnyPool, sku: &str) -> Result<Option<Stock>, sqlx::Error> {
    let row = sqlx::query(
        dialect_of(pool)
            .sql("SELECT sku, available, reserved, sold FROM inventory_stock WHERE sku = ?"),
    )
    .bind(sku)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(stock_from).transpose()
}

/// The stock of every SKU, by SKU.
pub async fn all_stock(pool: &AnyPool) -> Result<Vec<Stock>, sqlx::Error> {
    let rows =
        sqlx::query("SELECT sku, available, reserved, sold FROM inventory_stock ORDER BY sku")
            .fetch_all(pool)
            .await?;
    rows.iter().map(stock_from).collect()
}

/// Available, reserved and sold summed over all SKUs.
pub async fn totals(pool: &AnyPool) -> Result<StockTotals, sqlx::Error> {
    Ok(all_stock(pool)
        .await?
        .iter()
        .fold(StockTotals::default(), |t, s| StockTotals {
            available: t.available + s.available,
            reserved: t.reserved + s.reserved,
            sold: t.sold + s.sold,
        }))
}

fn reservation_from(row: &sqlx::any::AnyRow) -> Result<Reservation, sqlx::Error> {
    Ok(Reservation {
        gid: row.try_get("gid")?,
        branch_id: row.try_get("branch_id")?,
        sku: row.try_get("sku")?,
        quantity: row.try_get("quantity")?,
        status: row.try_get("status")?,
    })
}

const RESERVATION_COLUMNS: &str = "gid, branch_id, sku, quantity, status";

/// The reservation of one branch of the default tenant, if its Try ran.
pub async fn reservation(
    pool: &AnyPool,
    gid: &str,
    branch_id: &str,
) -> Result<Option<Reservation>, sqlx::Error> {
    reservation_in(pool, DEFAULT_TENANT, gid, branch_id).await
}

/// The reservation of one branch of `tenant`'s transaction `gid`, if its Try ran.
pub async fn reservation_in(
    pool: &AnyPool,
    tenant: &str,
    gid: &str,
    branch_id: &str,
) -> Result<Option<Reservation>, sqlx::Error> {
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS} FROM inventory_reservations \
         WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(tenant)
        .bind(gid)
        .bind(branch_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(reservation_from).transpose()
}

/// All reservations of `tenant`'s global transaction `gid`.
pub async fn reservations(
    pool: &AnyPool,
    tenant: &str,
    gid: &str,
) -> Result<Vec<Reservation>, sqlx::Error> {
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS} FROM inventory_reservations WHERE tenant = ? AND gid = ? \
         ORDER BY branch_id"
    );
    let rows = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(tenant)
        .bind(gid)
        .fetch_all(pool)
        .await?;
    rows.iter().map(reservation_from).collect()
}

/// The inventory service's routes.
pub fn router(pool: AnyPool) -> Router {
    router_with(pool, None)
}

/// The inventory service's routes, the branch routes behind signature checks when `verifier` is
/// given (the query routes are for people, so they stay open).
pub fn router_with(pool: AnyPool, verifier: Option<Verifier>) -> Router {
    let branch = Router::new()
        .route(RESERVE_PATH, post(reserve))
        .route("/inventory/reserve/{op}", post(reserve_op));
    crate::guard(branch, verifier)
        .route("/inventory/stock", get(get_all_stock))
        .route("/inventory/stock/{sku}", get(get_stock))
        .route(
            "/inventory/reservations/{gid}/{branch_id}",
            get(get_reservation),
        )
        .with_state(crate::Db::new(pool))
}

/// Serves the inventory on `listen` on a new task.
pub async fn start(pool: AnyPool, listen: &str) -> io::Result<Service> {
    crate::spawn(router(pool), listen).await
}

/// Serves the inventory on `listener` until the server fails.
pub async fn serve(pool: AnyPool, listener: tokio::net::TcpListener) -> io::Result<()> {
    axum::serve(listener, router(pool)).await
}

async fn reserve(
    State(steps): State<LeanPool<Any>>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<Reservation> {
    step(&steps, &call, &body).await
}

async fn reserve_op(
    State(steps): State<LeanPool<Any>>,
    Path(op): Path<String>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<Reservation> {
    call.expect_path_op(&op).map_err(err_response)?;
    step(&steps, &call, &body).await
}

/// One guarded inventory step.
async fn step(pool: &LeanPool<Any>, call: &BranchCall, body: &[u8]) -> StepResponse<Reservation> {
    let op = call
        .expect_op(&[Op::Try, Op::Confirm, Op::Cancel, Op::Action, Op::Compensate])
        .map_err(err_response)?;
    let barrier = call.barrier();
    let outcome = match op {
        Op::Try | Op::Action => {
            let req: ReserveRequest = parse_payload(body).map_err(err_response)?;
            if req.quantity <= 0 {
                return Err(err_response(ParticipantError::refused(
                    "quantity must be positive",
                )));
            }
            let req = &req;
            barrier
                .run(pool, |tx| async move { take(&tx, req).await })
                .await
        }
        Op::Compensate => {
            barrier
                .run(pool, |tx| async move { give_back(&tx).await })
                .await
        }
        Op::Confirm => {
            barrier
                .run(pool, |tx| async move { confirm(&tx).await })
                .await
        }
        _ => {
            barrier
                .run(pool, |tx| async move { cancel(&tx).await })
                .await
        }
    };
    outcome.map_err(err_response)
}

/// TCC Try reserves (`available` to `reserved`); a saga action sells at once (`available`
/// to `sold`, status `sold`), since a saga has no second phase to confirm it.
async fn take(tx: &StepTx<'_, Any>, req: &ReserveRequest) -> Result<Reservation, ParticipantError> {
    let saga = tx.call().op() == Op::Action;
    let (column, status) = if saga {
        ("sold", "sold")
    } else {
        ("reserved", "reserved")
    };
    let update = format!(
        "UPDATE inventory_stock SET available = available - ?, {column} = {column} + ? \
         WHERE sku = ? AND available >= ?"
    );
    let moved = sqlx::query(tx.sql(&update))
        .bind(req.quantity)
        .bind(req.quantity)
        .bind(req.sku.as_str())
        .bind(req.quantity)
        .execute(&mut *tx.conn())
        .await?
        .rows_affected();
    if moved == 0 {
        let available: Option<i64> =
            sqlx::query(tx.sql("SELECT available FROM inventory_stock WHERE sku = ?"))
                .bind(req.sku.as_str())
                .fetch_optional(&mut *tx.conn())
                .await?
                .map(|row| row.try_get(0))
                .transpose()?;
        return Err(ParticipantError::refused(match available {
            None => format!("unknown sku `{}`", req.sku),
            Some(n) => format!(
                "insufficient stock of `{}`: {n} available, {} wanted",
                req.sku, req.quantity
            ),
        }));
    }
    sqlx::query(tx.sql(
        "INSERT INTO inventory_reservations (tenant, gid, branch_id, sku, quantity, status) \
         VALUES (?, ?, ?, ?, ?, ?)",
    ))
    .bind(tx.call().tenant())
    .bind(tx.call().gid())
    .bind(tx.call().branch_id())
    .bind(req.sku.as_str())
    .bind(req.quantity)
    .bind(status)
    .execute(&mut *tx.conn())
    .await?;
    Ok(Reservation {
        gid: tx.call().gid().to_owned(),
        branch_id: tx.call().branch_id().to_owned(),
        sku: req.sku.clone(),
        quantity: req.quantity,
        status: status.into(),
    })
}

/// Moves this branch's reservation from `reserved` to `to` and returns it. The UPDATE comes
/// first: it reads the latest committed row whatever the isolation level, and afterwards
/// the row is this transaction's own write, so the SELECT cannot see a stale snapshot.
async fn settle(
    tx: &StepTx<'_, Any>,
    from: &str,
    to: &str,
) -> Result<Reservation, ParticipantError> {
    let changed = sqlx::query(tx.sql(
        "UPDATE inventory_reservations SET status = ?, updated_at = CURRENT_TIMESTAMP \
         WHERE tenant = ? AND gid = ? AND branch_id = ? AND status = ?",
    ))
    .bind(to)
    .bind(tx.call().tenant())
    .bind(tx.call().gid())
    .bind(tx.call().branch_id())
    .bind(from)
    .execute(&mut *tx.conn())
    .await?
    .rows_affected();
    let sql = format!(
        "SELECT {RESERVATION_COLUMNS} FROM inventory_reservations \
         WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(tx.sql(&sql))
        .bind(tx.call().tenant())
        .bind(tx.call().gid())
        .bind(tx.call().branch_id())
        .fetch_optional(&mut *tx.conn())
        .await?;
    let reservation = row.as_ref().map(reservation_from).transpose()?;
    match reservation {
        Some(r) if changed == 1 => Ok(r),
        // The barrier runs each of these once at most, and never without its forward step:
        // a Confirm only after an executed, committed Try (it refuses an earlier one as
        // retryable), a Cancel or compensate only when its Try or action ran (otherwise it
        // is an empty rollback). So the row exists and is still `from`; anything else is a
        // protocol violation (a Cancel after the Confirm) or a data error worth an alarm.
        Some(r) => Err(ParticipantError::internal(format!(
            "cannot {} reservation {}/{}: it is already {}",
            tx.call().op(),
            r.gid,
            r.branch_id,
            r.status
        ))),
        None => Err(ParticipantError::internal(format!(
            "no reservation for {}/{} although its Try ran",
            tx.call().gid(),
            tx.call().branch_id()
        ))),
    }
}

async fn confirm(tx: &StepTx<'_, Any>) -> Result<Reservation, ParticipantError> {
    let r = settle(tx, "reserved", "confirmed").await?;
    sqlx::query(
        tx.sql("UPDATE inventory_stock SET reserved = reserved - ?, sold = sold + ? WHERE sku = ?"),
    )
    .bind(r.quantity)
    .bind(r.quantity)
    .bind(r.sku.as_str())
    .execute(&mut *tx.conn())
    .await?;
    Ok(r)
}

async fn cancel(tx: &StepTx<'_, Any>) -> Result<Reservation, ParticipantError> {
    let r = settle(tx, "reserved", "cancelled").await?;
    sqlx::query(tx.sql("UPDATE inventory_stock SET reserved = reserved - ?, available = available + ? WHERE sku = ?"))
        .bind(r.quantity)
        .bind(r.quantity)
        .bind(r.sku.as_str())
        .execute(&mut *tx.conn())
        .await?;
    Ok(r)
}

/// Saga compensation: the sold stock comes back.
async fn give_back(tx: &StepTx<'_, Any>) -> Result<Reservation, ParticipantError> {
    let r = settle(tx, "sold", "returned").await?;
    sqlx::query(tx.sql(
        "UPDATE inventory_stock SET sold = sold - ?, available = available + ? WHERE sku = ?",
    ))
    .bind(r.quantity)
    .bind(r.quantity)
    .bind(r.sku.as_str())
    .execute(&mut *tx.conn())
    .await?;
    Ok(r)
}

async fn get_stock(
    State(pool): State<AnyPool>,
    Path(sku): Path<String>,
) -> Result<impl IntoResponse, QueryError> {
    match stock(&pool, &sku).await? {
        Some(s) => Ok(axum::Json(s)),
        None => Err(QueryError::NotFound(format!("unknown sku `{sku}`"))),
    }
}

async fn get_all_stock(State(pool): State<AnyPool>) -> Result<impl IntoResponse, QueryError> {
    Ok(axum::Json(all_stock(&pool).await?))
}

async fn get_reservation(
    State(pool): State<AnyPool>,
    Path((gid, branch_id)): Path<(String, String)>,
    Query(of): Query<OfTenant>,
) -> Result<impl IntoResponse, QueryError> {
    match reservation_in(&pool, of.tenant(), &gid, &branch_id).await? {
        Some(r) => Ok(axum::Json(r)),
        None => Err(QueryError::NotFound(format!(
            "no reservation for {gid}/{branch_id}"
        ))),
    }
}

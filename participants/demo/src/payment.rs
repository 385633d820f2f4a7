//! Payment: a TCC participant that freezes money.
//!
//! * Try: `frozen += amount`, only if `balance - frozen >= amount` (else 409): the available
//!   balance never goes negative. A ledger row keyed by (tenant, gid, branch_id) records it.
//! * Confirm: `balance -= amount, frozen -= amount` for that ledger row, only after the Try
//!   executed and committed (an earlier Confirm is refused as retryable by the barrier).
//! * Cancel: `frozen -= amount` for that ledger row; nothing when the Try never ran (an
//!   empty rollback).
//!
//! Like the inventory, Confirm and Cancel act on the ledger row, not on their payload. All
//! ops are served by [`FREEZE_PATH`] (or `FREEZE_PATH/{op}`).

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
pub const FREEZE_PATH: &str = "/payment/freeze";

/// The Try payload: `{"account":"alice","amount":30}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeRequest {
    pub account: String,
    pub amount: i64,
}

/// The ledger row of one TCC branch, and the result each step returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub gid: String,
    pub branch_id: String,
    pub account: String,
    pub amount: i64,
    /// `frozen`, `debited` or `released`.
    pub status: String,
}

/// One account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    pub account: String,
    /// The money on the account, frozen part included.
    pub balance: i64,
    /// Held by open TCC branches.
    pub frozen: i64,
}

impl Balance {
    /// What a new Try can still freeze.
    pub fn available(&self) -> i64 {
        self.balance - self.frozen
    }
}

/// Connects to the payment database and creates its tables (and the barrier table).
pub async fn open(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let pool = crate::connect(database_url).await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// Creates the payment tables and the barrier table if missing.
pub async fn migrate(pool: &AnyPool) -> Result<(), sqlx::Error> {
    crate::run_script(
        pool,
        include_str!("../sql/payment.sqlite.sql"),
        include_str!("../sql/payment.postgres.sql"),
        include_str!("../sql/payment.mysql.sql"),
    )
    .await
}

/// Sets the balance of `account` (creating it); the frozen amount stays.
pub async fn seed(pool: &AnyPool, account: &str, balance: i64) -> Result<(), sqlx::Error> {
    let sql = match dialect_of(pool) {
        Dialect::Mysql => {
            "INSERT INTO payment_accounts (account, balance) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE balance = VALUES(balance)"
        }
        _ => {
            "INSERT INTO payment_accounts (account, balance) VALUES (?, ?) \
             ON CONFLICT (account) DO UPDATE SET balance = excluded.balance"
        }
    };
    sqlx::query(dialect_of(pool).sql(sql))
        .bind(account)
        .bind(balance)
        .execute(pool)
        .await?;
    Ok(())
}

fn balance_from(row: &sqlx::any::AnyRow) -> Result<Balance, sqlx::Error> {
    Ok(Balance {
        account: row.try_get("account")?,
        balance: row.try_get("balance")?,
        frozen: row.try_get("frozen")?,
    })
}

/// One account's balance.
pub async fn balance(pool: &AnyPool, account: &str) -> Result<Option<Balance>, sqlx::Error> {
    let row = sqlx::query(
        dialect_of(pool)
            .sql("SELECT account, balance, frozen FROM payment_accounts WHERE account = ?"),
    )
    .bind(account)
    .fetch_optional(pool)
    .await?;
    row.as_ref().map(balance_from).transpose()
}

/// Every account, by name.
pub async fn balances(pool: &AnyPool) -> Result<Vec<Balance>, sqlx::Error> {
    let rows =
        sqlx::query("SELECT account, balance, frozen FROM payment_accounts ORDER BY account")
            .fetch_all(pool)
            .await?;
    rows.iter().map(balance_from).collect()
}

fn entry_from(row: &sqlx::any::AnyRow) -> Result<LedgerEntry, sqlx::Error> {
    Ok(LedgerEntry {
        gid: row.try_get("gid")?,
        branch_id: row.try_get("branch_id")?,
        account: row.try_get("account")?,
        amount: row.try_get("amount")?,
        status: row.try_get("status")?,
    })
}

const LEDGER_COLUMNS: &str = "gid, branch_id, account, amount, status";

/// The ledger row of one branch of the default tenant, if its Try ran.
pub async fn ledger_entry(
    pool: &AnyPool,
    gid: &str,
    branch_id: &str,
) -> Result<Option<LedgerEntry>, sqlx::Error> {
    ledger_entry_in(pool, DEFAULT_TENANT, gid, branch_id).await
}

/// The ledger row of one branch of `tenant`'s transaction `gid`, if its Try ran.
pub async fn ledger_entry_in(
    pool: &AnyPool,
    tenant: &str,
    gid: &str,
    branch_id: &str,
) -> Result<Option<LedgerEntry>, sqlx::Error> {
    let sql = format!(
        "SELECT {LEDGER_COLUMNS} FROM payment_ledger WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(tenant)
        .bind(gid)
        .bind(branch_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(entry_from).transpose()
}

/// The payment service's routes.
pub fn router(pool: AnyPool) -> Router {
    router_with(pool, None)
}

/// The payment service's routes, the branch routes behind signature checks when `verifier` is
/// given (the query routes are for people, so they stay open).
pub fn router_with(pool: AnyPool, verifier: Option<Verifier>) -> Router {
    let branch = Router::new()
        .route(FREEZE_PATH, post(freeze))
        .route("/payment/freeze/{op}", post(freeze_op));
    crate::guard(branch, verifier)
        .route("/payment/accounts", get(get_balances))
        .route("/payment/accounts/{account}", get(get_balance))
        .route("/payment/ledger/{gid}/{branch_id}", get(get_entry))
        .with_state(crate::Db::new(pool))
}

/// Serves the payment service on `listen` on a new task.
pub async fn start(pool: AnyPool, listen: &str) -> io::Result<Service> {
    crate::spawn(router(pool), listen).await
}

/// Serves the payment service on `listener` until the server fails.
pub async fn serve(pool: AnyPool, listener: tokio::net::TcpListener) -> io::Result<()> {
    axum::serve(listener, router(pool)).await
}

async fn freeze(
    State(steps): State<LeanPool<Any>>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<LedgerEntry> {
    step(&steps, &call, &body).await
}

async fn freeze_op(
    State(steps): State<LeanPool<Any>>,
    Path(op): Path<String>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<LedgerEntry> {
    call.expect_path_op(&op).map_err(err_response)?;
    step(&steps, &call, &body).await
}

async fn step(pool: &LeanPool<Any>, call: &BranchCall, body: &[u8]) -> StepResponse<LedgerEntry> {
    let op = call
        .expect_op(&[Op::Try, Op::Confirm, Op::Cancel, Op::Action, Op::Compensate])
        .map_err(err_response)?;
    let barrier = call.barrier();
    let outcome = match op {
        Op::Try | Op::Action => {
            let req: FreezeRequest = parse_payload(body).map_err(err_response)?;
            if req.amount <= 0 {
                return Err(err_response(ParticipantError::refused(
                    "amount must be positive",
                )));
            }
            let req = &req;
            barrier
                .run(pool, |tx| async move { take(&tx, req).await })
                .await
        }
        Op::Confirm => {
            barrier
                .run(
                    pool,
                    |tx| async move { settle(&tx, "frozen", "debited").await },
                )
                .await
        }
        Op::Compensate => {
            barrier
                .run(pool, |tx| async move {
                    settle(&tx, "debited", "refunded").await
                })
                .await
        }
        _ => {
            barrier
                .run(
                    pool,
                    |tx| async move { settle(&tx, "frozen", "released").await },
                )
                .await
        }
    };
    outcome.map_err(err_response)
}

/// TCC Try freezes the amount; a saga action debits it at once (status `debited`), since
/// a saga has no second phase to confirm it.
async fn take(tx: &StepTx<'_, Any>, req: &FreezeRequest) -> Result<LedgerEntry, ParticipantError> {
    let saga = tx.call().op() == Op::Action;
    let (update, status) = if saga {
        (
            "UPDATE payment_accounts SET balance = balance - ? WHERE account = ? AND balance - frozen >= ?",
            "debited",
        )
    } else {
        (
            "UPDATE payment_accounts SET frozen = frozen + ? WHERE account = ? AND balance - frozen >= ?",
            "frozen",
        )
    };
    let frozen = sqlx::query(tx.sql(update))
        .bind(req.amount)
        .bind(req.account.as_str())
        .bind(req.amount)
        .execute(&mut *tx.conn())
        .await?
        .rows_affected();
    if frozen == 0 {
        let row =
            sqlx::query(tx.sql("SELECT balance - frozen FROM payment_accounts WHERE account = ?"))
                .bind(req.account.as_str())
                .fetch_optional(&mut *tx.conn())
                .await?;
        let available: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
        return Err(ParticipantError::refused(match available {
            None => format!("unknown account `{}`", req.account),
            Some(n) => format!(
                "insufficient balance on `{}`: {n} available, {} wanted",
                req.account, req.amount
            ),
        }));
    }
    sqlx::query(tx.sql(
        "INSERT INTO payment_ledger (tenant, gid, branch_id, account, amount, status) \
         VALUES (?, ?, ?, ?, ?, ?)",
    ))
    .bind(tx.call().tenant())
    .bind(tx.call().gid())
    .bind(tx.call().branch_id())
    .bind(req.account.as_str())
    .bind(req.amount)
    .bind(status)
    .execute(&mut *tx.conn())
    .await?;
    Ok(LedgerEntry {
        gid: tx.call().gid().to_owned(),
        branch_id: tx.call().branch_id().to_owned(),
        account: req.account.clone(),
        amount: req.amount,
        status: status.into(),
    })
}

/// Confirm (`debited`) or Cancel (`released`) the money this branch froze. As in the
/// inventory, the ledger UPDATE runs first so that the row read after it is current, and
/// the barrier only gets here after the Try (or saga action) ran: a missing or already
/// settled row is an alarm.
async fn settle(
    tx: &StepTx<'_, Any>,
    from: &str,
    to: &str,
) -> Result<LedgerEntry, ParticipantError> {
    let changed = sqlx::query(tx.sql(
        "UPDATE payment_ledger SET status = ?, updated_at = CURRENT_TIMESTAMP \
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
        "SELECT {LEDGER_COLUMNS} FROM payment_ledger WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(tx.sql(&sql))
        .bind(tx.call().tenant())
        .bind(tx.call().gid())
        .bind(tx.call().branch_id())
        .fetch_optional(&mut *tx.conn())
        .await?;
    let entry = match row.as_ref().map(entry_from).transpose()? {
        Some(e) if changed == 1 => e,
        Some(e) => {
            return Err(ParticipantError::internal(format!(
                "cannot {} ledger entry {}/{}: it is already {}",
                tx.call().op(),
                e.gid,
                e.branch_id,
                e.status
            )));
        }
        None => {
            return Err(ParticipantError::internal(format!(
                "no ledger entry for {}/{} although its Try ran",
                tx.call().gid(),
                tx.call().branch_id()
            )));
        }
    };
    let sql = match to {
        "debited" => {
            "UPDATE payment_accounts SET balance = balance - ?, frozen = frozen - ? WHERE account = ?"
        }
        // Saga compensation: the debited money comes back.
        "refunded" => "UPDATE payment_accounts SET balance = balance + ? WHERE account = ?",
        _ => "UPDATE payment_accounts SET frozen = frozen - ? WHERE account = ?",
    };
    let mut query = sqlx::query(tx.sql(sql));
    if to == "debited" {
        query = query.bind(entry.amount);
    }
    query
        .bind(entry.amount)
        .bind(entry.account.as_str())
        .execute(&mut *tx.conn())
        .await?;
    Ok(entry)
}

async fn get_balance(
    State(pool): State<AnyPool>,
    Path(account): Path<String>,
) -> Result<impl IntoResponse, QueryError> {
    match balance(&pool, &account).await? {
        Some(b) => Ok(axum::Json(b)),
        None => Err(QueryError::NotFound(format!("unknown account `{account}`"))),
    }
}

async fn get_balances(State(pool): State<AnyPool>) -> Result<impl IntoResponse, QueryError> {
    Ok(axum::Json(balances(&pool).await?))
}

async fn get_entry(
    State(pool): State<AnyPool>,
    Path((gid, branch_id)): Path<(String, String)>,
    Query(of): Query<OfTenant>,
) -> Result<impl IntoResponse, QueryError> {
    match ledger_entry_in(&pool, of.tenant(), &gid, &branch_id).await? {
        Some(e) => Ok(axum::Json(e)),
        None => Err(QueryError::NotFound(format!(
            "no ledger entry for {gid}/{branch_id}"
        ))),
    }
}

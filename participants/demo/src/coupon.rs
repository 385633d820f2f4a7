//! Coupon: a saga participant that issues a coupon.
//!
//! * action: takes one coupon from the campaign (`remaining -= 1`, 409 when the campaign is
//!   unknown or used up) and issues it to the user: a coupon row keyed by (tenant, gid,
//!   branch_id), with a fresh coupon id.
//! * compensate: revokes *that* coupon row (found by tenant, gid and branch id, not by
//!   payload) and
//!   returns it to the campaign. It never issues, deletes or revokes any other coupon, and
//!   does nothing when the action never ran.
//!
//! The coupon id is random, so a duplicate action that got a fresh id would be visible; the
//! barrier returns the first action's result, id included. Both ops are served by
//! [`ISSUE_PATH`] (or `ISSUE_PATH/{op}`).

use std::io;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem_participant::signature::Verifier;
use idem_participant::{
    BranchCall, DEFAULT_TENANT, Dialect, LeanPool, Op, ParticipantError, StepTx,
};
use serde::{Deserialize, Serialize};
use sqlx::{Any, AnyPool, Row};

use crate::{QueryError, Service, StepResponse, dialect_of, err_response, parse_payload};

/// The saga branch URL (path) for action and compensate.
pub const ISSUE_PATH: &str = "/coupon/issue";

/// The action payload: `{"user":"alice","coupon":"WELCOME10"}` (`coupon` is the campaign
/// code).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IssueRequest {
    pub user: String,
    pub coupon: String,
}

/// An issued coupon: the ledger row of one saga branch, and the result of both steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coupon {
    pub coupon_id: String,
    pub gid: String,
    pub branch_id: String,
    pub user: String,
    /// The campaign code.
    pub code: String,
    /// `issued` or `revoked`.
    pub status: String,
}

/// A campaign and how many coupons it can still issue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Campaign {
    pub code: String,
    pub remaining: i64,
}

/// Connects to the coupon database and creates its tables (and the barrier table).
pub async fn open(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let pool = crate::connect(database_url).await?;
    migrate(&pool).await?;
    Ok(pool)
}

/// Creates the coupon tables and the barrier table if missing.
pub async fn migrate(pool: &AnyPool) -> Result<(), sqlx::Error> {
    crate::run_script(
        pool,
        include_str!("../sql/coupon.sqlite.sql"),
        include_str!("../sql/coupon.postgres.sql"),
        include_str!("../sql/coupon.mysql.sql"),
    )
    .await
}

/// Sets how many coupons of campaign `code` can still be issued (creating it).
pub async fn seed(pool: &AnyPool, code: &str, remaining: i64) -> Result<(), sqlx::Error> {
    let sql = match dialect_of(pool) {
        Dialect::Mysql => {
            "INSERT INTO coupon_campaigns (code, remaining) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE remaining = VALUES(remaining)"
        }
        _ => {
            "INSERT INTO coupon_campaigns (code, remaining) VALUES (?, ?) \
             ON CONFLICT (code) DO UPDATE SET remaining = excluded.remaining"
        }
    };
    sqlx::query(dialect_of(pool).sql(sql))
        .bind(code)
        .bind(remaining)
        .execute(pool)
        .await?;
    Ok(())
}

/// One campaign.
pub async fn campaign(pool: &AnyPool, code: &str) -> Result<Option<Campaign>, sqlx::Error> {
    let row = sqlx::query(
        dialect_of(pool).sql("SELECT code, remaining FROM coupon_campaigns WHERE code = ?"),
    )
    .bind(code)
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        Ok(Campaign {
            code: r.try_get("code")?,
            remaining: r.try_get("remaining")?,
        })
    })
    .transpose()
}

fn coupon_from(row: &sqlx::any::AnyRow) -> Result<Coupon, sqlx::Error> {
    Ok(Coupon {
        coupon_id: row.try_get("coupon_id")?,
        gid: row.try_get("gid")?,
        branch_id: row.try_get("branch_id")?,
        user: row.try_get("user_id")?,
        code: row.try_get("code")?,
        status: row.try_get("status")?,
    })
}

const COUPON_COLUMNS: &str = "coupon_id, gid, branch_id, user_id, code, status";

/// Every coupon of a user, issued or revoked, oldest id first.
pub async fn coupons_of(pool: &AnyPool, user: &str) -> Result<Vec<Coupon>, sqlx::Error> {
    let sql =
        format!("SELECT {COUPON_COLUMNS} FROM coupons WHERE user_id = ? ORDER BY gid, branch_id");
    let rows = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(user)
        .fetch_all(pool)
        .await?;
    rows.iter().map(coupon_from).collect()
}

/// The coupon one saga branch of the default tenant issued, if its action ran.
pub async fn coupon_of_branch(
    pool: &AnyPool,
    gid: &str,
    branch_id: &str,
) -> Result<Option<Coupon>, sqlx::Error> {
    coupon_of_branch_in(pool, DEFAULT_TENANT, gid, branch_id).await
}

/// The coupon one saga branch of `tenant`'s transaction `gid` issued, if its action ran.
pub async fn coupon_of_branch_in(
    pool: &AnyPool,
    tenant: &str,
    gid: &str,
    branch_id: &str,
) -> Result<Option<Coupon>, sqlx::Error> {
    let sql = format!(
        "SELECT {COUPON_COLUMNS} FROM coupons WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(dialect_of(pool).sql(&sql))
        .bind(tenant)
        .bind(gid)
        .bind(branch_id)
        .fetch_optional(pool)
        .await?;
    row.as_ref().map(coupon_from).transpose()
}

/// The coupon service's routes.
pub fn router(pool: AnyPool) -> Router {
    router_with(pool, None)
}

/// The coupon service's routes, the branch routes behind signature checks when `verifier` is
/// given (the query routes are for people, so they stay open).
pub fn router_with(pool: AnyPool, verifier: Option<Verifier>) -> Router {
    let branch = Router::new()
        .route(ISSUE_PATH, post(issue))
        .route("/coupon/issue/{op}", post(issue_op));
    crate::guard(branch, verifier)
        .route("/coupon/users/{user}/coupons", get(get_coupons))
        .route("/coupon/campaigns/{code}", get(get_campaign))
        .with_state(crate::Db::new(pool))
}

/// Serves the coupon service on `listen` on a new task.
pub async fn start(pool: AnyPool, listen: &str) -> io::Result<Service> {
    crate::spawn(router(pool), listen).await
}

/// Serves the coupon service on `listener` until the server fails.
pub async fn serve(pool: AnyPool, listener: tokio::net::TcpListener) -> io::Result<()> {
    axum::serve(listener, router(pool)).await
}

async fn issue(
    State(steps): State<LeanPool<Any>>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<Coupon> {
    step(&steps, &call, &body).await
}

async fn issue_op(
    State(steps): State<LeanPool<Any>>,
    Path(op): Path<String>,
    call: BranchCall,
    body: Bytes,
) -> StepResponse<Coupon> {
    call.expect_path_op(&op).map_err(err_response)?;
    step(&steps, &call, &body).await
}

async fn step(pool: &LeanPool<Any>, call: &BranchCall, body: &[u8]) -> StepResponse<Coupon> {
    let op = call
        .expect_op(&[Op::Action, Op::Compensate])
        .map_err(err_response)?;
    let barrier = call.barrier();
    let outcome = match op {
        Op::Action => {
            let req: IssueRequest = parse_payload(body).map_err(err_response)?;
            if req.user.is_empty() || req.coupon.is_empty() {
                return Err(err_response(ParticipantError::refused(
                    "user and coupon must not be empty",
                )));
            }
            let req = &req;
            barrier
                .run(pool, |tx| async move { issue_coupon(&tx, req).await })
                .await
        }
        _ => {
            barrier
                .run(pool, |tx| async move { revoke(&tx).await })
                .await
        }
    };
    outcome.map_err(err_response)
}

async fn issue_coupon(
    tx: &StepTx<'_, Any>,
    req: &IssueRequest,
) -> Result<Coupon, ParticipantError> {
    let taken = sqlx::query(tx.sql(
        "UPDATE coupon_campaigns SET remaining = remaining - 1 WHERE code = ? AND remaining > 0",
    ))
    .bind(req.coupon.as_str())
    .execute(&mut *tx.conn())
    .await?
    .rows_affected();
    if taken == 0 {
        let exists = sqlx::query(tx.sql("SELECT remaining FROM coupon_campaigns WHERE code = ?"))
            .bind(req.coupon.as_str())
            .fetch_optional(&mut *tx.conn())
            .await?
            .is_some();
        return Err(ParticipantError::refused(if exists {
            format!("campaign `{}` has no coupons left", req.coupon)
        } else {
            format!("unknown campaign `{}`", req.coupon)
        }));
    }
    let coupon = Coupon {
        coupon_id: format!("CPN-{}", uuid::Uuid::new_v4().simple()),
        gid: tx.call().gid().to_owned(),
        branch_id: tx.call().branch_id().to_owned(),
        user: req.user.clone(),
        code: req.coupon.clone(),
        status: "issued".into(),
    };
    sqlx::query(tx.sql(
        "INSERT INTO coupons (coupon_id, tenant, gid, branch_id, user_id, code, status) \
         VALUES (?, ?, ?, ?, ?, ?, 'issued')",
    ))
    .bind(coupon.coupon_id.as_str())
    .bind(tx.call().tenant())
    .bind(coupon.gid.as_str())
    .bind(coupon.branch_id.as_str())
    .bind(coupon.user.as_str())
    .bind(coupon.code.as_str())
    .execute(&mut *tx.conn())
    .await?;
    Ok(coupon)
}

/// Revokes the coupon this branch's action issued. UPDATE first, then read the row (see
/// the inventory's `settle` for why).
async fn revoke(tx: &StepTx<'_, Any>) -> Result<Coupon, ParticipantError> {
    let changed = sqlx::query(tx.sql(
        "UPDATE coupons SET status = 'revoked', updated_at = CURRENT_TIMESTAMP \
         WHERE tenant = ? AND gid = ? AND branch_id = ? AND status = 'issued'",
    ))
    .bind(tx.call().tenant())
    .bind(tx.call().gid())
    .bind(tx.call().branch_id())
    .execute(&mut *tx.conn())
    .await?
    .rows_affected();
    let sql = format!(
        "SELECT {COUPON_COLUMNS} FROM coupons WHERE tenant = ? AND gid = ? AND branch_id = ?"
    );
    let row = sqlx::query(tx.sql(&sql))
        .bind(tx.call().tenant())
        .bind(tx.call().gid())
        .bind(tx.call().branch_id())
        .fetch_optional(&mut *tx.conn())
        .await?;
    let coupon = match row.as_ref().map(coupon_from).transpose()? {
        Some(c) if changed == 1 => c,
        Some(c) => {
            return Err(ParticipantError::internal(format!(
                "cannot revoke coupon {}: it is already {}",
                c.coupon_id, c.status
            )));
        }
        None => {
            return Err(ParticipantError::internal(format!(
                "no coupon for {}/{} although its action ran",
                tx.call().gid(),
                tx.call().branch_id()
            )));
        }
    };
    sqlx::query(tx.sql("UPDATE coupon_campaigns SET remaining = remaining + 1 WHERE code = ?"))
        .bind(coupon.code.as_str())
        .execute(&mut *tx.conn())
        .await?;
    Ok(coupon)
}

async fn get_coupons(
    State(pool): State<AnyPool>,
    Path(user): Path<String>,
) -> Result<impl IntoResponse, QueryError> {
    Ok(axum::Json(coupons_of(&pool, &user).await?))
}

async fn get_campaign(
    State(pool): State<AnyPool>,
    Path(code): Path<String>,
) -> Result<impl IntoResponse, QueryError> {
    match campaign(&pool, &code).await? {
        Some(c) => Ok(axum::Json(c)),
        None => Err(QueryError::NotFound(format!("unknown campaign `{code}`"))),
    }
}

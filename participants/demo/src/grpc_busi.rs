//! A gRPC participant on tonic: a transfer between accounts as a saga, the shape of DTM's
//! gRPC examples (`busi.Busi`: `TransOut` takes money from an account, `TransIn` gives it,
//! each with its compensation). A coordinator calls it with a branch URL such as
//! `127.0.0.1:58081/busi.Busi/TransOut` and the protobuf `BusiReq` as the step's payload.
//!
//! Each method runs in the barrier, keyed by the call DTM's metadata names
//! ([`BranchCall::from_grpc_metadata`]), so a repeated call moves money once, a
//! compensation whose action never ran does nothing, and an action arriving after its
//! compensation is rejected. An account that would go below zero refuses (`ABORTED`), so
//! the saga compensates.

use idem_participant::grpc::{RequireSignatureLayer, status_of};
use idem_participant::signature::Verifier;
use idem_participant::{BranchCall, Op, ParticipantError, StepTx};
use sqlx::{Any, AnyPool, Row};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::{Db, dialect_of};

/// What `proto/busi.proto` generates.
pub mod proto {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("busi");
}

use proto::BusiReq;
use proto::busi_server::{Busi, BusiServer};

/// Opens the example's database and creates its table and the barrier table.
pub async fn open(database_url: &str) -> Result<AnyPool, sqlx::Error> {
    let pool = crate::connect(database_url).await?;
    let table = "CREATE TABLE IF NOT EXISTS busi_accounts (\
                 account VARCHAR(64) PRIMARY KEY, \
                 balance BIGINT NOT NULL CHECK (balance >= 0))";
    crate::run_script(&pool, table, table, table).await?;
    Ok(pool)
}

/// Sets `account`'s balance (creating it).
pub async fn seed(pool: &AnyPool, account: &str, balance: i64) -> Result<(), sqlx::Error> {
    let dialect = dialect_of(pool);
    sqlx::query(dialect.sql("DELETE FROM busi_accounts WHERE account = ?"))
        .bind(account)
        .execute(pool)
        .await?;
    sqlx::query(dialect.sql("INSERT INTO busi_accounts (account, balance) VALUES (?, ?)"))
        .bind(account)
        .bind(balance)
        .execute(pool)
        .await?;
    Ok(())
}

/// `account`'s balance.
pub async fn balance(pool: &AnyPool, account: &str) -> Result<i64, sqlx::Error> {
    let row =
        sqlx::query(dialect_of(pool).sql("SELECT balance FROM busi_accounts WHERE account = ?"))
            .bind(account)
            .fetch_one(pool)
            .await?;
    row.try_get(0)
}

/// Serves `busi.Busi` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, pool: AnyPool) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .add_service(BusiServer::new(Service { db: Db::new(pool) }))
        .serve_with_incoming(incoming)
        .await
}

/// Serves `busi.Busi` on `listener` to calls that `verifier` accepts (a coordinator with
/// signing keys signs its gRPC calls); any other call is answered `UNAUTHENTICATED`.
pub async fn serve_signed(
    listener: TcpListener,
    pool: AnyPool,
    verifier: Verifier,
) -> Result<(), tonic::transport::Error> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tonic::transport::Server::builder()
        .layer(RequireSignatureLayer::new(verifier))
        .add_service(BusiServer::new(Service { db: Db::new(pool) }))
        .serve_with_incoming(incoming)
        .await
}

struct Service {
    db: Db,
}

impl Service {
    /// Moves `sign × amount` on the request's account, once per branch operation.
    async fn step(
        &self,
        request: Request<BusiReq>,
        op: Op,
        sign: i64,
    ) -> Result<Response<()>, Status> {
        let call = BranchCall::from_grpc_metadata(request.metadata())?;
        call.expect_op(&[op])?;
        let req = request.into_inner();
        if req.amount <= 0 || req.account.is_empty() {
            return Err(
                ParticipantError::refused("an account and a positive amount are needed").into(),
            );
        }
        let req = &req;
        let outcome = call
            .barrier()
            .run(&self.db.steps, |tx| async move {
                move_money(&tx, req, sign).await
            })
            .await?;
        status_of(&outcome)?;
        Ok(Response::new(()))
    }
}

async fn move_money(
    tx: &StepTx<'_, Any>,
    req: &BusiReq,
    sign: i64,
) -> Result<(), ParticipantError> {
    let delta = sign * req.amount;
    let moved = sqlx::query(tx.sql(
        "UPDATE busi_accounts SET balance = balance + ? WHERE account = ? AND balance + ? >= 0",
    ))
    .bind(delta)
    .bind(&req.account)
    .bind(delta)
    .execute(&mut *tx.conn())
    .await?
    .rows_affected();
    if moved == 0 {
        return Err(ParticipantError::refused(format!(
            "account {} cannot move {delta}",
            req.account
        )));
    }
    Ok(())
}

#[tonic::async_trait]
impl Busi for Service {
    async fn trans_out(&self, request: Request<BusiReq>) -> Result<Response<()>, Status> {
        self.step(request, Op::Action, -1).await
    }

    async fn trans_out_revert(&self, request: Request<BusiReq>) -> Result<Response<()>, Status> {
        self.step(request, Op::Compensate, 1).await
    }

    async fn trans_in(&self, request: Request<BusiReq>) -> Result<Response<()>, Status> {
        self.step(request, Op::Action, 1).await
    }

    async fn trans_in_revert(&self, request: Request<BusiReq>) -> Result<Response<()>, Status> {
        self.step(request, Op::Compensate, -1).await
    }
}

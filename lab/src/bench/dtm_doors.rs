//! DTM's two doors side by side: the `empty_dtm` workload runs the `empty` saga through
//! DTM's HTTP API to an HTTP participant, `empty_grpc` the same saga through DTM's gRPC
//! service (`--grpc-listen`) to a gRPC participant, its payloads protobuf bytes; both
//! participants answer at once and touch no database, so what differs is the doors and
//! the branch calls.

use std::net::SocketAddr;

use idem_demo::grpc_busi::proto::BusiReq;
use idem_demo::grpc_busi::proto::busi_server::{Busi, BusiServer};
use idem_dtm_proto::{DtmClient, DtmRequest, DtmTransOptions};
use prost::Message;
use serde_json::{Value, json};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::Error;

/// `busi.Busi` answering every call at once.
struct Empty;

#[tonic::async_trait]
impl Busi for Empty {
    async fn trans_out(&self, _: Request<BusiReq>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
    async fn trans_out_revert(&self, _: Request<BusiReq>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
    async fn trans_in(&self, _: Request<BusiReq>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
    async fn trans_in_revert(&self, _: Request<BusiReq>) -> Result<Response<()>, Status> {
        Ok(Response::new(()))
    }
}

/// The gRPC participant, served on a loopback port until the task is aborted.
pub(super) struct GrpcParticipant {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl GrpcParticipant {
    pub(super) async fn start() -> Result<GrpcParticipant, Error> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(BusiServer::new(Empty))
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(GrpcParticipant { address, task })
    }

    /// The saga's two gRPC targets.
    pub(super) fn targets(&self) -> [String; 2] {
        ["TransOut", "TransIn"].map(|m| format!("{}/busi.Busi/{m}", self.address))
    }

    pub(super) fn stop(self) {
        self.task.abort();
    }
}

/// The saga of the `empty` workload as DTM's `TransGlobal` over HTTP, waiting for the result.
pub(super) async fn one_over_http(
    http: &reqwest::Client,
    api: &str,
    gid: &str,
    urls: &[String; 2],
    payloads: &[Value; 2],
) -> Result<(), Error> {
    let steps: Vec<Value> = urls
        .iter()
        .map(|u| json!({"action": u, "compensate": u}))
        .collect();
    let payloads: Vec<String> = payloads.iter().map(Value::to_string).collect();
    let body = json!({
        "gid": gid, "trans_type": "saga", "steps": steps, "payloads": payloads,
        "wait_result": true,
    });
    let answer: Value = http
        .post(format!("{api}/api/dtmsvr/submit"))
        .json(&body)
        .send()
        .await?
        .json()
        .await?;
    match answer["dtm_result"].as_str() {
        Some("SUCCESS") => Ok(()),
        _ => Err(format!("{gid}: {answer}").into()),
    }
}

/// The same saga over DTM's gRPC service, its payloads `BusiReq` messages (the amount's
/// varint makes them bytes that are not UTF-8).
pub(super) async fn one_over_grpc(
    client: &DtmClient<Channel>,
    gid: &str,
    targets: &[String; 2],
    n: usize,
) -> Result<(), Error> {
    let steps: Vec<Value> = targets
        .iter()
        .map(|t| json!({"action": t, "compensate": t}))
        .collect();
    let payload = BusiReq {
        account: format!("acct-{n}"),
        amount: 300,
    }
    .encode_to_vec();
    let request = DtmRequest {
        gid: gid.into(),
        trans_type: "saga".into(),
        steps: Value::Array(steps).to_string(),
        bin_payloads: vec![payload.clone(), payload],
        trans_options: Some(DtmTransOptions {
            wait_result: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    client.clone().submit(request).await?;
    Ok(())
}

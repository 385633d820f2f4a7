//! DTM's gRPC door: the `dtmgimp.Dtm` service (`crates/dtm-proto`) on its own listener
//! (`--grpc-listen`), for DTM's gRPC clients (Go's dtmgrpc and any client generated from
//! DTM's proto).
//!
//! Each RPC is turned into the body of the matching route of DTM's HTTP door
//! ([`translate`]) and handed to the API's own router, in process: so a gRPC request is
//! authenticated (a token in the `authorization` metadata, or the token-less rules of the
//! DTM door, judged on the gRPC peer's address), validated, capped, rate-limited, counted
//! and carried out exactly as the same request over HTTP, with no second copy of any of
//! it. The answer is mapped back as DTM's server maps its own: FAILURE (`409`) is
//! `ABORTED`, ONGOING (`425`) is `FAILED_PRECONDITION`; a client mistake is
//! `INVALID_ARGUMENT` (DTM answers many with `INTERNAL`), with idem's stable error code
//! in the message and in the `idem-error-code` metadata. DTM's workflow and topic RPCs
//! are `UNIMPLEMENTED`, with a message saying so.

use std::net::SocketAddr;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Method, Request as HttpRequest, StatusCode, header};
use idem_dtm_proto::{
    Dtm, DtmBranchRequest, DtmGidReply, DtmProgressesReply, DtmRequest, DtmTopicRequest,
};
use serde_json::Value;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Request, Response, Status};
use tower::ServiceExt;

use super::dtm::{NO_TOPICS, NO_WORKFLOW};
use translate::DoorRequest;

mod serve;
mod translate;

pub use serve::{GrpcListener, serve};

/// The most an answer of the HTTP door is read before it is mapped (they are small JSON
/// envelopes).
const MAX_ANSWER: usize = 64 << 10;

/// The `dtmgimp.Dtm` service over the API's router.
#[derive(Clone)]
pub struct DtmGrpc {
    router: Router,
    /// The `Host` the in-process requests carry: the gRPC listener's own address, an IP
    /// address, which the token-less door's DNS-rebinding check accepts. A browser cannot
    /// reach this listener (gRPC needs HTTP/2 frames and a content type no page may send
    /// without a preflight), so there is nothing for that check to stop here.
    host: HeaderValue,
}

impl DtmGrpc {
    pub fn new(router: Router, local: SocketAddr) -> DtmGrpc {
        DtmGrpc {
            router,
            host: HeaderValue::from_str(&local.to_string()).expect("an address is a valid Host"),
        }
    }

    /// Runs `route` of DTM's HTTP door for a gRPC request and maps the answer.
    async fn call(
        &self,
        rpc: &'static str,
        metadata: &MetadataMap,
        peer: Option<SocketAddr>,
        method: Method,
        route: &'static str,
        body: Option<DoorRequest>,
    ) -> Result<Value, Status> {
        let started = Instant::now();
        // The route, run for this request; every way out is measured below.
        let answer: Result<Value, Status> = async {
            let mut request = HttpRequest::builder()
                .method(method)
                .uri(route)
                .header(header::HOST, self.host.clone());
            // The caller's credentials and trace context; nothing else of its metadata reaches
            // the door (branch headers travel in TransOptions, as in DTM).
            for name in ["authorization", "traceparent", "tracestate"] {
                if let Some(value) = metadata.get(name)
                    && let Ok(value) = HeaderValue::from_bytes(value.as_bytes())
                {
                    request = request.header(name, value);
                }
            }
            let (body, payloads) = match body {
                Some(door) => {
                    request = request.header(header::CONTENT_TYPE, "application/json");
                    let json = serde_json::to_vec(&door.body).expect("a Value serializes");
                    (Body::from(json), door.payloads)
                }
                None => (Body::empty(), None),
            };
            let mut request = request
                .body(body)
                .map_err(|e| Status::internal(format!("cannot build the request: {e}")))?;
            if let Some(payloads) = payloads {
                request.extensions_mut().insert(payloads);
            }
            if let Some(peer) = peer {
                request.extensions_mut().insert(ConnectInfo(peer));
            }
            let response = self
                .router
                .clone()
                .oneshot(request)
                .await
                .unwrap_or_else(|never| match never {});
            let status = response.status();
            let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
            let bytes = axum::body::to_bytes(response.into_body(), MAX_ANSWER)
                .await
                .map_err(|e| Status::internal(format!("cannot read the answer: {e}")))?;
            let json: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if status.is_success() {
                return Ok(json);
            }
            Err(status_of(status, &json, retry_after))
        }
        .await;
        let code = match &answer {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        metrics::counter!("idem_grpc_requests_total", "method" => rpc, "code" => code_label(code))
            .increment(1);
        metrics::histogram!("idem_grpc_request_seconds", "method" => rpc)
            .record(started.elapsed().as_secs_f64());
        answer
    }
}

/// A refusal of the HTTP door as gRPC's status. DTM's two business answers keep DTM's
/// codes; the rest follow gRPC's own meanings of the HTTP statuses.
fn status_of(status: StatusCode, json: &Value, retry_after: Option<HeaderValue>) -> Status {
    let error_code = json["error"]["code"].as_str().unwrap_or_default();
    let message = json["message"]
        .as_str()
        .or_else(|| json["error"]["message"].as_str())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error"))
        .to_owned();
    let code = match status {
        StatusCode::CONFLICT => Code::Aborted,
        StatusCode::TOO_EARLY => Code::FailedPrecondition,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
        StatusCode::SERVICE_UNAVAILABLE => Code::Unavailable,
        StatusCode::GATEWAY_TIMEOUT => Code::DeadlineExceeded,
        s if s.is_client_error() => Code::InvalidArgument,
        _ => Code::Internal,
    };
    // DTM's clients compare ABORTED's and FAILED_PRECONDITION's messages ("FAILURE",
    // "ONGOING" prefixes are not needed): keep them as the door wrote them; prefix the
    // others with the stable code.
    let text = match code {
        Code::Aborted | Code::FailedPrecondition | Code::Internal => message,
        _ if error_code.is_empty() => message,
        _ => format!("{error_code}: {message}"),
    };
    let mut status = Status::new(code, text);
    if !error_code.is_empty()
        && let Ok(value) = MetadataValue::try_from(error_code)
    {
        status.metadata_mut().insert("idem-error-code", value);
    }
    if let Some(value) = retry_after.and_then(|v| MetadataValue::try_from(v.as_bytes()).ok()) {
        status.metadata_mut().insert("retry-after", value);
    }
    status
}

fn refused(refusal: translate::Refused) -> Status {
    let mut status = Status::invalid_argument(format!("{}: {}", refusal.code, refusal.message));
    if let Ok(value) = MetadataValue::try_from(refusal.code) {
        status.metadata_mut().insert("idem-error-code", value);
    }
    status
}

fn code_label(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::Aborted => "ABORTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Unauthenticated => "UNAUTHENTICATED",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::NotFound => "NOT_FOUND",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::Unavailable => "UNAVAILABLE",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::Unimplemented => "UNIMPLEMENTED",
        _ => "INTERNAL",
    }
}

/// A transaction RPC: its `DtmRequest` as DTM's HTTP body, to `route`.
async fn trans_rpc(
    door: &DtmGrpc,
    rpc: &'static str,
    route: &'static str,
    request: Request<DtmRequest>,
) -> Result<Response<()>, Status> {
    let peer = request.remote_addr();
    let body = translate::trans_body(request.get_ref()).map_err(refused)?;
    door.call(
        rpc,
        request.metadata(),
        peer,
        Method::POST,
        route,
        Some(body),
    )
    .await?;
    Ok(Response::new(()))
}

fn unimplemented(rpc: &str, why: &str) -> Status {
    metrics::counter!("idem_grpc_requests_total", "method" => rpc.to_owned(), "code" => "UNIMPLEMENTED")
        .increment(1);
    Status::unimplemented(format!("{rpc}: {why}"))
}

#[tonic::async_trait]
impl Dtm for DtmGrpc {
    async fn new_gid(&self, request: Request<()>) -> Result<Response<DtmGidReply>, Status> {
        let peer = request.remote_addr();
        let answer = self
            .call(
                "NewGid",
                request.metadata(),
                peer,
                Method::GET,
                "/api/dtmsvr/newGid",
                None,
            )
            .await?;
        let gid = answer["gid"].as_str().unwrap_or_default().to_owned();
        Ok(Response::new(DtmGidReply { gid }))
    }

    async fn submit(&self, request: Request<DtmRequest>) -> Result<Response<()>, Status> {
        trans_rpc(self, "Submit", "/api/dtmsvr/submit", request).await
    }

    async fn prepare(&self, request: Request<DtmRequest>) -> Result<Response<()>, Status> {
        trans_rpc(self, "Prepare", "/api/dtmsvr/prepare", request).await
    }

    async fn abort(&self, request: Request<DtmRequest>) -> Result<Response<()>, Status> {
        trans_rpc(self, "Abort", "/api/dtmsvr/abort", request).await
    }

    async fn register_branch(
        &self,
        request: Request<DtmBranchRequest>,
    ) -> Result<Response<()>, Status> {
        let peer = request.remote_addr();
        let body = translate::branch_body(request.get_ref());
        self.call(
            "RegisterBranch",
            request.metadata(),
            peer,
            Method::POST,
            "/api/dtmsvr/registerBranch",
            Some(body),
        )
        .await?;
        Ok(Response::new(()))
    }

    async fn prepare_workflow(
        &self,
        _request: Request<DtmRequest>,
    ) -> Result<Response<DtmProgressesReply>, Status> {
        Err(unimplemented("PrepareWorkflow", NO_WORKFLOW))
    }

    async fn subscribe(&self, _request: Request<DtmTopicRequest>) -> Result<Response<()>, Status> {
        Err(unimplemented("Subscribe", NO_TOPICS))
    }

    async fn unsubscribe(
        &self,
        _request: Request<DtmTopicRequest>,
    ) -> Result<Response<()>, Status> {
        Err(unimplemented("Unsubscribe", NO_TOPICS))
    }

    async fn delete_topic(
        &self,
        _request: Request<DtmTopicRequest>,
    ) -> Result<Response<()>, Status> {
        Err(unimplemented("DeleteTopic", NO_TOPICS))
    }
}

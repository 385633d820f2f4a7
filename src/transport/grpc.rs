//! Branch calls over gRPC, as DTM makes them: a branch URL without a scheme
//! ([`GrpcTarget`]) is a unary call of `/package.Service/Method` whose request message is
//! the stored payload's bytes, unchanged (the participant's own message type; idem never
//! decodes it), with DTM's metadata (`dtm-gid`, `dtm-trans_type`, `dtm-branch_id`,
//! `dtm-op`, `dtm-dtm`), the branch headers, idem's tenant and call id, its signature
//! when the tenant has signing keys, and a `grpc-timeout` of the request timeout. The
//! reply message is ignored.
//!
//! Answers follow DTM's rules: `OK` is success, `ABORTED` a failure (in progress when its
//! message says `ONGOING`, as participants older than DTM 1.10 answer),
//! `FAILED_PRECONDITION` in progress, anything else unknown (retried). As over HTTP, what
//! the participant wrote never reaches the outcome's detail: only the code does.
//!
//! The outbound policy judges the target as the plain-HTTP URL of its host, port and path,
//! then every address its name resolves to, exactly as for HTTP, on every call; the
//! connection is made here to an allowed address and handed to tonic, so nothing else
//! resolves the name. Connections are kept and reused ([`channels`]), one per address.

mod channels;

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Instant;

use bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::{Code, Status};

pub(crate) use channels::Channels;

use super::{CallRequest, CallResult, IDEM_HEADERS, redact_outcome, with_call_query};
use crate::core::CallOutcome;
use crate::outbound::resolve::filter;
use crate::outbound::{DENIED_PREFIX, GrpcTarget, OutboundPolicy};
use crate::signing::Signer;

/// What a gRPC call needs besides its request: the policy, the kept connections, the
/// signing keys and the bound on an answer.
pub(super) struct Caller<'a> {
    pub policy: &'a OutboundPolicy,
    pub channels: &'a Channels,
    pub signer: Option<&'a Signer>,
    pub max_answer: usize,
}

/// Calls `target` for `request`; see the module's documentation.
pub(super) async fn call(
    caller: &Caller<'_>,
    request: &CallRequest,
    target: &GrpcTarget,
) -> CallResult {
    let started = Instant::now();
    let outcome = match attempt(caller, request, target).await {
        Ok(outcome) => outcome,
        Err(detail) => CallOutcome::Unknown(detail),
    };
    CallResult {
        outcome: redact_outcome(outcome),
        status: None,
        duration: started.elapsed(),
        fault: None,
    }
}

async fn attempt(
    caller: &Caller<'_>,
    request: &CallRequest,
    target: &GrpcTarget,
) -> Result<CallOutcome, String> {
    let Caller {
        policy,
        channels,
        signer,
        max_answer,
    } = *caller;
    let url = target.http_url();
    policy
        .check_parsed(&request.tenant, &url)
        .map_err(|refusal| format!("{DENIED_PREFIX} {refusal}"))?;
    let host = url.host_str().expect("a target has a host");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = url.port_or_known_default().expect("a target has a port");
    let own_port = policy.own().has_port(port);
    let (_, rule) = policy.rule_for(&request.tenant);
    let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    let allowed = filter(rule, host, resolved, own_port)
        .map_err(|refusal| format!("{DENIED_PREFIX} {refusal}"))?;
    let (channel, address) = channels.get(&allowed, &target.authority).await?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(max_answer);
    if let Err(e) = grpc.ready().await {
        channels.forget(address, &target.authority);
        return Err(format!("connection failed: {e}"));
    }
    // Signed as a POST of the payload to the target's plain-HTTP URL with DTM's query
    // parameters, which travel as metadata: `idem_participant::grpc` rebuilds the same.
    let call_id = idem_signing::new_call_id();
    let body = request.payload.as_bytes();
    let signed_url = with_call_query(url.clone(), request);
    let signature =
        signer.and_then(|s| s.sign_request("POST", &signed_url, body, &request.tenant, &call_id));
    let mut message = tonic::Request::new(body.to_vec());
    message.set_timeout(request.timeout);
    put_metadata(
        message.metadata_mut(),
        request,
        &call_id,
        signature.as_deref(),
    );
    let path = http::uri::PathAndQuery::from_str(&target.path)
        .map_err(|e| format!("bad gRPC method path: {e}"))?;
    let answer = tokio::time::timeout(request.timeout, grpc.unary(message, path, RawCodec)).await;
    Ok(match answer {
        Err(_) => CallOutcome::Unknown("timed out".into()),
        Ok(Ok(_)) => CallOutcome::Success,
        Ok(Err(status)) => {
            // The connection may have broken (tonic says UNAVAILABLE): connect afresh next
            // time rather than wait for it to be found broken again.
            if status.code() == Code::Unavailable {
                channels.forget(address, &target.authority);
            }
            if status.code() != Code::Ok {
                tracing::debug!(
                    gid = %request.gid,
                    branch_id = %request.branch_id,
                    op = request.action.op(),
                    code = ?status.code(),
                    message = %status.message(),
                    "a gRPC participant answered"
                );
            }
            classify(&status)
        }
    })
}

/// DTM's reading of a gRPC status.
pub fn classify(status: &Status) -> CallOutcome {
    let code = status.code();
    match code {
        Code::Ok => CallOutcome::Success,
        Code::Aborted if status.message().contains("ONGOING") => {
            CallOutcome::InProgress("gRPC ABORTED (ONGOING)".into())
        }
        Code::Aborted => CallOutcome::Failure("gRPC ABORTED".into()),
        Code::FailedPrecondition => CallOutcome::InProgress("gRPC FAILED_PRECONDITION".into()),
        _ => CallOutcome::Unknown(format!("gRPC {code:?}")),
    }
}

/// DTM's metadata, the branch headers (those that are valid metadata), and idem's tenant
/// and call id, which a client's branch headers cannot replace.
fn put_metadata(
    metadata: &mut tonic::metadata::MetadataMap,
    request: &CallRequest,
    call_id: &str,
    signature: Option<&str>,
) {
    let mut put = |name: &str, value: &str| {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(name.to_ascii_lowercase().as_bytes()),
            AsciiMetadataValue::try_from(value),
        ) {
            metadata.insert(key, value);
        }
    };
    for (name, value) in &request.headers {
        if !IDEM_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h)) {
            put(name, value);
        }
    }
    put("dtm-gid", &request.gid);
    put("dtm-trans_type", request.kind.as_str());
    put("dtm-branch_id", &request.branch_id);
    put("dtm-op", request.action.op());
    put("dtm-dtm", "");
    put(idem_signing::TENANT_HEADER, &request.tenant);
    put(idem_signing::CALL_ID_HEADER, call_id);
    if let Some(signature) = signature {
        put(idem_signing::HEADER, signature);
    }
}

/// DTM's pass-through codec: the request message is the payload's bytes as stored, and
/// the reply is read (up to the answer bound) and dropped.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_read_as_dtm_reads_them() {
        let outcome = |code, message: &str| classify(&Status::new(code, message));
        assert_eq!(outcome(Code::Ok, ""), CallOutcome::Success);
        assert!(matches!(
            outcome(Code::Aborted, "FAILURE"),
            CallOutcome::Failure(_)
        ));
        assert!(matches!(
            outcome(Code::Aborted, "ONGOING"),
            CallOutcome::InProgress(_)
        ));
        assert!(matches!(
            outcome(Code::FailedPrecondition, ""),
            CallOutcome::InProgress(_)
        ));
        for code in [
            Code::Unavailable,
            Code::Internal,
            Code::Unknown,
            Code::DeadlineExceeded,
        ] {
            assert!(
                matches!(outcome(code, "x"), CallOutcome::Unknown(_)),
                "{code:?}"
            );
        }
        // What the participant wrote stays out of the detail.
        assert_eq!(
            outcome(Code::Aborted, "secret"),
            CallOutcome::Failure("gRPC ABORTED".into())
        );
    }
}

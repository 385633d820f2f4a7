//! Signed gRPC calls: a tower layer for a tonic server that lets through only calls whose
//! `idem-signature` verifies, as [`crate::signature::require_signature`] does for axum.
//!
//! A coordinator signs a gRPC call as a `POST` of the request message's bytes to the plain
//! URL of the target with DTM's branch parameters as its query,
//! `http://host:port/package.Service/Method?gid=…&trans_type=…&branch_id=…&op=…`, the
//! parameters taken from the metadata they travel in. The layer rebuilds that target from
//! the call's authority, path and `dtm-*` metadata and checks it with the [`Verifier`]:
//! so a call signed for one method, host, branch or tenant does not pass as another, a
//! changed message does not pass, and a replayed call id is refused. A refused call never
//! reaches the service: it is answered `UNAUTHENTICATED`, with the signature error's code
//! at the start of the message, which a coordinator retries like any answer it cannot use.
//!
//! ```no_run
//! # async fn run(listener: tokio::net::TcpListener, keys: idem_participant::signature::Keyring) {
//! use idem_participant::grpc::RequireSignatureLayer;
//! use idem_participant::signature::Verifier;
//!
//! let verifier = Verifier::new(keys);
//! tonic::transport::Server::builder()
//!     .layer(RequireSignatureLayer::new(verifier))
//!     // .add_service(BusiServer::new(...))
//! #   .add_routes(tonic::service::Routes::default())
//!     .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
//!     .await
//!     .unwrap();
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::http::uri::{PathAndQuery, Uri};
use axum::http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use tonic::Status;
use tonic::body::Body;

use super::PARAMETERS;
use crate::signature::{SignatureError, SignedBy, SignedCall, Verifier};

/// Wraps a tonic server's services in [`RequireSignature`].
#[derive(Clone)]
pub struct RequireSignatureLayer {
    verifier: Verifier,
}

impl RequireSignatureLayer {
    /// Lets through only the calls `verifier` accepts.
    pub fn new(verifier: Verifier) -> RequireSignatureLayer {
        RequireSignatureLayer { verifier }
    }
}

impl<S> tower::Layer<S> for RequireSignatureLayer {
    type Service = RequireSignature<S>;

    fn layer(&self, inner: S) -> RequireSignature<S> {
        RequireSignature {
            inner,
            verifier: self.verifier.clone(),
        }
    }
}

/// Verifies each call's signature before `S` sees it; a verified call carries
/// [`SignedCall`] and [`SignedBy`] in its extensions (`request.extensions()` in a tonic
/// method).
#[derive(Clone)]
pub struct RequireSignature<S> {
    inner: S,
    verifier: Verifier,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<Request<Body>> for RequireSignature<S>
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // The clone that was driven to ready serves this call; the fresh one waits for
        // the next (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let verifier = self.verifier.clone();
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            // A unary call's body is one frame: 5 bytes of header, then the message.
            let bytes = match Limited::new(body, verifier.max_body() + 5).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => {
                    let refused = Status::resource_exhausted(format!(
                        "a signed call's message is read up to {} bytes",
                        verifier.max_body()
                    ));
                    return Ok(refused.into_http());
                }
            };
            match verify(&verifier, &parts, &bytes) {
                Ok(signed) => {
                    parts.extensions.insert(SignedBy(signed.kid.clone()));
                    parts.extensions.insert(signed);
                    let body = Body::new(Full::new(bytes));
                    inner.call(Request::from_parts(parts, body)).await
                }
                Err(e) => {
                    tracing::warn!(code = e.code(), error = %e, "refused an unsigned or badly signed gRPC call");
                    let refused = Status::unauthenticated(format!("{}: {e}", e.code()));
                    Ok(refused.into_http())
                }
            }
        })
    }
}

/// Checks a gRPC call (its head, and its body as framed) as the coordinator signed it.
pub fn verify(
    verifier: &Verifier,
    parts: &axum::http::request::Parts,
    framed: &Bytes,
) -> Result<SignedCall, SignatureError> {
    let message = unary_message(framed)?;
    let mut signed = parts.clone();
    signed.uri = signed_target(parts)?;
    verifier.verify_parts(&signed, message)
}

/// The message of a unary call's one uncompressed frame (the coordinator never
/// compresses): what was signed.
fn unary_message(framed: &[u8]) -> Result<&[u8], SignatureError> {
    let malformed = SignatureError::Malformed("the call is not one uncompressed gRPC message");
    let (header, message) = framed.split_at_checked(5).ok_or(malformed.clone())?;
    let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if header[0] != 0 || length != message.len() {
        return Err(malformed);
    }
    Ok(message)
}

/// The call's URI with the query the coordinator signed: its `dtm-*` metadata, each once.
fn signed_target(parts: &axum::http::request::Parts) -> Result<Uri, SignatureError> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    // In the coordinator's order: the query of an HTTP call.
    for (metadata, name) in PARAMETERS {
        let mut values = parts.headers.get_all(metadata).iter();
        let value = match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().map_err(|_| {
                SignatureError::Malformed("a branch call's metadata is not visible ASCII")
            })?,
            _ => {
                return Err(SignatureError::Malformed(
                    "a branch call's metadata is missing or given twice",
                ));
            }
        };
        query.append_pair(name, value);
    }
    let target = format!("{}?{}", parts.uri.path(), query.finish());
    let mut uri = parts.uri.clone().into_parts();
    uri.path_and_query = Some(
        PathAndQuery::try_from(target)
            .map_err(|_| SignatureError::Malformed("the call's path and metadata make no URI"))?,
    );
    Uri::from_parts(uri).map_err(|_| SignatureError::Malformed("the call has no valid URI"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unary_frame_gives_its_message_and_anything_else_is_malformed() {
        assert_eq!(unary_message(b"\0\0\0\0\x02hi").unwrap(), b"hi");
        assert_eq!(unary_message(b"\0\0\0\0\0").unwrap(), b"");
        for bad in [&b"\x01\0\0\0\x02hi"[..], b"\0\0\0\0\x03hi", b"\0\0\0", b""] {
            assert!(unary_message(bad).is_err(), "{bad:?}");
        }
    }

    /// A call to `TransOut` of branch 01 of saga `gid`, as its head arrives.
    fn call_of(gid: &str) -> axum::http::request::Parts {
        let request = Request::builder()
            .uri("http://127.0.0.1:50051/busi.Busi/TransOut")
            .header("dtm-gid", gid)
            .header("dtm-trans_type", "saga")
            .header("dtm-branch_id", "01")
            .header("dtm-op", "action")
            .body(())
            .unwrap();
        request.into_parts().0
    }

    #[test]
    fn the_signed_target_is_the_path_with_dtms_parameters_as_the_coordinator_writes_them() {
        assert!(
            signed_target(&call_of("g 1/é")).is_err(),
            "metadata must be ASCII"
        );
        assert_eq!(
            signed_target(&call_of("g 1&x=y")).unwrap().to_string(),
            "http://127.0.0.1:50051/busi.Busi/TransOut?gid=g+1%26x%3Dy&trans_type=saga&branch_id=01&op=action"
        );
    }
}

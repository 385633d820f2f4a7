//! The gRPC listener: HTTP/2 over TCP or TLS, served by tonic. idem accepts the
//! connections itself, so that the HTTP API's cap on open connections and its TLS (the same
//! certificate, reloaded the same way, with `h2` as the protocol) hold here too, and so
//! that each request knows its peer's address (the token-less DTM door is judged on it).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use idem_dtm_proto::DtmServer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::DtmGrpc;
use crate::api::MAX_BODY;
use crate::http_server::HttpLimits;

/// A bound gRPC listener and, with TLS, its acceptor (see `CertResolver::grpc_acceptor`).
pub struct GrpcListener {
    pub listener: TcpListener,
    pub tls: Option<TlsAcceptor>,
}

/// Streams one connection may have open at once: a client multiplexes its calls over few
/// connections, and each stream holds a handler.
const MAX_STREAMS_PER_CONNECTION: u32 = 128;

/// Serves the `Dtm` service on `listener` until `shutdown`, then lets calls in progress
/// finish.
pub async fn serve(
    listener: GrpcListener,
    door: DtmGrpc,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let (sender, receiver) = mpsc::channel::<io::Result<GrpcIo>>(64);
    let accepting = tokio::spawn(accept(listener, limits, sender));
    let incoming = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    });
    let service = DtmServer::new(door)
        .max_decoding_message_size(MAX_BODY)
        .max_encoding_message_size(MAX_BODY);
    let served = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(64 << 10)
        // A connection whose peer vanished without a FIN is found and closed.
        .http2_keepalive_interval(Some(limits.idle_timeout))
        .http2_keepalive_timeout(Some(limits.read_timeout))
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    accepting.abort();
    served
}

/// Accepts connections while fewer than `max_connections` are open (more wait in the
/// kernel's backlog, as on the HTTP listener), shakes hands with TLS within the read
/// timeout, and hands each one to tonic.
async fn accept(
    listener: GrpcListener,
    limits: HttpLimits,
    sender: mpsc::Sender<io::Result<GrpcIo>>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1) as usize));
    loop {
        let permit = Arc::clone(&permits)
            .acquire_owned()
            .await
            .expect("never closed");
        let (tcp, remote) = match listener.listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a gRPC connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let info = TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: Some(remote),
        };
        let Some(acceptor) = listener.tls.clone() else {
            let io = GrpcIo {
                stream: Stream::Plain(tcp),
                info,
                _permit: permit,
            };
            if sender.send(Ok(io)).await.is_err() {
                return;
            }
            continue;
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(limits.read_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let io = GrpcIo {
                        stream: Stream::Tls(Box::new(tls)),
                        info,
                        _permit: permit,
                    };
                    let _ = sender.send(Ok(io)).await;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, peer = %remote, "gRPC TLS handshake failed")
                }
                Err(_) => {
                    tracing::debug!(peer = %remote, "gRPC TLS handshake took past the read timeout")
                }
            }
        });
    }
}

/// One accepted connection; its permit is given back when tonic drops it.
pub struct GrpcIo {
    stream: Stream,
    info: TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connected for GrpcIo {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for GrpcIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for GrpcIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

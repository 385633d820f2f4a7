//! The HTTP server of the API: the accept loop, the connection cap, the read and idle
//! timeouts, and a graceful stop.
//!
//! `axum::serve` has none of these knobs, and hyper's own `header_read_timeout` cannot give
//! them either: its timer starts whenever the connection waits for a request head, which
//! on a keep-alive connection includes the wait between requests (hyper 1.12: an idle
//! connection is closed one header timeout after its last response), and it does not cover
//! the body. So a single timer would make a tight deadline for slow clients also a tight
//! keep-alive, and a half-sent body would still hold a connection and a handler. Each
//! connection here is watched instead (see [`Activity`]):
//!
//! - a request must arrive whole, head and body, within `read_timeout` of its first byte
//!   (a connection's first request: of the accept, so a silent connection is closed too);
//! - a connection with no request in progress is closed `idle_timeout` after its last
//!   response went out;
//! - at most `max_connections` are open; past that, the loop stops accepting and new
//!   connections wait in the kernel's listen backlog until one closes;
//! - on stop, the listener closes, connections with a request in progress finish it
//!   (hyper closes them after the response), and the others are dropped at once, so a
//!   half-sent or idle connection cannot hold a stopping server.
//!
//! With TLS (see [`crate::tls`]), the handshake is part of reading a connection's first
//! request: it must end within `read_timeout` of the accept, and the request within
//! `read_timeout` of the ClientHello's first byte, so a client that connects and sends
//! nothing, or stalls mid-handshake, frees its slot like one that stalls mid-request.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ConnectInfo;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

/// The most a connection's buffer holds of what it reads (and so the longest request
/// head): hyper's default, about 400 KiB, is reached by every connection a body arrives
/// on quickly, and a few hundred connections sending bodies at once would hold a hundred
/// megabytes in buffers alone. A head past it is answered `431` and the connection closed.
pub const CONNECTION_BUFFER: usize = 64 << 10;

/// The server's limits; defaults are those of `idem serve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a client may take to send one request, head and body.
    pub read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// Open connections at most.
    pub max_connections: u32,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4_096,
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown` resolves, then stops
/// as described above.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let max = limits.max_connections.max(1);
    let permits = Arc::new(Semaphore::new(max as usize));
    let (stop, stopping) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("never closed"),
        };
        let accepted = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors, most likely: retrying at once would spin.
                tracing::error!(error = %e, "cannot accept a connection");
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        // Small JSON answers go out at once instead of waiting for Nagle's timer.
        let _ = tcp.set_nodelay(true);
        let conn = connection(
            tcp,
            app.clone(),
            limits,
            tls.clone(),
            stopping.clone(),
            permit,
        );
        tokio::spawn(conn);
    }
    drop(listener);
    let _ = stop.send(());
    // Every connection holds a permit until it ends: all of them back means all ended.
    let _all = permits.acquire_many(max).await;
}

/// Errors of one connection that was already gone, not of the listener.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn connection(
    tcp: TcpStream,
    app: Router,
    limits: HttpLimits,
    tls: Option<TlsAcceptor>,
    mut stopping: watch::Receiver<()>,
    _permit: OwnedSemaphorePermit,
) {
    let activity = Arc::new(Activity::new());
    // Handlers and layers read the caller's address as axum's `ConnectInfo` (DTM's door
    // without a token is open to some networks only).
    let peer = tcp.peer_addr().ok();
    let watched = Watched {
        inner: tcp,
        activity: Arc::clone(&activity),
    };
    let Some(acceptor) = tls else {
        return http(watched, peer, activity, app, limits, stopping).await;
    };
    let handshake = tokio::time::timeout(limits.read_timeout, acceptor.accept(watched));
    let stream = tokio::select! {
        done = handshake => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!("closing a connection whose TLS handshake took past the read timeout");
                return;
            }
        },
        // Nothing to finish yet.
        _ = stopping.changed() => return,
    };
    http(stream, peer, activity, app, limits, stopping).await;
}

/// Serves HTTP/1.1 on one connection's byte stream until it ends, times out or the
/// server stops.
async fn http<S>(
    io: S,
    peer: Option<SocketAddr>,
    activity: Arc<Activity>,
    app: Router,
    limits: HttpLimits,
    mut stopping: watch::Receiver<()>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(io);
    let service = {
        let activity = Arc::clone(&activity);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let (guard, deadline) = activity.request_started(limits.read_timeout);
            let mut request = request.map(|body| ReadBy {
                body,
                deadline: Box::pin(tokio::time::sleep_until(deadline)),
            });
            if let Some(peer) = peer {
                request.extensions_mut().insert(ConnectInfo(peer));
            }
            let app = app.clone();
            async move {
                let response = tower::ServiceExt::oneshot(app, request).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| Tracked {
                    body,
                    _guard: guard,
                }))
            }
        })
    };
    // hyper's own header timer stays off: it would also cut keep-alive (see the top).
    let conn = hyper::server::conn::http1::Builder::new()
        .header_read_timeout(None)
        .keep_alive(true)
        .max_buf_size(CONNECTION_BUFFER)
        .serve_connection(io, service);
    tokio::pin!(conn);
    let mut stop_requested = false;
    loop {
        let (deadline, quiet) = activity.deadline(&limits);
        if stop_requested && quiet {
            // Idle, or still sending its request head: nothing to finish.
            return;
        }
        let changed = activity.changed.notified();
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended");
                }
                return;
            }
            _ = stopping.changed(), if !stop_requested => {
                // A request in progress is answered; hyper then closes the connection.
                conn.as_mut().graceful_shutdown();
                stop_requested = true;
            }
            () = until(deadline) => {
                if activity.deadline(&limits).0.is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("closing a connection past its read or idle timeout");
                    return;
                }
            }
            () = changed => {}
        }
    }
}

async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// What a connection is doing, as its socket and its requests show it. Changed from
/// inside hyper's polling of the connection; [`connection`] waits on `changed` to
/// recompute its deadline.
struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
}

struct Phase {
    /// Requests whose response body hyper has not dropped yet.
    in_flight: usize,
    /// A response may still sit in hyper's write buffer: set when a request starts,
    /// cleared by the first successful flush of the socket after its body was dropped
    /// (hyper flushes the socket only once its own buffer is empty).
    unflushed: bool,
    /// Since when the connection has had nothing to do: its accept, then the flush of
    /// its last response.
    quiet_since: Instant,
    /// Whether a request has started on this connection.
    served: bool,
    /// When the first byte of the next request arrived, if it did.
    head_started: Option<Instant>,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            phase: Mutex::new(Phase {
                in_flight: 0,
                unflushed: false,
                quiet_since: Instant::now(),
                served: false,
                head_started: None,
            }),
            changed: Notify::new(),
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().expect("poisoned")
    }

    /// When the connection is to be closed if nothing changes, and whether it is quiet
    /// (no request in progress, no response left to send).
    fn deadline(&self, limits: &HttpLimits) -> (Option<Instant>, bool) {
        let p = self.phase();
        if p.in_flight > 0 || p.unflushed {
            return (None, false);
        }
        let at = match p.head_started {
            Some(first_byte) => first_byte + limits.read_timeout,
            None if !p.served => p.quiet_since + limits.read_timeout,
            None => p.quiet_since + limits.idle_timeout,
        };
        (Some(at), true)
    }

    /// A request head was parsed. Returns the guard that ends the request when the
    /// response body is dropped, and the deadline for the whole request to arrive.
    fn request_started(self: &Arc<Self>, read_timeout: Duration) -> (InFlight, Instant) {
        let mut p = self.phase();
        // A pipelined request was read before it was due: its clock starts now.
        let first_byte = p.head_started.take().unwrap_or_else(Instant::now);
        p.in_flight += 1;
        p.unflushed = true;
        p.served = true;
        let guard = InFlight(Arc::clone(self));
        (guard, first_byte + read_timeout)
    }

    fn read_some(&self) {
        let mut p = self.phase();
        if p.in_flight == 0 && p.head_started.is_none() {
            p.head_started = Some(Instant::now());
            drop(p);
            self.changed.notify_one();
        }
    }

    fn flushed(&self) {
        let mut p = self.phase();
        if p.unflushed && p.in_flight == 0 {
            p.unflushed = false;
            p.quiet_since = Instant::now();
            drop(p);
            self.changed.notify_one();
        }
    }
}

/// One request in progress, until its response body is dropped (sent, or abandoned).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.phase().in_flight -= 1;
        self.0.changed.notify_one();
    }
}

/// The socket, reporting reads and flushes to the connection's [`Activity`].
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.activity.read_some();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        self.activity.flushed();
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that must have arrived by a deadline: a client sending its body a
/// byte at a time would otherwise hold a connection and a handler as long as it likes.
/// Past the deadline the handler gets an error (the API answers `400 invalid_body`).
struct ReadBy {
    body: Incoming,
    deadline: Pin<Box<Sleep>>,
}

impl hyper::body::Body for ReadBy {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err("the request body did not arrive in time".into())));
        }
        Pin::new(&mut self.body)
            .poll_frame(cx)
            .map(|frame| frame.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A response body that ends its request's [`InFlight`] when hyper drops it.
struct Tracked {
    body: axum::body::Body,
    _guard: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

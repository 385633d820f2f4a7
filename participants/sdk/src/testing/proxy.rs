//! A TCP proxy between a client and a database server that a test can break on purpose.
//!
//! Database outages are hard to stage against a shared server without disturbing everyone
//! else using it. The proxy stages them for one client only:
//!
//! - [`TcpProxy::partition`]: bytes stop flowing both ways, but every connection stays
//!   open and new ones are accepted and then hear nothing: what a client sees when packets
//!   are dropped. [`TcpProxy::heal`] lets the held bytes through again.
//! - [`TcpProxy::stop`]: every connection is closed and new ones are refused, like a server
//!   that went down. [`TcpProxy::start_again`] accepts again (the server came back; the old
//!   connections stay dead, as after a restart).

use std::net::SocketAddr;

use idem_sql::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Partitioned,
    Stopped,
}

#[derive(Clone, Copy, Debug)]
struct State {
    mode: Mode,
    /// Bumped by every stop: connections accepted before it end.
    epoch: u64,
}

/// A proxy listening on a loopback port, forwarding to one server.
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: watch::Sender<State>,
    /// Whether the port accepts connections, and how many connections are open: what
    /// [`TcpProxy::stop`] and [`TcpProxy::start_again`] wait for.
    listening: watch::Receiver<bool>,
    open: watch::Receiver<usize>,
}

impl TcpProxy {
    /// Starts forwarding `127.0.0.1:<some free port>` to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, watch) = watch::channel(State {
            mode: Mode::Forward,
            epoch: 0,
        });
        let (listening_tx, listening) = watch::channel(true);
        let (open_tx, open) = watch::channel(0usize);
        let counter = Counter(std::sync::Arc::new(open_tx));
        tokio::spawn(accept_loop(
            listener,
            addr,
            target,
            watch,
            listening_tx,
            counter,
        ));
        Ok(TcpProxy {
            addr,
            target,
            state,
            listening,
            open,
        })
    }

    /// Starts a proxy for the server of a database URL (`postgres://user@host:port/db`,
    /// `mysql://...`) and returns it with the same URL pointing at the proxy.
    pub async fn for_url(url: &str) -> std::io::Result<(TcpProxy, String)> {
        let (authority, port) = host_port(url).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no host in {url}"),
            )
        })?;
        let host = authority.rsplit('@').next().unwrap_or(authority);
        let host = host.split(':').next().unwrap_or(host);
        let host = if host == "localhost" {
            "127.0.0.1"
        } else {
            host
        };
        let target: SocketAddr = format!("{host}:{port}").parse().map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{url}: {e}"))
        })?;
        let proxy = TcpProxy::start(target).await?;
        let user = authority
            .rsplit_once('@')
            .map(|(user, _)| format!("{user}@"))
            .unwrap_or_default();
        let proxied = url.replacen(
            authority,
            &format!("{user}127.0.0.1:{}", proxy.addr.port()),
            1,
        );
        Ok((proxy, proxied))
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Holds every byte in both directions from now on; connections stay open, and new
    /// ones are accepted but hear nothing.
    pub fn partition(&self) {
        self.set(Mode::Partitioned, false);
    }

    /// Forwards again, held bytes first.
    pub fn heal(&self) {
        self.set(Mode::Forward, false);
    }

    /// Closes every connection and refuses new ones; returns once both are so.
    pub async fn stop(&self) {
        self.set(Mode::Stopped, true);
        wait_for(self.listening.clone(), |l| !*l).await;
        wait_for(self.open.clone(), |n| *n == 0).await;
    }

    /// Accepts connections again after [`TcpProxy::stop`]; returns once it does.
    pub async fn start_again(&self) {
        self.set(Mode::Forward, false);
        wait_for(self.listening.clone(), |l| *l).await;
    }

    /// [`TcpProxy::stop`] then [`TcpProxy::start_again`]: every connection a client holds
    /// is dead, new ones work.
    pub async fn restart(&self) {
        self.stop().await;
        self.start_again().await;
    }

    fn set(&self, mode: Mode, new_epoch: bool) {
        self.state.send_modify(|s| {
            s.mode = mode;
            if new_epoch {
                s.epoch += 1;
            }
        });
    }
}

async fn wait_for<T>(mut watch: watch::Receiver<T>, done: impl Fn(&T) -> bool) {
    // An error means the accept loop ended, which only a dropped proxy does.
    let _ = watch.wait_for(done).await;
}

/// Counts open connections; each connection holds one [`Open`] while it lives.
#[derive(Clone)]
struct Counter(std::sync::Arc<watch::Sender<usize>>);

struct Open(Counter);

impl Counter {
    fn open(&self) -> Open {
        self.0.send_modify(|n| *n += 1);
        Open(self.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        (self.0).0.send_modify(|n| *n -= 1);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The accept loop and the connections end when they see it.
        self.set(Mode::Stopped, true);
    }
}

/// `user@host:port` and the port of a URL (the default port of its scheme when absent).
fn host_port(url: &str) -> Option<(&str, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let host = authority.rsplit('@').next()?;
    let port = match host.rsplit_once(':') {
        Some((_, port)) => port.parse().ok()?,
        None if Backend::from_name(scheme) == Some(Backend::Postgres) => 5432,
        None => 3306,
    };
    Some((authority, port))
}

async fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    target: SocketAddr,
    mut watch: watch::Receiver<State>,
    listening: watch::Sender<bool>,
    counter: Counter,
) {
    let mut listener = Some(listener);
    loop {
        let state = *watch.borrow_and_update();
        if state.mode == Mode::Stopped {
            // Refused, as by a server that is down: nothing listens on the port.
            listener = None;
        } else if listener.is_none() {
            listener = rebind(addr);
        }
        listening.send_replace(listener.is_some());
        tokio::select! {
            accepted = accept(listener.as_ref()) => {
                if let Ok((client, _)) = accepted {
                    let open = counter.open();
                    tokio::spawn(connection(client, target, state.epoch, watch.clone(), open));
                }
            }
            changed = watch.changed() => {
                if changed.is_err() {
                    return; // the proxy was dropped
                }
            }
        }
    }
}

async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    let socket = TcpSocket::new_v4().ok()?;
    // The port was just in use by this proxy; connections closed by it linger in
    // TIME_WAIT, which would refuse the bind without this.
    socket.set_reuseaddr(true).ok()?;
    socket.bind(addr).ok()?;
    socket.listen(128).ok()
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    epoch: u64,
    mut watch: watch::Receiver<State>,
    _open: Open,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let (to_server, to_client) = (watch.clone(), watch.clone());
    let ended = async move {
        loop {
            if watch.borrow_and_update().epoch != epoch || watch.changed().await.is_err() {
                return;
            }
        }
    };
    // Either direction ending (EOF, an error, a stop) closes both: database protocols do
    // not half-close.
    tokio::select! {
        _ = pump(client_read, server_write, epoch, to_server) => {}
        _ = pump(server_read, client_write, epoch, to_client) => {}
        _ = ended => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    epoch: u64,
    mut watch: watch::Receiver<State>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !forwarding(&mut watch, epoch).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // A partition (or stop) that starts while this waits for bytes: look again
            // before reading anything more.
            changed = watch.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        // Bytes read just before a partition wait for it to heal, like bytes in flight.
        if !forwarding(&mut watch, epoch).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits while partitioned; false once the connection must end.
async fn forwarding(watch: &mut watch::Receiver<State>, epoch: u64) -> bool {
    loop {
        let state = *watch.borrow_and_update();
        if state.epoch != epoch || state.mode == Mode::Stopped {
            return false;
        }
        if state.mode == Mode::Forward {
            return true;
        }
        if watch.changed().await.is_err() {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn urls_name_their_server() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
            Some(("postgres@127.0.0.1:5432", 5432))
        );
        assert_eq!(
            host_port("mysql://root@127.0.0.1/test"),
            Some(("root@127.0.0.1", 3306))
        );
    }
}

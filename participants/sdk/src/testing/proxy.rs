//! A TCP proxy between a client and a database server that a test can break on purpose.
//!
//! Database outages are hard to stage against a shared server without disturbing everyone
//! else using it. The proxy stages them for one client only:
//!
//! - [`TcpProxy::partition`]: bytes stop flowing both ways, but every connection stays
//!   open and new ones are accepted and then hear nothing: what a client sees when packets
//!   are dropped. [`TcpProxy::heal`] lets the held bytes through again;
//!   [`TcpProxy::freeze`] is a partition that heals itself after a while (a stalled link,
//!   a long pause of the server or of a middlebox).
//! - [`TcpProxy::set_latency`]: every chunk of bytes waits this long on its way, per
//!   direction: a slow or distant link.
//! - [`TcpProxy::cut`]: every open connection is reset (RST, as by a firewall or a load
//!   balancer that forgot them) while new ones are accepted as usual.
//! - [`TcpProxy::stop`]: every connection is closed and new ones are refused, like a server
//!   that went down. [`TcpProxy::start_again`] accepts again (the server came back; the old
//!   connections stay dead, as after a restart).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use idem_sql::Backend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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
    /// Bumped by every cut: connections accepted before it are reset.
    cuts: u64,
    /// Bumped by every partition, heal and freeze: a freeze heals only its own partition.
    holds: u64,
    /// Added to every chunk on its way to the server, and on its way to the client.
    latency: [Duration; 2],
}

/// Which way bytes go, as an index into [`State::latency`].
#[derive(Clone, Copy)]
enum Direction {
    ToServer = 0,
    ToClient = 1,
}

/// A proxy listening on a loopback port, forwarding to one server.
pub struct TcpProxy {
    addr: SocketAddr,
    target: SocketAddr,
    state: Arc<watch::Sender<State>>,
    /// Whether the port accepts connections, and how many connections are open per cut
    /// generation: what [`TcpProxy::stop`], [`TcpProxy::start_again`] and
    /// [`TcpProxy::cut`] wait for.
    listening: watch::Receiver<bool>,
    open: watch::Receiver<BTreeMap<u64, usize>>,
}

impl TcpProxy {
    /// Starts forwarding `127.0.0.1:<some free port>` to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<TcpProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, watch) = watch::channel(State {
            mode: Mode::Forward,
            epoch: 0,
            cuts: 0,
            holds: 0,
            latency: [Duration::ZERO; 2],
        });
        let (listening_tx, listening) = watch::channel(true);
        let (open_tx, open) = watch::channel(BTreeMap::new());
        let counter = Counter(Arc::new(open_tx));
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
            state: Arc::new(state),
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
        self.state.send_modify(|s| {
            s.mode = Mode::Partitioned;
            s.holds += 1;
        });
    }

    /// Forwards again, held bytes first.
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            if s.mode == Mode::Partitioned {
                s.mode = Mode::Forward;
            }
            s.holds += 1;
        });
    }

    /// [`TcpProxy::partition`] for `hold`, then [`TcpProxy::heal`] on its own, unless
    /// another partition, heal or freeze came in between (a later freeze replaces this
    /// one's end with its own). Returns at once.
    pub fn freeze(&self, hold: Duration) {
        let mut this = 0;
        self.state.send_modify(|s| {
            s.mode = Mode::Partitioned;
            s.holds += 1;
            this = s.holds;
        });
        // The proxy's own state, not the proxy: a freeze outliving a dropped proxy is moot.
        let state = Arc::downgrade(&self.state);
        tokio::spawn(async move {
            tokio::time::sleep(hold).await;
            if let Some(state) = state.upgrade() {
                state.send_modify(|s| {
                    if s.holds == this && s.mode == Mode::Partitioned {
                        s.mode = Mode::Forward;
                    }
                });
            }
        });
    }

    /// Whether bytes are held now (a partition or a freeze).
    pub fn is_partitioned(&self) -> bool {
        self.state.borrow().mode == Mode::Partitioned
    }

    /// Every chunk of bytes read from now on waits `to_server` (client to server) or
    /// `to_client` (server to client) before it is passed on; zero for both ends the
    /// latency. Chunks of one connection keep their order.
    pub fn set_latency(&self, to_server: Duration, to_client: Duration) {
        self.state
            .send_modify(|s| s.latency = [to_server, to_client]);
    }

    /// Resets every open connection (both sockets closed with RST: the client reads
    /// "connection reset", the server sees its client vanish) and keeps accepting new
    /// ones; returns once the connections open before the cut are gone.
    pub async fn cut(&self) {
        let mut cut = 0;
        self.state.send_modify(|s| {
            s.cuts += 1;
            cut = s.cuts;
        });
        wait_for(self.open.clone(), |open| open.range(..cut).next().is_none()).await;
    }

    /// Closes every connection and refuses new ones; returns once both are so.
    pub async fn stop(&self) {
        self.state.send_modify(|s| {
            s.mode = Mode::Stopped;
            s.epoch += 1;
        });
        wait_for(self.listening.clone(), |l| !*l).await;
        wait_for(self.open.clone(), BTreeMap::is_empty).await;
    }

    /// Accepts connections again after [`TcpProxy::stop`]; returns once it does.
    pub async fn start_again(&self) {
        self.state.send_modify(|s| s.mode = Mode::Forward);
        wait_for(self.listening.clone(), |l| *l).await;
    }

    /// [`TcpProxy::stop`] then [`TcpProxy::start_again`]: every connection a client holds
    /// is dead, new ones work.
    pub async fn restart(&self) {
        self.stop().await;
        self.start_again().await;
    }
}

async fn wait_for<T>(mut watch: watch::Receiver<T>, done: impl Fn(&T) -> bool) {
    // An error means the accept loop ended, which only a dropped proxy does.
    let _ = watch.wait_for(done).await;
}

/// Counts open connections per cut generation; each connection holds one [`Open`] while
/// it lives.
#[derive(Clone)]
struct Counter(Arc<watch::Sender<BTreeMap<u64, usize>>>);

struct Open(Counter, u64);

impl Counter {
    fn open(&self, cuts: u64) -> Open {
        self.0.send_modify(|m| *m.entry(cuts).or_default() += 1);
        Open(self.clone(), cuts)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let cuts = self.1;
        (self.0).0.send_modify(|m| {
            if let Some(n) = m.get_mut(&cuts) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&cuts);
                }
            }
        });
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // The accept loop and the connections end when they see it.
        self.state.send_modify(|s| {
            s.mode = Mode::Stopped;
            s.epoch += 1;
        });
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
                    let born = Born { epoch: state.epoch, cuts: state.cuts };
                    let open = counter.open(state.cuts);
                    tokio::spawn(connection(client, target, born, watch.clone(), open));
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

/// The stop and cut generations a connection was accepted in: a newer one ends it.
#[derive(Clone, Copy)]
struct Born {
    epoch: u64,
    cuts: u64,
}

impl Born {
    /// Whether the connection may live on in this state.
    fn lives(self, state: &State) -> bool {
        state.epoch == self.epoch && state.cuts == self.cuts && state.mode != Mode::Stopped
    }
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    born: Born,
    mut watch: watch::Receiver<State>,
    _open: Open,
) {
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let (to_server, to_client) = (watch.clone(), watch.clone());
    let ended = async {
        loop {
            if !born.lives(&watch.borrow_and_update()) || watch.changed().await.is_err() {
                return;
            }
        }
    };
    // Either direction ending (EOF, an error, a stop, a cut) closes both: database
    // protocols do not half-close.
    tokio::select! {
        _ = pump(&mut client_read, &mut server_write, Direction::ToServer, born, to_server) => {}
        _ = pump(&mut server_read, &mut client_write, Direction::ToClient, born, to_client) => {}
        _ = ended => {}
    }
    if watch.borrow().cuts != born.cuts {
        // Closed with a zero linger, a socket sends RST instead of FIN: both ends see the
        // connection reset, not ended.
        for socket in [client_write.as_ref(), server_write.as_ref()] {
            let _ = socket.set_zero_linger();
        }
    }
}

async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    direction: Direction,
    born: Born,
    mut watch: watch::Receiver<State>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !forwarding(&mut watch, born).await {
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
        let latency = watch.borrow().latency[direction as usize];
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        // Bytes read just before a partition wait for it to heal, like bytes in flight.
        if !forwarding(&mut watch, born).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits while partitioned; false once the connection must end.
async fn forwarding(watch: &mut watch::Receiver<State>, born: Born) -> bool {
    loop {
        let state = *watch.borrow_and_update();
        if !born.lives(&state) {
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

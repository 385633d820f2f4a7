//! Connections to gRPC participants, kept and reused: one HTTP/2 connection per (address,
//! authority) carries every call to it, as reqwest's pool does for HTTP participants.
//! Opening one per call would cost a handshake each time, and at a few hundred calls a
//! second would leave the coordinator's ephemeral ports in TIME_WAIT until none is free.
//!
//! The outbound policy still judges every call: each call resolves the target's name again
//! and filters the addresses (see the module above), and only a channel to an address
//! allowed now is used. A channel reconnects to its own address only, which was allowed
//! when it was made and is checked again before each use.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long connecting may take, as for HTTP participants.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The most channels kept; past it one is dropped for each new one. Participants are few:
/// this bounds what a stream of ever-new addresses can hold, not the common case.
const MAX_CHANNELS: usize = 1_024;

type Key = (SocketAddr, String);

/// The channels kept, by participant address and the authority calls name.
#[derive(Default)]
pub(crate) struct Channels {
    open: Mutex<HashMap<Key, Channel>>,
}

impl Channels {
    /// A channel for `authority` to one of `allowed` (tried in order): a kept one, or a new
    /// connection to the first address that accepts. Also returns the address, to
    /// [`Channels::forget`] the channel when its connection fails.
    pub(crate) async fn get(
        &self,
        allowed: &[SocketAddr],
        authority: &str,
    ) -> Result<(Channel, SocketAddr), String> {
        {
            let open = self.open.lock().expect("not poisoned");
            for address in allowed {
                if let Some(channel) = open.get(&(*address, authority.to_owned())) {
                    return Ok((channel.clone(), *address));
                }
            }
        }
        let stream = connect(allowed)
            .await
            .map_err(|e| format!("connection failed: {e}"))?;
        let peer = stream
            .peer_addr()
            .map_err(|e| format!("connection failed: {e}"))?;
        let channel = channel_to(peer, authority, stream)?;
        let mut open = self.open.lock().expect("not poisoned");
        if open.len() >= MAX_CHANNELS
            && let Some(key) = open.keys().next().cloned()
        {
            open.remove(&key);
        }
        // Two calls that raced both connected: the first one's channel is kept and used.
        let kept = open.entry((peer, authority.to_owned())).or_insert(channel);
        Ok((kept.clone(), peer))
    }

    /// Drops the channel to `address`, so that the next call connects afresh.
    pub(crate) fn forget(&self, address: SocketAddr, authority: &str) {
        let mut open = self.open.lock().expect("not poisoned");
        open.remove(&(address, authority.to_owned()));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.open.lock().expect("not poisoned").len()
    }
}

async fn connect(addresses: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addresses))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))??;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// A channel to `peer` whose first connection is `first`; when it breaks, tonic reconnects
/// to `peer` through the same connector (nothing resolves a name again).
fn channel_to(peer: SocketAddr, authority: &str, first: TcpStream) -> Result<Channel, String> {
    let first = Arc::new(Mutex::new(Some(first)));
    let connector = tower::service_fn(move |_: Uri| {
        let made = first.lock().expect("not poisoned").take();
        async move {
            let stream = match made {
                Some(stream) => stream,
                None => connect(&[peer]).await?,
            };
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    });
    let endpoint = Endpoint::from_shared(format!("http://{authority}"))
        .map_err(|e| format!("bad gRPC target: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT);
    Ok(endpoint.connect_with_connector_lazy(connector))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener that counts the connections it accepts (and holds them open).
    async fn counting_listener() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = tx.send(stream);
            }
        });
        (address, rx)
    }

    #[tokio::test]
    async fn one_connection_per_address_is_kept_until_forgotten() {
        let (address, mut accepted) = counting_listener().await;
        let refused = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let channels = Channels::default();
        // The first address that accepts is used: a closed port before it is skipped.
        let (_, used) = channels.get(&[refused, address], "p:1").await.unwrap();
        assert_eq!(used, address);
        accepted.recv().await.expect("one connection");
        for _ in 0..5 {
            let (_, again) = channels.get(&[address], "p:1").await.unwrap();
            assert_eq!(again, address);
        }
        assert_eq!(channels.len(), 1);
        assert!(accepted.try_recv().is_err(), "no second connection");
        // Another authority is another channel; a forgotten one connects afresh.
        channels.get(&[address], "q:1").await.unwrap();
        accepted
            .recv()
            .await
            .expect("a connection for the other authority");
        channels.forget(address, "p:1");
        channels.get(&[address], "p:1").await.unwrap();
        accepted.recv().await.expect("a fresh connection");
        assert_eq!(channels.len(), 2);
        // An address that is not among the allowed ones is never used.
        let err = channels.get(&[refused], "p:1").await.unwrap_err();
        assert!(err.starts_with("connection failed"), "{err}");
    }
}

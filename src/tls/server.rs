//! The API over HTTPS: the certificate and key files, and their reload.
//!
//! The served certificate sits in a [`CertResolver`] that every handshake asks, so a
//! reload (on SIGHUP, and every `--tls-reload-interval-ms`) changes what new connections
//! get while connections already open keep the session they have. A reload that fails —
//! a file missing or half-written, a key that does not belong to the certificate — is
//! logged at error level and keeps the certificate being served: a botched renewal must
//! not take the API down.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::{TlsError, certified_key, read};

/// How often `idem serve` rereads its certificate unless told otherwise.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(300);

/// Where the API's certificate and key are, and how often to reread them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM: the server's certificate first, then any intermediates.
    pub cert_file: PathBuf,
    /// PEM: its private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// `None`: reread on SIGHUP only.
    pub reload_interval: Option<Duration>,
}

/// The certificate new handshakes get: the last one that loaded.
#[derive(Debug)]
pub struct CertResolver {
    files: ServerTls,
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertResolver {
    /// Loads the files; fails if they cannot be used (start-up refuses to serve then).
    pub fn load(files: ServerTls) -> Result<Arc<CertResolver>, TlsError> {
        let current = RwLock::new(Arc::new(load_pair(&files)?));
        Ok(Arc::new(CertResolver { files, current }))
    }

    /// Rereads the files and serves them from the next handshake on; on an error the
    /// certificate being served stays. Whether the certificate changed.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let fresh = load_pair(&self.files)?;
        let mut current = self.current.write().expect("poisoned");
        if current.cert == fresh.cert {
            return Ok(false);
        }
        *current = Arc::new(fresh);
        Ok(true)
    }

    /// The certificate chain being served.
    pub fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().expect("poisoned"))
    }

    /// An acceptor for the API's connections: HTTP/1.1 only, the only protocol the
    /// server speaks (see [`crate::http_server`]).
    pub fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        self.acceptor_for(b"http/1.1")
    }

    /// An acceptor for the gRPC listener's connections (`--grpc-listen`): the same
    /// certificate, HTTP/2 only.
    pub fn grpc_acceptor(self: &Arc<Self>) -> TlsAcceptor {
        self.acceptor_for(b"h2")
    }

    fn acceptor_for(self: &Arc<Self>, protocol: &[u8]) -> TlsAcceptor {
        super::install_crypto_provider();
        let resolver: Arc<dyn ResolvesServerCert> = Arc::clone(self) as _;
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = vec![protocol.to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }

    /// Reloads on SIGHUP and at the configured interval until `stop` (see
    /// [`crate::reload`]; SIGHUP is caught from this call on).
    pub fn keep_reloading(
        self: Arc<Self>,
        stop: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let interval = self.files.reload_interval;
        crate::reload::on_hangup_and_every(
            interval,
            stop,
            "the TLS certificate and key",
            move |why| self.reload_logged(why),
        )
    }

    fn reload_logged(&self, why: &'static str) {
        match self.reload() {
            // Every few minutes, the same files: nothing to say.
            Ok(false) => tracing::debug!(trigger = why, "the TLS certificate is unchanged"),
            Ok(true) => tracing::info!(
                trigger = why,
                cert = %self.files.cert_file.display(),
                "reloaded the TLS certificate"
            ),
            Err(e) => tracing::error!(
                trigger = why,
                error = %e,
                "cannot reload the TLS certificate; still serving the previous one"
            ),
        }
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn load_pair(files: &ServerTls) -> Result<CertifiedKey, TlsError> {
    let cert = read(&files.cert_file)?;
    let key = read(&files.key_file)?;
    certified_key((&files.cert_file, &cert), (&files.key_file, &key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{scratch, self_signed};

    fn files(cert: PathBuf, key: PathBuf) -> ServerTls {
        ServerTls {
            cert_file: cert,
            key_file: key,
            reload_interval: None,
        }
    }

    #[test]
    fn a_failed_reload_keeps_the_served_certificate() {
        let dir = scratch("failed-reload");
        let (cert, key) = self_signed(&dir, "one");
        let (other_cert, other_key) = self_signed(&dir, "two");
        let tls = files(dir.join("served.crt"), dir.join("served.key"));
        std::fs::copy(&cert, &tls.cert_file).unwrap();
        std::fs::copy(&key, &tls.key_file).unwrap();
        let resolver = CertResolver::load(tls.clone()).unwrap();
        let first = resolver.current().cert[0].clone();

        // Another certificate with the old key: they do not belong together.
        std::fs::copy(&other_cert, &tls.cert_file).unwrap();
        let e = resolver.reload().unwrap_err();
        assert!(matches!(e, TlsError::Pair { .. }), "{e}");
        assert_eq!(resolver.current().cert[0], first);

        std::fs::write(&tls.key_file, "not PEM").unwrap();
        let e = resolver.reload().unwrap_err();
        assert!(e.to_string().contains("no PEM private key"), "{e}");
        assert_eq!(resolver.current().cert[0], first);

        std::fs::copy(&other_key, &tls.key_file).unwrap();
        assert!(resolver.reload().unwrap());
        assert_ne!(resolver.current().cert[0], first);
        assert!(!resolver.reload().unwrap(), "the same files again");
    }

    #[test]
    fn unusable_files_fail_the_load() {
        let dir = scratch("bad-load");
        let (cert, key) = self_signed(&dir, "one");
        let e = CertResolver::load(files(dir.join("missing.crt"), key.clone())).unwrap_err();
        assert!(e.to_string().contains("missing.crt"), "{e}");
        let e = CertResolver::load(files(key.clone(), key)).unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = CertResolver::load(files(cert.clone(), cert)).unwrap_err();
        assert!(e.to_string().contains("no PEM private key"), "{e}");
    }
}

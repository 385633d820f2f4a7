//! TLS: the API served over HTTPS ([`server`]), and whom calls to participants trust and
//! which client certificate they present ([`outbound`]).
//!
//! Both read PEM files with rustls' own parser (`rustls::pki_types::pem`) and check that a
//! key belongs to its certificate at load time, so a wrong pair fails at start-up (or a
//! reload keeps the certificate it has) instead of failing handshakes later.

pub mod outbound;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

pub use outbound::OutboundTls;
pub use server::{CertResolver, ServerTls};

/// reqwest and sqlx share rustls with the ring provider; it must be chosen once per process.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A certificate or key file that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{cert} and {key}: {message}", cert = cert.display(), key = key.display())]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    /// Only one of two options that go together was given.
    #[error("{given} needs {missing} too")]
    Incomplete {
        given: &'static str,
        missing: &'static str,
    },
}

/// Both or neither of two paths; one alone is a configuration error naming the other.
pub fn both<'a>(
    a: (&'static str, Option<&'a Path>),
    b: (&'static str, Option<&'a Path>),
) -> Result<Option<(&'a Path, &'a Path)>, TlsError> {
    match (a.1, b.1) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Incomplete {
            given: a.0,
            missing: b.0,
        }),
        (None, Some(_)) => Err(TlsError::Incomplete {
            given: b.0,
            missing: a.0,
        }),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| file_error(path, e))
}

fn file_error(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// Every certificate of a PEM file, in order; none is an error.
fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => file_error(path, "no PEM private key in it"),
        e => file_error(path, e),
    })
}

/// A certificate chain and its key, read from PEM bytes and checked to belong together.
fn certified_key(
    (cert, cert_pem): (&Path, &[u8]),
    (key, key_pem): (&Path, &[u8]),
) -> Result<CertifiedKey, TlsError> {
    let chain = parse_certs(cert, cert_pem)?;
    let private = parse_key(key, key_pem)?;
    install_crypto_provider();
    let provider: &Arc<CryptoProvider> =
        CryptoProvider::get_default().expect("installed just above");
    CertifiedKey::from_der(chain, private, provider).map_err(|e| TlsError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        message: e.to_string(),
    })
}

#[cfg(test)]
pub(crate) mod testing {
    //! Certificates made on the spot for the unit tests.

    use std::path::{Path, PathBuf};

    /// A self-signed certificate for `localhost` named `cn`, written as `cn.crt` and
    /// `cn.key` in `dir`.
    pub fn self_signed(dir: &Path, cn: &str) -> (PathBuf, PathBuf) {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (cert_path, key_path) = (dir.join(format!("{cn}.crt")), dir.join(format!("{cn}.key")));
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A fresh empty directory for one test.
    pub fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("idem-tls-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

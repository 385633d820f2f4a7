//! Calls to participants: extra roots to trust and a client certificate to present.
//!
//! The extra roots are added to the system's (`--outbound-ca-file`: participants behind
//! a private CA), and the client certificate is offered to every participant that asks for
//! one (`--outbound-client-cert`, `--outbound-client-key`: mutual TLS). Files are read once,
//! at start-up; [`OutboundTls::apply`] puts them on each HTTP client built from them.

use std::path::Path;

use super::{TlsError, both, certified_key, file_error, parse_certs, read};

/// Trust and identity for outbound calls; the default adds nothing.
#[derive(Clone, Default)]
pub struct OutboundTls {
    roots: Vec<reqwest::Certificate>,
    identity: Option<reqwest::Identity>,
}

impl std::fmt::Debug for OutboundTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundTls")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl OutboundTls {
    /// Reads a CA bundle and a client certificate with its key (both or neither).
    pub fn load(
        ca_file: Option<&Path>,
        client_cert: Option<&Path>,
        client_key: Option<&Path>,
    ) -> Result<OutboundTls, TlsError> {
        let mut tls = OutboundTls::default();
        if let Some(path) = ca_file {
            let pem = read(path)?;
            for der in parse_certs(path, &pem)? {
                let root = reqwest::Certificate::from_der(&der).map_err(|e| file_error(path, e))?;
                tls.roots.push(root);
            }
        }
        let pair = both(
            ("--outbound-client-cert", client_cert),
            ("--outbound-client-key", client_key),
        )?;
        if let Some((cert, key)) = pair {
            let (cert_pem, key_pem) = (read(cert)?, read(key)?);
            // reqwest would find a mismatch only at the first handshake that asks for it.
            certified_key((cert, &cert_pem), (key, &key_pem))?;
            let mut both = cert_pem;
            both.push(b'\n');
            both.extend_from_slice(&key_pem);
            let identity = reqwest::Identity::from_pem(&both).map_err(|e| file_error(cert, e))?;
            tls.identity = Some(identity);
        }
        Ok(tls)
    }

    /// `builder` trusting the extra roots too and presenting the client certificate.
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        let builder = builder.tls_certs_merge(self.roots.iter().cloned());
        match &self.identity {
            Some(identity) => builder.identity(identity.clone()),
            None => builder,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::testing::{scratch, self_signed};

    #[test]
    fn loads_roots_and_an_identity() {
        let dir = scratch("outbound-load");
        let (cert, key) = self_signed(&dir, "client");
        let tls = OutboundTls::load(Some(&cert), Some(&cert), Some(&key)).unwrap();
        assert_eq!(tls.roots.len(), 1);
        assert!(tls.identity.is_some());
        crate::tls::install_crypto_provider();
        tls.apply(reqwest::Client::builder()).build().unwrap();
    }

    #[test]
    fn refuses_half_an_identity_or_a_foreign_key() {
        let dir = scratch("outbound-refuse");
        let (cert, _) = self_signed(&dir, "one");
        let (_, other_key) = self_signed(&dir, "two");
        let e = OutboundTls::load(None, Some(&cert), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--outbound-client-cert needs --outbound-client-key too"
        );
        let e = OutboundTls::load(None, Some(&cert), Some(&other_key)).unwrap_err();
        assert!(matches!(e, TlsError::Pair { .. }), "{e}");
        let e = OutboundTls::load(Some(&other_key), None, None).unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
    }
}

//! The coordinator's signing keys for branch calls, from `idem serve`'s options, and their
//! reload without a restart (the format, the canonical strings and verification are in
//! the `idem-signing` crate, which the participant SDK shares).
//!
//! The keys come from `--signing-secret-file` (reread on SIGHUP and every
//! `--signing-reload-interval-ms`) or `--signing-secret` (the text itself, read once). A
//! tenant's calls are signed with the first key of its own list, else of the default list;
//! a tenant with neither gets unsigned calls. A reload that fails (a missing or
//! half-written file, a bad key) is logged and the keys in use stay.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use idem_signing::{Call, Keyring, SharedKeyring};
use tokio_util::sync::CancellationToken;

/// How often `idem serve` rereads its signing key file unless told otherwise.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(60);

/// Where the keys come from and how calls are signed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SigningOptions {
    /// `--signing-secret-file`.
    pub file: Option<PathBuf>,
    /// `--signing-secret`: the keys themselves.
    pub inline: Option<String>,
    /// `--signing-legacy-v1`: a v1 signature beside v2 (HMAC keys only), for participants
    /// that predate v2.
    pub legacy_v1: bool,
    /// `--signing-reload-interval-ms`; `None`: the file is reread on SIGHUP only.
    pub reload_interval: Option<Duration>,
}

/// Signs branch calls with the current keyring.
pub struct Signer {
    keys: SharedKeyring,
    file: Option<PathBuf>,
    legacy_v1: bool,
    reload_interval: Option<Duration>,
}

/// Key ids only: the material never shows.
impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("file", &self.file)
            .field("legacy_v1", &self.legacy_v1)
            .field("signing", &signing_kids(&self.keys.current()))
            .finish()
    }
}

/// Each list's signing key id, as `tenant=kid` (`*` for the default list), for logs.
fn signing_kids(keyring: &Keyring) -> String {
    let default = keyring
        .default_keys()
        .map(|k| format!("*={}", k.signing_key().kid()));
    let tenants = keyring
        .tenants()
        .map(|(t, k)| format!("{t}={}", k.signing_key().kid()));
    default
        .into_iter()
        .chain(tenants)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A keyring the coordinator can sign with: every list's first key a private one, every
/// tenant section a valid tenant name (the crate's rule is the coordinator's).
fn usable(keyring: Keyring) -> Result<Keyring, String> {
    keyring.check_can_sign().map_err(|e| e.to_string())?;
    Ok(keyring)
}

fn load(path: &Path) -> Result<Keyring, String> {
    usable(Keyring::from_file(path).map_err(|e| e.to_string())?)
}

impl Signer {
    /// The signer `options` describe; `None` when they name no keys (calls go unsigned).
    /// Both a file and inline keys are refused, since which one signs would be a guess.
    /// Errors name the key id or the file, never a secret.
    pub fn from_options(options: &SigningOptions) -> Result<Option<Arc<Signer>>, String> {
        let keyring = match (&options.file, &options.inline) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err("give --signing-secret-file or --signing-secret, not both".into());
            }
            (Some(path), None) => load(path)?,
            (None, Some(text)) => usable(Keyring::parse(text).map_err(|e| e.to_string())?)?,
        };
        if keyring.default_keys().is_none() {
            tracing::warn!(
                "the signing keys have no default list: calls of tenants without a [tenant NAME] section go unsigned"
            );
        }
        Ok(Some(Arc::new(Signer {
            keys: SharedKeyring::new(keyring),
            file: options.file.clone(),
            legacy_v1: options.legacy_v1,
            reload_interval: options.reload_interval,
        })))
    }

    /// A signer of `keyring` (no file to reload), v2 only.
    pub fn new(keyring: Keyring) -> Result<Arc<Signer>, String> {
        Ok(Arc::new(Signer {
            keys: SharedKeyring::new(usable(keyring)?),
            file: None,
            legacy_v1: false,
            reload_interval: None,
        }))
    }

    /// The `Idem-Signature` value of `call`, signed now with its tenant's key; `None`
    /// when the tenant has no key (the call goes unsigned).
    pub fn sign(&self, call: &Call<'_>) -> Option<String> {
        let keyring = self.keys.current();
        let key = keyring.for_tenant(call.tenant)?.signing_key();
        let now = idem_signing::unix_seconds(std::time::SystemTime::now());
        // A keyring is checked to sign before it is put in place.
        idem_signing::sign_call(key, now, call, self.legacy_v1).ok()
    }

    /// The `Idem-Signature` of a call to `url` with `body` for `tenant` under `call_id`,
    /// signed now; `None` when the tenant has no key or the URL no host.
    pub fn sign_request(
        &self,
        method: &str,
        url: &reqwest::Url,
        body: &[u8],
        tenant: &str,
        call_id: &str,
    ) -> Option<String> {
        // The request target as reqwest writes it on the request line.
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        // What the url crate gives is what reqwest connects to and writes in `Host`: the
        // host lowercase (punycode, IPv6 in brackets), the scheme's port when none is named.
        self.sign(&Call {
            method,
            scheme: url.scheme(),
            host: url.host_str()?,
            port: url.port_or_known_default()?,
            target: &target,
            body,
            tenant,
            call_id,
        })
    }

    /// Rereads the key file and signs with what it holds from the next call on; an
    /// unusable file leaves the keys in use. Whether they changed; `Ok(false)` without a
    /// file.
    pub fn reload(&self) -> Result<bool, String> {
        let Some(path) = &self.file else {
            return Ok(false);
        };
        Ok(self.keys.replace(load(path)?))
    }

    fn reload_logged(&self, why: &'static str) {
        match self.reload() {
            Ok(false) => tracing::debug!(trigger = why, "the signing keys are unchanged"),
            Ok(true) => tracing::info!(
                trigger = why,
                signing = signing_kids(&self.keys.current()),
                "reloaded the signing keys"
            ),
            Err(e) => tracing::error!(
                trigger = why,
                error = %e,
                "cannot reload the signing keys; still signing with the previous ones"
            ),
        }
    }

    /// With a key file: rereads it on SIGHUP and at the interval until `stop` (SIGHUP is
    /// caught from this call on; see [`crate::reload`]). `None` without a file.
    pub fn keep_reloading(
        self: &Arc<Self>,
        stop: CancellationToken,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        self.file.as_ref()?;
        let signer = Arc::clone(self);
        Some(crate::reload::on_hangup_and_every(
            self.reload_interval,
            stop,
            "the signing keys",
            move |why| signer.reload_logged(why),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(text: &str) -> SigningOptions {
        SigningOptions {
            inline: Some(text.into()),
            ..SigningOptions::default()
        }
    }

    fn call(tenant: &str) -> Call<'_> {
        Call {
            method: "POST",
            scheme: "http",
            host: "h",
            port: 80,
            target: "/p",
            body: b"",
            tenant,
            call_id: "00112233445566778899aabbccddeeff",
        }
    }

    fn kid(header: &str) -> &str {
        header
            .split(',')
            .find_map(|f| f.strip_prefix("kid="))
            .unwrap()
    }

    #[test]
    fn each_tenant_signs_with_its_list_and_none_means_unsigned() {
        assert!(
            Signer::from_options(&SigningOptions::default())
                .unwrap()
                .is_none()
        );
        let signer = Signer::from_options(&inline(
            "new:0123456789abcdef-new,old:0123456789abcdef-old\n[tenant acme]\nacme:0123456789abcdef-acme",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(kid(&signer.sign(&call("default")).unwrap()), "new");
        assert_eq!(kid(&signer.sign(&call("beta")).unwrap()), "new");
        assert_eq!(kid(&signer.sign(&call("acme")).unwrap()), "acme");
        let acme_only =
            Signer::new(Keyring::parse("[tenant acme]\nacme:0123456789abcdef-acme").unwrap())
                .unwrap();
        assert_eq!(acme_only.sign(&call("beta")), None);
        // The secrets never show.
        let shown = format!("{signer:?}");
        assert!(
            shown.contains("acme=acme") && !shown.contains("abcdef"),
            "{shown}"
        );
    }

    #[test]
    fn a_signature_covers_the_target_as_sent_and_the_tenant() {
        let keyring = Keyring::parse("k1:0123456789abcdef-transport").unwrap();
        let signer = Signer::new(keyring.clone()).unwrap();
        let id = idem_signing::new_call_id();
        let sign = |url: &str, tenant: &str| {
            let url = reqwest::Url::parse(url).unwrap();
            signer
                .sign_request("POST", &url, b"{}", tenant, &id)
                .unwrap()
        };
        let now = std::time::SystemTime::now();
        let check = |header: &str, host, port, target, tenant| {
            let call = Call {
                method: "POST",
                scheme: "http",
                host,
                port,
                target,
                body: b"{}",
                tenant,
                call_id: &id,
            };
            let policy = idem_signing::Policy::default();
            idem_signing::verify_call(Some(header), &call, now, &keyring, policy).map(|v| v.kid)
        };
        let header = sign("http://Shop.Example:1/a%20b?x=1&gid=g+1#frag", "acme");
        // The fragment is never sent, the percent-encoding is; the host is lowercase.
        let (host, target) = ("shop.example", "/a%20b?x=1&gid=g+1");
        assert_eq!(check(&header, host, 1, target, "acme"), Ok("k1".into()));
        assert!(check(&header, host, 1, "/a b?x=1&gid=g+1", "acme").is_err());
        assert!(check(&header, host, 1, target, "beta").is_err());
        // No port named: the scheme's; IPv6 in brackets.
        let bare = sign("http://[::1]", "default");
        assert_eq!(check(&bare, "[::1]", 80, "/", "default"), Ok("k1".into()));
    }

    #[test]
    fn bad_options_are_refused_naming_the_file_or_the_kid() {
        assert!(Signer::from_options(&inline("k1:short")).is_err());
        let both = SigningOptions {
            file: Some("/nonexistent".into()),
            ..inline("k:0123456789abcdef")
        };
        assert!(
            Signer::from_options(&both)
                .unwrap_err()
                .contains("not both")
        );
        let missing = SigningOptions {
            file: Some("/nonexistent/keys".into()),
            ..SigningOptions::default()
        };
        let e = Signer::from_options(&missing).unwrap_err();
        assert!(e.contains("/nonexistent/keys"), "{e}");
        let public =
            "p:ed25519-pub:d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
        let e = Signer::from_options(&inline(public)).unwrap_err();
        assert!(e.contains("public key"), "{e}");
    }

    #[test]
    fn the_shared_constants_are_the_coordinators() {
        assert_eq!(idem_signing::DEFAULT_TENANT, crate::tenant::DEFAULT_TENANT);
        assert_eq!(idem_signing::MAX_TENANT_LEN, crate::tenant::MAX_TENANT_LEN);
        for name in ["acme", "a_b-1", "", "Acme", "a/b", &"x".repeat(33)] {
            assert_eq!(
                idem_signing::is_tenant_name(name),
                crate::tenant::check_tenant(name).is_ok(),
                "{name:?}"
            );
        }
    }
}

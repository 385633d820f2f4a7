//! Signing keys: one entry is `kid:secret` (HMAC-SHA256), `kid:ed25519:<seed>` (an Ed25519
//! private key, which signs) or `kid:ed25519-pub:<public key>` (an Ed25519 public key,
//! which only verifies); a list of them is parsed from a file's text or an environment
//! value (see [`Keys::parse`], and [`crate::Keyring`] for lists per tenant).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use hmac::{Hmac, KeyInit, Mac};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use sha2::Sha256;

/// The shortest HMAC secret accepted, in bytes: HMAC-SHA256 is only as strong as its key.
pub const MIN_SECRET_BYTES: usize = 16;

/// The longest key id: it travels in every call's header.
const MAX_KID: usize = 64;

/// The prefix of an Ed25519 private key's 64 hex digits (its 32-byte seed).
const ED25519_PRIVATE: &str = "ed25519:";

/// The prefix of an Ed25519 public key's 64 hex digits.
const ED25519_PUBLIC: &str = "ed25519-pub:";

/// The algorithm a key signs or verifies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA256 with a shared secret: whoever verifies can also sign.
    HmacSha256,
    /// Ed25519 (RFC 8032): the coordinator signs with the private key, participants
    /// verify with the public key and cannot sign.
    Ed25519,
}

#[derive(Clone)]
enum Material {
    Hmac(Vec<u8>),
    /// The seed is kept to compare keys and to write the entry back out.
    Ed25519Private {
        seed: [u8; 32],
        pair: Arc<Ed25519KeyPair>,
    },
    Ed25519Public([u8; 32]),
}

/// One key: an id, which travels in the header, and its material, which never does.
#[derive(Clone)]
pub struct Key {
    kid: String,
    material: Material,
}

/// The key material stays out of logs and `{:?}`.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("algorithm", &self.algorithm())
            .field("can_sign", &self.can_sign())
            .field("material", &"***")
            .finish()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        let same = match (&self.material, &other.material) {
            (Material::Hmac(a), Material::Hmac(b)) => a == b,
            (
                Material::Ed25519Private { seed: a, .. },
                Material::Ed25519Private { seed: b, .. },
            ) => a == b,
            (Material::Ed25519Public(a), Material::Ed25519Public(b)) => a == b,
            _ => false,
        };
        same && self.kid == other.kid
    }
}

impl Eq for Key {}

fn check_kid(kid: &str) -> Result<(), KeyError> {
    let ok = !kid.is_empty()
        && kid.len() <= MAX_KID
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(KeyError::BadKid(kid.chars().take(MAX_KID).collect()))
    }
}

/// 32 bytes from 64 hex digits.
fn key_bytes(kid: &str, hex_text: &str) -> Result<[u8; 32], KeyError> {
    let mut bytes = [0u8; 32];
    hex::decode_to_slice(hex_text, &mut bytes).map_err(|_| KeyError::BadKey(kid.to_owned()))?;
    Ok(bytes)
}

/// Fills `buf` from the operating system's random generator.
pub(crate) fn os_random(buf: &mut [u8]) {
    use ring::rand::SecureRandom;
    ring::rand::SystemRandom::new()
        .fill(buf)
        .expect("the operating system's random generator answers");
}

impl Key {
    /// An HMAC key from its id (`[A-Za-z0-9._-]`, 1 to 64 characters) and secret (at
    /// least [`MIN_SECRET_BYTES`] bytes, no whitespace or comma; its UTF-8 bytes are the
    /// HMAC key).
    pub fn new(kid: &str, secret: &str) -> Result<Key, KeyError> {
        check_kid(kid)?;
        if secret.len() < MIN_SECRET_BYTES {
            return Err(KeyError::ShortSecret(kid.to_owned()));
        }
        if secret.chars().any(|c| c.is_whitespace() || c == ',') {
            return Err(KeyError::BadSecret(kid.to_owned()));
        }
        Ok(Key {
            kid: kid.to_owned(),
            material: Material::Hmac(secret.as_bytes().to_vec()),
        })
    }

    /// An Ed25519 private key from its id and 32-byte seed (RFC 8032's private key).
    pub fn ed25519_private(kid: &str, seed: [u8; 32]) -> Result<Key, KeyError> {
        check_kid(kid)?;
        let pair =
            Ed25519KeyPair::from_seed_unchecked(&seed).map_err(|_| KeyError::BadKey(kid.into()))?;
        Ok(Key {
            kid: kid.to_owned(),
            material: Material::Ed25519Private {
                seed,
                pair: Arc::new(pair),
            },
        })
    }

    /// An Ed25519 public key from its id and 32 bytes.
    pub fn ed25519_public(kid: &str, public: [u8; 32]) -> Result<Key, KeyError> {
        check_kid(kid)?;
        Ok(Key {
            kid: kid.to_owned(),
            material: Material::Ed25519Public(public),
        })
    }

    /// A new HMAC key with a 256-bit secret (64 hex digits) from the OS generator.
    pub fn generate_hmac(kid: &str) -> Result<Key, KeyError> {
        let mut secret = [0u8; 32];
        os_random(&mut secret);
        Key::new(kid, &hex::encode(secret))
    }

    /// A new Ed25519 private key, its seed from the OS generator.
    pub fn generate_ed25519(kid: &str) -> Result<Key, KeyError> {
        let mut seed = [0u8; 32];
        os_random(&mut seed);
        Key::ed25519_private(kid, seed)
    }

    /// One entry of a list: `kid:secret`, `kid:ed25519:<64 hex digits>` or
    /// `kid:ed25519-pub:<64 hex digits>`; `line` names it in errors.
    pub fn parse_entry(entry: &str, line: usize) -> Result<Key, KeyError> {
        let (kid, material) = entry.split_once(':').ok_or(KeyError::NotKidSecret(line))?;
        let (kid, material) = (kid.trim(), material.trim());
        if let Some(seed) = material.strip_prefix(ED25519_PRIVATE) {
            check_kid(kid)?;
            return Key::ed25519_private(kid, key_bytes(kid, seed)?);
        }
        if let Some(public) = material.strip_prefix(ED25519_PUBLIC) {
            check_kid(kid)?;
            return Key::ed25519_public(kid, key_bytes(kid, public)?);
        }
        Key::new(kid, material)
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// What it signs or verifies with.
    pub fn algorithm(&self) -> Algorithm {
        match self.material {
            Material::Hmac(_) => Algorithm::HmacSha256,
            Material::Ed25519Private { .. } | Material::Ed25519Public(_) => Algorithm::Ed25519,
        }
    }

    /// Whether it can sign: an HMAC secret or an Ed25519 private key, not a public key.
    pub fn can_sign(&self) -> bool {
        !matches!(self.material, Material::Ed25519Public(_))
    }

    /// The entry as written in a key file, secret included (what `idem signing keygen`
    /// prints for the coordinator's file).
    pub fn entry(&self) -> String {
        match &self.material {
            Material::Hmac(secret) => format!("{}:{}", self.kid, String::from_utf8_lossy(secret)),
            Material::Ed25519Private { seed, .. } => {
                format!("{}:{ED25519_PRIVATE}{}", self.kid, hex::encode(seed))
            }
            Material::Ed25519Public(public) => {
                format!("{}:{ED25519_PUBLIC}{}", self.kid, hex::encode(public))
            }
        }
    }

    /// The entry a participant holds to verify this key's signatures: the public key of an
    /// Ed25519 key, the shared secret itself of an HMAC key.
    pub fn verifying_entry(&self) -> String {
        match &self.material {
            Material::Ed25519Private { pair, .. } => format!(
                "{}:{ED25519_PUBLIC}{}",
                self.kid,
                hex::encode(pair.public_key().as_ref())
            ),
            _ => self.entry(),
        }
    }

    /// The signature of `message` as lowercase hex (64 digits for HMAC, 128 for
    /// Ed25519); `None` for a public key.
    pub(crate) fn sign(&self, message: &[u8]) -> Option<String> {
        match &self.material {
            Material::Hmac(secret) => {
                Some(hex::encode(hmac(secret, message).finalize().into_bytes()))
            }
            Material::Ed25519Private { pair, .. } => Some(hex::encode(pair.sign(message))),
            Material::Ed25519Public(_) => None,
        }
    }

    /// Whether `signature` (decoded hex) is this key's over `message`; HMAC compares in
    /// constant time.
    pub(crate) fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.material {
            Material::Hmac(secret) => hmac(secret, message).verify_slice(signature).is_ok(),
            Material::Ed25519Private { pair, .. } => {
                UnparsedPublicKey::new(&ED25519, pair.public_key())
                    .verify(message, signature)
                    .is_ok()
            }
            Material::Ed25519Public(public) => UnparsedPublicKey::new(&ED25519, public)
                .verify(message, signature)
                .is_ok(),
        }
    }
}

fn hmac(secret: &[u8], message: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length; the error branch cannot happen.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts any key size");
    mac.update(message);
    mac
}

/// Why a list of keys was refused. Messages name the key id, never a secret.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// An entry without `:`.
    #[error("a signing key entry is not kid:secret (line {0})")]
    NotKidSecret(usize),
    /// A key id with characters outside `[A-Za-z0-9._-]`, empty or too long.
    #[error("signing key id `{0}` must be 1 to 64 of A-Z a-z 0-9 . _ -")]
    BadKid(String),
    /// An HMAC secret under [`MIN_SECRET_BYTES`].
    #[error("the secret of signing key `{0}` is shorter than 16 bytes")]
    ShortSecret(String),
    /// An HMAC secret with whitespace or a comma (the list's separators).
    #[error("the secret of signing key `{0}` contains whitespace or a comma")]
    BadSecret(String),
    /// An Ed25519 key that is not 64 hex digits.
    #[error("the Ed25519 key of signing key `{0}` is not 64 hex digits")]
    BadKey(String),
    /// The same key id twice in one file: which key it means would be ambiguous.
    #[error("signing key id `{0}` is listed twice")]
    Duplicate(String),
    /// No entry at all.
    #[error("no signing key is listed")]
    Empty,
    /// A `[...]` line that is neither `[default]` nor `[tenant NAME]`.
    #[error("line {0}: a section is `[default]` or `[tenant NAME]` (NAME: 1 to 32 of a-z 0-9 _ -)")]
    BadSection(usize),
    /// The same section twice.
    #[error("the signing key section `{0}` appears twice")]
    DuplicateSection(String),
    /// A section without a key.
    #[error("the signing key section `{0}` lists no key")]
    EmptySection(String),
    /// A list whose first key (the one that signs) is a public key.
    #[error(
        "signing key `{0}` is an Ed25519 public key: the coordinator signs with a private key (kid:ed25519:…), participants hold the public one"
    )]
    PublicOnly(String),
    /// The file could not be read.
    #[error("cannot read the signing key file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
}

/// A non-empty list of keys: the first signs, any verifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys(Vec<Key>);

impl Keys {
    /// Parses entries (see [`Key::parse_entry`]), one per line or separated by commas;
    /// blank lines and lines starting with `#` are skipped, spaces around an entry are
    /// trimmed.
    ///
    /// ```
    /// let keys = idem_signing::Keys::parse("# newest first\nk2:0123456789abcdef0123\nk1:fedcba9876543210fedc").unwrap();
    /// assert_eq!(keys.signing_key().kid(), "k2");
    /// assert!(keys.get("k1").is_some());
    /// ```
    pub fn parse(text: &str) -> Result<Keys, KeyError> {
        let mut keys = Vec::new();
        for (n, line) in text.lines().enumerate() {
            push_entries(&mut keys, line, n + 1)?;
        }
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Keys(keys))
    }

    /// Reads and parses a key file (see [`Keys::parse`]).
    pub fn from_file(path: &Path) -> Result<Keys, KeyError> {
        Keys::parse(&read(path)?)
    }

    /// A list from keys already made (at least one, ids distinct).
    pub fn new(keys: Vec<Key>) -> Result<Keys, KeyError> {
        let mut checked: Vec<Key> = Vec::with_capacity(keys.len());
        for key in keys {
            if checked.iter().any(|k| k.kid == key.kid) {
                return Err(KeyError::Duplicate(key.kid));
            }
            checked.push(key);
        }
        if checked.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Keys(checked))
    }

    /// The key that signs: the first listed.
    pub fn signing_key(&self) -> &Key {
        &self.0[0]
    }

    /// The key with this id.
    pub fn get(&self, kid: &str) -> Option<&Key> {
        self.0.iter().find(|k| k.kid == kid)
    }

    /// Every key, in the order listed.
    pub fn iter(&self) -> impl Iterator<Item = &Key> {
        self.0.iter()
    }
}

/// The entries of one line (none for a blank or `#` line), appended to `keys`.
pub(crate) fn push_entries(keys: &mut Vec<Key>, line: &str, n: usize) -> Result<(), KeyError> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(());
    }
    for entry in line.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let key = Key::parse_entry(entry, n)?;
        if keys.iter().any(|k| k.kid == key.kid) {
            return Err(KeyError::Duplicate(key.kid));
        }
        keys.push(key);
    }
    Ok(())
}

/// A key file's text; the error names the file, never its content.
pub(crate) fn read(path: &Path) -> Result<String, KeyError> {
    std::fs::read_to_string(path).map_err(|e| KeyError::File {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

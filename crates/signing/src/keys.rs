//! Signing keys: `kid:secret` entries, parsed from a file's text or an environment value.

use std::fmt;
use std::path::Path;

/// The shortest secret accepted, in bytes: HMAC-SHA256 is only as strong as its key.
pub const MIN_SECRET_BYTES: usize = 16;

/// The longest key id: it travels in every call's header.
const MAX_KID: usize = 64;

/// One key: an id, which travels in the header, and a secret, which never does.
#[derive(Clone, PartialEq, Eq)]
pub struct Key {
    kid: String,
    secret: Vec<u8>,
}

/// The secret stays out of logs and `{:?}`.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("secret", &"***")
            .finish()
    }
}

impl Key {
    /// A key from its id (`[A-Za-z0-9._-]`, 1 to 64 characters) and secret (at least
    /// [`MIN_SECRET_BYTES`] bytes, no whitespace or comma).
    pub fn new(kid: &str, secret: &str) -> Result<Key, KeyError> {
        let kid_ok = !kid.is_empty()
            && kid.len() <= MAX_KID
            && kid
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !kid_ok {
            return Err(KeyError::BadKid(kid.chars().take(MAX_KID).collect()));
        }
        if secret.len() < MIN_SECRET_BYTES {
            return Err(KeyError::ShortSecret(kid.to_owned()));
        }
        if secret.chars().any(|c| c.is_whitespace() || c == ',') {
            return Err(KeyError::BadSecret(kid.to_owned()));
        }
        Ok(Key {
            kid: kid.to_owned(),
            secret: secret.as_bytes().to_vec(),
        })
    }

    /// The key id.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The secret's bytes (the HMAC key).
    pub fn secret(&self) -> &[u8] {
        &self.secret
    }
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
    /// A secret under [`MIN_SECRET_BYTES`].
    #[error("the secret of signing key `{0}` is shorter than 16 bytes")]
    ShortSecret(String),
    /// A secret with whitespace or a comma (the list's separators).
    #[error("the secret of signing key `{0}` contains whitespace or a comma")]
    BadSecret(String),
    /// The same key id twice: which secret it means would be ambiguous.
    #[error("signing key id `{0}` is listed twice")]
    Duplicate(String),
    /// No entry at all.
    #[error("no signing key is listed")]
    Empty,
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
    /// Parses `kid:secret` entries, one per line or separated by commas; blank lines and
    /// lines starting with `#` are skipped, spaces around an entry are trimmed.
    ///
    /// ```
    /// let keys = idem_signing::Keys::parse("# newest first\nk2:0123456789abcdef0123\nk1:fedcba9876543210fedc").unwrap();
    /// assert_eq!(keys.signing_key().kid(), "k2");
    /// assert!(keys.get("k1").is_some());
    /// ```
    pub fn parse(text: &str) -> Result<Keys, KeyError> {
        let mut keys: Vec<Key> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            for entry in line.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let (kid, secret) = entry.split_once(':').ok_or(KeyError::NotKidSecret(n + 1))?;
                let key = Key::new(kid.trim(), secret.trim())?;
                if keys.iter().any(|k| k.kid == key.kid) {
                    return Err(KeyError::Duplicate(key.kid));
                }
                keys.push(key);
            }
        }
        if keys.is_empty() {
            return Err(KeyError::Empty);
        }
        Ok(Keys(keys))
    }

    /// Reads and parses a key file (see [`Keys::parse`]).
    pub fn from_file(path: &Path) -> Result<Keys, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|e| KeyError::File {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Keys::parse(&text)
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

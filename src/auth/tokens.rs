//! API tokens: `idem_<id>_<secret>`. The id is public (it names the token in lists and
//! logs); the secret is shown once, when the token is issued, and only its SHA-256 is
//! stored. Secrets are 256 random bits, so a plain hash is as good as a slow one: nobody
//! can guess a preimage, and verifying stays cheap enough for every request.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::Role;
use crate::core::Millis;
use crate::store::{Store, StoreError, TokenRecord};
use crate::tenant::check_tenant;

const PREFIX: &str = "idem_";
/// Hex digits of a token's id.
pub const ID_LEN: usize = 12;
/// Hex digits of a token's secret.
const SECRET_LEN: usize = 64;
/// Longest label, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// A token split into its parts, not yet verified.
#[derive(Debug, PartialEq, Eq)]
pub struct Presented<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

/// Reads `idem_<id>_<secret>`; `None` for anything else.
pub fn parse(token: &str) -> Option<Presented<'_>> {
    let rest = token.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(id, ID_LEN) && hex(secret, SECRET_LEN)).then_some(Presented { id, secret })
}

/// The stored form of a secret.
pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Whether `secret` is the one whose hash is stored, compared in constant time.
pub fn secret_matches(secret: &str, stored_hash: &str) -> bool {
    hash_secret(secret)
        .as_bytes()
        .ct_eq(stored_hash.as_bytes())
        .into()
}

/// `len` hex digits from the operating system's generator: a secret's 64 are 256 bits, all
/// of them random (UUIDv4s gave 122 of every 128).
fn random_hex(len: usize) -> String {
    use rand::TryRng;
    let mut bytes = vec![0u8; len.div_ceil(2)];
    rand::rngs::SysRng
        .try_fill_bytes(&mut bytes)
        .expect("the operating system's random generator answers");
    let mut out = hex::encode(bytes);
    out.truncate(len);
    out
}

/// Why a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum IssueError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A token just issued: the only time its full text exists.
#[derive(Debug, Clone)]
pub struct Issued {
    pub token: String,
    pub record: TokenRecord,
}

/// Issues a token for `tenant` with `role`, stores its hash, and returns its text.
pub async fn issue(
    store: &dyn Store,
    tenant: &str,
    role: Role,
    label: &str,
    now: Millis,
) -> Result<Issued, IssueError> {
    check_tenant(tenant).map_err(IssueError::Invalid)?;
    if label.len() > MAX_LABEL_LEN || label.chars().any(char::is_control) {
        return Err(IssueError::Invalid(format!(
            "a label is at most {MAX_LABEL_LEN} bytes without control characters"
        )));
    }
    loop {
        let id = random_hex(ID_LEN);
        let secret = random_hex(SECRET_LEN);
        let record = TokenRecord {
            id: id.clone(),
            tenant: tenant.to_owned(),
            role: role.as_str().to_owned(),
            secret_hash: hash_secret(&secret),
            label: label.to_owned(),
            created_at: now,
            revoked_at: None,
        };
        // 48 random bits of id: a clash is a fresh draw, never an overwrite.
        if store.insert_token(&record).await? {
            return Ok(Issued {
                token: format!("{PREFIX}{id}_{secret}"),
                record,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_the_exact_shape() {
        let secret = "a".repeat(SECRET_LEN);
        let token = format!("idem_0123456789ab_{secret}");
        assert_eq!(
            parse(&token),
            Some(Presented {
                id: "0123456789ab",
                secret: &secret
            })
        );
        assert_eq!(parse(&token[..token.len() - 1]), None);
        assert_eq!(parse(&format!("idem_0123456789a_{secret}")), None);
        assert_eq!(parse(&format!("xdem_0123456789ab_{secret}")), None);
        assert_eq!(parse(&format!("idem_0123456789zz_{secret}")), None);
        assert_eq!(parse(""), None);
    }

    #[test]
    fn only_the_right_secret_matches_its_hash() {
        let stored = hash_secret("s3cret");
        assert_eq!(stored.len(), 64);
        assert!(secret_matches("s3cret", &stored));
        assert!(!secret_matches("s3cres", &stored));
        assert!(!secret_matches("s3cret", ""));
    }

    #[test]
    fn random_parts_have_their_length_and_differ() {
        let a = random_hex(SECRET_LEN);
        assert_eq!(a.len(), SECRET_LEN);
        assert_ne!(a, random_hex(SECRET_LEN));
        assert_eq!(random_hex(ID_LEN).len(), ID_LEN);
    }

    /// Two UUIDv4s put a fixed '4' at digits 12 and 44 of every secret: from the OS
    /// generator, those digits vary like the rest.
    #[test]
    fn every_digit_of_a_secret_is_random() {
        let secrets: Vec<String> = (0..64).map(|_| random_hex(SECRET_LEN)).collect();
        for digit in [12, 16, 44, 48] {
            let seen: std::collections::HashSet<u8> =
                secrets.iter().map(|s| s.as_bytes()[digit]).collect();
            assert!(seen.len() > 1, "digit {digit} never varies");
        }
    }
}

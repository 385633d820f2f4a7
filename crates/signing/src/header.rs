//! Parsing an `Idem-Signature` header value.

use crate::error::SignatureError;

/// The fields of a header value; the signatures decoded from hex.
pub(crate) struct Parsed<'a> {
    pub timestamp: u64,
    pub kid: &'a str,
    pub v1: Option<Vec<u8>>,
    pub v2: Option<Vec<u8>>,
}

/// `t`, `kid`, and `v1` and/or `v2`, `,`-separated; unknown fields are ignored, a field
/// twice is refused.
pub(crate) fn parse(header: &str) -> Result<Parsed<'_>, SignatureError> {
    let (mut t, mut kid, mut v1, mut v2) = (None, None, None, None);
    for field in header.split(',') {
        let Some((name, value)) = field.trim().split_once('=') else {
            return Err(SignatureError::Malformed("a field is not name=value"));
        };
        let slot = match name {
            "t" => &mut t,
            "kid" => &mut kid,
            "v1" => &mut v1,
            "v2" => &mut v2,
            _ => continue,
        };
        if slot.replace(value).is_some() {
            return Err(SignatureError::Malformed("a field appears twice"));
        }
    }
    let t = t.ok_or(SignatureError::Malformed("no t"))?;
    let kid = kid.ok_or(SignatureError::Malformed("no kid"))?;
    // Digits only: `+5` or ` 5` would parse but sign a different text.
    if t.is_empty() || t.len() > 20 || !t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Malformed("t is not Unix seconds"));
    }
    let timestamp = t
        .parse()
        .map_err(|_| SignatureError::Malformed("t is not Unix seconds"))?;
    let v1 = v1
        .map(|v| decode(v, &[64]).ok_or(SignatureError::Malformed("v1 is not 64 hex digits")))
        .transpose()?;
    // 64 digits for an HMAC, 128 for an Ed25519 signature.
    let v2 = v2
        .map(|v| {
            decode(v, &[64, 128]).ok_or(SignatureError::Malformed("v2 is not 64 or 128 hex digits"))
        })
        .transpose()?;
    Ok(Parsed {
        timestamp,
        kid,
        v1,
        v2,
    })
}

fn decode(value: &str, lengths: &[usize]) -> Option<Vec<u8>> {
    if !lengths.contains(&value.len()) {
        return None;
    }
    hex::decode(value).ok()
}

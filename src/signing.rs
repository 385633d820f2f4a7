//! The coordinator's signing key for branch calls, from `idem serve`'s options (the
//! format, the canonical string and verification are in the `idem-signing` crate, which
//! the participant SDK shares).

use std::path::Path;

use idem_signing::{Key, Keys};

/// The key that signs: the first of `--signing-secret` (the value itself) or else of
/// `--signing-secret-file`; both are `kid:secret` lists, and the rest of a list is for
/// participants, which verify with every key listed. Neither given: `None`, calls go
/// unsigned. Both given is refused, since which one signs would be a guess.
/// Errors name the key id or the file, never a secret.
pub fn signing_key(file: Option<&Path>, inline: Option<&str>) -> Result<Option<Key>, String> {
    let keys = match (file, inline) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err("give --signing-secret-file or --signing-secret, not both".into());
        }
        (Some(path), None) => Keys::from_file(path),
        (None, Some(text)) => Keys::parse(text),
    };
    let keys = keys.map_err(|e| e.to_string())?;
    Ok(Some(keys.signing_key().clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_key_signs_and_none_means_unsigned() {
        assert_eq!(signing_key(None, None), Ok(None));
        let key = signing_key(
            None,
            Some("new:0123456789abcdef-new,old:0123456789abcdef-old"),
        )
        .unwrap()
        .unwrap();
        assert_eq!(key.kid(), "new");
        assert!(signing_key(None, Some("k1:short")).is_err());
        let both = signing_key(Some(Path::new("/nonexistent")), Some("k:0123456789abcdef"));
        assert!(both.unwrap_err().contains("not both"));
    }

    #[test]
    fn a_missing_file_names_the_file() {
        let e = signing_key(Some(Path::new("/nonexistent/keys")), None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/keys"), "{e}");
    }
}

//! v1: what a coordinator sent before v2, and what a participant that predates v2 checks.

use std::time::Duration;

use super::*;

fn sign(key: &Key, t: u64, method: &str, target: &str, body: &[u8]) -> String {
    sign_v1(key, t, method, target, body).unwrap()
}

fn verify(
    header: Option<&str>,
    method: &str,
    target: &str,
    body: &[u8],
    now: std::time::SystemTime,
    keys: &Keys,
    window: Duration,
) -> Result<String, SignatureError> {
    verify_v1(header, method, target, body, now, keys, window).map(|v| v.kid)
}

fn check(header: &str, keys: &Keys) -> Result<String, SignatureError> {
    verify(
        Some(header),
        "POST",
        PATH,
        BODY,
        at(T),
        keys,
        DEFAULT_WINDOW,
    )
}

#[test]
fn the_canonical_string_is_six_lines() {
    assert_eq!(
        canonical_v1(T, "k1", "POST", PATH, BODY),
        "idem-signature-v1\n1764600000\nk1\nPOST\n\
         /inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try\n\
         67fb69ba57882fd7e97c99b5ae6f1081738f13ddd0b9f7e243edc6a6e06b0e19"
    );
    // An empty body (DTM's GET back-check) hashes nothing.
    assert!(
        canonical_v1(T, "k1", "GET", "/q", b"")
            .ends_with("\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
    );
}

#[test]
fn the_signature_matches_an_independent_hmac() {
    // Computed with Python's hmac and hashlib over the string above: docs/signing.md's recipe.
    let header = sign(
        keys(&format!("k1:{SECRET}")).signing_key(),
        T,
        "POST",
        PATH,
        BODY,
    );
    assert_eq!(
        header,
        "t=1764600000,kid=k1,v1=e546941eaeed1768fd4a3809b2c6280c5d2fef34ba259a6c43a022dbc73790e6"
    );
}

#[test]
fn a_good_signature_verifies_and_names_its_key() {
    let k = keys(&format!("k1:{SECRET}"));
    let header = sign(k.signing_key(), T, "POST", PATH, BODY);
    assert_eq!(check(&header, &k), Ok("k1".into()));
}

#[test]
fn a_wrong_secret_or_an_unknown_kid_is_refused() {
    let header = sign(
        keys(&format!("k1:{SECRET}")).signing_key(),
        T,
        "POST",
        PATH,
        BODY,
    );
    let other_secret = keys("k1:another-secret-of-20b");
    assert_eq!(check(&header, &other_secret), Err(SignatureError::Mismatch));
    let other_kid = keys(&format!("k2:{SECRET}"));
    let refused = check(&header, &other_kid).unwrap_err();
    assert_eq!(refused, SignatureError::UnknownKey("k1".into()));
    assert_eq!(refused.code(), "signature_unknown_key");
    // A header that claims another kid than the one that signed does not match either.
    let both = keys(&format!("k1:{SECRET},k2:{SECRET}"));
    let relabelled = header.replace("kid=k1", "kid=k2");
    assert_eq!(check(&relabelled, &both), Err(SignatureError::Mismatch));
}

#[test]
fn a_changed_body_path_method_or_timestamp_is_refused() {
    let k = keys(&format!("k1:{SECRET}"));
    let header = sign(k.signing_key(), T, "POST", PATH, BODY);
    let verify_with = |method: &str, path: &str, body: &[u8]| {
        verify(Some(&header), method, path, body, at(T), &k, DEFAULT_WINDOW)
    };
    let tampered_body = br#"{"sku":"apple","quantity":200}"#;
    assert_eq!(
        verify_with("POST", PATH, tampered_body),
        Err(SignatureError::Mismatch)
    );
    let tampered_path = PATH.replace("op=try", "op=confirm");
    assert_eq!(
        verify_with("POST", &tampered_path, BODY),
        Err(SignatureError::Mismatch)
    );
    assert_eq!(
        verify_with("GET", PATH, BODY),
        Err(SignatureError::Mismatch)
    );
    let moved = header.replace("t=1764600000", "t=1764600001");
    assert_eq!(check(&moved, &k), Err(SignatureError::Mismatch));
}

#[test]
fn old_and_future_timestamps_are_refused_outside_the_window() {
    let k = keys(&format!("k1:{SECRET}"));
    let window = Duration::from_secs(300);
    let signed_at = |t: u64| sign(k.signing_key(), t, "POST", PATH, BODY);
    let run = |t: u64| verify(Some(&signed_at(t)), "POST", PATH, BODY, at(T), &k, window);
    assert!(run(T - 300).is_ok(), "at the window's edge");
    assert!(run(T + 300).is_ok(), "at the window's edge");
    let expired = run(T - 301).unwrap_err();
    assert_eq!(expired.code(), "signature_expired");
    assert_eq!(
        expired,
        SignatureError::OutsideWindow {
            timestamp: T - 301,
            skew_seconds: 301,
            window_seconds: 300
        }
    );
    assert_eq!(run(T + 301).unwrap_err().code(), "signature_expired");
}

#[test]
fn missing_and_malformed_headers_have_their_codes() {
    let k = keys(&format!("k1:{SECRET}"));
    let missing = verify(None, "POST", PATH, BODY, at(T), &k, DEFAULT_WINDOW).unwrap_err();
    assert_eq!(missing.code(), "signature_missing");
    let good = sign(k.signing_key(), T, "POST", PATH, BODY);
    let v1 = good.rsplit_once("v1=").unwrap().1;
    for bad in [
        "",
        "garbage",
        "kid=k1,v1=00",
        &format!("t=+1764600000,kid=k1,v1={v1}"),
        &format!("t=1764600000,kid=k1,v1={}", &v1[..63]),
        &format!("t=1764600000,kid=k1,v1={}zz", &v1[..62]),
        &format!("t=1764600000,t=1764600000,kid=k1,v1={v1}"),
        &format!("t=99999999999999999999999,kid=k1,v1={v1}"),
    ] {
        let e = check(bad, &k).unwrap_err();
        assert_eq!(e.code(), "signature_malformed", "{bad:?}: {e}");
    }
    // Unknown fields are ignored: room for a later version next to these.
    assert!(check(&format!("{good},v9=abc"), &k).is_ok());
}

#[test]
fn rotation_accepts_every_listed_key() {
    let old = keys(&format!("old:{SECRET}"));
    let new = keys("new:a-brand-new-secret-0001");
    let participant = keys(&format!("new:a-brand-new-secret-0001\nold:{SECRET}"));
    for signer in [&old, &new] {
        let header = sign(signer.signing_key(), T, "POST", PATH, BODY);
        let kid = signer.signing_key().kid().to_owned();
        assert_eq!(check(&header, &participant), Ok(kid));
    }
    let header = sign(old.signing_key(), T, "POST", PATH, BODY);
    assert_eq!(
        check(&header, &new).unwrap_err().code(),
        "signature_unknown_key"
    );
}

#[test]
fn key_lists_parse_and_refuse_bad_entries() {
    let k = keys(&format!(
        "# comment\n\n  k2:{SECRET}  \nk1:{SECRET},k0:{SECRET}\n"
    ));
    let kids: Vec<&str> = k.iter().map(Key::kid).collect();
    assert_eq!(kids, ["k2", "k1", "k0"]);
    assert_eq!(k.signing_key().kid(), "k2");
    assert_eq!(Keys::parse("# none\n"), Err(KeyError::Empty));
    assert_eq!(Keys::parse("no-colon"), Err(KeyError::NotKidSecret(1)));
    assert_eq!(
        Keys::parse("k1:short"),
        Err(KeyError::ShortSecret("k1".into()))
    );
    assert!(matches!(
        Keys::parse(&format!("k y:{SECRET}")),
        Err(KeyError::BadKid(_))
    ));
    assert!(matches!(
        Keys::parse(&format!("k=1:{SECRET}")),
        Err(KeyError::BadKid(_))
    ));
    assert_eq!(
        Keys::parse(&format!("k1:{SECRET}\nk1:{SECRET}")),
        Err(KeyError::Duplicate("k1".into()))
    );
    // A secret never shows in an error or in Debug.
    let e = Keys::parse("k1:short-secret").unwrap_err().to_string();
    assert!(!e.contains("short-secret"), "{e}");
    assert!(!format!("{k:?}").contains(SECRET));
}

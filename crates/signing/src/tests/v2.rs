//! v2: the string, known answers from independent implementations, what it binds.

use super::*;

const CALL_ID: &str = "5f0c3a9e1b2d4c6f8a7e9d0b1c2a3f4e";
/// RFC 8032's first test key.
const SEED: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const PUBLIC: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

fn call() -> Call<'static> {
    Call {
        method: "POST",
        scheme: "https",
        host: "shop.example",
        port: 8443,
        target: PATH,
        body: BODY,
        tenant: "acme",
        call_id: CALL_ID,
    }
}

fn ring(text: &str) -> Keyring {
    Keyring::parse(text).unwrap()
}

fn verify_at(header: &str, call: &Call<'_>, keyring: &Keyring) -> Result<Verified, SignatureError> {
    verify_call(Some(header), call, at(T), keyring, Policy::default())
}

#[test]
fn the_canonical_string_is_eleven_lines() {
    assert_eq!(
        canonical_v2(T, "k1", &call()),
        "idem-signature-v2\n1764600000\nk1\n5f0c3a9e1b2d4c6f8a7e9d0b1c2a3f4e\nacme\nPOST\n\
         https\nshop.example\n8443\n\
         /inventory/reserve?gid=g1&trans_type=tcc&branch_id=01&op=try\n\
         67fb69ba57882fd7e97c99b5ae6f1081738f13ddd0b9f7e243edc6a6e06b0e19"
    );
}

#[test]
fn signatures_match_independent_implementations() {
    // Python's hmac and hashlib over the string above (docs/signing.md's recipe).
    let hmac_key = Key::new("k1", SECRET).unwrap();
    assert_eq!(
        sign_call(&hmac_key, T, &call(), false).unwrap(),
        "t=1764600000,kid=k1,v2=0db23350d9112ecfcb300a53d0a4d532fff70c60043a0d1a60afccc29df27423"
    );
    // Python's `cryptography` (Ed25519PrivateKey.from_private_bytes) with RFC 8032's first
    // key; Ed25519 signatures are deterministic.
    let ed = Key::parse_entry(&format!("ed-1:ed25519:{SEED}"), 1).unwrap();
    assert_eq!(
        sign_call(&ed, T, &call(), false).unwrap(),
        "t=1764600000,kid=ed-1,v2=32e0bcbd4e263e150cebc65b506e05b847b791c2e994f3a6931edc7846e2626f\
         98f6457a407b95ec2da8c570fab938531c9ea54b7bdc4e620d9d7de0f88fc60c"
    );
    assert_eq!(ed.verifying_entry(), format!("ed-1:ed25519-pub:{PUBLIC}"));
}

#[test]
fn rfc_8032_test_vector_1() {
    let ed = Key::parse_entry(&format!("k:ed25519:{SEED}"), 1).unwrap();
    assert_eq!(
        ed.sign(b"").unwrap(),
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"
    );
}

#[test]
fn every_part_of_the_call_is_bound() {
    for entry in [format!("k1:{SECRET}"), format!("k1:ed25519:{SEED}")] {
        let signer = Key::parse_entry(&entry, 1).unwrap();
        let header = sign_call(&signer, T, &call(), false).unwrap();
        // The participant holds the public key of an Ed25519 pair.
        let keyring = ring(&signer.verifying_entry());
        assert_eq!(
            verify_at(&header, &call(), &keyring),
            Ok(Verified {
                kid: "k1".into(),
                version: Version::V2,
                timestamp: T
            })
        );
        let changed: [(&str, Call<'_>); 9] = [
            (
                "method",
                Call {
                    method: "GET",
                    ..call()
                },
            ),
            (
                "scheme",
                Call {
                    scheme: "http",
                    ..call()
                },
            ),
            (
                "host",
                Call {
                    host: "evil.example",
                    ..call()
                },
            ),
            (
                "port",
                Call {
                    port: 443,
                    ..call()
                },
            ),
            (
                "path",
                Call {
                    target: "/inventory/release?gid=g1&trans_type=tcc&branch_id=01&op=try",
                    ..call()
                },
            ),
            (
                "query",
                Call {
                    target: "/inventory/reserve?gid=g2&trans_type=tcc&branch_id=01&op=try",
                    ..call()
                },
            ),
            (
                "body",
                Call {
                    body: b"{}",
                    ..call()
                },
            ),
            (
                "tenant",
                Call {
                    tenant: "beta",
                    ..call()
                },
            ),
            (
                "call id",
                Call {
                    call_id: "00000000000000000000000000000000",
                    ..call()
                },
            ),
        ];
        for (what, other) in changed {
            assert_eq!(
                verify_at(&header, &other, &keyring),
                Err(SignatureError::Mismatch),
                "{entry}: a changed {what} must not verify"
            );
        }
        let moved = header.replace("t=1764600000", "t=1764600001");
        assert_eq!(
            verify_at(&moved, &call(), &keyring),
            Err(SignatureError::Mismatch)
        );
    }
}

#[test]
fn v1_is_sent_beside_v2_when_asked_and_a_v2_verifier_requires_v2() {
    let key = Key::new("k1", SECRET).unwrap();
    let keyring = Keyring::from(keys(&format!("k1:{SECRET}")));
    let both = sign_call(&key, T, &call(), true).unwrap();
    assert!(both.contains(",v2=") && both.contains(",v1="), "{both}");
    // A participant that predates v2 checks the v1 field of the same header.
    let old = verify_v1(
        Some(&both),
        "POST",
        PATH,
        BODY,
        at(T),
        &keyring.for_tenant("acme").unwrap().clone(),
        DEFAULT_WINDOW,
    );
    assert_eq!(old.map(|v| v.version), Ok(Version::V1));
    // A v2 verifier checks v2 only: a v1 that still matches does not save a wrong target.
    let elsewhere = Call {
        host: "evil.example",
        ..call()
    };
    let lenient = Policy {
        accept_v1: true,
        ..Policy::default()
    };
    assert_eq!(
        verify_call(Some(&both), &elsewhere, at(T), &keyring, lenient),
        Err(SignatureError::Mismatch)
    );
    // v1 alone: refused unless the verifier accepts v1, then checked as v1.
    let v1_only = sign_v1(&key, T, "POST", PATH, BODY).unwrap();
    let refused = verify_at(&v1_only, &call(), &keyring).unwrap_err();
    assert_eq!(refused.code(), "signature_v2_required");
    let accepted = verify_call(Some(&v1_only), &call(), at(T), &keyring, lenient).unwrap();
    assert_eq!(accepted.version, Version::V1);
    // An Ed25519 key signs no v1: the header carries v2 only.
    let ed = Key::parse_entry(&format!("k1:ed25519:{SEED}"), 1).unwrap();
    let header = sign_call(&ed, T, &call(), true).unwrap();
    assert!(!header.contains("v1="), "{header}");
    assert!(sign_v1(&ed, T, "POST", PATH, BODY).is_err());
}

#[test]
fn a_public_key_cannot_sign() {
    let public = Key::parse_entry(&format!("p1:ed25519-pub:{PUBLIC}"), 1).unwrap();
    assert!(!public.can_sign());
    assert_eq!(
        sign_call(&public, T, &call(), false),
        Err(KeyError::PublicOnly("p1".into()))
    );
}

#[test]
fn malformed_calls_have_their_codes() {
    let key = Key::new("k1", SECRET).unwrap();
    let keyring = Keyring::from(keys(&format!("k1:{SECRET}")));
    let header = sign_call(&key, T, &call(), false).unwrap();
    let malformed = |header: &str, call: Call<'_>| {
        let e = verify_at(header, &call, &keyring).unwrap_err();
        assert_eq!(e.code(), "signature_malformed", "{header}: {e}");
    };
    malformed(
        &header,
        Call {
            call_id: "",
            ..call()
        },
    );
    malformed(
        &header,
        Call {
            call_id: "5F0C3A9E1B2D4C6F8A7E9D0B1C2A3F4E",
            ..call()
        },
    );
    malformed(
        &header,
        Call {
            tenant: "Acme",
            ..call()
        },
    );
    malformed(
        &header,
        Call {
            tenant: "a/b",
            ..call()
        },
    );
    malformed(&format!("{header},v2=00"), call());
    malformed(&format!("t={T},kid=k1"), call());
    malformed(&format!("t={T},kid=k1,v2={}", "0".repeat(96)), call());
    assert_eq!(
        verify_call(None, &call(), at(T), &keyring, Policy::default())
            .unwrap_err()
            .code(),
        "signature_missing"
    );
}

#[test]
fn new_call_ids_are_random_128_bit_hex() {
    let ids: std::collections::HashSet<String> = (0..1_000).map(|_| new_call_id()).collect();
    assert_eq!(ids.len(), 1_000);
    assert!(ids.iter().all(|id| is_call_id(id)));
    assert!(!is_call_id("xyz"));
}

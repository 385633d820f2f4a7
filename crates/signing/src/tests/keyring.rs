//! Key lists per tenant: sections, which list a tenant's calls use, what is refused, and
//! replacing the shared keyring.

use super::*;

const ACME: &str = "acme-1:the-secret-of-acme-0001";
const BETA: &str = "beta-1:the-secret-of-beta-0001";
const SHARED: &str = "shared-1:the-shared-secret-0001";

fn call(tenant: &str) -> Call<'_> {
    Call {
        method: "POST",
        scheme: "http",
        host: "127.0.0.1",
        port: 8080,
        target: PATH,
        body: BODY,
        tenant,
        call_id: "00112233445566778899aabbccddeeff",
    }
}

fn signed_by(entry: &str, call: &Call<'_>) -> String {
    sign_call(&Key::parse_entry(entry, 1).unwrap(), T, call, false).unwrap()
}

#[test]
fn a_tenant_uses_its_own_list_else_the_default_one() {
    let text = format!(
        "# the default list first\n{SHARED}\n\n[tenant acme]\n{ACME}\n[tenant beta]\n{BETA}\n"
    );
    let ring = Keyring::parse(&text).unwrap();
    let kid = |t: &str| ring.for_tenant(t).unwrap().signing_key().kid().to_owned();
    assert_eq!(kid("acme"), "acme-1");
    assert_eq!(kid("beta"), "beta-1");
    assert_eq!(kid("default"), "shared-1");
    assert_eq!(kid("initech"), "shared-1");
    // Without a default list, a tenant without a section has no key.
    let only_acme = Keyring::parse(&format!("[tenant acme]\n{ACME}")).unwrap();
    assert!(only_acme.for_tenant("beta").is_none());
    // `[default]` names the default list explicitly; a plain list is one.
    let explicit = Keyring::parse(&format!("[default]\n{SHARED}\n[tenant acme]\n{ACME}")).unwrap();
    assert_eq!(
        explicit,
        Keyring::parse(&format!("{SHARED}\n[tenant acme]\n{ACME}")).unwrap()
    );
    assert_eq!(Keyring::parse(SHARED).unwrap(), Keyring::from(keys(SHARED)));
}

#[test]
fn one_tenants_key_does_not_verify_another_tenants_calls() {
    let participant =
        Keyring::parse(&format!("[tenant acme]\n{ACME}\n[tenant beta]\n{BETA}")).unwrap();
    let verify = |header: &str, call: &Call<'_>| {
        verify_call(Some(header), call, at(T), &participant, Policy::default())
    };
    let acme = call("acme");
    assert!(verify(&signed_by(ACME, &acme), &acme).is_ok());
    // Whoever holds beta's key signs a call for acme: beta's key is not acme's.
    let forged = signed_by(BETA, &acme);
    assert_eq!(
        verify(&forged, &acme),
        Err(SignatureError::UnknownKey("beta-1".into()))
    );
    // Nor does a participant holding only beta's key verify acme's calls.
    let beta_only = Keyring::parse(&format!("[tenant beta]\n{BETA}")).unwrap();
    let e = verify_call(
        Some(&signed_by(ACME, &acme)),
        &acme,
        at(T),
        &beta_only,
        Policy::default(),
    );
    assert_eq!(e.unwrap_err().code(), "signature_unknown_tenant");
}

#[test]
fn bad_keyrings_are_refused_without_showing_a_secret() {
    let refused = |text: &str| Keyring::parse(text).unwrap_err();
    assert_eq!(refused("# nothing\n"), KeyError::Empty);
    assert_eq!(
        refused(&format!("[tenant Acme]\n{ACME}")),
        KeyError::BadSection(1)
    );
    assert_eq!(
        refused(&format!("[tenant]\n{ACME}")),
        KeyError::BadSection(1)
    );
    assert_eq!(
        refused(&format!("[tenants acme]\n{ACME}")),
        KeyError::BadSection(1)
    );
    assert_eq!(
        refused(&format!("[tenant acme]\n{ACME}\n[tenant acme]\n{BETA}")),
        KeyError::DuplicateSection("[tenant acme]".into())
    );
    assert_eq!(
        refused(&format!(
            "{SHARED}\n[tenant acme]\n# none\n[tenant beta]\n{BETA}"
        )),
        KeyError::EmptySection("[tenant acme]".into())
    );
    // A key id once per file: the same key for two tenants would not be per tenant.
    assert_eq!(
        refused(&format!("[tenant acme]\n{ACME}\n[tenant beta]\n{ACME}")),
        KeyError::Duplicate("acme-1".into())
    );
    let e = refused("k1:ed25519:0011").to_string();
    assert!(e.contains("64 hex digits") && !e.contains("0011"), "{e}");
    // Listing the secret in Debug never happens.
    let ring = Keyring::parse(&format!("{SHARED}\n[tenant acme]\n{ACME}")).unwrap();
    let shown = format!("{ring:?}");
    assert!(
        !shown.contains("secret-of-acme") && !shown.contains("shared-secret"),
        "{shown}"
    );
}

#[test]
fn a_keyring_signs_only_with_private_keys_and_gives_participants_public_ones() {
    let ed = Key::generate_ed25519("ed-1").unwrap();
    let coordinator = Keyring::parse(&format!("{SHARED}\n[tenant acme]\n{}", ed.entry())).unwrap();
    assert_eq!(coordinator.check_can_sign(), Ok(()));
    let participant_text = coordinator.verifying_text();
    assert!(
        participant_text.contains("ed-1:ed25519-pub:"),
        "{participant_text}"
    );
    assert!(
        !participant_text.contains(&ed.entry()),
        "no private key for participants"
    );
    let participant = Keyring::parse(&participant_text).unwrap();
    assert_eq!(
        participant.check_can_sign(),
        Err(KeyError::PublicOnly("ed-1".into()))
    );
    let acme = call("acme");
    let header = sign_call(&ed, T, &acme, false).unwrap();
    let verified = verify_call(Some(&header), &acme, at(T), &participant, Policy::default());
    assert_eq!(verified.map(|v| v.kid), Ok("ed-1".to_owned()));
    // Two generated keys differ.
    assert_ne!(
        Key::generate_ed25519("x").unwrap(),
        Key::generate_ed25519("x").unwrap()
    );
    let hmac = Key::generate_hmac("h").unwrap();
    assert_eq!(hmac.entry().len(), "h:".len() + 64);
}

#[test]
fn a_shared_keyring_is_replaced_whole_and_a_bad_file_keeps_it() {
    let dir = std::env::temp_dir().join(format!("idem-signing-keyring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys");
    std::fs::write(&file, SHARED).unwrap();
    let shared = SharedKeyring::new(Keyring::from_file(&file).unwrap());
    let signing = |ring: &Keyring| ring.for_tenant("x").unwrap().signing_key().kid().to_owned();
    let held = shared.current();
    assert_eq!(
        shared.reload(&file),
        Ok(false),
        "the same file changes nothing"
    );
    std::fs::write(&file, format!("{ACME}\n{SHARED}")).unwrap();
    assert_eq!(shared.reload(&file), Ok(true));
    assert_eq!(signing(&shared.current()), "acme-1");
    // A call that started before still holds the keyring it started with.
    assert_eq!(signing(&held), "shared-1");
    std::fs::write(&file, "k1:short").unwrap();
    assert!(matches!(
        shared.reload(&file),
        Err(KeyError::ShortSecret(_))
    ));
    assert_eq!(signing(&shared.current()), "acme-1");
    let _ = std::fs::remove_dir_all(&dir);
}

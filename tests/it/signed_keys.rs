//! Signing keys end to end, on SQLite, PostgreSQL and MariaDB (issue 28, point 3): Ed25519
//! (the coordinator signs with the private key, an SDK participant verifies with the
//! public key only), keys made with `idem signing keygen` and a participant's file made
//! with `idem signing public` used by a real `idem serve`, and keys rotated without a
//! restart: a real `idem serve` rereads its file on SIGHUP, an in-process one at its
//! interval, and a file that cannot be used leaves the keys in use.

use crate::common;
use crate::signed;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::typed;
use idem::signing::{Signer, SigningOptions};
use idem_client::{Client, Status};
use idem_participant::signature::Key;
use signed::{Participant, action_error, coordinator, each_backend, saga};

const OLD: &str = "old:the-old-secret-0123456789";
const NEW: &str = "new:the-new-secret-9876543210";

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `text` to `path` whole: a reload never reads half a file.
fn write(path: &Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Runs one-step sagas on `p` (gids `<prefix>-1`, `-2`…) until one is signed by `kid`;
/// fails after 10 s. A reload is asynchronous to the signal or interval that triggers it.
async fn until_signed_by(idem: &Client, p: &Participant, prefix: &str, kid: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for n in 1.. {
        let tx = saga(idem, p, &format!("{prefix}-{n}")).await;
        assert_eq!(tx.status, Status::Succeeded, "{tx:#?}");
        if p.reached().last().is_some_and(|(_, k)| k == kid) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never signed by {kid}: {:?}",
            p.reached()
        );
    }
}

/// Waits (10 s at most) until the log file holds `text`.
async fn wait_for_line(log: &Path, text: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log)
        .unwrap_or_default()
        .contains(text)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never logged {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_signed_by_the_coordinator_verified_with_the_public_key() {
    each_backend("signed_ed25519", async |db| {
        let b = db.backend.name();
        let private = Key::generate_ed25519("ed-1").unwrap();
        let server = coordinator(&db.url, Some(&private.entry())).await;
        let idem = typed::client(&server.url());
        // The participant holds the public key only: it cannot sign.
        let public = private.verifying_entry();
        assert!(public.starts_with("ed-1:ed25519-pub:"), "{public}");
        assert!(!Key::parse_entry(&public, 1).unwrap().can_sign());
        let holder = Participant::start(&public).await;
        let tx = saga(&idem, &holder, "ed-ok").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        assert_eq!(
            holder.reached(),
            [("/s1/action".into(), "ed-1".into())],
            "{b}"
        );
        let header = holder.calls()[0]
            .header("idem-signature")
            .unwrap()
            .to_owned();
        let v2 = header.rsplit_once("v2=").unwrap().1;
        assert_eq!(v2.len(), 128, "{b}: an Ed25519 signature: {header}");
        // Another key pair's public key under the same id: refused.
        let other = Key::generate_ed25519("ed-1").unwrap().verifying_entry();
        let stranger = Participant::start(&other).await;
        let tx = saga(&idem, &stranger, "ed-wrong").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        assert!(
            stranger.refused_with("signature_mismatch"),
            "{b}: {:?}",
            stranger.refusals()
        );
        assert!(stranger.calls().is_empty(), "{b}");
        server.stop().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_idem_serve_signs_with_keygens_key_and_rereads_its_file_on_sighup() {
    each_backend("signed_keygen_sighup", async |db| {
        let b = db.backend.name();
        let dir = scratch(&format!("signed-keygen-{b}"));
        let keys = dir.join("keys");
        // An Ed25519 key for the default list, an HMAC key of acme's own.
        let ed = common::idem_cli(&["signing", "keygen", "--ed25519", "--kid", "ed-cli"]);
        let hmac = common::idem_cli(&["signing", "keygen", "--kid", "hmac-cli"]);
        assert!(
            ed.starts_with("# public (for participants): ed-cli:ed25519-pub:"),
            "{ed}"
        );
        assert!(
            hmac.starts_with("hmac-cli:") && hmac.trim().len() == "hmac-cli:".len() + 64,
            "{hmac}"
        );
        write(&keys, &format!("{ed}[tenant acme]\n{hmac}"));
        let public = common::idem_cli(&["signing", "public", keys.to_str().unwrap()]);
        assert!(
            !public.contains(":ed25519:"),
            "{b}: no private key for participants: {public}"
        );
        let participant = Participant::start(&format!("{NEW}\n{public}")).await;

        let log = dir.join("idem.log");
        let child = common::Child::serve_logged(
            &db.url,
            &[
                "--signing-secret-file",
                keys.to_str().unwrap(),
                "--signing-reload-interval-ms",
                "0",
            ],
            &log,
        )
        .await;
        let idem = typed::client(&child.url);
        let tx = saga(&idem, &participant, "keygen").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        assert_eq!(participant.reached()[0].1, "ed-cli", "{b}");

        // The file now signs with NEW first; SIGHUP; the same process signs with it.
        write(&keys, &format!("{NEW}\n{ed}"));
        child.signal("HUP");
        until_signed_by(&idem, &participant, "after-hup", "new").await;
        // A broken file and SIGHUP: logged, and the keys in use stay.
        write(&keys, "new:short\n");
        child.signal("HUP");
        wait_for_line(
            &log,
            "cannot reload the signing keys; still signing with the previous ones",
        )
        .await;
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(
            text.contains("shorter than 16 bytes") && !text.contains("new:short"),
            "{b}: {text}"
        );
        let tx = saga(&idem, &participant, "after-bad-hup").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        assert_eq!(participant.reached().last().unwrap().1, "new", "{b}");
        child.kill();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_file_is_reread_at_its_interval() {
    each_backend("signed_reload_interval", async |db| {
        let b = db.backend.name();
        let dir = scratch(&format!("signed-interval-{b}"));
        let keys = dir.join("keys");
        write(&keys, OLD);
        let options = SigningOptions {
            file: Some(keys.clone()),
            reload_interval: Some(Duration::from_millis(50)),
            ..SigningOptions::default()
        };
        let signer = Signer::from_options(&options).unwrap();
        let server = common::coordinator_with(&db.url, |c| c.signing = signer).await;
        let idem = typed::client(&server.url());
        let participant = Participant::start(OLD).await;
        let tx = saga(&idem, &participant, "before").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        // Rotation: a participant holding both keys, then the coordinator's file.
        let both = Participant::start(&format!("{NEW}\n{OLD}")).await;
        write(&keys, &format!("{NEW}\n{OLD}"));
        until_signed_by(&idem, &both, "rotated", "new").await;
        // Without a restart, the old participant no longer passes what is signed now.
        let tx = saga(&idem, &participant, "old-participant").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        assert!(
            participant.refused_with("signature_unknown_key"),
            "{b}: {:?}",
            participant.refusals()
        );
        server.stop().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

//! Signed branch calls end to end, on SQLite, PostgreSQL and MariaDB: a coordinator in
//! this process with signing keys, participants that verify with the SDK's middleware
//! over real HTTP. The right key gets through; another key, or none, is refused (401) and
//! the transaction does not succeed; during a rotation both keys are accepted; the demo's
//! coupon service runs a saga signed; a real `idem serve` signs with its file's or its
//! environment's keys. What v2 binds (target, tenant, call), keys per tenant, Ed25519 and
//! reloads are in `signed_calls_bound.rs`.

use crate::common;
use crate::signed;

use common::typed;
use common::typed::{created, wait_status};
use idem_client::{Options, Status};
use idem_demo::coupon;
use idem_participant::signature::{Key, Keys, Verifier, sign_v1};
use idem_participant::testing::TestDatabase;
use serde_json::json;
use signed::{Participant, action_error, coordinator, each_backend, saga};

const WAIT: std::time::Duration = signed::WAIT;
const OLD: &str = "old:the-old-secret-0123456789";
const NEW: &str = "new:the-new-secret-9876543210";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_key_gets_through_another_key_or_none_is_refused() {
    each_backend("signed_right_and_wrong_key", async |db| {
        let b = db.backend.name();
        let server = coordinator(&db.url, Some(OLD)).await;
        let idem = typed::client(&server.url());

        let holder = Participant::start(OLD).await;
        let tx = saga(&idem, &holder, "signed-ok").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        assert_eq!(
            holder.reached(),
            [("/s1/action".to_owned(), "old".to_owned())],
            "{b}"
        );

        // Same key id, another secret: every call is refused, the compensation too, so
        // the saga neither succeeds nor fails cleanly; it stalls for an operator.
        let stranger = Participant::start("old:a-different-secret-000").await;
        let tx = saga(&idem, &stranger, "signed-wrong-secret").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(
            stranger.reached().is_empty(),
            "{b}: {:?}",
            stranger.reached()
        );
        let error = action_error(&tx);
        assert!(error.contains("HTTP 401"), "{b}: {error}");
        let other_kid = Participant::start(NEW).await;
        let tx = saga(&idem, &other_kid, "signed-unknown-kid").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(other_kid.reached().is_empty(), "{b}");
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        server.stop().await.unwrap();

        // A coordinator without a key sends no signature at all.
        let unsigned = coordinator(&db.url, None).await;
        let idem = typed::client(&unsigned.url());
        let tx = saga(&idem, &holder, "unsigned").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        // Nor does it pass on one a client put in branch_headers, even a valid one: only
        // idem's own signature is sent.
        let gid = "forged";
        let target = format!("/s1/action?gid={gid}&trans_type=saga&branch_id=01&op=action");
        let now = idem_participant::signature::unix_seconds(std::time::SystemTime::now());
        let key = Key::parse_entry(OLD, 1).unwrap();
        let forged = sign_v1(&key, now, "POST", &target, br#"{"step":1}"#).unwrap();
        let options = Options {
            branch_headers: [("Idem-Signature".to_owned(), forged)].into(),
            ..Options::default()
        };
        idem.saga(gid)
            .step(
                holder.url("/s1/action"),
                holder.url("/s1/compensate"),
                json!({"step": 1}),
            )
            .options(options)
            .send()
            .await
            .unwrap();
        let tx = wait_status(&idem, gid, &[Status::Stalled], WAIT).await;
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        assert_eq!(
            holder.reached().len(),
            1,
            "{b}: only the signed saga got through"
        );
        unsigned.stop().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_rotation_the_old_and_the_new_key_are_accepted() {
    each_backend("signed_rotation", async |db| {
        let b = db.backend.name();
        // Step 1 of a rotation: every participant holds both keys.
        let participant = Participant::start(&format!("{NEW}\n{OLD}")).await;
        let before = coordinator(&db.url, Some(OLD)).await;
        let tx = saga(&typed::client(&before.url()), &participant, "rotate-old").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        before.stop().await.unwrap();
        // Step 2: the coordinator signs with the new key (listed first).
        let after = coordinator(&db.url, Some(&format!("{NEW},{OLD}"))).await;
        let idem = typed::client(&after.url());
        let tx = saga(&idem, &participant, "rotate-new").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        let kids: Vec<String> = participant.reached().into_iter().map(|(_, k)| k).collect();
        assert_eq!(kids, ["old", "new"], "{b}");
        // Step 3: the old key is dropped; a coordinator still signing with it is refused.
        let retired = Participant::start(NEW).await;
        let tx = saga(&idem, &retired, "rotate-done").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        after.stop().await.unwrap();
        let stale = coordinator(&db.url, Some(OLD)).await;
        let tx = saga(&typed::client(&stale.url()), &retired, "rotate-stale").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        assert!(action_error(&tx).contains("HTTP 401"), "{b}");
        stale.stop().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_coupon_service_runs_a_signed_saga() {
    each_backend("signed_demo_idem", async |db| {
        let b = db.backend.name();
        let shop = TestDatabase::create(db.backend, "signed_demo_coupon").await;
        let pool = coupon::open(&shop.url).await.unwrap();
        coupon::seed(&pool, "WELCOME10", 5).await.unwrap();
        let verifier = Verifier::new(Keys::parse(OLD).unwrap());
        let router = coupon::router_with(pool.clone(), Some(verifier));
        let service = idem_demo::spawn(router, "127.0.0.1:0").await.unwrap();
        let url = service.url(coupon::ISSUE_PATH);

        let server = coordinator(&db.url, Some(OLD)).await;
        let idem = typed::client(&server.url());
        let issue = json!({"user": "alice", "coupon": "WELCOME10"});
        let answer = idem
            .saga("demo-signed")
            .step(&url, &url, &issue)
            .wait_result(true)
            .send()
            .await;
        let tx = created(answer.unwrap_or_else(|e| panic!("{b}: {e:?}")));
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        let campaign = coupon::campaign(&pool, "WELCOME10").await.unwrap().unwrap();
        assert_eq!(campaign.remaining, 4, "{b}");
        server.stop().await.unwrap();

        // The same service refuses an unsigned coordinator: nothing more is issued.
        let unsigned = coordinator(&db.url, None).await;
        let idem = typed::client(&unsigned.url());
        idem.saga("demo-unsigned")
            .step(&url, &url, &issue)
            .send()
            .await
            .unwrap();
        let tx = wait_status(&idem, "demo-unsigned", &[Status::Stalled], WAIT).await;
        assert!(action_error(&tx).contains("HTTP 401"), "{b}: {tx:#?}");
        let campaign = coupon::campaign(&pool, "WELCOME10").await.unwrap().unwrap();
        assert_eq!(campaign.remaining, 4, "{b}");
        assert!(
            coupon::coupons_of(&pool, "alice").await.unwrap().len() == 1,
            "{b}"
        );
        unsigned.stop().await.unwrap();
        service.stop().await.unwrap();
        pool.close().await;
        shop.drop_database().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_idem_serve_signs_with_the_first_key_of_its_file_or_env() {
    each_backend("signed_idem_serve", async |db| {
        let b = db.backend.name();
        let dir =
            std::env::temp_dir().join(format!("idem-signed-serve-{}-{b}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, format!("# newest first\n{NEW}\n{OLD}\n")).unwrap();
        let participant = Participant::start(NEW).await;
        let child = common::Child::serve(
            &db.url,
            "",
            &["--signing-secret-file", file.to_str().unwrap()],
        )
        .await;
        let tx = saga(&typed::client(&child.url), &participant, "serve-file").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        child.kill();
        let child =
            common::Child::serve_env(&db.url, "", &[], &[("IDEM_SIGNING_SECRET", NEW)]).await;
        let tx = saga(&typed::client(&child.url), &participant, "serve-env").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        child.kill();
        let kids: Vec<String> = participant.reached().into_iter().map(|(_, k)| k).collect();
        assert_eq!(kids, ["new", "new"], "{b}");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[test]
fn idem_config_hides_the_keys_and_serve_refuses_bad_ones_without_showing_them() {
    let secret = "k1:do-not-print-this-secret";
    let out = common::idem_run(&["config"], &[("IDEM_SIGNING_SECRET", secret)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("do-not-print"), "{text}");
    assert!(text.contains("signing_secret = \"***\""), "{text}");

    let dir = std::env::temp_dir().join(format!("idem-signed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let database = format!("sqlite://{}?mode=rwc", dir.join("idem.db").display());
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--database-url",
            &database,
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        let out = common::idem_run(&args, &[]);
        assert!(!out.status.success(), "{extra:?} must not start");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = serve(&["--signing-secret-file", "/nonexistent/idem-keys"]);
    assert!(missing.contains("/nonexistent/idem-keys"), "{missing}");
    let short = serve(&["--signing-secret", "k1:tooshort"]);
    assert!(short.contains("shorter than 16 bytes"), "{short}");
    assert!(!short.contains("tooshort"), "{short}");
    let keys = dir.join("keys");
    std::fs::write(
        &keys,
        "k1:a-long-enough-secret-1\nk1:a-long-enough-secret-2\n",
    )
    .unwrap();
    let twice = serve(&["--signing-secret-file", keys.to_str().unwrap()]);
    assert!(twice.contains("listed twice"), "{twice}");
    assert!(!twice.contains("long-enough"), "{twice}");
    let _ = std::fs::remove_dir_all(&dir);
}

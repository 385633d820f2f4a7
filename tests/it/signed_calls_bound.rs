//! What a v2 signature binds, end to end on SQLite, PostgreSQL and MariaDB (issue 28, point
//! 3): a coordinator in this process signs, participants verify with the SDK's middleware
//! over real HTTP, and the test replays what they recorded. A call replayed to the
//! participant that got it is refused (its id was seen); a call signed for one host is
//! refused by another (same path and gid); a call of tenant acme does not pass as beta's;
//! one tenant's key does not pass another tenant's calls; v1 still reaches a participant
//! that predates v2 when the coordinator is told to send it. Ed25519 and reloads without a
//! restart are in `signed_keys.rs`.

use crate::common;
use crate::signed;

use common::auth::{Setup, post};
use common::typed;
use idem::auth::Role;
use idem_client::Status;
use idem_participant::signature::{
    CALL_ID_HEADER, Call, Keyring, Keys, TENANT_HEADER, Verifier, new_call_id, sign_call,
    unix_seconds,
};
use serde_json::json;
use signed::{Check, Participant, action_error, coordinator, each_backend, replay, saga};

const KEY: &str = "k1:the-shared-secret-0123456789";
const ACME: &str = "acme-1:the-secret-of-acme-000001";
const BETA: &str = "beta-1:the-secret-of-beta-000001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_call_replayed_to_its_participant_is_refused() {
    each_backend("signed_replay", async |db| {
        let b = db.backend.name();
        let server = coordinator(&db.url, Some(KEY)).await;
        let idem = typed::client(&server.url());
        let p = Participant::start(KEY).await;
        // The first attempt gets 503: idem's retry is a new call, with a new id, accepted.
        p.fail_next(1);
        let tx = saga(&idem, &p, "replayed").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        let calls = p.calls();
        assert_eq!(calls.len(), 2, "{b}: {calls:#?}");
        let ids: Vec<&str> = calls
            .iter()
            .map(|c| c.header(CALL_ID_HEADER).unwrap())
            .collect();
        assert_ne!(ids[0], ids[1], "{b}: a new id per attempt");

        // Both recorded calls, replayed as they were: refused before the handler.
        for call in &calls {
            assert_eq!(
                replay(&p.base, call, |_| {}).await,
                (401, "signature_replayed".to_owned()),
                "{b}"
            );
        }
        assert_eq!(p.calls().len(), 2, "{b}: no replay reached the handler");
        server.stop().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_signed_for_one_host_is_refused_by_another() {
    each_backend("signed_target", async |db| {
        let b = db.backend.name();
        let server = coordinator(&db.url, Some(KEY)).await;
        let idem = typed::client(&server.url());
        // The attacker registers its own host with the victim's path and gid, and lets
        // idem sign a call to it.
        let attacker = Participant::open(Check::None).await;
        let tx = saga(&idem, &attacker, "order-7").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        let stolen = attacker.calls().pop().unwrap();
        assert!(stolen.header("idem-signature").is_some(), "{b}");

        // The victim rebuilding the target from Host (the SDK's default), and one told its
        // own base URL, which ignores Host.
        let by_host = Participant::start(KEY).await;
        let keyring = Keyring::parse(KEY).unwrap();
        let pinned = Participant::open(Check::Sdk(Box::new(move |port| {
            Verifier::new(keyring)
                .external_url(&format!("http://127.0.0.1:{port}"))
                .unwrap()
        })))
        .await;
        for victim in [&by_host, &pinned] {
            // Genuine calls get through.
            let tx = saga(&idem, victim, &format!("order-genuine-{}", victim.port)).await;
            assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
            assert_eq!(
                replay(&victim.base, &stolen, |_| {}).await,
                (401, "signature_mismatch".to_owned()),
                "{b}: same path and gid, another host"
            );
        }
        // With its base URL set, a replay claiming the attacker's Host is refused too.
        let attacker_host = attacker.base.trim_start_matches("http://").to_owned();
        let forged_host = replay(&pinned.base, &stolen, |h| {
            h.insert("host", attacker_host.parse().unwrap());
        })
        .await;
        assert_eq!(forged_host, (401, "signature_mismatch".to_owned()), "{b}");
        for victim in [&by_host, &pinned] {
            let gids: Vec<String> = victim.calls().iter().map(|c| c.target.clone()).collect();
            assert!(
                gids.iter().all(|t| !t.contains("gid=order-7&")),
                "{b}: the stolen call never reached a handler: {gids:?}"
            );
        }
        server.stop().await.unwrap();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_one_tenant_does_not_pass_as_another() {
    for db in idem_participant::testing::all("signed_tenant").await {
        let b = db.backend.name();
        let signer = idem::signing::Signer::new(Keyring::parse(KEY).unwrap()).unwrap();
        let s = Setup::with(db, |c| c.signing = Some(signer)).await;
        let p = Participant::start(KEY).await;
        for tenant in ["acme", "beta", "default"] {
            let token = s.token(tenant, Role::Client).await;
            let body = json!({"gid": "order-1", "kind": "saga", "wait_result": true, "steps": [{
                "action": p.url("/s1/action"), "compensate": p.url("/s1/compensate"),
                "payload": {"tenant": tenant},
            }]});
            let (status, view) = post(&s, "/api/v1/transactions", Some(&token), body).await;
            assert_eq!(status, 201, "{b}: {view}");
            assert_eq!(view["status"], "succeeded", "{b}: {view}");
        }
        // Each call named its tenant (the default one too), and the SDK gave it to the
        // handler: the same gid, three tenants.
        let calls = p.calls();
        let seen: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.header(TENANT_HEADER).unwrap(), c.tenant.as_str()))
            .collect();
        assert_eq!(
            seen,
            [("acme", "acme"), ("beta", "beta"), ("default", "default")],
            "{b}"
        );

        // acme's call with the tenant changed to beta: the signature no longer matches
        // (checked before the call id, which was seen: the tenant is what fails).
        let acme_call = &calls[0];
        assert!(acme_call.target.contains("gid=order-1&"), "{b}");
        let as_beta = replay(&p.base, acme_call, |h| {
            h.insert(TENANT_HEADER, "beta".parse().unwrap());
        })
        .await;
        assert_eq!(as_beta, (401, "signature_mismatch".to_owned()), "{b}");
        let as_default = replay(&p.base, acme_call, |h| {
            h.remove(TENANT_HEADER);
        })
        .await;
        assert_eq!(as_default, (401, "signature_mismatch".to_owned()), "{b}");
        assert_eq!(p.calls().len(), 3, "{b}");
        s.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_key_does_not_pass_another_tenants_calls() {
    for db in idem_participant::testing::all("signed_tenant_keys").await {
        let b = db.backend.name();
        let file = format!("{KEY}\n[tenant acme]\n{ACME}\n[tenant beta]\n{BETA}\n");
        let signer = idem::signing::Signer::new(Keyring::parse(&file).unwrap()).unwrap();
        let s = Setup::with(db, |c| c.signing = Some(signer)).await;
        let (acme, beta) = (
            s.token("acme", Role::Client).await,
            s.token("beta", Role::Client).await,
        );
        // acme's own service holds acme's key only; a service shared by both tenants holds
        // each tenant's key in its section.
        let acme_only = Participant::start(ACME).await;
        let shared =
            Participant::start(&format!("[tenant acme]\n{ACME}\n[tenant beta]\n{BETA}")).await;
        let run = async |token: &str, p: &Participant, gid: &str| {
            let body = json!({"gid": gid, "kind": "saga", "steps": [{
                "action": p.url("/s1/action"), "compensate": p.url("/s1/compensate"),
                "payload": {},
            }]});
            let (status, view) = post(&s, "/api/v1/transactions", Some(token), body).await;
            assert_eq!(status, 201, "{b}: {view}");
            common::auth::wait_status(&s, token, gid, "succeeded").await
        };
        run(&acme, &acme_only, "o-acme").await;
        run(&acme, &shared, "o-acme-shared").await;
        run(&beta, &shared, "o-beta-shared").await;
        let kids = |p: &Participant| {
            p.calls()
                .iter()
                .map(|c| (c.tenant.clone(), c.kid.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(kids(&acme_only), [("acme".into(), "acme-1".into())], "{b}");
        assert_eq!(
            kids(&shared),
            [
                ("acme".into(), "acme-1".into()),
                ("beta".into(), "beta-1".into())
            ],
            "{b}"
        );
        // beta's calls are signed with beta's key, which acme's service does not hold.
        let body = json!({"gid": "o-beta", "kind": "saga", "steps": [{
            "action": acme_only.url("/s1/action"), "compensate": acme_only.url("/s1/compensate"),
            "payload": {},
        }]});
        assert_eq!(
            post(&s, "/api/v1/transactions", Some(&beta), body).await.0,
            201,
            "{b}"
        );
        let view = common::auth::wait_status(&s, &beta, "o-beta", "stalled").await;
        assert!(view.to_string().contains("HTTP 401"), "{b}: {view}");
        assert!(
            acme_only.refused_with("signature_unknown_key"),
            "{b}: {:?}",
            acme_only.refusals()
        );

        // Whoever holds beta's key (beta's own participant) signs a call for acme and
        // sends it to the shared service: beta's key is not acme's.
        let call_id = new_call_id();
        let target = "/s1/action?gid=o-acme-shared&trans_type=saga&branch_id=01&op=action";
        let forged_call = Call {
            method: "POST",
            scheme: "http",
            host: "127.0.0.1",
            port: shared.port,
            target,
            body: b"{}",
            tenant: "acme",
            call_id: &call_id,
        };
        let beta_key = Keys::parse(BETA).unwrap().signing_key().clone();
        let now = unix_seconds(std::time::SystemTime::now());
        let header = sign_call(&beta_key, now, &forged_call, false).unwrap();
        let answer = reqwest::Client::new()
            .post(shared.url(target))
            .header("idem-signature", header)
            .header(TENANT_HEADER, "acme")
            .header(CALL_ID_HEADER, &call_id)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401, "{b}");
        let answer: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(answer["error"], "signature_unknown_key", "{b}: {answer}");
        assert_eq!(shared.calls().len(), 2, "{b}");
        s.finish().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_reaches_a_participant_that_predates_v2_only_when_sent() {
    each_backend("signed_legacy_v1", async |db| {
        let b = db.backend.name();
        let old = Participant::open(Check::V1Only(Keys::parse(KEY).unwrap())).await;
        let new = Participant::start(KEY).await;
        // During the migration the coordinator sends v1 beside v2: both get through.
        let options = idem::signing::SigningOptions {
            inline: Some(KEY.into()),
            legacy_v1: true,
            ..Default::default()
        };
        let signer = idem::signing::Signer::from_options(&options).unwrap();
        let server = common::coordinator_with(&db.url, |c| c.signing = signer).await;
        let idem = typed::client(&server.url());
        for (p, gid) in [(&old, "to-old"), (&new, "to-new")] {
            let tx = saga(&idem, p, gid).await;
            assert_eq!(tx.status, Status::Succeeded, "{b}: {gid}: {tx:#?}");
        }
        let header = old.calls()[0].header("idem-signature").unwrap().to_owned();
        assert!(
            header.contains(",v2=") && header.contains(",v1="),
            "{b}: {header}"
        );
        server.stop().await.unwrap();
        // Without it (the default), v2 only: the old participant refuses, the new one
        // does not notice.
        let server = coordinator(&db.url, Some(KEY)).await;
        let idem = typed::client(&server.url());
        let tx = saga(&idem, &new, "to-new-v2").await;
        assert_eq!(tx.status, Status::Succeeded, "{b}: {tx:#?}");
        let tx = saga(&idem, &old, "to-old-v2").await;
        assert_eq!(tx.status, Status::Stalled, "{b}: {tx:#?}");
        let error = action_error(&tx);
        assert!(error.contains("HTTP 401"), "{b}: {error}");
        let refusals = old.refusals();
        assert!(
            refusals.iter().any(|r| r.contains("no v1")),
            "{b}: {refusals:?}"
        );
        assert_eq!(old.calls().len(), 1, "{b}");
        server.stop().await.unwrap();
    })
    .await;
}

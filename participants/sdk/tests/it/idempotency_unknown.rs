//! Unknown outcomes of the Idempotency-Key layer over real HTTP on loopback, on every
//! backend: a 5xx after the handler acted, a panic and a client hang-up leave the record
//! `UNKNOWN`; a repeat is settled by the recovery hook, by the background settler, or
//! answered 503 `idempotency_outcome_unknown` until an operator settles it; the handler
//! never runs again unless the fact source says nothing happened.

use std::sync::Arc;
use std::time::Duration;

use idem_participant::idempotency::{
    IdempotencyStore, Recovery, Settled, Settler, Status, StoredResult, purge_idempotency,
    request_digest,
};
use idem_participant::testing;
use idem_participant::{ManualClock, SharedClock, SystemClock};

use crate::kit_support::keys;
use keys::{
    ChargeLookup, Charger, SCOPE, charge, charge_result, charges, client, hang_up, mode, send,
    serve_charger, setup, wait_for_status,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_of_an_unknown_outcome_is_settled_by_the_hook_never_by_a_rerun() {
    for db in testing::all("unknown_settled_by_the_hook").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone());
        let charger = Charger::new(&pool);
        let hook = ChargeLookup::new(&pool);
        let url = serve_charger(store.clone(), &charger, Some(hook.clone())).await;
        let client = client();

        // The three ways a run ends UNKNOWN after it charged.
        let r = send(&client, &url, Some("k-502"), "-", &mode("502-after")).await;
        assert_eq!(
            r.status, 502,
            "{b}: the first client sees the handler's answer"
        );
        let r = send(&client, &url, Some("k-panic"), "-", &mode("panic")).await;
        assert_eq!(
            (r.status, r.code().as_deref()),
            (500, Some("handler_panicked")),
            "{b}"
        );
        hang_up(&url, "k-hang", &mode("hang"), &charger, 1).await;
        for key in ["k-502", "k-panic", "k-hang"] {
            wait_for_status(&store, SCOPE, key, Status::Unknown).await;
        }
        // And one whose provider timed out before anything happened.
        let r = send(&client, &url, Some("k-504"), "-", &mode("504-before")).await;
        assert_eq!(r.status, 504, "{b}");
        assert_eq!(
            store.lookup(SCOPE, "k-504").await.unwrap(),
            Some((Status::Unknown, 1)),
            "{b}: a 5xx is unknown until the fact source says otherwise"
        );
        assert_eq!(hook.asked(), 0, "{b}");

        // Each repeat asks the fact source: the charge happened, so its answer is
        // recorded and replayed; the handler does not run again.
        for (i, key) in ["k-502", "k-panic", "k-hang"].into_iter().enumerate() {
            let body = match key {
                "k-502" => mode("502-after"),
                "k-panic" => mode("panic"),
                _ => mode("hang"),
            };
            let r = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!(
                (r.status, r.replayed),
                (201, true),
                "{b}: {key}: {}",
                r.text()
            );
            assert_eq!(r.bytes, charge_result(key).body, "{b}: {key}");
            assert_eq!(charger.runs(key), 1, "{b}: {key} never ran again");
            assert_eq!(hook.asked(), i + 1, "{b}");
            assert_eq!(
                store.lookup(SCOPE, key).await.unwrap(),
                Some((Status::Succeeded, 1)),
                "{b}: {key}"
            );
        }
        // The fact source says the 504 changed nothing: this repeat runs it, once.
        let r = send(&client, &url, Some("k-504"), "-", &mode("504-before")).await;
        assert_eq!((r.status, r.replayed), (201, false), "{b}: {}", r.text());
        assert_eq!((charger.runs("k-504"), hook.asked()), (2, 4), "{b}");
        assert_eq!(
            store.lookup(SCOPE, "k-504").await.unwrap(),
            Some((Status::Succeeded, 2)),
            "{b}"
        );
        // Settled: later repeats replay without the hook or the handler.
        for key in ["k-502", "k-panic", "k-hang", "k-504"] {
            let r = send(&client, &url, Some(key), "-", "{}").await;
            assert_eq!(r.status, 409, "{b}: another body is still another request");
            let body = match key {
                "k-502" => mode("502-after"),
                "k-panic" => mode("panic"),
                "k-hang" => mode("hang"),
                _ => mode("504-before"),
            };
            let r = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!((r.status, r.replayed), (201, true), "{b}: {key}");
        }
        assert_eq!(hook.asked(), 4, "{b}");
        assert_eq!(charges(&pool).await, 4, "{b}: one charge per key");
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_hook_an_unknown_outcome_answers_503_until_an_operator_settles_it() {
    for db in testing::all("unknown_without_a_hook").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone());
        let charger = Charger::new(&pool);
        let url = serve_charger(store.clone(), &charger, None).await;
        let client = client();

        assert_eq!(
            send(&client, &url, Some("k-502"), "-", &mode("502-after"))
                .await
                .status,
            502
        );
        assert_eq!(
            send(&client, &url, Some("k-panic"), "-", &mode("panic"))
                .await
                .status,
            500
        );
        hang_up(&url, "k-hang", &mode("hang"), &charger, 1).await;
        assert_eq!(
            send(&client, &url, Some("k-504"), "-", &mode("504-before"))
                .await
                .status,
            504
        );
        let keys = [
            ("k-502", mode("502-after")),
            ("k-panic", mode("panic")),
            ("k-hang", mode("hang")),
            ("k-504", mode("504-before")),
        ];
        for (key, _) in &keys {
            wait_for_status(&store, SCOPE, key, Status::Unknown).await;
        }
        // Every repeat, as often as it comes, gets the same stable answer; nothing runs.
        for _ in 0..3 {
            for (key, body) in &keys {
                let r = send(&client, &url, Some(key), "-", body).await;
                assert_eq!(
                    (r.status, r.code().as_deref()),
                    (503, Some("idempotency_outcome_unknown")),
                    "{b}: {key}"
                );
                assert_eq!(r.retry_after.as_deref(), Some("1"), "{b}");
                assert_eq!(charger.runs(key), 1, "{b}: {key} never ran again");
            }
        }

        // Listed for an operator, with what the handler answered when it answered.
        let open = store.unsettled(100).await.unwrap();
        let listed: Vec<_> = open
            .iter()
            .map(|r| (r.key.as_str(), r.status, r.answered))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("k-502", Status::Unknown, Some(502)),
                ("k-panic", Status::Unknown, None),
                ("k-hang", Status::Unknown, None),
                ("k-504", Status::Unknown, Some(504)),
            ],
            "{b}"
        );
        // Retention never takes them: their outcome is still open.
        let far: SharedClock = Arc::new(ManualClock::at(
            idem_participant::Clock::now_ms(&SystemClock) + 365 * 86_400_000,
        ));
        assert_eq!(
            purge_idempotency(&pool, Duration::from_secs(3600), 100, &far)
                .await
                .unwrap(),
            0,
            "{b}"
        );

        // The operator's verdicts, each fenced by what was listed.
        let record = |key: &str| open.iter().find(|r| r.key == key).unwrap().clone();
        let paid = charge_result("k-502");
        assert_eq!(
            store
                .settle(&record("k-502"), Recovery::Succeeded(paid.clone()))
                .await
                .unwrap(),
            Settled::Recorded(Status::Succeeded),
            "{b}"
        );
        assert_eq!(
            store
                .settle(&record("k-502"), Recovery::NotHappened)
                .await
                .unwrap(),
            Settled::Moved,
            "{b}: a second verdict on what was listed finds it settled"
        );
        let refused = StoredResult::new(422, r#"{"error":"card_declined"}"#);
        assert_eq!(
            store
                .settle(&record("k-panic"), Recovery::FailedFinal(refused.clone()))
                .await
                .unwrap(),
            Settled::Recorded(Status::FailedFinal),
            "{b}"
        );
        assert_eq!(
            store
                .settle(&record("k-hang"), Recovery::Unknown)
                .await
                .unwrap(),
            Settled::StillUnknown,
            "{b}"
        );
        assert_eq!(
            store
                .settle(&record("k-504"), Recovery::NotHappened)
                .await
                .unwrap(),
            Settled::Recorded(Status::FailedRetryable),
            "{b}"
        );

        let r = send(&client, &url, Some("k-502"), "-", &keys[0].1).await;
        assert_eq!(
            (r.status, r.replayed, &r.bytes),
            (201, true, &paid.body),
            "{b}"
        );
        let r = send(&client, &url, Some("k-panic"), "-", &keys[1].1).await;
        assert_eq!(
            (r.status, r.replayed, &r.bytes),
            (422, true, &refused.body),
            "{b}"
        );
        let r = send(&client, &url, Some("k-hang"), "-", &keys[2].1).await;
        assert_eq!(r.status, 503, "{b}: still unknown");
        let r = send(&client, &url, Some("k-504"), "-", &keys[3].1).await;
        assert_eq!((r.status, r.replayed), (201, false), "{b}: run, once");
        assert_eq!(
            ["k-502", "k-panic", "k-hang", "k-504"].map(|k| charger.runs(k)),
            [1, 1, 1, 2],
            "{b}"
        );
        assert_eq!(
            store
                .unsettled(100)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.key)
                .collect::<Vec<_>>(),
            vec!["k-hang".to_owned()],
            "{b}"
        );
        assert_eq!(charges(&pool).await, 4, "{b}");
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_settler_settles_unknown_and_expired_records_without_a_repeat() {
    for db in testing::all("unknown_settled_by_the_settler").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone());
        let charger = Charger::new(&pool);
        // No hook in the layer: only the settler can settle anything.
        let url = serve_charger(store.clone(), &charger, None).await;
        let client = client();
        let keys = [
            ("k-502", mode("502-after")),
            ("k-panic", mode("panic")),
            ("k-hang", mode("hang")),
            ("k-504", mode("504-before")),
            ("unsure-502", mode("502-after")),
        ];
        for (key, body) in &keys {
            if *key == "k-hang" {
                hang_up(&url, key, body, &charger, 1).await;
            } else {
                let r = send(&client, &url, Some(key), "-", body).await;
                assert!(r.status >= 500, "{b}: {key}: {}", r.status);
            }
        }
        // A crashed owner: claimed with a lease of 1 ms, charged, never finished.
        let crashed_body = mode("ok");
        let crashed_hash = request_digest(
            "POST",
            "/charges",
            None,
            serde_json::from_str(&crashed_body).unwrap(),
            &[],
        );
        let short = IdempotencyStore::new(pool.clone()).with_lease(Duration::from_millis(1));
        assert!(matches!(
            short
                .claim(SCOPE, "k-crashed", &crashed_hash)
                .await
                .unwrap(),
            idem_participant::Claim::Acquired(_)
        ));
        charge(&pool, "k-crashed").await;
        for (key, _) in &keys {
            wait_for_status(&store, SCOPE, key, Status::Unknown).await;
        }

        // Two records a pass: the record the hook cannot settle never starves the rest.
        let hook = ChargeLookup::new(&pool);
        let settler = Settler::new(store.clone())
            .recovery(hook.clone())
            .every(Duration::from_millis(20))
            .batch(2)
            .spawn();
        for key in ["k-502", "k-panic", "k-hang", "k-crashed"] {
            wait_for_status(&store, SCOPE, key, Status::Succeeded).await;
        }
        wait_for_status(&store, SCOPE, "k-504", Status::FailedRetryable).await;
        settler.stop().await;
        assert!(hook.asked() >= 6, "{b}: every record was asked about");
        assert_eq!(
            store.lookup(SCOPE, "unsure-502").await.unwrap(),
            Some((Status::Unknown, 1)),
            "{b}: the hook could not tell: it stays"
        );
        let asked = hook.asked();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(hook.asked(), asked, "{b}: a stopped settler asks nothing");

        // The repeats: replays of what the settler recorded, and one run of what did not
        // happen. No handler ran twice for an effect.
        for key in ["k-502", "k-panic", "k-hang"] {
            let body = &keys.iter().find(|(k, _)| *k == key).unwrap().1;
            let r = send(&client, &url, Some(key), "-", body).await;
            assert_eq!((r.status, r.replayed), (201, true), "{b}: {key}");
            assert_eq!(r.bytes, charge_result(key).body, "{b}: {key}");
        }
        let r = send(&client, &url, Some("k-crashed"), "-", &crashed_body).await;
        assert_eq!((r.status, r.replayed), (201, true), "{b}: {}", r.text());
        let r = send(&client, &url, Some("k-504"), "-", &keys[3].1).await;
        assert_eq!((r.status, r.replayed), (201, false), "{b}");
        let r = send(&client, &url, Some("unsure-502"), "-", &keys[4].1).await;
        assert_eq!(
            r.code().as_deref(),
            Some("idempotency_outcome_unknown"),
            "{b}"
        );
        assert_eq!(
            [
                "k-502",
                "k-panic",
                "k-hang",
                "k-crashed",
                "k-504",
                "unsure-502"
            ]
            .map(|k| charger.runs(k)),
            [1, 1, 1, 0, 2, 1],
            "{b}"
        );
        assert_eq!(charges(&pool).await, 6, "{b}: one charge per key");
        pool.close().await;
        db.drop_database().await;
    }
}

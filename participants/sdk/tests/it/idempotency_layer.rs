//! The Idempotency-Key layer over real HTTP on loopback, on every backend: answers that
//! say nothing happened (408, 429, a 503 the route names, a marked 500) run again; a
//! handler slower than its lease keeps it, so a concurrent repeat never runs it beside
//! itself; bodies are replayed byte for byte up to the store's bound, and a larger one is
//! never replayed empty.

use std::time::Duration;

use idem_participant::idempotency::{Claim, IdempotencyStore, Status, request_digest};
use idem_participant::testing::{self, Backend};
use sqlx::{AnyPool, Row};

use crate::kit_support::keys;
use keys::{
    Charger, SCOPE, charges, client, db_now, lease_until, mode, send, serve_charger, setup,
    sized_body,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_say_nothing_happened_run_again_and_are_then_replayed() {
    for db in testing::all("nothing_happened_runs_again").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone());
        let charger = Charger::new(&pool);
        let url = serve_charger(store.clone(), &charger, None).await;
        let client = client();
        for (key, first) in [
            ("k-408", 408),
            ("k-429", 429),
            ("k-503", 503),
            ("k-marked-500", 500),
        ] {
            let body = mode(key.trim_start_matches("k-"));
            let r = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!((r.status, r.replayed), (first, false), "{b}: {key}");
            assert_eq!(
                store.lookup(SCOPE, key).await.unwrap(),
                Some((Status::FailedRetryable, 1)),
                "{b}: {key} is not final"
            );
            let r = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!((r.status, r.replayed), (201, false), "{b}: {key} ran again");
            let r = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!(
                (r.status, r.replayed),
                (201, true),
                "{b}: {key} then replays"
            );
            assert_eq!(charger.runs(key), 2, "{b}: {key}");
            assert_eq!(
                store.lookup(SCOPE, key).await.unwrap(),
                Some((Status::Succeeded, 2)),
                "{b}: {key}"
            );
        }
        assert_eq!(charges(&pool).await, 4, "{b}");
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_outlasting_its_lease_keeps_it_and_a_concurrent_repeat_never_runs_it() {
    const LEASE_MS: i64 = 600;
    for db in testing::all("lease_renewed_while_running").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone())
            .with_lease(Duration::from_millis(LEASE_MS.unsigned_abs()));
        let charger = Charger::new(&pool);
        let url = serve_charger(store.clone(), &charger, None).await;
        let client = client();
        let body = mode("slow");
        let first = {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move { send(&client, &url, Some("k-slow"), "-", &body).await })
        };
        charger.parked(1).await;
        let claimed_until = lease_until(&pool, b, "k-slow").await;
        // Wait on the database's clock until the claim's first lease has run out twice.
        while db_now(&pool, b).await < claimed_until + 2 * LEASE_MS {
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let renewed = lease_until(&pool, b, "k-slow").await;
        assert!(
            renewed > db_now(&pool, b).await,
            "{b}: the running handler's lease is still live ({renewed} vs first {claimed_until})"
        );

        // A concurrent repeat finds the live lease: 202, and the handler does not run.
        let r = send(&client, &url, Some("k-slow"), "-", &body).await;
        assert_eq!((r.status, r.replayed), (202, false), "{b}: {}", r.text());
        assert!(r.retry_after.is_some(), "{b}");
        let hash = request_digest(
            "POST",
            "/charges",
            None,
            serde_json::from_str(&body).unwrap(),
            &[],
        );
        assert!(
            matches!(
                store.claim(SCOPE, "k-slow", &hash).await.unwrap(),
                Claim::InProgress { .. }
            ),
            "{b}"
        );
        assert_eq!(charger.runs("k-slow"), 1, "{b}");

        charger.release.send_replace(true);
        let r = first.await.unwrap();
        assert_eq!((r.status, r.replayed), (201, false), "{b}");
        let r = send(&client, &url, Some("k-slow"), "-", &body).await;
        assert_eq!((r.status, r.replayed), (201, true), "{b}");
        assert_eq!(
            (charger.runs("k-slow"), charges(&pool).await),
            (1, 1),
            "{b}"
        );
        pool.close().await;
        db.drop_database().await;
    }
}

fn bytes_request(size: usize, binary: bool, nul: bool) -> String {
    serde_json::json!({"mode": "bytes", "size": size, "binary": binary, "nul": nul}).to_string()
}

/// Which body column holds the record's body: (text, bytes) present.
async fn body_columns(pool: &AnyPool, backend: Backend, key: &str) -> (bool, bool) {
    let row = sqlx::query(backend.sql(
        "SELECT CASE WHEN result_body IS NULL THEN 0 ELSE 1 END, \
         CASE WHEN result_bytes IS NULL THEN 0 ELSE 1 END FROM idem_idempotency WHERE idem_key = ?",
    ))
    .bind(key.to_owned())
    .fetch_one(pool)
    .await
    .unwrap();
    (row.get::<i32, _>(0) == 1, row.get::<i32, _>(1) == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_replay_byte_for_byte_up_to_the_bound_and_a_larger_one_never_replays_empty() {
    const BOUND: usize = 100_000;
    for db in testing::all("bodies_as_bytes").await {
        let b = db.backend;
        let pool = setup(&db).await;
        let store = IdempotencyStore::new(pool.clone()).with_max_result_body(BOUND);
        let charger = Charger::new(&pool);
        let url = serve_charger(store.clone(), &charger, None).await;
        let client = client();
        for (key, size, binary, nul, columns) in [
            // Over TEXT's 64 KiB on MySQL, every byte value, NUL included.
            ("k-binary", 70_000, true, false, (false, true)),
            ("k-nul-text", 3, false, true, (false, true)),
            ("k-text-at-bound", BOUND, false, false, (true, false)),
            ("k-binary-at-bound", BOUND, true, false, (false, true)),
            ("k-empty", 0, false, false, (true, false)),
        ] {
            let body = bytes_request(size, binary, nul);
            let expected = if nul {
                b"a\0b".to_vec()
            } else {
                sized_body(size, binary)
            };
            let first = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!((first.status, first.replayed), (200, false), "{b}: {key}");
            assert_eq!(first.bytes, expected, "{b}: {key}");
            let again = send(&client, &url, Some(key), "-", &body).await;
            assert_eq!((again.status, again.replayed), (200, true), "{b}: {key}");
            assert!(
                again.bytes == expected,
                "{b}: {key}: replayed byte for byte"
            );
            assert_eq!(
                again.content_type.as_deref(),
                Some("application/octet-stream"),
                "{b}: {key}"
            );
            assert_eq!(
                body_columns(&pool, b, key).await,
                columns,
                "{b}: {key}: UTF-8 text without NUL in the text column, the rest as bytes"
            );
            assert_eq!(charger.runs(key), 1, "{b}: {key}");
        }

        // One byte over the bound: the first client gets it all; the record cannot replay
        // it, so it is an unknown outcome, never an empty success.
        let body = bytes_request(BOUND + 1, true, false);
        let first = send(&client, &url, Some("k-over"), "-", &body).await;
        assert_eq!(first.status, 200, "{b}");
        assert!(first.bytes == sized_body(BOUND + 1, true), "{b}");
        assert_eq!(
            store.lookup(SCOPE, "k-over").await.unwrap(),
            Some((Status::Unknown, 1)),
            "{b}"
        );
        let open = store.unsettled(10).await.unwrap();
        assert_eq!(
            open.iter()
                .map(|r| (r.key.as_str(), r.answered))
                .collect::<Vec<_>>(),
            vec![("k-over", Some(200))],
            "{b}: listed, with the status it answered"
        );
        for _ in 0..2 {
            let again = send(&client, &url, Some("k-over"), "-", &body).await;
            assert_eq!(
                (again.status, again.code().as_deref()),
                (503, Some("idempotency_outcome_unknown")),
                "{b}"
            );
        }
        assert_eq!(charger.runs("k-over"), 1, "{b}");
        pool.close().await;
        db.drop_database().await;
    }
}

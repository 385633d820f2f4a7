//! The idempotency record protocol on every backend: claims, the owner-token fence, the
//! answers of each state, mode 1, recovery of an expired claim, retention.

use std::sync::Arc;
use std::time::Duration;

use idem_participant::idempotency::{
    BoxFuture, Claim, ExpiredClaim, IdempotencyError, IdempotencyStore, LocalOutcome, Recovery,
    RecoveryHook, Status, StoredResult, create_idempotency_tables, purge_idempotency,
};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{ManualClock, ParticipantError, SharedClock};
use sqlx::{AnyPool, Row};

const T0: i64 = 1_900_000_000_000;

async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
    create_idempotency_tables(&pool)
        .await
        .expect("idempotency table");
    // Idempotent DDL: a second run changes nothing.
    create_idempotency_tables(&pool)
        .await
        .expect("idempotency table again");
    sqlx::query("CREATE TABLE counters (name VARCHAR(64) PRIMARY KEY, value BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .expect("counters");
    sqlx::query("INSERT INTO counters (name, value) VALUES ('c', 0)")
        .execute(&pool)
        .await
        .expect("seed");
    pool
}

async fn counter(pool: &AnyPool) -> i64 {
    sqlx::query("SELECT value FROM counters WHERE name = 'c'")
        .fetch_one(pool)
        .await
        .expect("counter")
        .get::<i64, _>(0)
}

fn store(pool: &AnyPool, clock: &ManualClock) -> IdempotencyStore<sqlx::Any> {
    let shared: SharedClock = Arc::new(clock.clone());
    IdempotencyStore::new(pool.clone())
        .with_clock(shared)
        .with_lease(Duration::from_secs(10))
}

fn hash(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn acquired(claim: Claim) -> idem_participant::idempotency::Ticket {
    match claim {
        Claim::Acquired(t) => t,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn expired(claim: Claim) -> ExpiredClaim {
    match claim {
        Claim::Expired(e) => e,
        other => panic!("expected Expired, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_cannot_overwrite_a_newer_one() {
    for db in testing::all("a_stale_owner_cannot_overwrite_a_newer_one").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(T0);
        let s = store(&pool, &clock);
        let b = db.backend;

        // Takeover after "not happened": the first owner's late completion is refused.
        let first = acquired(s.claim("t:pay", "k1", &hash(1)).await.unwrap());
        assert_eq!(first.attempt, 1);
        assert!(
            matches!(
                s.claim("t:pay", "k1", &hash(1)).await.unwrap(),
                Claim::InProgress { retry_after } if retry_after == Duration::from_secs(10)
            ),
            "{b}: a live lease answers in progress"
        );
        clock.advance(10_001);
        let e = expired(s.claim("t:pay", "k1", &hash(1)).await.unwrap());
        assert_eq!(e.owner_token, first.owner_token, "{b}");
        let second = acquired(s.resolve_expired(&e, Recovery::NotHappened).await.unwrap());
        assert_ne!(second.owner_token, first.owner_token, "{b}");
        assert_eq!(second.attempt, 2, "{b}");
        // A second repeat racing with the same expired view loses: the row moved on.
        assert!(
            matches!(
                s.resolve_expired(&e, Recovery::NotHappened).await.unwrap(),
                Claim::InProgress { .. }
            ),
            "{b}: only one takeover per expired claim"
        );
        let late = s.complete(&first, StoredResult::new(201, "stale")).await;
        assert!(
            matches!(late, Err(IdempotencyError::StaleOwner { .. })),
            "{b}: {late:?}"
        );
        let late = s.fail_final(&first, StoredResult::new(400, "stale")).await;
        assert!(
            matches!(late, Err(IdempotencyError::StaleOwner { .. })),
            "{b}: {late:?}"
        );
        s.complete(&second, StoredResult::new(201, "fresh"))
            .await
            .unwrap();
        // Completing twice with the same ticket is fine; a stale one still is not.
        s.complete(&second, StoredResult::new(201, "fresh"))
            .await
            .unwrap();
        assert!(
            s.complete(&first, StoredResult::new(201, "stale"))
                .await
                .is_err()
        );
        assert_eq!(
            s.claim("t:pay", "k1", &hash(1)).await.unwrap(),
            Claim::Replay(StoredResult::new(201, "fresh")),
            "{b}"
        );

        // Recovery that found the effect: recorded under a new token, the old owner refused.
        let owner = acquired(s.claim("t:pay", "k2", &hash(2)).await.unwrap());
        clock.advance(10_001);
        let e = expired(s.claim("t:pay", "k2", &hash(2)).await.unwrap());
        let found = StoredResult::new(201, "from the provider");
        assert_eq!(
            s.resolve_expired(&e, Recovery::Succeeded(found.clone()))
                .await
                .unwrap(),
            Claim::Replay(found.clone()),
            "{b}"
        );
        assert!(
            s.complete(&owner, StoredResult::new(201, "late"))
                .await
                .is_err(),
            "{b}"
        );
        assert_eq!(
            s.claim("t:pay", "k2", &hash(2)).await.unwrap(),
            Claim::Replay(found),
            "{b}"
        );

        // Unknown keeps PROCESSING: the next repeat asks again.
        let _owner = acquired(s.claim("t:pay", "k3", &hash(3)).await.unwrap());
        clock.advance(10_001);
        let e = expired(s.claim("t:pay", "k3", &hash(3)).await.unwrap());
        assert_eq!(
            s.resolve_expired(&e, Recovery::Unknown).await.unwrap(),
            Claim::Expired(e.clone())
        );
        assert_eq!(
            s.lookup("t:pay", "k3").await.unwrap(),
            Some((Status::Processing, 1)),
            "{b}"
        );
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_state_answers_a_repeat_as_the_seed_says() {
    for db in testing::all("each_state_answers_a_repeat_as_the_seed_says").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(T0);
        let s = store(&pool, &clock);
        let b = db.backend;

        let t = acquired(s.claim("t:op", "final", &hash(1)).await.unwrap());
        let failure = StoredResult {
            status: 422,
            headers: vec![("content-type".into(), "application/json".into())],
            body: r#"{"error":"bad"}"#.into(),
            resource_id: None,
        };
        s.fail_final(&t, failure.clone()).await.unwrap();
        assert_eq!(
            s.claim("t:op", "final", &hash(1)).await.unwrap(),
            Claim::FailedFinal(failure),
            "{b}"
        );
        assert_eq!(
            s.claim("t:op", "final", &hash(9)).await.unwrap(),
            Claim::Conflict,
            "{b}"
        );

        let t1 = acquired(s.claim("t:op", "retry", &hash(2)).await.unwrap());
        s.fail_retryable(&t1).await.unwrap();
        let t2 = acquired(s.claim("t:op", "retry", &hash(2)).await.unwrap());
        assert_ne!(
            t1.owner_token, t2.owner_token,
            "{b}: re-acquired under a new token"
        );
        assert_eq!(t2.attempt, 2, "{b}");
        assert!(
            s.complete(&t1, StoredResult::new(200, "old"))
                .await
                .is_err(),
            "{b}"
        );
        let done = StoredResult {
            resource_id: Some("order-7".into()),
            ..StoredResult::new(201, "ok")
        };
        s.complete(&t2, done.clone()).await.unwrap();
        assert_eq!(
            s.claim("t:op", "retry", &hash(2)).await.unwrap(),
            Claim::Replay(done),
            "{b}"
        );
        assert_eq!(
            s.lookup("t:op", "retry").await.unwrap(),
            Some((Status::Succeeded, 2))
        );

        // Another scope (tenant) is another record.
        assert!(matches!(
            s.claim("u:op", "retry", &hash(5)).await.unwrap(),
            Claim::Acquired(_)
        ));

        // Bad input is refused before any write, with a stable code.
        for (scope, key, h, code) in [
            ("t:op", "", hash(1), "invalid_idempotency_key"),
            ("t:op", "has space", hash(1), "invalid_idempotency_key"),
            (
                "t:op",
                &*"k".repeat(129),
                hash(1),
                "invalid_idempotency_key",
            ),
            (&*"s".repeat(129), "k", hash(1), "invalid_scope"),
            ("t:op", "k", "abc".to_owned(), "invalid_request_hash"),
        ] {
            match s.claim(scope, key, &h).await {
                Err(IdempotencyError::Invalid { code: c, .. }) => assert_eq!(c, code, "{b}"),
                other => panic!("{b}: expected {code}, got {other:?}"),
            }
        }
        // A body over the bound is refused at store time, nothing written: it could not
        // be replayed whole.
        let bounded = s.clone().with_max_result_body(1000);
        let t = acquired(bounded.claim("t:op", "big", &hash(3)).await.unwrap());
        let big = StoredResult::new(200, vec![7u8; 1001]);
        assert!(matches!(
            bounded.complete(&t, big).await,
            Err(IdempotencyError::Invalid {
                code: "result_too_large",
                ..
            })
        ));
        assert_eq!(
            bounded.lookup("t:op", "big").await.unwrap(),
            Some((Status::Processing, 1)),
            "{b}"
        );
        let exact = StoredResult::new(200, vec![7u8; 1000]);
        bounded.complete(&t, exact.clone()).await.unwrap();
        assert_eq!(
            bounded.claim("t:op", "big", &hash(3)).await.unwrap(),
            Claim::Replay(exact),
            "{b}"
        );
        db.drop_database().await;
    }
}

async fn bump(
    tx: idem_participant::LocalTx<'static, sqlx::Any>,
) -> Result<StoredResult, ParticipantError> {
    sqlx::query(tx.sql("UPDATE counters SET value = value + 1 WHERE name = 'c'"))
        .execute(&mut *tx.conn())
        .await?;
    Ok(StoredResult::new(201, uuid::Uuid::new_v4().to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_1_commits_the_record_with_the_business_change_or_neither() {
    for db in testing::all("mode_1_commits_the_record_with_the_business_change_or_neither").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(T0);
        let s = store(&pool, &clock);
        let b = db.backend;

        let failed = s
            .run_local("t:op", "m1", &hash(1), |tx| async move {
                bump(tx).await?;
                Err::<StoredResult, _>(ParticipantError::transient("down"))
            })
            .await;
        assert!(failed.is_err(), "{b}");
        assert_eq!(counter(&pool).await, 0, "{b}: rolled back");
        assert_eq!(
            s.lookup("t:op", "m1").await.unwrap(),
            None,
            "{b}: no record left"
        );

        let mut tasks = Vec::new();
        for _ in 0..20 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.run_local("t:op", "m1", &hash(1), bump).await.unwrap()
            }));
        }
        let mut first = Vec::new();
        let mut replays = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                LocalOutcome::First(r) => first.push(r),
                LocalOutcome::Repeat(Claim::Replay(r)) => replays.push(r),
                other => panic!("{b}: {other:?}"),
            }
        }
        assert_eq!(first.len(), 1, "{b}: one run");
        assert_eq!(counter(&pool).await, 1, "{b}: one business effect");
        assert!(
            replays.iter().all(|r| *r == first[0]),
            "{b}: every repeat gets the first result"
        );
        assert_eq!(
            s.run_local("t:op", "m1", &hash(2), bump).await.unwrap(),
            LocalOutcome::Repeat(Claim::Conflict),
            "{b}"
        );
        assert_eq!(counter(&pool).await, 1, "{b}");
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_processing_and_young_records() {
    for db in testing::all("retention_keeps_processing_and_young_records").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(T0);
        let s = store(&pool, &clock);
        let shared: SharedClock = Arc::new(clock.clone());
        let b = db.backend;
        for i in 0..5 {
            let t = acquired(s.claim("t:op", &format!("old{i}"), &hash(1)).await.unwrap());
            s.complete(&t, StoredResult::new(201, "ok")).await.unwrap();
        }
        let t = acquired(s.claim("t:op", "old-final", &hash(1)).await.unwrap());
        s.fail_final(&t, StoredResult::new(400, "no"))
            .await
            .unwrap();
        // An old PROCESSING record (its lease long expired) waits for recovery: never purged.
        let _stuck = acquired(s.claim("t:op", "stuck", &hash(1)).await.unwrap());
        clock.advance(3 * 3600 * 1000);
        let t = acquired(s.claim("t:op", "young", &hash(1)).await.unwrap());
        s.complete(&t, StoredResult::new(201, "ok")).await.unwrap();
        let _live = acquired(s.claim("t:op", "live", &hash(1)).await.unwrap());

        assert!(matches!(
            purge_idempotency(&pool, Duration::from_secs(60), 2, &shared).await,
            Err(IdempotencyError::Invalid {
                code: "retention_too_short",
                ..
            })
        ));
        let deleted = purge_idempotency(&pool, Duration::from_secs(2 * 3600), 2, &shared)
            .await
            .unwrap();
        assert_eq!(
            deleted, 6,
            "{b}: the six old terminal records, in batches of two"
        );
        for key in ["stuck", "young", "live"] {
            assert!(
                s.lookup("t:op", key).await.unwrap().is_some(),
                "{b}: {key} kept"
            );
        }
        assert_eq!(s.lookup("t:op", "old0").await.unwrap(), None, "{b}");
        db.drop_database().await;
    }
}

/// A fact source that found the effect, with an answer too large to record.
struct Oversized;

impl RecoveryHook for Oversized {
    fn recover<'a>(&'a self, _: &'a ExpiredClaim) -> BoxFuture<'a, Recovery> {
        Box::pin(async { Recovery::Succeeded(StoredResult::new(201, vec![1u8; 2048])) })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verdict_the_record_cannot_hold_leaves_the_outcome_unknown() {
    for db in testing::all("a_verdict_the_record_cannot_hold").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(T0);
        let s = store(&pool, &clock).with_max_result_body(1024);
        let b = db.backend;
        let t = acquired(s.claim("t:pay", "k", &hash(1)).await.unwrap());
        s.mark_unknown(&t, Some(504)).await.unwrap();
        let e = expired(
            s.claim_with_recovery("t:pay", "k", &hash(1), &Oversized)
                .await
                .unwrap(),
        );
        assert_eq!(
            (e.status, e.answered, e.owner_token.clone()),
            (Status::Unknown, Some(504), t.owner_token),
            "{b}: still unknown, never a client error"
        );
        assert!(matches!(
            s.settle(&e, Oversized.recover(&e).await).await,
            Err(IdempotencyError::Invalid {
                code: "result_too_large",
                ..
            })
        ));
        assert_eq!(
            s.lookup("t:pay", "k").await.unwrap(),
            Some((Status::Unknown, 1)),
            "{b}: nothing written"
        );
        db.drop_database().await;
    }
}

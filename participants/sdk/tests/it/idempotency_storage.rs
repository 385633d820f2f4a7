//! The idempotency table on every backend: leases judged on the database's clock, a table
//! made by an older SDK still answering after the upgrade, and the backlog gauges.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_participant::idempotency::{
    Backlog, Claim, IdempotencyStore, PROCESSING_GAUGE, PROCESSING_OLDEST_GAUGE, Recovery, Settler,
    StoredResult, UNKNOWN_GAUGE, create_idempotency_tables,
};
use idem_participant::testing::{self, Backend, TestDatabase};
use idem_participant::{ManualClock, SharedClock, split_sql_script};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Row};

use crate::kit_support::keys;
use crate::kit_support::recorder;
use keys::{db_now, lease_until};

fn hash(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

async fn connect(db: &TestDatabase) -> AnyPool {
    idem_participant::connect(&db.url, 8)
        .await
        .expect("connect")
}

/// A MariaDB pool whose sessions' clock is `shift_s` seconds off the server's
/// (`SET timestamp`, which `UTC_TIMESTAMP` follows): an instance on it reads another time
/// from the same database.
async fn shifted_mysql_pool(url: &str, shift_s: i64) -> AnyPool {
    AnyPoolOptions::new()
        .max_connections(1)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                let sql = format!("SET timestamp = UNIX_TIMESTAMP() + ({shift_s})");
                sqlx::query(sqlx::AssertSqlSafe(sql)).execute(conn).await?;
                Ok(())
            })
        })
        .connect(url)
        .await
        .expect("connect with a shifted session clock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_judged_on_the_database_clock() {
    for db in testing::all("leases_on_the_database_clock").await {
        let b = db.backend;
        let pool = connect(&db).await;
        create_idempotency_tables(&pool).await.unwrap();
        let store = IdempotencyStore::new(pool.clone()).with_lease(Duration::from_secs(1));

        assert!(matches!(
            store.claim("t:op", "k1", &hash(1)).await.unwrap(),
            Claim::Acquired(_)
        ));
        let until = lease_until(&pool, b, "k1").await;
        let now = db_now(&pool, b).await;
        assert!(
            (1..=1000).contains(&(until - now)),
            "{b}: the lease is a second from the database's now ({until} - {now})"
        );
        match store.claim("t:op", "k1", &hash(1)).await.unwrap() {
            Claim::InProgress { retry_after } => {
                assert!(
                    retry_after <= Duration::from_secs(1),
                    "{b}: {retry_after:?}"
                )
            }
            other => panic!("{b}: a live lease is in progress: {other:?}"),
        }
        // Wait on the database's clock: the claim expires when it says so.
        let deadline = Instant::now() + Duration::from_secs(10);
        while db_now(&pool, b).await < until {
            assert!(Instant::now() < deadline, "{b}: the database's clock moves");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match store.claim("t:op", "k1", &hash(1)).await.unwrap() {
            Claim::Expired(e) => assert_eq!(e.lease_until_ms, Some(until), "{b}"),
            other => panic!("{b}: the database's clock passed the lease: {other:?}"),
        }

        // MariaDB can shift one session's clock: two instances on one server, one whose
        // database session reads an hour later, one an hour earlier, and the same wall
        // clock in this process. What each judges follows its database clock.
        if b == Backend::Mysql {
            let ahead = IdempotencyStore::new(shifted_mysql_pool(&db.url, 3600).await);
            let behind = IdempotencyStore::new(shifted_mysql_pool(&db.url, -3600).await);
            let live = store.clone().with_lease(Duration::from_secs(60));
            assert!(matches!(
                live.claim("t:op", "k2", &hash(2)).await.unwrap(),
                Claim::Acquired(_)
            ));
            assert!(
                matches!(
                    store.claim("t:op", "k2", &hash(2)).await.unwrap(),
                    Claim::InProgress { .. }
                ),
                "{b}"
            );
            assert!(
                matches!(
                    ahead.claim("t:op", "k2", &hash(2)).await.unwrap(),
                    Claim::Expired(_)
                ),
                "{b}: an hour later by its database clock, the lease is over"
            );
            // And the other way: expired by the server's clock, live an hour earlier.
            assert!(matches!(
                store
                    .clone()
                    .with_lease(Duration::from_millis(1))
                    .claim("t:op", "k3", &hash(3))
                    .await
                    .unwrap(),
                Claim::Acquired(_)
            ));
            let until = lease_until(&pool, b, "k3").await;
            while db_now(&pool, b).await < until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(
                matches!(
                    store.claim("t:op", "k3", &hash(3)).await.unwrap(),
                    Claim::Expired(_)
                ),
                "{b}"
            );
            assert!(
                matches!(
                    behind.claim("t:op", "k3", &hash(3)).await.unwrap(),
                    Claim::InProgress { .. }
                ),
                "{b}: an hour earlier by its database clock, the lease is live"
            );
            ahead.pool().close().await;
            behind.pool().close().await;
        }
        pool.close().await;
        db.drop_database().await;
    }
}

/// The table as an older SDK created it, with rows it wrote.
async fn old_table(pool: &AnyPool, backend: Backend) {
    let ddl = match backend {
        Backend::Sqlite => include_str!("fixtures/idempotency_v1.sqlite.sql"),
        Backend::Postgres => include_str!("fixtures/idempotency_v1.postgres.sql"),
        Backend::Mysql => include_str!("fixtures/idempotency_v1.mysql.sql"),
    };
    for statement in split_sql_script(ddl) {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await
            .expect("the old DDL");
    }
    for (key, status, result_status, body, lease) in [
        (
            "old-ok",
            "SUCCEEDED",
            Some(201_i64),
            Some(r#"{"id":"o-1"}"#),
            None,
        ),
        (
            "old-final",
            "FAILED_FINAL",
            Some(422),
            Some("declined"),
            None,
        ),
        ("old-crashed", "PROCESSING", None, None, Some(1_000_i64)),
    ] {
        sqlx::query(backend.sql(
            "INSERT INTO idem_idempotency (scope, idem_key, request_hash, status, owner_token, \
             lease_until_ms, result_status, result_headers, result_body, resource_id, attempts, \
             version, created_at_ms, updated_at_ms) \
             VALUES ('t:op', ?, ?, ?, ?, ?, ?, ?, ?, NULL, 1, 2, 1000, 1000)",
        ))
        .bind(key)
        .bind(hash(9))
        .bind(status)
        .bind("0".repeat(32))
        .bind(lease)
        .bind(result_status)
        .bind(result_status.map(|_| r#"[["content-type","application/json"]]"#))
        .bind(body)
        .execute(pool)
        .await
        .expect("an old row");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_made_by_an_older_sdk_keeps_answering_after_the_upgrade() {
    for db in testing::all("idempotency_table_upgrade").await {
        let b = db.backend;
        let pool = connect(&db).await;
        old_table(&pool, b).await;
        // The new SDK at start, twice (every instance runs it; the step is idempotent).
        create_idempotency_tables(&pool).await.expect("upgrade");
        create_idempotency_tables(&pool)
            .await
            .expect("upgrade again");
        let store = IdempotencyStore::new(pool.clone());

        let kept = vec![("content-type".to_owned(), "application/json".to_owned())];
        assert_eq!(
            store.claim("t:op", "old-ok", &hash(9)).await.unwrap(),
            Claim::Replay(StoredResult {
                headers: kept.clone(),
                ..StoredResult::new(201, r#"{"id":"o-1"}"#)
            }),
            "{b}: an old answer replays as it was"
        );
        assert_eq!(
            store.claim("t:op", "old-final", &hash(9)).await.unwrap(),
            Claim::FailedFinal(StoredResult {
                headers: kept,
                ..StoredResult::new(422, "declined")
            }),
            "{b}"
        );
        let Claim::Expired(crashed) = store.claim("t:op", "old-crashed", &hash(9)).await.unwrap()
        else {
            panic!("{b}: an old expired claim is recovered as before");
        };
        let found = StoredResult::new(201, vec![0xff, 0, 0xfe]);
        assert_eq!(
            store
                .resolve_expired(&crashed, Recovery::Succeeded(found.clone()))
                .await
                .unwrap(),
            Claim::Replay(found.clone()),
            "{b}"
        );
        assert_eq!(
            store.claim("t:op", "old-crashed", &hash(9)).await.unwrap(),
            Claim::Replay(found),
            "{b}: a binary body in the upgraded table"
        );

        // A text answer written now is still where an older SDK reads it (a rolling
        // upgrade: old and new instances share the table for a while).
        let Claim::Acquired(t) = store.claim("t:op", "new-ok", &hash(1)).await.unwrap() else {
            panic!("{b}: a new claim");
        };
        store
            .complete(&t, StoredResult::new(201, r#"{"id":"o-2"}"#))
            .await
            .unwrap();
        let old_read: String = sqlx::query(
            b.sql("SELECT result_body FROM idem_idempotency WHERE idem_key = 'new-ok'"),
        )
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
        assert_eq!(old_read, r#"{"id":"o-2"}"#, "{b}");
        pool.close().await;
        db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_gauges_count_processing_its_oldest_age_and_unknown() {
    if !testing::in_own_process(
        "idempotency_storage::the_backlog_gauges_count_processing_its_oldest_age_and_unknown",
    ) {
        return;
    }
    let snapshotter = recorder::snapshotter(idem_participant::metrics::describe_metrics);
    for db in testing::all("idempotency_backlog_gauges").await {
        let b = db.backend;
        let pool = connect(&db).await;
        create_idempotency_tables(&pool).await.unwrap();
        let clock = ManualClock::at(1_900_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        let store = IdempotencyStore::new(pool.clone()).with_clock(shared);
        let claim = |key: &'static str| {
            let store = store.clone();
            async move {
                match store.claim("t:gauged", key, &hash(1)).await.unwrap() {
                    Claim::Acquired(t) => t,
                    other => panic!("{other:?}"),
                }
            }
        };
        let _ = recorder::counters(snapshotter);
        let first = claim("a").await;
        clock.advance(5_000);
        let _second = claim("b").await;
        let third = claim("c").await;
        store.mark_unknown(&third, Some(502)).await.unwrap();
        clock.advance(2_000);
        let counters = recorder::counters(snapshotter);
        assert_eq!(
            recorder::counter_value(
                &counters,
                "idem_participant_idempotency_total",
                &[("operation", "gauged"), ("outcome", "ended_unknown")]
            ),
            1,
            "{b}"
        );

        let expected = Backlog {
            processing: 2,
            oldest_processing: Duration::from_secs(7),
            unknown: 1,
        };
        assert_eq!(store.backlog().await.unwrap(), expected, "{b}");
        let gauges = || {
            let seen = recorder::gauges(snapshotter);
            [PROCESSING_GAUGE, PROCESSING_OLDEST_GAUGE, UNKNOWN_GAUGE].map(|g| seen.get(g).copied())
        };
        assert_eq!(gauges(), [Some(2.0), Some(7.0), Some(1.0)], "{b}");

        store
            .complete(&first, StoredResult::new(201, "ok"))
            .await
            .unwrap();
        // The settler keeps them current on its own, hook or not.
        let settler = Settler::new(store.clone())
            .every(Duration::from_millis(10))
            .spawn();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let seen = gauges();
            if seen == [Some(1.0), Some(2.0), Some(1.0)] {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{b}: the settler sets the gauges: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        settler.stop().await;
        pool.close().await;
        db.drop_database().await;
    }
}

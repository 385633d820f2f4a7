//! What the barrier test files share: a database with a counter, the business step that
//! bumps it, and the barriers and gids the tests use.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::hash::{BuildHasher, Hasher};

use idem_participant::testing::TestDatabase;
use idem_participant::{Barrier, Op, ParticipantError, StepTx, TransType, create_barrier_table};
use sqlx::{Any, AnyPool, Row};

pub async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
    create_barrier_table(&pool).await.expect("barrier table");
    sqlx::query("CREATE TABLE counters (name VARCHAR(64) PRIMARY KEY, value BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .expect("counters table");
    sqlx::query("INSERT INTO counters (name, value) VALUES ('c', 0)")
        .execute(&pool)
        .await
        .expect("seed counter");
    pool
}

pub async fn counter(pool: &AnyPool) -> i64 {
    sqlx::query("SELECT value FROM counters WHERE name = 'c'")
        .fetch_one(pool)
        .await
        .expect("read counter")
        .get::<i64, _>(0)
}

/// The business step of these tests: add `delta` to the counter, return a random token so
/// that a duplicate provably gets the first call's result and not a fresh one.
pub async fn bump(tx: &StepTx<'_, Any>, delta: i64) -> Result<u64, ParticipantError> {
    sqlx::query(tx.sql("UPDATE counters SET value = value + ? WHERE name = ?"))
        .bind(delta)
        .bind("c")
        .execute(&mut *tx.conn())
        .await?;
    Ok(std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish())
}

pub fn tcc(gid: &str, op: Op) -> Barrier {
    Barrier::new(TransType::Tcc, gid, "01", op).unwrap()
}

pub fn gid(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Makes the barrier rows of `gid` `days` old: the purge judges rows by `created_at`.
// Used by the purge tests only; each test file compiles this module on its own.
#[allow(dead_code)]
pub async fn age_rows(pool: &AnyPool, db: &TestDatabase, gid: &str, days: u32) {
    use idem_participant::testing::Backend;
    let old = match db.backend {
        Backend::Sqlite => format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{days} days')"),
        Backend::Postgres => format!("now() - interval '{days} days'"),
        Backend::Mysql => format!("NOW(3) - INTERVAL {days} DAY"),
    };
    sqlx::query(db.backend.sql(&format!(
        "UPDATE idem_barrier SET created_at = {old} WHERE gid = ?"
    )))
    .bind(gid.to_owned())
    .execute(pool)
    .await
    .expect("age the rows");
}

//! What the barrier test files share: a database with a counter, the business step that
//! bumps it, and the barriers and gids the tests use.

use std::hash::{BuildHasher, Hasher};

use idem_participant::testing::TestDatabase;
use idem_participant::{Barrier, Op, ParticipantError, StepTx, TransType, create_barrier_table};
use sqlx::{Any, AnyPool, Row};

pub async fn setup(db: &TestDatabase) -> AnyPool {
    let pool = with_counter(db).await;
    create_barrier_table(&pool).await.expect("barrier table");
    pool
}

/// A pool on `db` with the counter but no barrier table yet.
pub async fn with_counter(db: &TestDatabase) -> AnyPool {
    let pool = idem_participant::connect(&db.url, 8)
        .await
        .expect("connect");
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

/// Creates barrier table `table` as an older SDK did, from that SDK's own DDL file: `1`,
/// before lease mode (git b0dca79), or `2`, before tenants (git e5711f6).
pub async fn create_old_barrier(pool: &AnyPool, db: &TestDatabase, version: u8, table: &str) {
    use idem_participant::testing::Backend;
    let script = match (version, db.backend) {
        (1, Backend::Sqlite) => include_str!("../fixtures/barrier_v1.sqlite.sql"),
        (1, Backend::Postgres) => include_str!("../fixtures/barrier_v1.postgres.sql"),
        (1, Backend::Mysql) => include_str!("../fixtures/barrier_v1.mysql.sql"),
        (2, Backend::Sqlite) => include_str!("../fixtures/barrier_v2.sqlite.sql"),
        (2, Backend::Postgres) => include_str!("../fixtures/barrier_v2.postgres.sql"),
        (2, Backend::Mysql) => include_str!("../fixtures/barrier_v2.mysql.sql"),
        _ => panic!("no barrier table version {version}"),
    };
    for statement in idem_participant::split_sql_script(script) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(
            statement.replace("idem_barrier", table),
        ))
        .execute(pool)
        .await
        .expect("old barrier DDL");
    }
}

/// Writes a TCC row of branch `01` as an SDK before tenants did (no tenant column).
pub async fn insert_old_row(
    pool: &AnyPool,
    db: &TestDatabase,
    table: &str,
    gid: &str,
    (op, reason, outcome): (&str, &str, &str),
    result: Option<&str>,
) {
    let sql = format!(
        "INSERT INTO {table} (trans_type, gid, branch_id, op, barrier_id, reason, outcome, result) \
         VALUES ('tcc', ?, '01', ?, '01', ?, ?, ?)"
    );
    sqlx::query(db.backend.sql(&sql))
        .bind(gid.to_owned())
        .bind(op.to_owned())
        .bind(reason.to_owned())
        .bind(outcome.to_owned())
        .bind(result.map(str::to_owned))
        .execute(pool)
        .await
        .expect("old row");
}

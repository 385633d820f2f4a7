//! PostgreSQL: a coordinator starting on tables that hold rows but were never analyzed
//! analyzes them, so the writers' generic plans are made with statistics. Without them a
//! plan made on a few hundred rows looked gids up through `idem_global_created` instead of
//! the primary key, and kept doing so as the table grew (docs/bench/issue-17.md).

use crate::common;

use idem_core::*;
use sqlx::Connection;

const T0: Millis = 1_700_000_000_000;

fn saga(gid: &str) -> Transaction {
    let step = SagaStep {
        action: "http://p/0/a".into(),
        compensate: "http://p/0/c".into(),
        payload: "{}".into(),
    };
    Transaction::saga(gid, vec![step], TxOptions::default(), T0)
}

async fn last_manual_analyze(conn: &mut sqlx::PgConnection) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT extract(epoch FROM last_analyze)::bigint FROM pg_stat_user_tables \
         WHERE relname = 'idem_global' AND schemaname = current_schema()",
    )
    .fetch_one(conn)
    .await
    .expect("pg_stat_user_tables answers")
}

#[tokio::test]
async fn tables_with_rows_and_no_statistics_are_analyzed_when_a_coordinator_starts() {
    let dbs = common::stores("pg_statistics").await;
    let mut checked = false;
    for (db, store) in &dbs {
        if !db.url.starts_with("postgres") {
            continue;
        }
        checked = true;
        // A few rows: far below autovacuum's threshold, so only idem can analyze them.
        for i in 0..3 {
            store
                .create(&saga(&format!("s{i}")), "h", None)
                .await
                .unwrap();
        }
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        assert_eq!(
            last_manual_analyze(&mut conn).await,
            None,
            "not analyzed yet"
        );
        // What `idem serve` does at start.
        store.migrate().await.unwrap();
        assert!(
            last_manual_analyze(&mut conn).await.is_some(),
            "the start analyzed idem_global"
        );
    }
    assert!(checked, "no PostgreSQL database to check");
    common::cleanup(dbs).await;
}

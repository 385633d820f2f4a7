//! Upgrading a barrier table an older SDK made (issue 28, point 4), on every backend: from
//! the DDL of the SDK before lease mode and of the one before tenants, `create_barrier_table`
//! upgrades in place; the old rows become the default tenant's and still answer their
//! repeats; the table ends as a fresh one is; replicas upgrading at once all succeed; a
//! table whose old key cannot be removed stops the start instead of sharing rows.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{bump, counter, create_old_barrier, gid, insert_old_row, tcc, with_counter};
use idem_participant::testing::{self, Backend, TestDatabase};
use idem_participant::{
    Op, Outcome, barrier_records, create_barrier_table, create_barrier_table_named,
    upgrade_barrier_table,
};
use sqlx::AnyPool;

async fn done(db: TestDatabase, pool: AnyPool) {
    pool.close().await;
    db.drop_database().await;
}

/// Each column of `table` as the catalog describes it (name, type, size, nullability,
/// default), one text per column, by name.
async fn columns(pool: &AnyPool, backend: Backend, table: &str) -> Vec<String> {
    let sql = match backend {
        Backend::Sqlite => {
            "SELECT name || ' ' || type || ' ' || \"notnull\" || ' ' || COALESCE(dflt_value, '') \
             || ' ' || pk FROM pragma_table_info(?) ORDER BY name"
        }
        Backend::Postgres => {
            "SELECT CAST(column_name AS text) || ' ' || CAST(data_type AS text) || ' ' || \
             COALESCE(CAST(character_maximum_length AS text), '') || ' ' || \
             CAST(is_nullable AS text) || ' ' || COALESCE(CAST(column_default AS text), '') \
             FROM information_schema.columns WHERE table_schema = current_schema() \
             AND table_name = ? ORDER BY column_name"
        }
        Backend::Mysql => {
            "SELECT CONCAT_WS(' ', column_name, column_type, is_nullable, \
             COALESCE(column_default, ''), COALESCE(collation_name, '')) \
             FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = ? ORDER BY column_name"
        }
    };
    sqlx::query_scalar::<_, String>(backend.sql(sql))
        .bind(table.to_owned())
        .fetch_all(pool)
        .await
        .expect("describe the table")
}

async fn rows(pool: &AnyPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idem_barrier")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// From each older shape: the rows an old SDK wrote answer as before in the default tenant
/// (a duplicate Try, a guard that rejects a late Try, a Try a Confirm now finds), another
/// tenant's same gid is its own, and the table is what a fresh one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_table_is_upgraded_in_place_and_its_rows_stay_the_default_tenants() {
    for version in [1, 2] {
        for db in testing::all(&format!("barrier_upgrade_v{version}")).await {
            let name = format!("{} from v{version}", db.backend.name());
            let pool = with_counter(&db).await;
            create_old_barrier(&pool, &db, version, "idem_barrier").await;
            let (g1, g2, g3) = (gid("done"), gid("guarded"), gid("tried"));
            let table = "idem_barrier";
            insert_old_row(
                &pool,
                &db,
                table,
                &g1,
                ("try", "try", "executed"),
                Some("7"),
            )
            .await;
            let cancel = ("cancel", "cancel", "empty_rollback");
            insert_old_row(&pool, &db, table, &g2, cancel, None).await;
            let guard = ("try", "cancel", "guard");
            insert_old_row(&pool, &db, table, &g2, guard, None).await;
            insert_old_row(
                &pool,
                &db,
                table,
                &g3,
                ("try", "try", "executed"),
                Some("8"),
            )
            .await;

            // The new SDK's start.
            create_barrier_table(&pool).await.expect(&name);

            let run = |g: &str, tenant: &str, op: Op| {
                let barrier = tcc(g, op).with_tenant(tenant).unwrap();
                let pool = pool.clone();
                async move {
                    barrier
                        .run(&pool, |tx| async move {
                            bump(&tx, 1).await?;
                            Ok(1_u64)
                        })
                        .await
                        .unwrap()
                }
            };
            assert_eq!(
                run(&g1, "default", Op::Try).await,
                Outcome::Duplicate(7),
                "{name}"
            );
            assert_eq!(
                run(&g2, "default", Op::Try).await,
                Outcome::Rejected,
                "{name}"
            );
            assert_eq!(
                run(&g2, "default", Op::Cancel).await,
                Outcome::EmptyRollback,
                "{name}"
            );
            assert_eq!(counter(&pool).await, 0, "{name}: no repeat ran");
            assert_eq!(
                run(&g3, "default", Op::Confirm).await,
                Outcome::Executed(1),
                "{name}"
            );
            assert_eq!(
                run(&g1, "acme", Op::Try).await,
                Outcome::Executed(1),
                "{name}"
            );
            assert_eq!(counter(&pool).await, 2, "{name}");
            let tenants: Vec<_> = barrier_records(&pool, &g1)
                .await
                .unwrap()
                .into_iter()
                .map(|r| (r.tenant, r.result))
                .collect();
            assert_eq!(
                tenants,
                [
                    ("acme".to_owned(), Some("1".to_owned())),
                    ("default".to_owned(), Some("7".to_owned()))
                ],
                "{name}"
            );

            // Again, as every later start does: nothing changes.
            let before = rows(&pool).await;
            create_barrier_table(&pool).await.expect(&name);
            upgrade_barrier_table(&pool, "idem_barrier")
                .await
                .expect(&name);
            assert_eq!(rows(&pool).await, before, "{name}");

            create_barrier_table_named(&pool, "fresh_barrier")
                .await
                .unwrap();
            assert_eq!(
                columns(&pool, db.backend, "idem_barrier").await,
                columns(&pool, db.backend, "fresh_barrier").await,
                "{name}"
            );
            done(db, pool).await;
        }
    }
}

/// How many sessions of this test's database wait for a lock on the barrier table (for
/// its DDL), as the server reports it.
async fn waiting(pool: &AnyPool, backend: Backend) -> i64 {
    let sql = match backend {
        Backend::Postgres => {
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock'"
        }
        Backend::Mysql => {
            "SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() \
             AND state = 'Waiting for table metadata lock'"
        }
        Backend::Sqlite => unreachable!("SQLite shows no waiters"),
    };
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// Four replicas start at once on a table from before tenants. On PostgreSQL and
/// MariaDB a session holding the table keeps their DDL waiting until all four have read
/// the old shape and started upgrading, so all four really race; on SQLite they start
/// together and `BEGIN IMMEDIATE` orders them. All succeed, and the rows are there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_upgrading_at_once_all_succeed() {
    const REPLICAS: usize = 4;
    for db in testing::all("barrier_upgrade_race").await {
        let name = db.backend.name();
        let pool = with_counter(&db).await;
        create_old_barrier(&pool, &db, 2, "idem_barrier").await;
        let g = gid("old");
        let executed = ("try", "try", "executed");
        insert_old_row(&pool, &db, "idem_barrier", &g, executed, Some("7")).await;

        let mut holder = pool.begin().await.unwrap();
        let hold = match db.backend {
            Backend::Postgres => Some("LOCK TABLE idem_barrier IN SHARE MODE"),
            Backend::Mysql => Some("SELECT COUNT(*) FROM idem_barrier"),
            Backend::Sqlite => None,
        };
        if let Some(statement) = hold {
            sqlx::query(statement).execute(&mut *holder).await.unwrap();
        }
        let start = Arc::new(tokio::sync::Barrier::new(REPLICAS));
        let replicas: Vec<_> = (0..REPLICAS)
            .map(|_| {
                let (pool, start) = (pool.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    create_barrier_table(&pool).await
                })
            })
            .collect();
        if hold.is_some() {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while waiting(&pool, db.backend).await < REPLICAS as i64 {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{name}: the replicas never all waited on the table"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        holder.commit().await.unwrap();
        for replica in replicas {
            replica.await.unwrap().expect(name);
        }
        assert_eq!(rows(&pool).await, 1, "{name}");
        let repeat = tcc(&g, Op::Try)
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(repeat, Outcome::Duplicate(7), "{name}");
        done(db, pool).await;
    }
}

/// A unique key on the old columns left beside the new one (a hand-made index, a
/// half-applied manual upgrade) would make two tenants' same gid collide: the start fails,
/// naming it, and keeps failing until it is gone. The tenant rows already there stay their
/// tenants' (on SQLite the rebuild, which makes every row the default tenant's, must not run
/// again on a table that has the tenant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_keeping_a_key_without_the_tenant_stops_the_start() {
    for db in testing::all("barrier_upgrade_leftover_key").await {
        let name = db.backend.name();
        let pool = with_counter(&db).await;
        create_barrier_table(&pool).await.unwrap();
        let g = gid("kept");
        let acme = tcc(&g, Op::Try).with_tenant("acme").unwrap();
        acme.run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        sqlx::query(
            "CREATE UNIQUE INDEX legacy_key ON idem_barrier (gid, branch_id, op, barrier_id)",
        )
        .execute(&pool)
        .await
        .unwrap();
        for _ in 0..2 {
            let err = create_barrier_table(&pool).await.unwrap_err().to_string();
            assert!(
                err.contains("idem_barrier") && err.contains("without the tenant"),
                "{name}: {err}"
            );
        }
        let drop_index = match db.backend {
            Backend::Mysql => "DROP INDEX legacy_key ON idem_barrier",
            _ => "DROP INDEX legacy_key",
        };
        sqlx::query(drop_index).execute(&pool).await.unwrap();
        create_barrier_table(&pool).await.expect(name);
        let records = barrier_records(&pool, &g).await.unwrap();
        assert_eq!(records.len(), 1, "{name}");
        assert_eq!(records[0].tenant, "acme", "{name}");
        done(db, pool).await;
    }
}

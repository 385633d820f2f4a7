//! Migrations that let a rolling upgrade, and a rollback, keep running.
//!
//! During a rolling upgrade the new binary migrates the schema while old coordinators still
//! serve on it, and a rollback starts an old binary on a schema a newer one migrated. sqlx's
//! migrator refuses both: an applied migration it does not know is an error. Here a binary
//! starts on such a schema when every migration it does not know is recorded in
//! `idem_schema_compat` (written by the migration itself) with an oldest binary no newer than
//! this one; otherwise it refuses, naming the versions. The check and the migration run
//! under the migrator's lock, so a newer binary cannot migrate in between.

use std::collections::BTreeSet;

use sqlx::migrate::{Migrate, Migrator};
use sqlx::{Decode, Executor, IntoArguments, Pool, Type};

use super::StoreDatabase;
use crate::{Result, StoreError};

/// This binary's version, as migrations' `oldest_binary` is compared with it.
pub const BINARY_VERSION: &str = env!("CARGO_PKG_VERSION");

/// A migration this binary does not know, as recorded by the binary that applied it.
struct Unknown {
    version: i64,
    oldest_binary: Option<String>,
    applied_by: Option<String>,
}

/// Applies `migrator`'s migrations to the database, after checking that the ones already
/// applied which this binary does not know allow it to run.
pub(crate) async fn migrate<DB>(pool: &Pool<DB>, migrator: &'static Migrator) -> Result<()>
where
    DB: StoreDatabase,
    DB::Connection: Migrate,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> Option<String>: Decode<'r, DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + Type<DB>,
    usize: sqlx::ColumnIndex<DB::Row>,
{
    use sqlx::Row;
    let mut pooled = pool.acquire().await?;
    let conn: &mut DB::Connection = &mut pooled;
    conn.lock().await?;
    let locked = async {
        conn.ensure_migrations_table(&migrator.table_name).await?;
        let known: BTreeSet<i64> = migrator.iter().map(|m| m.version).collect();
        let unknown: Vec<i64> = conn
            .list_applied_migrations(&migrator.table_name)
            .await?
            .into_iter()
            .map(|m| m.version)
            .filter(|v| !known.contains(v))
            .collect();
        if !unknown.is_empty() {
            // The records of the migrations this binary does not know; none when the
            // table does not exist (then nothing says this binary may run).
            let exists: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(DB::BACKEND.rewrite(DB::TABLE_EXISTS)))
                    .bind("idem_schema_compat")
                    .fetch_one(&mut *conn)
                    .await?;
            let mut records = Vec::new();
            if exists != 0 {
                let rows = sqlx::query(
                    "SELECT version, oldest_binary, applied_by FROM idem_schema_compat",
                )
                .fetch_all(&mut *conn)
                .await?;
                for row in &rows {
                    records.push(Unknown {
                        version: row.try_get(0)?,
                        oldest_binary: row.try_get(1)?,
                        applied_by: row.try_get(2)?,
                    });
                }
            }
            for version in unknown {
                check(version, records.iter().find(|r| r.version == version))?;
            }
        }
        let mut run = Migrator {
            migrations: migrator.migrations.clone(),
            table_name: migrator.table_name.clone(),
            // Held above, around the check too.
            locking: false,
            ..Migrator::DEFAULT
        };
        run.set_ignore_missing(true);
        run.run_direct(None, &mut *conn, false).await?;
        let sql = DB::BACKEND
            .rewrite("UPDATE idem_schema_compat SET applied_by = ? WHERE applied_by IS NULL");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(BINARY_VERSION)
            .execute(&mut *conn)
            .await?;
        Ok::<(), StoreError>(())
    }
    .await;
    let unlocked = conn.unlock().await;
    locked?;
    unlocked?;
    Ok(())
}

/// Whether this binary may run on a schema holding migration `version`, which it does not
/// know.
fn check(version: i64, record: Option<&Unknown>) -> Result<()> {
    let Some(record) = record else {
        return Err(StoreError::SchemaUnknown {
            version,
            this: BINARY_VERSION.into(),
        });
    };
    let applied_by = record
        .applied_by
        .clone()
        .unwrap_or_else(|| "a newer idem".into());
    let needs = record.oldest_binary.clone().unwrap_or_default();
    let this = semver::Version::parse(BINARY_VERSION).expect("the crate's version is semver");
    match semver::Version::parse(&needs) {
        Ok(oldest) if oldest <= this => Ok(()),
        _ => Err(StoreError::SchemaTooNew {
            version,
            applied_by,
            needs,
            this: BINARY_VERSION.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(oldest: &str) -> Unknown {
        Unknown {
            version: 20990101000001,
            oldest_binary: Some(oldest.into()),
            applied_by: Some("9.1.0".into()),
        }
    }

    #[test]
    fn a_compatible_migration_lets_this_binary_run() {
        assert!(check(20990101000001, Some(&record("0.1.0"))).is_ok());
        assert!(check(20990101000001, Some(&record(BINARY_VERSION))).is_ok());
    }

    #[test]
    fn a_migration_that_needs_a_newer_binary_is_refused_with_both_versions() {
        let err = check(20990101000001, Some(&record("9.0.0"))).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("9.1.0"), "{text}");
        assert!(text.contains("9.0.0"), "{text}");
        assert!(text.contains(BINARY_VERSION), "{text}");
        assert!(text.contains("20990101000001"), "{text}");
    }

    #[test]
    fn a_migration_without_a_record_or_with_a_broken_one_is_refused() {
        assert!(matches!(
            check(20990101000001, None),
            Err(StoreError::SchemaUnknown { .. })
        ));
        assert!(matches!(
            check(20990101000001, Some(&record("not a version"))),
            Err(StoreError::SchemaTooNew { .. })
        ));
    }
}

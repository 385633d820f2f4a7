//! The barrier table: creating it (and upgrading one an older SDK made, [`upgrade_barrier_table`]),
//! inspecting it, purging it, and the two-phase message back-check that reads it.

mod upgrade;

use std::time::Duration;

use sqlx::Pool;

use super::rows::{Read, fetch_row, insert_if_absent};
use super::{Barrier, DEFAULT_TABLE};
use crate::backend::{Arg, BarrierDatabase};
use crate::error::ParticipantError;
use crate::kit::{RetryPolicy, check_table_name, run_local, split_sql_script};
use idem_sql::Backend;
pub use upgrade::upgrade_barrier_table;

const SQLITE_DDL: &str = include_str!("../../sql/barrier.sqlite.sql");
const POSTGRES_DDL: &str = include_str!("../../sql/barrier.postgres.sql");
const MYSQL_DDL: &str = include_str!("../../sql/barrier.mysql.sql");

/// The DDL of the barrier table (the files in `participants/sdk/sql/`) for `dialect`,
/// under the table name `table`, split into statements.
pub fn barrier_ddl(dialect: Backend, table: &str) -> Result<Vec<String>, String> {
    check_table_name(table)?;
    let text = match dialect {
        Backend::Sqlite => SQLITE_DDL,
        Backend::Postgres => POSTGRES_DDL,
        Backend::Mysql => MYSQL_DDL,
    };
    Ok(split_sql_script(text)
        .into_iter()
        .map(|s| s.replace(DEFAULT_TABLE, table))
        .collect())
}

/// Creates the barrier table `idem_barrier` (and its index) if it does not exist, and
/// upgrades one an older SDK made ([`upgrade_barrier_table`]).
pub async fn create_barrier_table<DB: BarrierDatabase>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    create_barrier_table_named(pool, DEFAULT_TABLE).await
}

/// Creates a barrier table under another name, or upgrades it; pass the same name to
/// [`Barrier::with_table`].
///
/// Safe at every start of every replica, at the same time too: a replica whose `CREATE`
/// lost a race with another's is done once the table it finds has the current shape.
pub async fn create_barrier_table_named<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    let dialect = DB::pool_dialect(pool);
    let statements =
        barrier_ddl(dialect, table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let created = async {
        let mut conn = pool.acquire().await?;
        for statement in statements {
            DB::exec(&mut conn, statement, Vec::new()).await?;
        }
        Ok::<_, sqlx::Error>(())
    }
    .await;
    if let Err(e) = created {
        // Two replicas' CREATE TABLE IF NOT EXISTS can collide in the catalog
        // (PostgreSQL); the table the winner made is as good as ours.
        if !upgrade::is_current(pool, table).await? {
            return Err(e);
        }
    }
    upgrade_barrier_table(pool, table).await
}

/// One row of the barrier table, for auditors and tests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BarrierRecord {
    /// `tcc`, `saga` or `msg`.
    pub trans_type: String,
    /// The tenant the row belongs to (`default` for rows older than tenants).
    pub tenant: String,
    /// The global transaction's id (unique within its tenant).
    pub gid: String,
    /// The branch within it.
    pub branch_id: String,
    /// The operation of the row.
    pub op: String,
    /// The step number within the branch (`01` for the first).
    pub barrier_id: String,
    /// The op whose call inserted the row.
    pub reason: String,
    /// `executed`, `empty_rollback` or `guard`.
    pub outcome: String,
    /// The first result, JSON (only for `executed`).
    pub result: Option<String>,
}

/// All barrier rows of a gid, in every tenant (each record names its own), ordered by
/// tenant, branch, op and step.
pub async fn barrier_records<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    gid: &str,
) -> Result<Vec<BarrierRecord>, sqlx::Error> {
    barrier_records_in(pool, DEFAULT_TABLE, gid).await
}

/// [`barrier_records`] for a barrier table of another name.
pub async fn barrier_records_in<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
    gid: &str,
) -> Result<Vec<BarrierRecord>, sqlx::Error> {
    check_table_name(table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let dialect = DB::pool_dialect(pool);
    let sql = format!(
        "SELECT trans_type, tenant, gid, branch_id, op, barrier_id, reason, outcome, result \
         FROM {table} WHERE gid = ? ORDER BY tenant, branch_id, op, barrier_id"
    );
    let mut conn = pool.acquire().await?;
    let rows = DB::fetch_texts(
        &mut conn,
        dialect.rewrite(&sql),
        vec![Arg::Text(gid.into())],
        9,
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|cols| {
            let mut it = cols.into_iter();
            let mut next = || it.next().flatten().unwrap_or_default();
            BarrierRecord {
                trans_type: next(),
                tenant: next(),
                gid: next(),
                branch_id: next(),
                op: next(),
                barrier_id: next(),
                reason: next(),
                outcome: next(),
                result: Some(next()).filter(|s| !s.is_empty()),
            }
        })
        .collect())
}

/// Deletes barrier rows older than `retention`; returns how many.
///
/// The retention must exceed the latest moment a call for a global transaction can still
/// arrive: the coordinator's (its timeout plus its whole retry schedule) and a Try your
/// client calls itself (its timeout, a request timeout and the client's retry period). A
/// Try arriving after its guard was purged would run, and a Confirm first arriving (or first succeeding) after
/// its Try's row was purged is refused on every retry, leaving the branch stuck, and a late
/// Cancel whose Try row is gone records an empty rollback while the Try's effect stays.
/// Never purge more eagerly than that: [`crate::BarrierRetention`] derives the window from
/// the coordinator's settings, and [`crate::spawn_barrier_purge`] runs this on a schedule.
pub async fn purge_barriers<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
    retention: Duration,
) -> Result<u64, sqlx::Error> {
    check_table_name(table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let dialect = DB::pool_dialect(pool);
    let cutoff = match dialect {
        Backend::Postgres => "now() - make_interval(secs => CAST(? AS DOUBLE PRECISION))",
        Backend::Mysql => "NOW(3) - INTERVAL ? SECOND",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%d seconds', ?))",
    };
    // A lease-mode claim is never purged, however old: its effect is unknown until it is
    // settled, and without the row a retry would run the external call again.
    let sql =
        format!("DELETE FROM {table} WHERE created_at < {cutoff} AND outcome <> 'processing'");
    let secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let mut conn = pool.acquire().await?;
    DB::exec(&mut conn, dialect.rewrite(&sql), vec![Arg::Int(secs)]).await
}

/// Whether a two-phase message's local transaction committed, as the coordinator's
/// back-check (`op=msg`) asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgState {
    /// The local transaction committed: the coordinator delivers the message (200).
    Committed,
    /// It never committed, and now never will: the back-check's own row blocks it
    /// (409, the coordinator drops the message).
    RolledBack,
}

/// The coordinator's back-check for a two-phase message whose local transaction ran under
/// [`Barrier::msg`] in `tenant` (the back-check call's own tenant: `BranchCall::tenant`).
///
/// It inserts the local transaction's own barrier row with reason `rollback`. If the local
/// transaction is still in flight, the insert waits on the unique index until it finishes;
/// if it committed, the row is there (committed); if it never ran or rolled back, this
/// insert wins and also makes any later attempt of it fail (its barrier reports
/// `Rejected`). Another tenant's message of the same gid is neither seen nor blocked.
pub async fn query_prepared<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    tenant: &str,
    gid: &str,
) -> Result<MsgState, ParticipantError> {
    let barrier = Barrier::msg(gid)
        .and_then(|b| b.with_tenant(tenant))
        .map_err(|e| ParticipantError::refused(e.to_string()))?;
    let barrier = &barrier;
    let op = barrier.call().op();
    run_local(
        pool,
        RetryPolicy::default(),
        "msg back-check",
        |tx| async move {
            if insert_if_absent(&tx, barrier, op, "rollback", "guard").await? {
                return Ok(MsgState::RolledBack);
            }
            match fetch_row(&tx, barrier, op, Read::Collided).await? {
                Some((reason, _, _)) if reason == "rollback" => Ok(MsgState::RolledBack),
                Some(_) => Ok(MsgState::Committed),
                None => Err(ParticipantError::transient(
                    "msg barrier row disappeared; retry",
                )),
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ddl_splits_into_statements_for_each_dialect() {
        let sqlite = barrier_ddl(Backend::Sqlite, DEFAULT_TABLE).unwrap();
        assert_eq!(sqlite.len(), 2);
        assert!(sqlite[0].starts_with("CREATE TABLE IF NOT EXISTS idem_barrier ("));
        assert!(sqlite[1].starts_with("CREATE INDEX IF NOT EXISTS idem_barrier_created_at"));
        assert_eq!(
            barrier_ddl(Backend::Postgres, DEFAULT_TABLE).unwrap().len(),
            2
        );
        let mysql = barrier_ddl(Backend::Mysql, DEFAULT_TABLE).unwrap();
        assert_eq!(mysql.len(), 1);
        assert!(mysql[0].contains("utf8mb4_bin"));
        for dialect in Backend::ALL {
            for stmt in barrier_ddl(dialect, DEFAULT_TABLE).unwrap() {
                assert!(!stmt.ends_with(';'), "{stmt}");
                assert!(!stmt.contains("--"), "{stmt}");
            }
        }
    }

    #[test]
    fn ddl_takes_a_table_name() {
        let ddl = barrier_ddl(Backend::Postgres, "orders_barrier")
            .unwrap()
            .join("\n");
        assert!(ddl.contains("CREATE TABLE IF NOT EXISTS orders_barrier ("));
        assert!(ddl.contains("orders_barrier_tenant_uniq"));
        assert!(ddl.contains("orders_barrier_created_at ON orders_barrier"));
        assert!(!ddl.contains("idem_barrier"));
        assert!(barrier_ddl(Backend::Postgres, "x; DROP TABLE y").is_err());
    }

    #[test]
    fn every_ddl_has_the_unique_key() {
        for dialect in Backend::ALL {
            let ddl = barrier_ddl(dialect, DEFAULT_TABLE).unwrap().join("\n");
            assert!(
                ddl.contains("idem_barrier_tenant_uniq")
                    && ddl.contains("(tenant, gid, branch_id, op, barrier_id)"),
                "{dialect}"
            );
            assert!(
                !ddl.contains("(gid, branch_id, op, barrier_id)"),
                "{dialect}"
            );
            for column in [
                "tenant",
                "reason",
                "outcome",
                "result",
                "created_at",
                "trans_type",
            ] {
                assert!(ddl.contains(column), "{dialect} lacks {column}");
            }
        }
    }
}

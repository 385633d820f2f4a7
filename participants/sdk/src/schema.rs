//! The barrier table: creating it, inspecting it, purging it, and the two-phase message
//! back-check that reads it.

use std::time::Duration;

use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase};
use crate::barrier::{Barrier, DEFAULT_TABLE, MSG_BRANCH_ID, Op, check_table_name};
use crate::error::{DbErrorKind, ParticipantError, classify};
use idem_sql::Backend;

const SQLITE_DDL: &str = include_str!("../sql/barrier.sqlite.sql");
const POSTGRES_DDL: &str = include_str!("../sql/barrier.postgres.sql");
const MYSQL_DDL: &str = include_str!("../sql/barrier.mysql.sql");

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

/// Splits a DDL script on `;` at line ends, dropping `--` comment lines, so it can be run
/// one statement at a time (prepared statements take one each). Meant for simple DDL
/// files like the barrier's: a `;` ending a line inside a literal would split it.
pub fn split_sql_script(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("--") || trimmed.is_empty() {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let stmt = current.trim().trim_end_matches(';').trim().to_owned();
            out.push(stmt);
            current.clear();
        }
    }
    if !current.trim().is_empty() {
        out.push(current.trim().to_owned());
    }
    out
}

/// Creates the barrier table `idem_barrier` (and its index) if it does not exist.
pub async fn create_barrier_table<DB: BarrierDatabase>(pool: &Pool<DB>) -> Result<(), sqlx::Error> {
    create_barrier_table_named(pool, DEFAULT_TABLE).await
}

/// Creates a barrier table under another name; pass the same name to
/// [`Barrier::with_table`].
pub async fn create_barrier_table_named<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    let dialect = DB::pool_dialect(pool);
    let statements =
        barrier_ddl(dialect, table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let mut conn = pool.acquire().await?;
    for statement in statements {
        DB::exec(&mut conn, statement, Vec::new()).await?;
    }
    Ok(())
}

/// One row of the barrier table, for auditors and tests.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BarrierRecord {
    /// `tcc`, `saga` or `msg`.
    pub trans_type: String,
    /// The global transaction's id.
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

/// All barrier rows of one global transaction, ordered by branch, op and step.
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
        "SELECT trans_type, gid, branch_id, op, barrier_id, reason, outcome, result FROM {table} \
         WHERE gid = ? ORDER BY branch_id, op, barrier_id"
    );
    let mut conn = pool.acquire().await?;
    let rows = DB::fetch_texts(
        &mut conn,
        dialect.rewrite(&sql),
        vec![Arg::Text(gid.into())],
        8,
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(|cols| {
            let mut it = cols.into_iter();
            let mut next = || it.next().flatten().unwrap_or_default();
            BarrierRecord {
                trans_type: next(),
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
/// [`Barrier::msg`].
///
/// It inserts the local transaction's own barrier row with reason `rollback`. If the local
/// transaction is still in flight, the insert waits on the unique index until it finishes;
/// if it committed, the row is there (committed); if it never ran or rolled back, this
/// insert wins and also makes any later attempt of it fail (its barrier reports
/// `Rejected`).
pub async fn query_prepared<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    gid: &str,
) -> Result<MsgState, ParticipantError> {
    let barrier = Barrier::msg(gid).map_err(|e| ParticipantError::refused(e.to_string()))?;
    let dialect = DB::pool_dialect(pool);
    let mut attempt = 1;
    loop {
        let result = query_prepared_once::<DB>(pool, dialect, &barrier).await;
        match result {
            Err(e) if e.is_retryable_conflict(dialect) && attempt < 20 => attempt += 1,
            other => return other,
        }
    }
}

async fn query_prepared_once<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    dialect: Backend,
    barrier: &Barrier,
) -> Result<MsgState, ParticipantError> {
    let mut tx = dialect.begin(pool).await?;
    let table = barrier.table();
    let columns = "(trans_type, gid, branch_id, op, barrier_id, reason, outcome) VALUES (?, ?, ?, ?, ?, ?, ?)";
    let insert = match dialect {
        Backend::Mysql => format!("INSERT INTO {table} {columns}"),
        _ => format!(
            "INSERT INTO {table} {columns} ON CONFLICT (gid, branch_id, op, barrier_id) DO NOTHING"
        ),
    };
    let args = vec![
        Arg::Text(barrier.trans_type().as_str().into()),
        Arg::Text(barrier.gid().into()),
        Arg::Text(MSG_BRANCH_ID.into()),
        Arg::Text(Op::Msg.as_str().into()),
        Arg::Text(barrier.barrier_id()),
        Arg::Text("rollback".into()),
        Arg::Text("guard".into()),
    ];
    let inserted = match DB::exec(&mut tx, dialect.rewrite(&insert), args).await {
        Ok(n) => n == 1,
        Err(e)
            if dialect == Backend::Mysql
                && classify(dialect, &e) == DbErrorKind::UniqueViolation =>
        {
            false
        }
        Err(e) => return Err(e.into()),
    };
    let state = if inserted {
        MsgState::RolledBack
    } else {
        let lock = if dialect == Backend::Mysql {
            " LOCK IN SHARE MODE"
        } else {
            ""
        };
        let select = format!(
            "SELECT reason FROM {table} WHERE gid = ? AND branch_id = ? AND op = ? AND barrier_id = ?{lock}"
        );
        let rows = DB::fetch_texts(
            &mut tx,
            dialect.rewrite(&select),
            vec![
                Arg::Text(barrier.gid().into()),
                Arg::Text(MSG_BRANCH_ID.into()),
                Arg::Text(Op::Msg.as_str().into()),
                Arg::Text(barrier.barrier_id()),
            ],
            1,
        )
        .await?;
        match rows.into_iter().next().and_then(|mut r| r.pop().flatten()) {
            Some(reason) if reason == "rollback" => MsgState::RolledBack,
            Some(_) => MsgState::Committed,
            None => {
                return Err(ParticipantError::transient(
                    "msg barrier row disappeared; retry",
                ));
            }
        }
    };
    tx.commit().await?;
    Ok(state)
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
        assert!(ddl.contains("orders_barrier_uniq"));
        assert!(ddl.contains("orders_barrier_created_at ON orders_barrier"));
        assert!(!ddl.contains("idem_barrier"));
        assert!(barrier_ddl(Backend::Postgres, "x; DROP TABLE y").is_err());
    }

    #[test]
    fn every_ddl_has_the_unique_key() {
        for dialect in Backend::ALL {
            let ddl = barrier_ddl(dialect, DEFAULT_TABLE).unwrap().join("\n");
            assert!(
                ddl.contains("(gid, branch_id, op, barrier_id)"),
                "{dialect}"
            );
            for column in ["reason", "outcome", "result", "created_at", "trans_type"] {
                assert!(ddl.contains(column), "{dialect} lacks {column}");
            }
        }
    }
}

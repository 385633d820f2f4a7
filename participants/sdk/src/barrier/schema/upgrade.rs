//! Bringing a barrier table an older SDK made to the current shape, in place: the lease
//! columns (`sql/barrier_lease.*.sql`), then the tenant and the unique key that includes it
//! (`sql/barrier_tenant.*.sql`). The old rows become the default tenant's, which is what
//! every call was before tenants existed, so their repeats are still answered from them.
//!
//! Several replicas start at once, so the upgrade must be safe to race, and it is decided
//! by the table's shape as the catalog shows it, never by a note of what ran:
//!
//! * PostgreSQL runs its script in one transaction that first locks the table: a second
//!   upgrader waits, then finds every `IF [NOT] EXISTS` step done. A crash leaves the old
//!   shape, never half of the new one.
//! * MySQL/MariaDB runs one `ALTER TABLE` (InnoDB applies all of it or none): a second
//!   upgrader's fails (duplicate column), and it reads the shape to see that the first did
//!   the work.
//! * SQLite rebuilds the table inside `BEGIN IMMEDIATE`, after checking there that it
//!   still lacks the tenant: a second upgrader waits for the write lock and then finds it.
//!
//! Before any of it, the shape is read without a lock, so a table that is already current
//! costs a start a few catalog reads and takes no lock at all.

use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::barrier::DEFAULT_TABLE;
use crate::barrier::lease::add_lease_columns;
use crate::kit::{check_table_name, split_sql_script};
use idem_sql::Backend;

const SQLITE: &str = include_str!("../../../sql/barrier_tenant.sqlite.sql");
const POSTGRES: &str = include_str!("../../../sql/barrier_tenant.postgres.sql");
const MYSQL: &str = include_str!("../../../sql/barrier_tenant.mysql.sql");

/// The unique key before tenants, and the current one, as the catalog lists their columns.
const OLD_KEY: &str = "gid,branch_id,op,barrier_id";
const KEY: &str = "tenant,gid,branch_id,op,barrier_id";

/// Upgrades barrier table `table` made by an older SDK to the current shape, in place:
/// adds the lease columns if missing, then the `tenant` column (`'default'` for every
/// existing row) with the unique key (tenant, gid, branch_id, op, barrier_id) instead of
/// (gid, branch_id, op, barrier_id). A table already current is left alone.
/// [`crate::create_barrier_table`] runs it at every start; it is safe to run again and
/// from several replicas at once (see the module documentation).
///
/// The scripts are `sql/barrier_lease.*.sql` and `sql/barrier_tenant.*.sql`, for running
/// by hand. An older SDK does not key by tenant: upgrade every replica's SDK together.
pub async fn upgrade_barrier_table<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<(), sqlx::Error> {
    check_table_name(table).map_err(|e| sqlx::Error::Configuration(e.into()))?;
    if is_current(pool, table).await? {
        return Ok(());
    }
    add_lease_columns(pool, table).await?;
    let dialect = DB::pool_dialect(pool);
    let script = match dialect {
        Backend::Sqlite => SQLITE,
        Backend::Postgres => POSTGRES,
        Backend::Mysql => MYSQL,
    };
    let statements: Vec<String> = split_sql_script(script)
        .into_iter()
        .map(|s| s.replace(DEFAULT_TABLE, table))
        .collect();
    let ran = run_tenant_step::<DB>(pool, dialect, table, statements).await;
    // A replica that lost the race has an error in hand and a current table before it.
    let shape = shape_of(pool, table).await?;
    if shape.is_current() {
        tracing::info!(
            table,
            "barrier table upgraded: rows keyed by tenant, the old ones the default tenant's"
        );
        return Ok(());
    }
    // Never run on a table that would let two tenants' same gid share a row.
    let why = match ran {
        Err(e) => format!("; the upgrade failed: {e}"),
        Ok(()) => String::new(),
    };
    Err(sqlx::Error::Configuration(
        format!(
            "barrier table `{table}` is not in the current shape after its upgrade ({}){why}",
            shape.problems().join(", ")
        )
        .into(),
    ))
}

async fn run_tenant_step<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    dialect: Backend,
    table: &str,
    statements: Vec<String>,
) -> Result<(), sqlx::Error> {
    if dialect == Backend::Mysql {
        // DDL commits by itself on MySQL; the script is one ALTER.
        let mut conn = pool.acquire().await?;
        for statement in statements {
            DB::exec(&mut conn, statement, Vec::new()).await?;
        }
        return Ok(());
    }
    let mut tx = dialect.begin(pool).await?;
    // SQLite's rebuild is not idempotent: under the write lock, look again.
    let needed =
        dialect != Backend::Sqlite || !has_column::<DB>(&mut tx, dialect, table, "tenant").await?;
    if needed {
        for statement in statements {
            DB::exec(&mut tx, statement, Vec::new()).await?;
        }
    }
    tx.commit().await
}

/// True when `table` has the current shape (and exists).
pub(super) async fn is_current<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    table: &str,
) -> Result<bool, sqlx::Error> {
    Ok(shape_of(pool, table).await?.is_current())
}

/// What the upgrade looks at in the catalog.
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    lease_columns: bool,
    tenant_column: bool,
    old_key: bool,
    key: bool,
}

impl Shape {
    fn is_current(&self) -> bool {
        self.problems().is_empty()
    }

    fn problems(&self) -> Vec<&'static str> {
        [
            (!self.lease_columns, "no lease columns"),
            (!self.tenant_column, "no tenant column"),
            (
                self.old_key,
                "a unique key on (gid, branch_id, op, barrier_id), without the tenant",
            ),
            (
                !self.key,
                "no unique key on (tenant, gid, branch_id, op, barrier_id)",
            ),
        ]
        .into_iter()
        .filter_map(|(wrong, what)| wrong.then_some(what))
        .collect()
    }
}

async fn shape_of<DB: BarrierDatabase>(pool: &Pool<DB>, table: &str) -> Result<Shape, sqlx::Error> {
    let dialect = DB::pool_dialect(pool);
    let mut conn = pool.acquire().await?;
    let lease_columns = has_column::<DB>(&mut conn, dialect, table, "owner_token").await?
        && has_column::<DB>(&mut conn, dialect, table, "lease_until_ms").await?;
    Ok(Shape {
        lease_columns,
        tenant_column: has_column::<DB>(&mut conn, dialect, table, "tenant").await?,
        old_key: has_unique_key::<DB>(&mut conn, dialect, table, OLD_KEY).await?,
        key: has_unique_key::<DB>(&mut conn, dialect, table, KEY).await?,
    })
}

async fn has_column<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Backend,
    table: &str,
    column: &str,
) -> Result<bool, sqlx::Error> {
    let sql = match dialect {
        Backend::Postgres => {
            "SELECT COUNT(*) FROM pg_attribute WHERE attrelid = to_regclass(CAST(? AS text)) \
             AND CAST(attname AS text) = ? AND attnum > 0 AND NOT attisdropped"
        }
        Backend::Mysql => {
            "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() \
             AND table_name = ? AND column_name = ?"
        }
        Backend::Sqlite => "SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?",
    };
    exists::<DB>(conn, dialect, sql, table, column).await
}

/// Whether `table` has a unique key on exactly `columns` (comma-separated, in key order),
/// whatever its name.
async fn has_unique_key<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Backend,
    table: &str,
    columns: &str,
) -> Result<bool, sqlx::Error> {
    let sql = match dialect {
        Backend::Postgres => {
            "SELECT COUNT(*) FROM pg_index i WHERE i.indrelid = to_regclass(CAST(? AS text)) \
             AND i.indisunique AND (SELECT string_agg(CAST(a.attname AS text), ',' ORDER BY k.n) \
             FROM unnest(CAST(i.indkey AS int2[])) WITH ORDINALITY AS k(attnum, n) \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) = ?"
        }
        Backend::Mysql => {
            "SELECT COUNT(*) FROM (SELECT GROUP_CONCAT(column_name ORDER BY seq_in_index \
             SEPARATOR ',') AS cols FROM information_schema.statistics \
             WHERE table_schema = DATABASE() AND table_name = ? AND non_unique = 0 \
             GROUP BY index_name) AS k WHERE k.cols = ?"
        }
        // pragma_index_info lists an index's columns in key order.
        Backend::Sqlite => {
            "SELECT COUNT(*) FROM pragma_index_list(?) AS l WHERE l.\"unique\" = 1 \
             AND (SELECT group_concat(name, ',') FROM pragma_index_info(l.name)) = ?"
        }
    };
    exists::<DB>(conn, dialect, sql, table, columns).await
}

/// Runs a `SELECT COUNT(*)` bound to (`table`, `what`); true when it counts any.
async fn exists<DB: BarrierDatabase>(
    conn: &mut DB::Connection,
    dialect: Backend,
    sql: &str,
    table: &str,
    what: &str,
) -> Result<bool, sqlx::Error> {
    let args = vec![Arg::Text(table.into()), Arg::Text(what.into())];
    let rows = DB::fetch_cells(conn, dialect.rewrite(sql), args, &[CellKind::Int]).await?;
    Ok(rows
        .first()
        .and_then(|row| row.first())
        .and_then(Cell::int)
        .is_some_and(|n| n > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_script_names_the_table_only_where_it_is_renamed() {
        for script in [SQLITE, POSTGRES, MYSQL] {
            let statements: Vec<String> = split_sql_script(script)
                .into_iter()
                .map(|s| s.replace(DEFAULT_TABLE, "shop_barrier"))
                .collect();
            assert!(!statements.is_empty());
            for statement in &statements {
                assert!(!statement.contains("idem_barrier"), "{statement}");
                assert!(!statement.ends_with(';'), "{statement}");
            }
            let text = statements.join("\n");
            assert!(text.contains("(tenant, gid, branch_id, op, barrier_id)"));
            assert!(text.contains("'default'"));
        }
    }

    #[test]
    fn only_the_tenant_key_without_the_old_one_is_current() {
        let current = Shape {
            lease_columns: true,
            tenant_column: true,
            old_key: false,
            key: true,
        };
        assert!(current.is_current());
        for shape in [
            Shape {
                old_key: true,
                ..current
            },
            Shape {
                key: false,
                ..current
            },
            Shape {
                tenant_column: false,
                ..current
            },
            Shape {
                lease_columns: false,
                ..current
            },
        ] {
            assert!(!shape.is_current(), "{shape:?}");
        }
    }
}

//! Deadlocks the database server detected during the measured pass: the count the
//! coordinator's batches must keep at zero (two writers lock disjoint rows, in gid order).
//! PostgreSQL counts them per database (`pg_stat_database.deadlocks`, summed over the
//! bench's own databases); MariaDB and MySQL only server-wide (`Innodb_deadlocks`), so
//! there the count includes anything else the server ran meanwhile. SQLite has one
//! writer and no deadlocks to count.

use idem_participant::testing::{Backend, TestDatabase};
use sqlx::Connection;

/// The server's deadlock counter now, for the databases of `servers`; `None` for SQLite
/// or when the counter cannot be read.
pub(super) async fn count(servers: &[TestDatabase]) -> Option<u64> {
    let first = servers.first()?;
    match first.backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&first.url).await.ok()?;
            let names: Vec<String> = servers.iter().map(|d| d.name().to_owned()).collect();
            let n: Option<i64> = sqlx::query_scalar(
                "SELECT sum(deadlocks)::bigint FROM pg_stat_database WHERE datname = ANY($1)",
            )
            .bind(&names)
            .fetch_one(&mut conn)
            .await
            .ok()?;
            let _ = conn.close().await;
            n.map(|n| n as u64)
        }
        Backend::Mysql => {
            let mut conn = sqlx::MySqlConnection::connect(&first.url).await.ok()?;
            let row: (String, String) =
                sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
                    .fetch_one(&mut conn)
                    .await
                    .ok()?;
            let _ = conn.close().await;
            row.1.parse().ok()
        }
        Backend::Sqlite => None,
    }
}

//! Which store errors a retry can cure.
//!
//! The engine retries a failed write, and the recovery loop resumes a transaction whose
//! driver gave up; both only help when the cause goes away (a lost connection, a deadlock,
//! a database restarting). A write the database refuses for its content (a value too long,
//! out of range, a constraint) fails the same way every time, and resuming it would
//! re-send the round's calls forever. Those are *permanent*: the engine stalls the
//! transaction with the reason instead (see `Engine::drive`).
//!
//! Unknown database error codes count as permanent: a stall is visible and an operator
//! retry is one command, while an unbounded retry loop is neither.

use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::postgres::PgDatabaseError;
use sqlx::sqlite::SqliteError;

use super::StoreError;

impl StoreError {
    /// True when retrying the same write cannot succeed.
    pub fn is_permanent(&self) -> bool {
        match self {
            StoreError::Database(e) => is_permanent(e),
            StoreError::Corrupt(_)
            | StoreError::Migrate(_)
            | StoreError::SchemaTooNew { .. }
            | StoreError::SchemaUnknown { .. }
            | StoreError::Backup(_)
            | StoreError::UnsupportedUrl(_) => true,
            // The group-commit writer stopped: a shutdown, not the data.
            StoreError::Batch(_) => false,
            // A refused request, not a failed write: nothing to retry.
            StoreError::TooManyBranches { .. } => true,
            StoreError::TimedOut(_) => false,
        }
    }

    /// What went wrong in a few words that name no database, host, table or value: for
    /// answers to clients and health checks. The full text (`Display`) is for the log.
    pub fn reason(&self) -> &'static str {
        use std::io::ErrorKind;
        match self {
            StoreError::TimedOut(_) => "the database did not answer in time",
            StoreError::Database(e) => match e {
                sqlx::Error::Io(io) => match io.kind() {
                    ErrorKind::ConnectionRefused => "the database refused the connection",
                    ErrorKind::TimedOut => "the database did not answer in time",
                    ErrorKind::NotFound => "the database file is missing",
                    _ => "the connection to the database failed",
                },
                sqlx::Error::PoolTimedOut => "no database connection was free in time",
                sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                    "the database connections are closed"
                }
                sqlx::Error::Tls(_) => "the secure connection to the database failed",
                sqlx::Error::Protocol(_) => "the connection to the database broke",
                sqlx::Error::Configuration(_) => "the database settings are invalid",
                sqlx::Error::Database(_) if is_permanent(e) => "the database refused the request",
                sqlx::Error::Database(_) => "the database cannot serve the request for now",
                _ => "the database request failed",
            },
            StoreError::Migrate(_) => "the database schema could not be migrated",
            StoreError::SchemaTooNew { .. } | StoreError::SchemaUnknown { .. } => {
                "the database schema is newer than this binary"
            }
            StoreError::Backup(_) => "the backup failed",
            StoreError::Corrupt(_) => "stored data is invalid",
            StoreError::UnsupportedUrl(_) => "the database URL is not supported",
            StoreError::Batch(_) => "the database writer has stopped",
            StoreError::TooManyBranches { .. } => "the transaction has too many branches",
        }
    }

    /// The label of `idem_store_errors_total`: a few fixed kinds, so that an operator tells
    /// an outage (`timeout`, `connection`, `pool_timeout`) from contention (`transient`) and
    /// from writes the database refuses (`refused`). `None`: a refused request (too many
    /// branches), not a failure of the database.
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            StoreError::TimedOut(_) => "timeout",
            StoreError::Database(e) => match e {
                sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => "timeout",
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::Protocol(_)
                | sqlx::Error::PoolClosed
                | sqlx::Error::WorkerCrashed => "connection",
                sqlx::Error::PoolTimedOut => "pool_timeout",
                sqlx::Error::Database(_) if is_permanent(e) => "refused",
                sqlx::Error::Database(_) => "transient",
                _ => "other",
            },
            StoreError::Corrupt(_) => "corrupt",
            StoreError::Batch(_) => "writer_stopped",
            StoreError::Migrate(_)
            | StoreError::SchemaTooNew { .. }
            | StoreError::SchemaUnknown { .. }
            | StoreError::Backup(_)
            | StoreError::UnsupportedUrl(_) => "other",
            StoreError::TooManyBranches { .. } => return None,
        })
    }

    /// Whether waiting can cure this error at start-up: the server may be starting, or
    /// unreachable for now. A wrong password, an unknown database or a bad URL stay wrong.
    pub fn retryable_at_start(&self) -> bool {
        use sqlx::migrate::MigrateError;
        match self {
            StoreError::Migrate(
                MigrateError::Execute(e) | MigrateError::ExecuteMigration(e, _),
            ) => !is_permanent(e),
            other => !other.is_permanent(),
        }
    }
}

fn is_permanent(e: &sqlx::Error) -> bool {
    use sqlx::Error::*;
    match e {
        Database(db) => permanent_database_error(db.as_ref()),
        Encode(_)
        | Decode(_)
        | ColumnDecode { .. }
        | TypeNotFound { .. }
        | ColumnNotFound(_)
        | ColumnIndexOutOfBounds { .. }
        | InvalidArgument(_)
        | Configuration(_) => true,
        // The connection, the pool, TLS, the wire protocol: none says the data is wrong.
        _ => false,
    }
}

fn permanent_database_error(db: &dyn DatabaseError) -> bool {
    if let Some(pg) = db.try_downcast_ref::<PgDatabaseError>() {
        return !transient_postgres(pg.code());
    }
    if let Some(my) = db.try_downcast_ref::<MySqlDatabaseError>() {
        return !transient_mysql(my.number());
    }
    if db.try_downcast_ref::<SqliteError>().is_some() {
        let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(-1);
        return !transient_sqlite(code);
    }
    true
}

/// SQLSTATE classes and codes that describe the server or the session, not the data.
fn transient_postgres(code: &str) -> bool {
    let class = code.get(..2).unwrap_or("");
    // 08 connection exception, 40 transaction rollback (serialization failure, deadlock),
    // 53 insufficient resources, 57 operator intervention (shutdown, cancel), 58 system
    // error (I/O); 55P03 lock not available, 25P02 a transaction aborted by an earlier
    // error, 25006 read-only transaction (a standby during failover).
    matches!(class, "08" | "40" | "53" | "57" | "58") || matches!(code, "55P03" | "25P02" | "25006")
}

/// MySQL/MariaDB error numbers that describe the server or the session, not the data.
fn transient_mysql(number: u16) -> bool {
    matches!(
        number,
        // lock wait timeout, deadlock, record changed since last read
        1205 | 1213 | 1020
        // too many connections, server shutdown, connection killed, query interrupted
        | 1040 | 1053 | 1927 | 1317 | 3024 | 1969
        // read-only server or transaction (failover in progress)
        | 1290 | 1792 | 1836
        // client-side connection errors
        | 2002 | 2003 | 2006 | 2013
    )
}

/// SQLite result codes (primary code in the low byte) that a retry can cure.
fn transient_sqlite(code: i64) -> bool {
    // BUSY, LOCKED, NOMEM, READONLY, IOERR, FULL, CANTOPEN, PROTOCOL.
    code >= 0 && matches!(code & 0xff, 5 | 6 | 7 | 8 | 10 | 13 | 14 | 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_data_errors_are_permanent() {
        assert!(!transient_postgres("22001")); // string_data_right_truncation
        assert!(!transient_postgres("23502")); // not_null_violation
        assert!(!transient_postgres("P0001")); // raise_exception (a trigger)
        assert!(transient_postgres("40001"));
        assert!(transient_postgres("40P01"));
        assert!(transient_postgres("57P01")); // admin_shutdown
        assert!(transient_postgres("08006"));
        assert!(transient_postgres("53300")); // too_many_connections
    }

    #[test]
    fn mysql_data_errors_are_permanent() {
        assert!(!transient_mysql(1406)); // data too long
        assert!(!transient_mysql(1366)); // incorrect string value
        assert!(!transient_mysql(1264)); // out of range
        assert!(!transient_mysql(1644)); // SIGNAL from a trigger
        assert!(transient_mysql(1213));
        assert!(transient_mysql(2013));
    }

    #[test]
    fn sqlite_data_errors_are_permanent() {
        assert!(!transient_sqlite(18)); // TOOBIG
        assert!(!transient_sqlite(1811)); // CONSTRAINT_TRIGGER (RAISE(ABORT))
        assert!(!transient_sqlite(1)); // ERROR
        assert!(transient_sqlite(5));
        assert!(transient_sqlite(517)); // BUSY_SNAPSHOT
        assert!(transient_sqlite(3338)); // IOERR_FSYNC
        assert!(!transient_sqlite(-1));
    }

    #[test]
    fn connection_trouble_is_transient() {
        assert!(!StoreError::Database(sqlx::Error::PoolTimedOut).is_permanent());
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(!StoreError::Database(sqlx::Error::Io(io)).is_permanent());
        assert!(StoreError::Corrupt("bad".into()).is_permanent());
        assert!(!StoreError::Batch("writer stopped".into()).is_permanent());
        assert!(!StoreError::TimedOut(std::time::Duration::from_secs(1)).is_permanent());
    }

    #[test]
    fn reasons_name_nothing_of_the_database() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connect to db.internal:5432 refused",
        );
        let e = StoreError::Database(sqlx::Error::Io(refused));
        assert_eq!(e.reason(), "the database refused the connection");
        assert!(e.to_string().contains("db.internal"), "the log keeps it");
        assert_eq!(
            StoreError::Database(sqlx::Error::PoolTimedOut).reason(),
            "no database connection was free in time"
        );
    }

    #[test]
    fn at_start_only_what_waiting_can_cure_is_retried() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(StoreError::Database(sqlx::Error::Io(refused)).retryable_at_start());
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let migrate = sqlx::migrate::MigrateError::Execute(sqlx::Error::Io(broken));
        assert!(StoreError::Migrate(migrate).retryable_at_start());
        assert!(!StoreError::UnsupportedUrl("x:".into()).retryable_at_start());
        let dirty = sqlx::migrate::MigrateError::Dirty(3);
        assert!(!StoreError::Migrate(dirty).retryable_at_start());
    }
}

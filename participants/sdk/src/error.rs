//! What can go wrong in a branch step, sorted by what the coordinator should do about it.
//!
//! The coordinator's contract has three answers besides success: 409 (the business said no;
//! do not retry), 425 (still running; ask again later) and anything else (try again; this
//! crate answers 503 for what a retry can cure, 500 for a broken invariant). A
//! participant only has to say which kind of failure it has; [`ParticipantError`] carries
//! that decision to the HTTP mapping.

use std::borrow::Cow;

use idem_sql::Backend;

/// Why a branch step did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ParticipantError {
    /// The business refuses the step for good: not enough stock, insufficient balance, an
    /// unknown coupon campaign. Answered with 409 so the coordinator stops retrying (and, for
    /// a Try or saga action, rolls the global transaction back). The local transaction,
    /// barrier row included, is rolled back.
    #[error("refused: {0}")]
    Refused(String),

    /// The step cannot be answered yet (for example, something it depends on is still
    /// running). Answered with 425 so the coordinator asks again.
    #[error("in progress: {0}")]
    InProgress(String),

    /// A database error that was not resolved by the barrier's own retries. Answered with
    /// 503: the coordinator retries, and the barrier makes the retry safe.
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),

    /// Any other failure that may go away on retry (a timeout, a dependency that is down).
    /// Answered with 503.
    #[error("transient failure: {0}")]
    Transient(String),

    /// A TCC Confirm whose Try has no committed, executed barrier row: the Try has not run,
    /// is still running, or its Cancel ran first and turned it away. The barrier refuses the
    /// Confirm before its closure runs and rolls everything back, the Confirm's own row
    /// included. Answered with 503, like [`ParticipantError::Transient`]: once the Try
    /// commits, a retried Confirm goes through; if it never does (the Cancel won), the
    /// branch stalls in the coordinator, visibly, rather than confirming nothing.
    #[error("confirm without try: {0}")]
    ConfirmWithoutTry(String),

    /// A broken invariant: a stored result that no longer decodes, a Confirm for a
    /// reservation that does not exist. Answered with 500, which the coordinator retries,
    /// so the problem stays visible until someone fixes it.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ParticipantError {
    /// A business refusal (409, FAILURE): the coordinator does not retry it.
    pub fn refused(message: impl Into<String>) -> Self {
        ParticipantError::Refused(message.into())
    }

    /// Still in progress (425): the coordinator asks again later.
    pub fn in_progress(message: impl Into<String>) -> Self {
        ParticipantError::InProgress(message.into())
    }

    /// A failure a retry may cure (503): the coordinator retries.
    pub fn transient(message: impl Into<String>) -> Self {
        ParticipantError::Transient(message.into())
    }

    /// A bug or a broken invariant (500): the coordinator retries, an operator should look.
    pub fn internal(message: impl Into<String>) -> Self {
        ParticipantError::Internal(message.into())
    }

    /// True for a business refusal (HTTP 409).
    pub fn is_refusal(&self) -> bool {
        matches!(self, ParticipantError::Refused(_))
    }

    /// True for a Confirm refused because its Try has not committed (HTTP 503).
    pub fn is_confirm_without_try(&self) -> bool {
        matches!(self, ParticipantError::ConfirmWithoutTry(_))
    }

    /// The HTTP status code the coordinator expects for this error.
    pub fn status_code(&self) -> u16 {
        match self {
            ParticipantError::Refused(_) => 409,
            ParticipantError::InProgress(_) => 425,
            ParticipantError::Database(_)
            | ParticipantError::Transient(_)
            | ParticipantError::ConfirmWithoutTry(_) => 503,
            ParticipantError::Internal(_) => 500,
        }
    }

    /// A stable name of the kind of error, for logs and response bodies (`error`).
    pub fn kind(&self) -> &'static str {
        match self {
            ParticipantError::Refused(_) => "refused",
            ParticipantError::InProgress(_) => "in_progress",
            ParticipantError::Database(_) => "database",
            ParticipantError::Transient(_) => "transient",
            ParticipantError::ConfirmWithoutTry(_) => "confirm_without_try",
            ParticipantError::Internal(_) => "internal",
        }
    }

    /// True when the error is a lock conflict that a fresh attempt of the whole local
    /// transaction resolves (deadlock, serialization failure, busy database).
    pub(crate) fn is_retryable_conflict(&self, dialect: Backend) -> bool {
        match self {
            ParticipantError::Database(e) => classify(dialect, e) == DbErrorKind::Conflict,
            _ => false,
        }
    }
}

/// What a database error means to the barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DbErrorKind {
    /// The insert hit an existing row of a unique key.
    UniqueViolation,
    /// The transaction lost a lock conflict (deadlock, serialization failure, lock wait
    /// timeout, busy database); retrying the whole transaction is the cure.
    Conflict,
    Other,
}

/// Sorts a database error by the backend's error code.
pub(crate) fn classify(dialect: Backend, error: &sqlx::Error) -> DbErrorKind {
    let sqlx::Error::Database(db) = error else {
        return DbErrorKind::Other;
    };
    match dialect {
        Backend::Mysql => {
            // MySQL's SQLSTATE is too coarse (23000 covers every integrity error), so go by
            // the error number.
            match db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                Some(e) => classify_mysql(e.number()),
                None => DbErrorKind::Other,
            }
        }
        Backend::Postgres => classify_postgres(db.code().as_deref().unwrap_or("")),
        Backend::Sqlite => classify_sqlite(
            db.code()
                .unwrap_or(Cow::Borrowed(""))
                .parse::<i64>()
                .unwrap_or(-1),
        ),
    }
}

/// MySQL/MariaDB error numbers.
pub(crate) fn classify_mysql(number: u16) -> DbErrorKind {
    match number {
        // ER_DUP_ENTRY. Only this one: INSERT IGNORE would also swallow truncation and
        // NOT NULL errors, which must surface.
        1062 => DbErrorKind::UniqueViolation,
        // ER_LOCK_DEADLOCK (the whole transaction was rolled back), ER_LOCK_WAIT_TIMEOUT,
        // and MariaDB's ER_CHECKREAD ("record has changed since last read", raised under
        // innodb_snapshot_isolation).
        1213 | 1205 | 1020 => DbErrorKind::Conflict,
        _ => DbErrorKind::Other,
    }
}

/// PostgreSQL SQLSTATE codes.
pub(crate) fn classify_postgres(code: &str) -> DbErrorKind {
    match code {
        "23505" => DbErrorKind::UniqueViolation,
        // serialization_failure, deadlock_detected, lock_not_available.
        "40001" | "40P01" | "55P03" => DbErrorKind::Conflict,
        _ => DbErrorKind::Other,
    }
}

/// SQLite extended result codes.
pub(crate) fn classify_sqlite(code: i64) -> DbErrorKind {
    match code {
        // SQLITE_CONSTRAINT_PRIMARYKEY, SQLITE_CONSTRAINT_UNIQUE.
        1555 | 2067 => DbErrorKind::UniqueViolation,
        // SQLITE_BUSY and SQLITE_LOCKED with all their extended variants.
        c if c >= 0 && (c & 0xff == 5 || c & 0xff == 6) => DbErrorKind::Conflict,
        _ => DbErrorKind::Other,
    }
}

/// A callback that cannot name a barrier: a parameter is missing, unknown or too long, or
/// its tenant header is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCall {
    #[error("missing query parameter `{0}`")]
    /// A required parameter is absent.
    Missing(&'static str),
    #[error("invalid query parameter `{param}`: {reason}")]
    /// A parameter is unknown or too long.
    Invalid {
        /// The parameter.
        param: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    #[error("invalid header `{header}`: {reason}")]
    /// A header the call is keyed by (`Idem-Tenant`) is malformed or repeated.
    Header {
        /// The header.
        header: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_numbers() {
        assert_eq!(classify_mysql(1062), DbErrorKind::UniqueViolation);
        assert_eq!(classify_mysql(1213), DbErrorKind::Conflict);
        assert_eq!(classify_mysql(1205), DbErrorKind::Conflict);
        // Data too long: must not be mistaken for "row exists".
        assert_eq!(classify_mysql(1406), DbErrorKind::Other);
        assert_eq!(classify_mysql(1048), DbErrorKind::Other);
    }

    #[test]
    fn postgres_codes() {
        assert_eq!(classify_postgres("23505"), DbErrorKind::UniqueViolation);
        assert_eq!(classify_postgres("40001"), DbErrorKind::Conflict);
        assert_eq!(classify_postgres("40P01"), DbErrorKind::Conflict);
        assert_eq!(classify_postgres("23502"), DbErrorKind::Other);
    }

    #[test]
    fn sqlite_codes() {
        assert_eq!(classify_sqlite(2067), DbErrorKind::UniqueViolation);
        assert_eq!(classify_sqlite(5), DbErrorKind::Conflict);
        assert_eq!(classify_sqlite(517), DbErrorKind::Conflict); // BUSY_SNAPSHOT
        assert_eq!(classify_sqlite(6), DbErrorKind::Conflict);
        assert_eq!(classify_sqlite(1299), DbErrorKind::Other); // CONSTRAINT_NOTNULL
        assert_eq!(classify_sqlite(-1), DbErrorKind::Other);
    }

    #[test]
    fn status_codes_follow_the_coordinator_contract() {
        assert_eq!(ParticipantError::refused("no").status_code(), 409);
        assert_eq!(ParticipantError::in_progress("later").status_code(), 425);
        assert_eq!(ParticipantError::transient("down").status_code(), 503);
        assert_eq!(
            ParticipantError::Database(sqlx::Error::PoolTimedOut).status_code(),
            503
        );
        assert_eq!(ParticipantError::internal("bug").status_code(), 500);
        let early = ParticipantError::ConfirmWithoutTry("no try yet".into());
        assert_eq!(early.status_code(), 503);
        assert_eq!(early.kind(), "confirm_without_try");
        assert!(early.is_confirm_without_try());
        assert!(!early.is_refusal());
        assert!(ParticipantError::refused("no").is_refusal());
    }
}

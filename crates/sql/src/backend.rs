//! The one notion of "which database" that the coordinator and the SDK share.

use std::fmt;

use sqlx::{AssertSqlSafe, Database, Pool, Transaction};

use crate::placeholders::{Placeholders, rewrite_placeholders};

/// A database family idem runs on. MariaDB speaks [`Backend::Mysql`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// SQLite, embedded: one writer at a time.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL and MariaDB.
    Mysql,
}

impl Backend {
    /// Every backend, SQLite first.
    pub const ALL: [Backend; 3] = [Backend::Sqlite, Backend::Postgres, Backend::Mysql];

    /// `sqlite`, `postgres` or `mysql`: the name in logs, flags, metrics and the store's
    /// `migrations/<name>/`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
        }
    }

    /// The backend of a connection URL, from its scheme (`sqlite:`, `postgres://`,
    /// `postgresql://`, `mysql://`, `mariadb://`; any case).
    pub fn from_url(url: &str) -> Option<Backend> {
        Backend::from_name(url.split(':').next()?)
    }

    /// The backend a name or a URL scheme means: [`Backend::name`], `postgresql` or
    /// `mariadb`, in any case (a `--backend` flag, a URL's scheme).
    pub fn from_name(name: &str) -> Option<Backend> {
        match name.to_ascii_lowercase().as_str() {
            "sqlite" => Some(Backend::Sqlite),
            "postgres" | "postgresql" => Some(Backend::Postgres),
            "mysql" | "mariadb" => Some(Backend::Mysql),
            _ => None,
        }
    }

    /// The backend behind an `AnyConnection`, from the driver's name (`SQLite`,
    /// `PostgreSQL`, `MySQL`).
    pub fn from_backend_name(name: &str) -> Option<Backend> {
        match name {
            "SQLite" => Some(Backend::Sqlite),
            "PostgreSQL" => Some(Backend::Postgres),
            "MySQL" => Some(Backend::Mysql),
            _ => None,
        }
    }

    /// How statements sent to this backend mark their parameters.
    pub fn placeholders(self) -> Placeholders {
        match self {
            Backend::Postgres => Placeholders::Numbered,
            Backend::Sqlite | Backend::Mysql => Placeholders::QuestionMark,
        }
    }

    /// The statement that opens a transaction that will write, where it is not the
    /// driver's own `BEGIN`.
    ///
    /// SQLite needs `BEGIN IMMEDIATE`: a plain (deferred) transaction takes the write lock
    /// only at its first write, and two deferred transactions that both read first cannot
    /// both upgrade, so one fails with `SQLITE_BUSY` without waiting. Taking the lock up
    /// front makes concurrent writers queue on the busy timeout instead.
    pub fn begin_statement(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => Some("BEGIN IMMEDIATE"),
            Backend::Postgres | Backend::Mysql => None,
        }
    }

    /// [`Backend::begin_statement`] spelled out, for a connection whose transaction sqlx
    /// does not track (a [`crate::Leased`] one, ended with a plain `COMMIT`).
    pub fn begin_sql(self) -> &'static str {
        self.begin_statement().unwrap_or("BEGIN")
    }

    /// Opens a write transaction on `pool` with [`Backend::begin_statement`].
    pub async fn begin<DB: Database>(
        self,
        pool: &Pool<DB>,
    ) -> Result<Transaction<'static, DB>, sqlx::Error> {
        match self.begin_statement() {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
    }

    /// `text` with its `?` placeholders rewritten for this backend, ready for
    /// `sqlx::query`. PostgreSQL gets `$1, $2, ...`; the others get the text unchanged.
    ///
    /// Question marks inside string literals, quoted identifiers and comments are left
    /// alone. PostgreSQL operators spelled with `?` (the jsonb `?|`) cannot be used in text
    /// passed here.
    pub fn sql(self, text: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(self.rewrite(text))
    }

    /// The rewriting behind [`Backend::sql`], as a plain string.
    pub fn rewrite(self, text: &str) -> String {
        rewrite_placeholders(text, self.placeholders())
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_from_url_and_backend_name() {
        assert_eq!(
            Backend::from_url("sqlite://x.db?mode=rwc"),
            Some(Backend::Sqlite)
        );
        assert_eq!(Backend::from_url("sqlite::memory:"), Some(Backend::Sqlite));
        assert_eq!(Backend::from_url("sqlite:idem.db"), Some(Backend::Sqlite));
        assert_eq!(
            Backend::from_url("postgres://u@h/db?sslmode=disable"),
            Some(Backend::Postgres)
        );
        assert_eq!(
            Backend::from_url("postgresql://u@h/db"),
            Some(Backend::Postgres)
        );
        assert_eq!(Backend::from_url("mysql://root@h/db"), Some(Backend::Mysql));
        assert_eq!(
            Backend::from_url("mariadb://root@h/db"),
            Some(Backend::Mysql)
        );
        assert_eq!(Backend::from_url("redis://h"), None);
        assert_eq!(Backend::from_url(""), None);
        assert_eq!(
            Backend::from_backend_name("PostgreSQL"),
            Some(Backend::Postgres)
        );
        assert_eq!(Backend::from_backend_name("MySQL"), Some(Backend::Mysql));
        assert_eq!(Backend::from_backend_name("SQLite"), Some(Backend::Sqlite));
    }

    #[test]
    fn names_round_trip_through_urls() {
        for backend in Backend::ALL {
            let url = format!("{}://somewhere", backend.name());
            assert_eq!(Backend::from_url(&url), Some(backend));
            assert_eq!(Backend::from_name(backend.name()), Some(backend));
            assert_eq!(backend.to_string(), backend.name());
        }
        assert_eq!(Backend::from_name("MariaDB"), Some(Backend::Mysql));
        assert_eq!(Backend::from_name("postgresql"), Some(Backend::Postgres));
        assert_eq!(Backend::from_name("oracle"), None);
    }

    #[test]
    fn only_sqlite_begins_immediate() {
        assert_eq!(Backend::Sqlite.begin_statement(), Some("BEGIN IMMEDIATE"));
        assert_eq!(Backend::Postgres.begin_statement(), None);
        assert_eq!(Backend::Mysql.begin_statement(), None);
        assert_eq!(Backend::Sqlite.begin_sql(), "BEGIN IMMEDIATE");
        assert_eq!(Backend::Postgres.begin_sql(), "BEGIN");
        assert_eq!(Backend::Mysql.begin_sql(), "BEGIN");
    }

    #[test]
    fn only_postgres_numbers_its_placeholders() {
        assert_eq!(Backend::Postgres.placeholders(), Placeholders::Numbered);
        assert_eq!(Backend::Sqlite.placeholders(), Placeholders::QuestionMark);
        assert_eq!(Backend::Mysql.placeholders(), Placeholders::QuestionMark);
        assert_eq!(
            Backend::Postgres.rewrite("a = ? AND b = ?"),
            "a = $1 AND b = $2"
        );
        assert_eq!(Backend::Mysql.rewrite("a = ?"), "a = ?");
    }
}

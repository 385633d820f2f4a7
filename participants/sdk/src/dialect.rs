//! The three SQL dialects a participant database can speak, and the little that differs.
//!
//! `sqlx::Any` passes SQL through untouched, so a participant written once for any backend
//! still has to send `$1` to PostgreSQL and `?` to SQLite and MySQL. [`Dialect::sql`] lets
//! business code be written once with `?` placeholders.

use std::fmt;

use sqlx::AssertSqlSafe;

/// A database family. MariaDB speaks [`Dialect::Mysql`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    Sqlite,
    Postgres,
    Mysql,
}

impl Dialect {
    pub const ALL: [Dialect; 3] = [Dialect::Sqlite, Dialect::Postgres, Dialect::Mysql];

    pub fn name(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
        }
    }

    /// The dialect of a connection URL, from its scheme (`sqlite:`, `postgres://`,
    /// `postgresql://`, `mysql://`, `mariadb://`).
    pub fn from_url(url: &str) -> Option<Dialect> {
        let scheme = url.split(':').next()?.to_ascii_lowercase();
        match scheme.as_str() {
            "sqlite" => Some(Dialect::Sqlite),
            "postgres" | "postgresql" => Some(Dialect::Postgres),
            "mysql" | "mariadb" => Some(Dialect::Mysql),
            _ => None,
        }
    }

    /// The dialect behind an `AnyConnection`, from the driver's name.
    pub fn from_backend_name(name: &str) -> Option<Dialect> {
        match name {
            "SQLite" => Some(Dialect::Sqlite),
            "PostgreSQL" => Some(Dialect::Postgres),
            "MySQL" => Some(Dialect::Mysql),
            _ => None,
        }
    }

    /// The statement that opens a barrier transaction.
    ///
    /// SQLite needs `BEGIN IMMEDIATE`: a plain (deferred) transaction takes the write lock
    /// only at its first write, and two deferred transactions that both read first cannot
    /// both upgrade, so one fails with `SQLITE_BUSY` without waiting. Taking the lock up
    /// front makes concurrent steps queue on the busy timeout instead.
    pub fn begin_statement(self) -> Option<&'static str> {
        match self {
            Dialect::Sqlite => Some("BEGIN IMMEDIATE"),
            Dialect::Postgres | Dialect::Mysql => None,
        }
    }

    /// `text` with its `?` placeholders rewritten for this dialect, ready for
    /// `sqlx::query`. PostgreSQL gets `$1, $2, ...`; the others get the text unchanged.
    ///
    /// Question marks inside string literals, quoted identifiers and comments are left
    /// alone. PostgreSQL operators spelled with `?` (the jsonb `?|`) cannot be used in text
    /// passed here.
    pub fn sql(self, text: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(self.rewrite(text))
    }

    /// The rewriting behind [`Dialect::sql`], as a plain string.
    pub fn rewrite(self, text: &str) -> String {
        match self {
            Dialect::Postgres => numbered_placeholders(text),
            Dialect::Sqlite | Dialect::Mysql => text.to_owned(),
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Replaces each `?` outside literals and comments by `$n`, counting from 1.
fn numbered_placeholders(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0u32;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                // A quoted literal or identifier; a doubled quote is an escaped quote and is
                // simply copied as "close then reopen".
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                out.push(c);
                out.push(chars.next().expect("peeked"));
                let mut prev = '\0';
                for d in chars.by_ref() {
                    out.push(d);
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
            }
            '?' => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_placeholders_are_numbered() {
        assert_eq!(
            Dialect::Postgres.rewrite("UPDATE t SET a = ?, b = ? WHERE k = ?"),
            "UPDATE t SET a = $1, b = $2 WHERE k = $3"
        );
    }

    #[test]
    fn other_dialects_keep_question_marks() {
        let q = "SELECT a FROM t WHERE k = ? AND j = ?";
        assert_eq!(Dialect::Sqlite.rewrite(q), q);
        assert_eq!(Dialect::Mysql.rewrite(q), q);
    }

    #[test]
    fn literals_identifiers_and_comments_are_left_alone() {
        assert_eq!(
            Dialect::Postgres.rewrite(
                "SELECT '?', 'it''s?', \"we?ird\" FROM t -- why?\nWHERE k = ? /* ? */ AND j = ?"
            ),
            "SELECT '?', 'it''s?', \"we?ird\" FROM t -- why?\nWHERE k = $1 /* ? */ AND j = $2"
        );
    }

    #[test]
    fn dialect_from_url_and_backend_name() {
        assert_eq!(
            Dialect::from_url("sqlite://x.db?mode=rwc"),
            Some(Dialect::Sqlite)
        );
        assert_eq!(Dialect::from_url("sqlite::memory:"), Some(Dialect::Sqlite));
        assert_eq!(
            Dialect::from_url("postgres://u@h/db?sslmode=disable"),
            Some(Dialect::Postgres)
        );
        assert_eq!(
            Dialect::from_url("postgresql://u@h/db"),
            Some(Dialect::Postgres)
        );
        assert_eq!(Dialect::from_url("mysql://root@h/db"), Some(Dialect::Mysql));
        assert_eq!(
            Dialect::from_url("mariadb://root@h/db"),
            Some(Dialect::Mysql)
        );
        assert_eq!(Dialect::from_url("redis://h"), None);
        assert_eq!(
            Dialect::from_backend_name("PostgreSQL"),
            Some(Dialect::Postgres)
        );
        assert_eq!(Dialect::from_backend_name("MySQL"), Some(Dialect::Mysql));
        assert_eq!(Dialect::from_backend_name("SQLite"), Some(Dialect::Sqlite));
    }

    #[test]
    fn only_sqlite_begins_immediate() {
        assert_eq!(Dialect::Sqlite.begin_statement(), Some("BEGIN IMMEDIATE"));
        assert_eq!(Dialect::Postgres.begin_statement(), None);
        assert_eq!(Dialect::Mysql.begin_statement(), None);
    }
}

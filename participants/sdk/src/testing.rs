//! Fresh, isolated databases for tests, on each backend idem supports.
//!
//! Every call makes a new database (a new file for SQLite, `CREATE DATABASE` on the
//! servers), so tests can run in parallel and never see each other's rows.
//!
//! Server URLs come from `IDEM_TEST_POSTGRES_URL` and `IDEM_TEST_MYSQL_URL`, defaulting to
//! the local servers this project's machines run. A server that cannot be reached is a
//! test failure, loudly, with the reason: a test that cannot run is never counted as
//! passed, so there is no switch to skip a backend.
//!
//! [`in_own_process`] runs a test that must be alone in its process (it reads a
//! process-wide recorder) in a child process of its binary; [`IdemServe`] starts the
//! coordinator (`idem serve`) as a child process, for the coordinator's own tests and the
//! lab.

use std::path::PathBuf;

use sqlx::Connection;

mod idem_serve;
mod own_process;
pub mod proxy;
pub use idem_serve::{IdemProcess, IdemServe, StartError};
pub use own_process::in_own_process;
pub use proxy::TcpProxy;

/// The database backends: idem's one backend enum, re-exported for tests.
pub use idem_sql::Backend;

/// What a test needs to know of a backend beyond the enum: where its server is.
pub trait TestBackend {
    /// The URL of the server's maintenance database, where test databases are created.
    fn admin_url(self) -> Option<String>;
}

impl TestBackend for Backend {
    fn admin_url(self) -> Option<String> {
        match self {
            Backend::Sqlite => None,
            Backend::Postgres => {
                Some(std::env::var("IDEM_TEST_POSTGRES_URL").unwrap_or_else(|_| {
                    "postgres://postgres@127.0.0.1:5432/test?sslmode=disable".into()
                }))
            }
            Backend::Mysql => Some(
                std::env::var("IDEM_TEST_MYSQL_URL")
                    .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into()),
            ),
        }
    }
}

/// A database that exists only for one test.
pub struct TestDatabase {
    /// Which database server (or SQLite).
    pub backend: Backend,
    /// Connect here.
    pub url: String,
    name: String,
    file: Option<PathBuf>,
}

impl TestDatabase {
    /// Creates a fresh database. Panics with a clear message when a server cannot be
    /// reached; `test` names the test in that message.
    pub async fn create(backend: Backend, test: &str) -> TestDatabase {
        let name = format!("idem_t_{}", uuid::Uuid::new_v4().simple());
        match backend {
            Backend::Sqlite => {
                let file = std::env::temp_dir().join(format!("{name}.db"));
                TestDatabase {
                    backend,
                    url: format!("sqlite://{}?mode=rwc", file.display()),
                    name,
                    file: Some(file),
                }
            }
            Backend::Postgres | Backend::Mysql => {
                let admin = backend.admin_url().expect("server backend");
                admin_execute(backend, &admin, format!("CREATE DATABASE {name}"))
                    .await
                    .unwrap_or_else(|e| {
                        panic!("{test}: cannot create a test database on {backend}: {e}")
                    });
                TestDatabase {
                    backend,
                    url: replace_database(&admin, &name),
                    name,
                    file: None,
                }
            }
        }
    }

    /// The database's name (the file name for SQLite).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Removes the database. Best effort: a test that fails before calling it leaves a
    /// database named `idem_t_...` behind.
    pub async fn drop_database(self) {
        match self.backend {
            Backend::Sqlite => {
                if let Some(file) = &self.file {
                    for suffix in ["", "-wal", "-shm"] {
                        let mut path = file.clone().into_os_string();
                        path.push(suffix);
                        let _ = std::fs::remove_file(path);
                    }
                }
            }
            Backend::Postgres | Backend::Mysql => {
                let admin = self.backend.admin_url().expect("server backend");
                let drop = match self.backend {
                    Backend::Postgres => {
                        format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)
                    }
                    _ => format!("DROP DATABASE IF EXISTS {}", self.name),
                };
                let _ = admin_execute(self.backend, &admin, drop).await;
            }
        }
    }
}

/// The databases to run a cross-backend test on: SQLite, PostgreSQL and MySQL/MariaDB.
pub async fn all(test: &str) -> Vec<TestDatabase> {
    let mut out = Vec::new();
    for backend in Backend::ALL {
        out.push(TestDatabase::create(backend, test).await);
    }
    out
}

/// Runs one statement on the server's maintenance database. Panics when the server is
/// unreachable, so that a missing database never passes for a skipped one.
async fn admin_execute(backend: Backend, url: &str, sql: String) -> Result<(), sqlx::Error> {
    let unreachable = |e: sqlx::Error| -> ! {
        panic!(
            "{backend} is unreachable at {url}: {e}\n\
             Start it, or point IDEM_TEST_{}_URL at it.",
            backend.name().to_uppercase()
        )
    };
    let sql = sqlx::AssertSqlSafe(sql);
    match backend {
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url)
                .await
                .unwrap_or_else(|e| unreachable(e));
            sqlx::raw_sql(sql).execute(&mut conn).await?;
            let _ = conn.close().await;
        }
        Backend::Mysql => {
            let mut conn = sqlx::MySqlConnection::connect(url)
                .await
                .unwrap_or_else(|e| unreachable(e));
            sqlx::raw_sql(sql).execute(&mut conn).await?;
            let _ = conn.close().await;
        }
        Backend::Sqlite => unreachable!("SQLite has no server"),
    }
    Ok(())
}

fn replace_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map(|i| i + 3).unwrap_or(0);
    let path_start = base[scheme_end..]
        .find('/')
        .map(|i| i + scheme_end)
        .unwrap_or(base.len());
    let mut out = format!("{}/{}", &base[..path_start], name);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn database_name_is_replaced() {
        assert_eq!(
            replace_database("postgres://u@h:5432/test?sslmode=disable", "x"),
            "postgres://u@h:5432/x?sslmode=disable"
        );
        assert_eq!(
            replace_database("mysql://root@h:3306/test", "x"),
            "mysql://root@h:3306/x"
        );
        assert_eq!(
            replace_database("mysql://root@h:3306", "x"),
            "mysql://root@h:3306/x"
        );
    }
}

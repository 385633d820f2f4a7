//! A PostgreSQL server of the test's own, for tests that restart the database server: the
//! shared one on 5432 serves everyone's tests and must never go down. `initdb` into a
//! temporary directory (owned by the `postgres` user when the tests run as root, since
//! PostgreSQL refuses to run as root), started on a free port with its socket in that
//! directory; stopped and removed on drop.

use std::path::PathBuf;
use std::process::Command;

pub struct PrivatePostgres {
    pub port: u16,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl PrivatePostgres {
    /// Starts one; a machine without PostgreSQL's programs fails the test, as a missing
    /// server would.
    pub fn start(test: &str) -> PrivatePostgres {
        let bin = bin_dir().unwrap_or_else(|| {
            panic!(
                "{test}: no PostgreSQL programs (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; \
                 or set IDEM_TEST_PG_BIN"
            )
        });
        let as_postgres = run(Command::new("id").arg("-u")).trim() == "0";
        let dir = std::env::temp_dir().join(format!("idem-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut pg = PrivatePostgres {
            port: 0,
            dir,
            bin,
            as_postgres,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&pg.dir));
        }
        run(pg
            .command("initdb")
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-D"])
            .arg(pg.data()));
        // A port nobody listens on now; PostgreSQL binds it a moment later.
        pg.port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=300",
            pg.port,
            pg.dir.display()
        );
        let log = pg.dir.join("log");
        run(pg
            .command("pg_ctl")
            .arg("-D")
            .arg(pg.data())
            .args(["-w", "-o", &options, "-l"])
            .arg(&log)
            .arg("start"));
        pg
    }

    /// The maintenance database, where test databases are created.
    pub fn admin_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// A shell command that restarts this server, and only it (`pg_ctl restart` keeps the
    /// options it was started with), returning once it accepts connections again.
    pub fn restart_command(&self) -> String {
        let prefix = if self.as_postgres {
            "runuser -u postgres -- "
        } else {
            ""
        };
        format!(
            "{prefix}{} -D {} -w -m fast -l {} restart",
            self.bin.join("pg_ctl").display(),
            self.data().display(),
            self.dir.join("log").display()
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "stop"])
            .output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `IDEM_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/<version>/bin` with `initdb`.
fn bin_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("IDEM_TEST_PG_BIN") {
        return Some(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// Runs a command to completion; panics with its output if it fails.
fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

//! Backups taken while idem serves, and what restoring one means, on each backend: SQLite
//! with `idem backup` (`VACUUM INTO`), PostgreSQL with `pg_dump`/`pg_restore`, MariaDB
//! with `mariadb-dump --single-transaction --hex-blob`/`mariadb` (docs/operations.md#backup-and-restore).
//!
//! After a restore: what finished before the backup is as it was; what was unfinished is
//! driven again to its end (its participant sees the call again, which its barrier
//! absorbs); what was created after the backup is gone, and the client's retry with the
//! same gid and body creates it again.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::Child;
use common::recorder::Recorder;
use common::typed::{self, wait_status};
use idem_client::{Client, Error, Status, TxView};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn sqlite_file(url: &str) -> PathBuf {
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    PathBuf::from(path.split('?').next().unwrap())
}

fn run(command: &mut Command) -> String {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Host, port, user and database of a `mysql://user@host:port/db` URL.
fn mysql_parts(url: &str) -> (String, String, String, String) {
    let u = reqwest::Url::parse(url).unwrap();
    (
        u.host_str().unwrap().to_owned(),
        u.port().unwrap_or(3306).to_string(),
        u.username().to_owned(),
        u.path().trim_start_matches('/').to_owned(),
    )
}

/// Copies `db` with its backend's tool while it is in use; the copy's path.
fn back_up(db: &TestDatabase, dir: &Path) -> PathBuf {
    let to = dir.join("backup");
    match db.backend {
        Backend::Sqlite => {
            let printed = common::idem_cli(&[
                "backup",
                "--database-url",
                &db.url,
                "--to",
                to.to_str().unwrap(),
            ]);
            assert!(printed.contains("(1 unfinished)"), "{printed}");
        }
        Backend::Postgres => {
            run(Command::new("pg_dump")
                .args(["--format=custom", "--no-owner", "--file"])
                .arg(&to)
                .arg(&db.url));
        }
        Backend::Mysql => {
            let (host, port, user, name) = mysql_parts(&db.url);
            // --hex-blob: the migrations' checksums are binary, and a dump of raw bytes
            // read back through a text connection comes back changed.
            let dump = run(Command::new("mariadb-dump").args([
                "--single-transaction",
                "--hex-blob",
                "-h",
                &host,
                "-P",
                &port,
                "-u",
                &user,
                &name,
            ]));
            std::fs::write(&to, dump).unwrap();
        }
    }
    to
}

/// Restores `backup` into a database of `db`'s backend: over the file for SQLite, into a
/// new database on the servers. The URL to serve from.
async fn restore(db: &TestDatabase, backup: &Path) -> (String, Option<TestDatabase>) {
    match db.backend {
        Backend::Sqlite => {
            let file = sqlite_file(&db.url);
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
            std::fs::copy(backup, &file).unwrap();
            (db.url.clone(), None)
        }
        Backend::Postgres => {
            let target = TestDatabase::create(Backend::Postgres, "restored").await;
            run(Command::new("pg_restore")
                .args(["--no-owner", "--dbname"])
                .arg(&target.url)
                .arg(backup));
            (target.url.clone(), Some(target))
        }
        Backend::Mysql => {
            let target = TestDatabase::create(Backend::Mysql, "restored").await;
            let (host, port, user, name) = mysql_parts(&target.url);
            run(Command::new("mariadb")
                .args(["-h", &host, "-P", &port, "-u", &user, &name])
                .stdin(std::fs::File::open(backup).unwrap()));
            (target.url.clone(), Some(target))
        }
    }
}

async fn saga(idem: &Client, p: &Recorder, gid: &str, action: &str) -> Result<TxView, Error> {
    idem.saga(gid)
        .step(p.url(action), p.url("/undo"), json!({"gid": gid}))
        .send()
        .await
        .map(|c| c.view)
}

async fn backup_and_restore(backend: Backend) {
    let db = TestDatabase::create(backend, "backup").await;
    let dir = std::env::temp_dir().join(format!(
        "idem-backup-{}-{}",
        std::process::id(),
        backend.name()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let p = Recorder::start().await;
    p.delay("/slow", None, 1_000_000, Duration::from_secs(3_600));

    let first = Child::serve(&db.url, "first", &[]).await;
    let idem = typed::client(&first.url);
    saga(&idem, &p, "done", "/quick").await.unwrap();
    wait_status(&idem, "done", &[Status::Succeeded], WAIT).await;
    saga(&idem, &p, "unfinished", "/slow").await.unwrap();
    wait_status(&idem, "unfinished", &[Status::Running], WAIT).await;

    let backup = back_up(&db, &dir);

    saga(&idem, &p, "after", "/quick").await.unwrap();
    wait_status(&idem, "after", &[Status::Succeeded], WAIT).await;
    assert_eq!(p.count("after", "/quick"), 1, "{backend}");
    first.kill();
    p.heal();

    let (url, restored) = restore(&db, &backup).await;
    let second = Child::serve(&url, "second", &[]).await;
    let idem = typed::client(&second.url);
    // Finished before the backup: as it was, not called again.
    let done = idem.get("done").await.unwrap();
    assert_eq!(done.status, Status::Succeeded, "{backend}");
    assert_eq!(p.count("done", "/quick"), 1, "{backend}");
    // Unfinished at the backup: driven again to its end.
    wait_status(&idem, "unfinished", &[Status::Succeeded], WAIT).await;
    assert!(p.count("unfinished", "/slow") >= 1, "{backend}");
    // Created after the backup: gone, and the client's retry makes it again; its
    // participant sees the step a second time (its barrier absorbs it).
    let gone = idem.get("after").await;
    assert!(
        matches!(&gone, Err(Error::Api { status: 404, .. })),
        "{backend}: {gone:?}"
    );
    let again = idem
        .saga("after")
        .step(p.url("/quick"), p.url("/undo"), json!({"gid": "after"}))
        .send()
        .await
        .unwrap();
    assert!(again.new, "{backend}: created again");
    wait_status(&idem, "after", &[Status::Succeeded], WAIT).await;
    assert_eq!(p.count("after", "/quick"), 2, "{backend}");
    assert_eq!(p.count("after", "/undo") + p.count("done", "/undo"), 0);

    second.kill();
    if let Some(restored) = restored {
        restored.drop_database().await;
    }
    db.drop_database().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_restored_sqlite_backup_finishes_what_was_unfinished_and_forgets_what_came_after() {
    backup_and_restore(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_restored_postgres_dump_finishes_what_was_unfinished_and_forgets_what_came_after() {
    backup_and_restore(Backend::Postgres).await;
}

#[tokio::test]
async fn a_restored_mariadb_dump_finishes_what_was_unfinished_and_forgets_what_came_after() {
    backup_and_restore(Backend::Mysql).await;
}

/// `idem backup` refuses to overwrite a file and points PostgreSQL and MariaDB users at
/// their tools; nothing is written.
#[tokio::test]
async fn idem_backup_refuses_what_it_cannot_do_and_writes_nothing() {
    let db = TestDatabase::create(Backend::Sqlite, "backup_refusals").await;
    Child::serve(&db.url, "once", &[]).await.kill();
    let dir = std::env::temp_dir().join(format!("idem-backup-refusals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let existing = dir.join("existing");
    std::fs::write(&existing, "keep me").unwrap();
    let out = common::idem_run(
        &[
            "backup",
            "--database-url",
            &db.url,
            "--to",
            existing.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("exists"));
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    for (url, tool) in [
        ("postgres://u:pw@127.0.0.1:1/x", "pg_dump"),
        ("mysql://u:pw@127.0.0.1:1/x", "mariadb-dump"),
    ] {
        let to = dir.join("never");
        let out = common::idem_run(
            &[
                "backup",
                "--database-url",
                url,
                "--to",
                to.to_str().unwrap(),
            ],
            &[],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains(tool), "{stderr}");
        assert!(
            !stderr.contains("pw@"),
            "the password stays hidden: {stderr}"
        );
        assert!(!to.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_database().await;
}

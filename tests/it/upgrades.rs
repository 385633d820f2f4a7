//! Upgrades and rollbacks, on SQLite, PostgreSQL and MariaDB.
//!
//! - A database at every earlier schema version (the first k migrations of the repo),
//!   holding transactions of every kind in every unfinished status, is migrated by this
//!   binary, which then finishes every one of them as it should.
//! - This binary serves on a schema that a newer binary extended with a compatible
//!   migration, and refuses, naming both versions, a schema extended incompatibly.
//! - Two coordinators, one started before a newer binary's migration and one after, drive
//!   one database together.
//!
//! The unfinished transactions are made by a real coordinator killed while their calls
//! hang, and carried onto each older schema column by column (the columns that schema has;
//! the newer ones take the defaults their migrations give).

use crate::common;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use common::Child;
use common::recorder::Recorder;
use common::typed::{self, created, created_tcc, register, wait_status};
use idem_client::{Client, Options, Status, TxView};
use idem_participant::testing::{Backend, TestDatabase};
use serde_json::json;
use sqlx::migrate::{Migration, Migrator};
use sqlx::{AnyPool, Row};

const WAIT: Duration = Duration::from_secs(60);
const FOREVER: usize = 1_000_000;
/// Longer than any test: a call held this long never comes back.
const HANG: Duration = Duration::from_secs(3_600);

/// The tables whose rows a transaction is (tokens and coordinators' rows are not needed).
const TABLES: [&str; 3] = ["idem_global", "idem_branch", "idem_attempt"];

/// The repo's migrations for `backend`, oldest first.
async fn repo_migrations(backend: Backend) -> Vec<Migration> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("crates/store/migrations")
        .join(backend.name());
    Migrator::new(dir.as_path())
        .await
        .expect("the repo's migrations load")
        .migrations
        .to_vec()
}

/// Applies the first `k` of `migrations`, as the binary that had only those left it.
async fn apply_first(pool: &AnyPool, migrations: &[Migration], k: usize) {
    let migrator = Migrator {
        migrations: Cow::Owned(migrations[..k].to_vec()),
        ..Migrator::DEFAULT
    };
    migrator.run(pool).await.expect("the older schema builds");
}

/// One stored value, as far as these tables hold them.
#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
}

type StoredRow = Vec<(String, Cell)>;

fn cell(row: &sqlx::any::AnyRow, i: usize) -> Cell {
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return v.map_or(Cell::Null, Cell::Int);
    }
    if let Ok(v) = row.try_get::<Option<String>, _>(i) {
        return v.map_or(Cell::Null, Cell::Text);
    }
    if let Ok(v) = row.try_get::<Option<bool>, _>(i) {
        return v.map_or(Cell::Null, Cell::Bool);
    }
    panic!("column {i} holds a value these tests cannot carry");
}

/// Boolean columns: sqlx's `Any` driver cannot read SQLite's, so they are read as 0 or 1
/// and written back as booleans.
const BOOLEAN_COLUMNS: [&str; 1] = ["tokenless"];

/// Every row of the transaction tables, the columns an insert may name.
async fn dump(pool: &AnyPool, backend: Backend) -> BTreeMap<&'static str, Vec<StoredRow>> {
    let mut out = BTreeMap::new();
    for table in TABLES {
        let columns: Vec<String> = insertable(pool, backend, table).await.into_iter().collect();
        let select: Vec<String> = columns
            .iter()
            .map(|c| {
                if BOOLEAN_COLUMNS.contains(&c.as_str()) {
                    format!("CASE WHEN {c} THEN 1 ELSE 0 END AS {c}")
                } else {
                    c.clone()
                }
            })
            .collect();
        let order = if table == "idem_attempt" {
            " ORDER BY id"
        } else {
            ""
        };
        let sql = format!("SELECT {} FROM {table}{order}", select.join(", "));
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap();
        let rows = rows
            .iter()
            .map(|row| {
                columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.clone(), cell(row, i)))
                    .collect()
            })
            .collect();
        out.insert(table, rows);
    }
    out
}

/// The columns of `table` an insert may name (not generated ones).
async fn insertable(pool: &AnyPool, backend: Backend, table: &str) -> BTreeSet<String> {
    let sql = match backend {
        Backend::Sqlite => {
            format!("SELECT name FROM pragma_table_xinfo('{table}') WHERE hidden = 0")
        }
        Backend::Postgres => format!(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema() AND table_name = '{table}' AND is_generated = 'NEVER'"
        ),
        Backend::Mysql => format!(
            "SELECT CAST(column_name AS CHAR) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = '{table}' AND extra NOT LIKE '%GENERATED%'"
        ),
    };
    let names: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_all(pool)
        .await
        .unwrap();
    assert!(!names.is_empty(), "{backend}: {table} has columns");
    names.into_iter().collect()
}

/// Writes `rows` into a database at an older schema: each row with the columns that schema
/// has (an attempt's id is left to the database, in the same order).
async fn load(pool: &AnyPool, backend: Backend, rows: &BTreeMap<&'static str, Vec<StoredRow>>) {
    for (table, rows) in rows {
        let columns = insertable(pool, backend, table).await;
        for row in rows {
            let kept: Vec<&(String, Cell)> = row
                .iter()
                .filter(|(name, value)| {
                    columns.contains(name)
                        && *value != Cell::Null
                        && !(*table == "idem_attempt" && name == "id")
                })
                .collect();
            let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
            let marks = vec!["?"; kept.len()].join(", ");
            let sql = backend.rewrite(&format!(
                "INSERT INTO {table} ({}) VALUES ({marks})",
                names.join(", ")
            ));
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (name, value) in &kept {
                query = match value {
                    Cell::Int(v) if BOOLEAN_COLUMNS.contains(&name.as_str()) => query.bind(*v != 0),
                    Cell::Int(v) => query.bind(*v),
                    Cell::Text(v) => query.bind(v.clone()),
                    Cell::Bool(v) => query.bind(*v),
                    Cell::Null => unreachable!("left out above"),
                };
            }
            query
                .execute(pool)
                .await
                .unwrap_or_else(|e| panic!("{backend}: a {table} row: {e}"));
        }
    }
}

/// The unfinished transactions, and the status each must end in.
struct InFlight {
    expected: BTreeMap<String, Status>,
    /// Stalled ones, which an operator resumes after the upgrade.
    stalled: Vec<String>,
}

/// A coordinator leaves transactions of every kind in every unfinished status on `db`: it is
/// killed while their calls hang.
async fn leave_in_flight(db: &TestDatabase, p: &Recorder) -> InFlight {
    let b = db.backend;
    p.delay("/hang/action", None, FOREVER, HANG);
    p.delay("/hc/confirm", None, FOREVER, HANG);
    p.delay("/ha/cancel", None, FOREVER, HANG);
    p.delay("/hang/compensate", None, FOREVER, HANG);
    p.delay("/hang/check", None, FOREVER, HANG);
    p.delay("/hang/deliver", None, FOREVER, HANG);
    p.answer("/no/action", None, FOREVER, 409);
    p.answer("/flaky/compensate", None, FOREVER, 503);
    // The prepared TCC and msg time out soon after the upgrade: one is aborted, the other
    // asked about (the back-check answers that it committed).
    let old = Child::serve(&db.url, "old", &["--prepared-timeout-ms", "4000"]).await;
    let idem = typed::client(&old.url);
    let saga = |gid: &str, steps: &[(&str, &str)], options: Options| {
        let builder = steps
            .iter()
            .fold(idem.saga(gid), |saga, (action, compensate)| {
                saga.step(p.url(action), p.url(compensate), json!({"gid": gid}))
            });
        builder.options(options).send()
    };
    let mut expected = BTreeMap::new();
    let mut seen = HashMap::new();

    // Saga, running: its first step done, the second hanging.
    created(
        saga(
            "saga-running",
            &[
                ("/ok/action", "/ok/compensate"),
                ("/hang/action", "/ok/compensate"),
            ],
            Options::default(),
        )
        .await
        .unwrap(),
    );
    expected.insert("saga-running".to_owned(), Status::Succeeded);
    // Saga, aborting: its second step refused, the first one's compensation hanging.
    created(
        saga(
            "saga-aborting",
            &[
                ("/ok/action", "/hang/compensate"),
                ("/no/action", "/ok/compensate"),
            ],
            Options::default(),
        )
        .await
        .unwrap(),
    );
    expected.insert("saga-aborting".to_owned(), Status::Failed);
    // Saga, stalled: its second step refused, the first one's compensation failed both
    // attempts it had.
    let stalled = Options {
        max_attempts: Some(2),
        ..Options::default()
    };
    created(
        saga(
            "saga-stalled",
            &[
                ("/ok/action", "/flaky/compensate"),
                ("/no/action", "/ok/compensate"),
            ],
            stalled,
        )
        .await
        .unwrap(),
    );
    expected.insert("saga-stalled".to_owned(), Status::Failed);
    // TCC, prepared: a branch registered, never submitted.
    let tcc = idem
        .tcc("tcc-prepared")
        .create()
        .await
        .map(created_tcc)
        .unwrap();
    register(&tcc, p, "a").await.unwrap();
    expected.insert("tcc-prepared".to_owned(), Status::Failed);
    // TCC, committing: its Confirm hanging.
    let tcc = idem
        .tcc("tcc-committing")
        .create()
        .await
        .map(created_tcc)
        .unwrap();
    register(&tcc, p, "hc").await.unwrap();
    idem.submit("tcc-committing", false).await.unwrap();
    expected.insert("tcc-committing".to_owned(), Status::Succeeded);
    // TCC, aborting: its Cancel hanging.
    let tcc = idem
        .tcc("tcc-aborting")
        .create()
        .await
        .map(created_tcc)
        .unwrap();
    register(&tcc, p, "ha").await.unwrap();
    idem.abort("tcc-aborting", None, false).await.unwrap();
    expected.insert("tcc-aborting".to_owned(), Status::Failed);
    // Msg, prepared: never submitted; its back-check will say it committed.
    idem.msg("msg-prepared")
        .step(p.url("/ok/deliver"), json!({}))
        .query_prepared(p.url("/hang/check"))
        .prepare()
        .await
        .unwrap();
    expected.insert("msg-prepared".to_owned(), Status::Succeeded);
    // Msg, committing: submitted, its action hanging.
    idem.msg("msg-committing")
        .step(p.url("/hang/deliver"), json!({}))
        .prepare()
        .await
        .unwrap();
    idem.submit("msg-committing", false).await.unwrap();
    expected.insert("msg-committing".to_owned(), Status::Succeeded);

    wait_status(&idem, "saga-stalled", &[Status::Stalled], WAIT).await;
    wait_status(&idem, "saga-aborting", &[Status::Aborting], WAIT).await;
    p.wait_until(WAIT, |calls| {
        calls
            .iter()
            .any(|c| c.gid == "saga-running" && c.path == "/ok/action")
    })
    .await;
    for gid in expected.keys() {
        let tx: TxView = idem.get(gid).await.unwrap();
        assert!(!tx.status.is_terminal(), "{b}: {gid} is {:?}", tx.status);
        seen.insert(tx.status, gid.clone());
    }
    let unfinished: HashSet<Status> = Status::ALL
        .iter()
        .copied()
        .filter(|s| !s.is_terminal())
        .collect();
    assert_eq!(
        seen.keys().copied().collect::<HashSet<_>>(),
        unfinished,
        "{b}: every unfinished status is left in flight"
    );
    old.kill();
    p.heal();
    InFlight {
        expected,
        stalled: vec!["saga-stalled".to_owned()],
    }
}

/// Starts this binary on `db` (which it migrates), resumes the stalled transactions as an
/// operator would, and checks that every transaction ends as expected with the calls it
/// should have made.
async fn finish(db: &TestDatabase, p: &Recorder, flight: &InFlight, label: &str) {
    let b = db.backend;
    // The calls of earlier runs on the same participant are not this run's.
    let since = p.calls().len();
    let new = Child::serve(&db.url, "new", &[]).await;
    let idem = typed::client(&new.url);
    for gid in &flight.stalled {
        wait_status(&idem, gid, &[Status::Stalled], WAIT).await;
        idem.retry(gid).await.unwrap();
    }
    for (gid, status) in &flight.expected {
        let tx = wait_status(&idem, gid, &[Status::Succeeded, Status::Failed], WAIT).await;
        assert_eq!(tx.status, *status, "{b} {label}: {gid}: {tx:#?}");
    }
    let calls = p.calls().split_off(since);
    let called = |gid: &str, path: &str| calls.iter().any(|c| c.gid == gid && c.path == path);
    for (gid, path) in [
        ("saga-running", "/hang/action"),
        ("saga-aborting", "/hang/compensate"),
        ("saga-stalled", "/flaky/compensate"),
        ("tcc-prepared", "/a/cancel"),
        ("tcc-committing", "/hc/confirm"),
        ("tcc-aborting", "/ha/cancel"),
        ("msg-prepared", "/hang/check"),
        ("msg-prepared", "/ok/deliver"),
        ("msg-committing", "/hang/deliver"),
    ] {
        assert!(called(gid, path), "{b} {label}: {gid} called {path}");
    }
    for (gid, path) in [
        ("saga-running", "/ok/compensate"),
        ("tcc-prepared", "/a/confirm"),
        ("tcc-committing", "/hc/cancel"),
        ("tcc-aborting", "/ha/confirm"),
    ] {
        assert!(!called(gid, path), "{b} {label}: {gid} never called {path}");
    }
    new.kill();
}

async fn every_earlier_schema(backend: Backend) {
    let migrations = repo_migrations(backend).await;
    assert!(
        migrations.len() >= 2,
        "{backend}: migrations to upgrade from"
    );
    let source = TestDatabase::create(backend, "upgrade_source").await;
    let p = Recorder::start().await;
    let flight = leave_in_flight(&source, &p).await;
    let rows = dump(
        &idem_participant::connect(&source.url, 1).await.unwrap(),
        backend,
    )
    .await;
    for k in 1..migrations.len() {
        let label = format!(
            "from schema {} ({})",
            migrations[k - 1].version,
            migrations[k - 1].description
        );
        let db = TestDatabase::create(backend, "upgrade_from").await;
        {
            let pool = idem_participant::connect(&db.url, 1).await.unwrap();
            apply_first(&pool, &migrations, k).await;
            load(&pool, backend, &rows).await;
            pool.close().await;
        }
        finish(&db, &p, &flight, &label).await;
        db.drop_database().await;
    }
    source.drop_database().await;
}

#[tokio::test]
async fn every_earlier_schema_is_migrated_and_its_transactions_finish_on_sqlite() {
    every_earlier_schema(Backend::Sqlite).await;
}

#[tokio::test]
async fn every_earlier_schema_is_migrated_and_its_transactions_finish_on_postgres() {
    every_earlier_schema(Backend::Postgres).await;
}

#[tokio::test]
async fn every_earlier_schema_is_migrated_and_its_transactions_finish_on_mariadb() {
    every_earlier_schema(Backend::Mysql).await;
}

/// What a newer binary's `idem migrate` leaves: its migration's change (a column this binary
/// does not know), its row in `_sqlx_migrations`, and its compatibility record naming
/// `oldest_binary`, applied by idem 9.9.0.
async fn newer_migration(pool: &AnyPool, backend: Backend, version: i64, oldest_binary: &str) {
    let column = format!("future_{version}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE idem_global ADD COLUMN {column} VARCHAR(32)"
    )))
    .execute(pool)
    .await
    .unwrap();
    let sql = backend.rewrite(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (?, ?, ?, ?, ?)",
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(version)
        .bind(format!("a newer binary's {column}"))
        .bind(true)
        .bind(vec![7u8; 48])
        .bind(1i64)
        .execute(pool)
        .await
        .unwrap();
    let sql = backend.rewrite(
        "INSERT INTO idem_schema_compat (version, oldest_binary, applied_by) VALUES (?, ?, ?)",
    );
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(version)
        .bind(oldest_binary)
        .bind("9.9.0")
        .execute(pool)
        .await
        .unwrap();
}

async fn migrations_applied(pool: &AnyPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A saga of one step on `p`, run to its end.
async fn one_saga(idem: &Client, p: &Recorder, gid: &str) -> TxView {
    idem.saga(gid)
        .step(p.url("/ok/action"), p.url("/ok/compensate"), json!({}))
        .wait_result(true)
        .create()
        .await
        .unwrap()
}

async fn a_newer_schema(backend: Backend) {
    let db = TestDatabase::create(backend, "upgrade_newer").await;
    let p = Recorder::start().await;
    Child::serve(&db.url, "first", &[]).await.kill();
    let pool = idem_participant::connect(&db.url, 1).await.unwrap();
    newer_migration(&pool, backend, 20991231000001, "0.1.0").await;

    // Compatible: this binary serves on it, and leaves it as it found it.
    let idem = Child::serve(&db.url, "after-compatible", &[]).await;
    let tx = one_saga(&typed::client(&idem.url), &p, "on-a-newer-schema").await;
    assert_eq!(tx.status, Status::Succeeded, "{backend}: {tx:#?}");
    idem.kill();
    let migrate = common::idem_run(&["migrate", "--database-url", &db.url], &[]);
    assert!(migrate.status.success(), "{backend}: {migrate:?}");

    // Incompatible: refused at start and by `idem migrate`, naming the versions, and
    // nothing is changed.
    newer_migration(&pool, backend, 20991231000002, "9.0.0").await;
    let before = migrations_applied(&pool).await;
    for args in [
        vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &db.url,
        ],
        vec!["migrate", "--database-url", &db.url],
    ] {
        let out = common::idem_run(&args, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{backend} {args:?}: {stderr}");
        for part in [
            "20991231000002",
            "9.9.0",
            "9.0.0",
            env!("CARGO_PKG_VERSION"),
        ] {
            assert!(
                stderr.contains(part),
                "{backend} {args:?}: {part} in {stderr}"
            );
        }
    }
    assert_eq!(migrations_applied(&pool).await, before, "{backend}");
    pool.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn a_schema_a_newer_binary_extended_is_served_if_compatible_and_refused_if_not() {
    for backend in Backend::ALL {
        a_newer_schema(backend).await;
    }
}

/// A rolling upgrade: coordinator `a` runs, a newer binary migrates the database under it,
/// coordinator `b` starts on the migrated schema, and both drive transactions on it.
async fn across_a_migration(backend: Backend) {
    let db = TestDatabase::create(backend, "upgrade_rolling").await;
    let p = Recorder::start().await;
    // Slow enough that transactions are in flight when the schema changes.
    p.delay("/slow/action", None, FOREVER, Duration::from_millis(100));
    let a = Child::serve(&db.url, "a", &[]).await;
    let first = typed::client(&a.url);
    let mut gids = Vec::new();
    let saga = |idem: &Client, gid: String| {
        let builder = idem
            .saga(gid)
            .step(p.url("/slow/action"), p.url("/ok/compensate"), json!({}))
            .step(p.url("/ok/action"), p.url("/ok/compensate"), json!({}));
        builder.send()
    };
    for i in 0..10 {
        created(saga(&first, format!("before-{i}")).await.unwrap());
        gids.push(format!("before-{i}"));
    }
    let pool = idem_participant::connect(&db.url, 1).await.unwrap();
    newer_migration(&pool, backend, 20991231000001, "0.1.0").await;
    let b = Child::serve(&db.url, "b", &[]).await;
    let second = typed::client(&b.url);
    for i in 0..10 {
        let idem = if i % 2 == 0 { &first } else { &second };
        created(saga(idem, format!("after-{i}")).await.unwrap());
        gids.push(format!("after-{i}"));
    }
    for gid in &gids {
        for idem in [&first, &second] {
            let tx = wait_status(idem, gid, &[Status::Succeeded], WAIT).await;
            assert_eq!(tx.status, Status::Succeeded, "{backend}: {gid}");
        }
        for path in ["/slow/action", "/ok/action"] {
            assert!(p.count(gid, path) >= 1, "{backend}: {gid} called {path}");
        }
        assert_eq!(p.count(gid, "/ok/compensate"), 0, "{backend}: {gid}");
    }
    a.kill();
    b.kill();
    pool.close().await;
    db.drop_database().await;
}

#[tokio::test]
async fn two_coordinators_drive_one_database_across_a_newer_binarys_migration() {
    for backend in Backend::ALL {
        across_a_migration(backend).await;
    }
}

/// Every migration after the one that made `idem_schema_compat` records its compatibility,
/// so that older binaries can tell whether they may run on it.
#[test]
fn every_migration_records_its_compatibility() {
    for backend in Backend::ALL {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("crates/store/migrations")
            .join(backend.name());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        let first = files
            .iter()
            .position(|f| f.to_string_lossy().ends_with("_schema_compat.sql"))
            .expect("the migration that makes idem_schema_compat");
        for file in &files[first..] {
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            let version = name.split('_').next().unwrap();
            let text = std::fs::read_to_string(file).unwrap();
            assert!(
                text.contains("INSERT INTO idem_schema_compat")
                    && text.contains(&format!("({version}, '")),
                "{backend}: {name} inserts its own row into idem_schema_compat"
            );
        }
    }
}

//! The operator's commands (`idem tx ...`) as an operator meets them: the `idem` binary run
//! as a child process against a real `idem serve` on each backend (or, with
//! `--database-url`, its database), and what it printed read back.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::recorder::Recorder;
use common::{Api, Child, idem_cli, idem_command, idem_run};
use idem::timestamp::rfc3339;
use idem_participant::testing::{self, Backend, TestDatabase};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(40);

fn branch(p: &Recorder, id: &str) -> Value {
    json!({
        "branch_id": id,
        "confirm": p.url(&format!("/{id}/confirm")),
        "cancel": p.url(&format!("/{id}/cancel")),
        "payload": {"branch": id},
    })
}

/// A TCC whose Confirm fails twice, on a server with `--max-attempts 2`: it stalls.
async fn stalled(api: &Api, p: &Recorder, gid: &str) -> Value {
    let body = json!({"gid": gid, "kind": "tcc", "branches": [branch(p, "a")]});
    assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);
    p.answer("/a/confirm", Some(gid), 2, 500);
    let (_, tx) = api
        .post(
            &format!("/api/v1/transactions/{gid}/submit"),
            json!({"wait_result": true}),
        )
        .await;
    assert_eq!(tx["status"], "stalled", "{tx:#}");
    api.get(&format!("/api/v1/transactions/{gid}")).await.1
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_of(args: &[&str]) -> Value {
    let text = idem_cli(args);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("idem {args:?}: {e}: {text}"))
}

/// A fresh empty directory.
fn empty_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// list, show, retry, force-stop and abort through `--server` (and `IDEM_SERVER`), on
/// every backend; `--json` is the API's answer as it is, and `--database-url` reads and
/// writes the same through the database.
#[tokio::test]
async fn operator_commands_through_the_server_on_every_backend() {
    for db in testing::all("cli_through_the_server").await {
        let b = db.backend;
        let p = Recorder::start().await;
        let server = Child::serve(&db.url, "cli", &["--max-attempts", "2"]).await;
        let s = server.url.as_str();
        let api = Api::new(s);
        let view = stalled(&api, &p, "cli-retry").await;
        stalled(&api, &p, "cli-stop").await;
        stalled(&api, &p, "cli-direct").await;
        let body = json!({"gid": "cli-abort", "kind": "tcc", "branches": [branch(&p, "a")]});
        assert_eq!(api.post("/api/v1/transactions", body).await.0, 201);

        // A table with RFC 3339 times, one row per transaction.
        let list = idem_cli(&["tx", "list", "--server", s, "--status", "stalled"]);
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(lines.len(), 4, "{b}: {list}");
        assert!(lines[0].starts_with("GID "), "{b}: {list}");
        let created = view["created_at"].as_i64().unwrap();
        let row = lines.iter().find(|l| l.starts_with("cli-retry ")).unwrap();
        assert!(row.contains(&rfc3339(created)), "{b}: {row}");
        assert!(!row.contains(&created.to_string()), "{b}: raw ms in {row}");
        assert!(row.contains("exhausted 2 attempts"), "{b}: {row}");

        // --json: exactly what the API answers, through the server or the database.
        let (_, page) = api.get("/api/v1/transactions?status=stalled").await;
        let listed = ["tx", "list", "--status", "stalled", "--json"];
        assert_eq!(
            json_of(&[&listed[..], &["--server", s]].concat()),
            page,
            "{b}"
        );
        let direct = json_of(&[&listed[..], &["--database-url", &db.url]].concat());
        assert_eq!(direct, page, "{b}: the database gives what the API gives");

        let shown = idem_cli(&["tx", "show", "--server", s, "cli-retry"]);
        assert!(
            shown.contains("status       stalled (from committing)\n"),
            "{b}: {shown}"
        );
        assert!(shown.contains("calls that did not succeed"), "{b}: {shown}");
        let first_call = view["history"][0]["started_at"].as_i64().unwrap();
        assert!(shown.contains(&rfc3339(first_call)), "{b}: {shown}");
        let shown_json = json_of(&["tx", "show", "--server", s, "cli-retry", "--json"]);
        assert_eq!(shown_json, view, "{b}");
        let shown_direct = json_of(&[
            "tx",
            "show",
            "--database-url",
            &db.url,
            "cli-retry",
            "--json",
        ]);
        assert_eq!(shown_direct, view, "{b}");

        // IDEM_SERVER names the server when --server does not; the server drives the retry.
        let out = idem_run(&["tx", "retry", "cli-retry"], &[("IDEM_SERVER", s)]);
        assert!(out.status.success(), "{b}: {}", stderr(&out));
        assert_eq!(stdout(&out), "cli-retry: committing\n", "{b}");
        api.wait_status("cli-retry", &["succeeded"], WAIT).await;

        // Directly on the database, the row is released for the server to continue.
        let out = idem_cli(&["tx", "retry", "--database-url", &db.url, "cli-direct"]);
        assert_eq!(
            out, "cli-direct: committing (a running idem serve on this database continues it)\n",
            "{b}"
        );
        api.wait_status("cli-direct", &["succeeded"], WAIT).await;

        let out = idem_cli(&[
            "tx",
            "force-stop",
            "--server",
            s,
            "cli-stop",
            "--reason",
            "refunded by hand",
        ]);
        assert_eq!(out, "cli-stop: failed\n", "{b}");
        let (_, tx) = api.get("/api/v1/transactions/cli-stop").await;
        assert_eq!(tx["reason"], "refunded by hand", "{b}");

        let out = idem_cli(&["tx", "abort", "--server", s, "cli-abort"]);
        assert!(
            out == "cli-abort: aborting\n" || out == "cli-abort: failed\n",
            "{b}: {out}"
        );
        api.wait_status("cli-abort", &["failed"], WAIT).await;
        assert_eq!(p.paths("cli-abort"), ["/a/cancel"], "{b}");

        // The API's refusals come out as `code: message`, with a failing status, either way.
        for via in [["--server", s], ["--database-url", db.url.as_str()]] {
            let out = idem_run(&[&["tx", "retry", "cli-stop"][..], &via].concat(), &[]);
            assert!(!out.status.success(), "{b} {via:?}");
            assert!(
                stderr(&out).contains("invalid_state: "),
                "{b} {via:?}: {}",
                stderr(&out)
            );
            let out = idem_run(&[&["tx", "show", "no-such-gid"][..], &via].concat(), &[]);
            assert!(!out.status.success(), "{b} {via:?}");
            assert!(
                stderr(&out).contains("not_found: no transaction with gid \"no-such-gid\""),
                "{b} {via:?}: {}",
                stderr(&out)
            );
        }
        drop(server);
        db.drop_database().await;
    }
}

/// Seen: `idem tx list` in the wrong directory created and migrated an empty `idem.db` and
/// printed an empty table. Now no tx command creates a database.
#[test]
fn a_missing_sqlite_file_is_an_error_and_is_not_created() {
    let dir = empty_dir("cli-missing");
    let file = dir.join("does-not-exist.db");
    let urls = [
        format!("sqlite:{}", file.display()),
        // Even when the URL asks for creation, as the server's default does.
        format!("sqlite://{}?mode=rwc", file.display()),
    ];
    for url in &urls {
        for command in [
            &["tx", "list"][..],
            &["tx", "show", "g"],
            &["tx", "retry", "g"],
            &["tx", "force-stop", "g"],
        ] {
            let out = idem_run(&[command, &["--database-url", url]].concat(), &[]);
            assert!(!out.status.success(), "{command:?} {url}");
            let expected = format!("no SQLite database at {}", file.display());
            assert!(
                stderr(&out).contains(&expected),
                "{command:?} {url}: {}",
                stderr(&out)
            );
            assert_eq!(stdout(&out), "", "{command:?} {url}: no empty table");
        }
    }
    assert_eq!(entries(&dir), Vec::<String>::new(), "nothing created");
    std::fs::remove_dir_all(dir).unwrap();

    // The path of the report, where nobody else made it.
    let literal = Path::new("/tmp/does-not-exist.db");
    if !literal.exists() {
        let out = idem_run(
            &[
                "tx",
                "list",
                "--database-url",
                "sqlite:/tmp/does-not-exist.db",
            ],
            &[],
        );
        assert!(!out.status.success());
        assert!(!literal.exists(), "created {}", literal.display());
    }
}

/// A database that exists but is not idem's is named as such, and left as it was: no
/// migration runs.
#[tokio::test]
async fn a_database_without_idem_tables_is_refused_and_left_alone() {
    use sqlx::Connection;
    let dir = empty_dir("cli-foreign");
    let file = dir.join("other.db");
    let url = format!("sqlite://{}?mode=rwc", file.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("CREATE TABLE other (x INTEGER)")
        .execute(&mut conn)
        .await
        .unwrap();
    let out = idem_run(&["tx", "list", "--database-url", &url], &[]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("cannot read idem's tables"),
        "{}",
        stderr(&out)
    );
    let tables: Vec<String> = sqlx::query_scalar("SELECT name FROM sqlite_master")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(tables, ["other"], "no migration ran");
    conn.close().await.unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A coordinator that is not there is said to be not there; nothing falls back to a
/// database, and nothing is created in the working directory.
#[test]
fn an_unreachable_server_is_a_clear_error() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let dir = empty_dir("cli-unreachable");
    let server = format!("http://127.0.0.1:{port}");
    for (args, env) in [
        (vec!["tx", "list", "--server", &server], vec![]),
        (
            vec!["tx", "show", "g"],
            vec![("IDEM_SERVER", server.as_str())],
        ),
        (vec!["tx", "retry", "g", "--server", &server], vec![]),
    ] {
        let out = idem_command(&args, &env)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("cannot reach the coordinator at {server}: "))
                && err.contains("onnection refused")
                && err.contains("--database-url"),
            "{args:?}: {err}"
        );
    }
    // With no flag at all it goes to the default address; whatever is there, no database
    // appears here.
    let out = idem_command(&["tx", "list"], &[])
        .current_dir(&dir)
        .output()
        .unwrap();
    if !out.status.success() {
        assert!(
            stderr(&out).contains("http://127.0.0.1:8686"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(entries(&dir), Vec::<String>::new());
    // Both ways at once is refused, not settled silently.
    let out = idem_command(
        &[
            "tx",
            "list",
            "--server",
            &server,
            "--database-url",
            "sqlite:x.db",
        ],
        &[],
    )
    .current_dir(&dir)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Seen: `idem tx show GID | head` panicked on the broken pipe. A reader that goes away
/// ends the command quietly, with status 0.
#[tokio::test]
async fn a_reader_that_stops_early_ends_the_command_quietly() {
    let db = TestDatabase::create(Backend::Sqlite, "cli_broken_pipe").await;
    let p = Recorder::start().await;
    let server = Child::serve(&db.url, "pipe", &["--max-attempts", "2"]).await;
    let s = server.url.as_str();
    let api = Api::new(s);
    stalled(&api, &p, "pipe-1").await;
    for args in [
        &["tx", "show", "pipe-1", "--server", s][..],
        &["tx", "show", "pipe-1", "--server", s, "--json"],
        &["tx", "list", "--server", s],
        &["tx", "list", "--database-url", &db.url],
    ] {
        // A pipe whose reading end is already closed: the first write fails (EPIPE),
        // every time, whatever the timing.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = idem_command(args, &[])
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
    // As a shell runs it; with pipefail, a panic or a SIGPIPE death would show.
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            "set -o pipefail; \"$0\" tx show pipe-1 --server \"$1\" | head -c 10",
            env!("CARGO_BIN_EXE_idem"),
            s,
        ])
        .env_remove("IDEM_SERVER")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        out.stdout, b"gid       ",
        "the first ten bytes of the table"
    );
    assert_eq!(stderr(&out), "");
    drop(server);
    db.drop_database().await;
}

/// `idem --version` names the version and the commit it was built from (`build.rs`).
#[test]
fn the_version_names_the_commit() {
    let printed = common::idem_cli(&["--version"]);
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    assert_eq!(
        printed.trim(),
        format!("idem {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
}

//! `idem serve`'s configuration: flag > env > file > default for every option, the
//! file's unknown keys and wrong types, `idem config`'s report and its redactions.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use clap::{Args, Parser, Subcommand};
use idem::cli::ServeArgs;
use idem::cli::config;

/// A fresh directory for one test's files.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-config-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `idem` with none of the developer's `IDEM_…` variables or `RUST_LOG`: only what the
/// test sets decides.
fn idem(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("IDEM_") || name == "RUST_LOG" {
            command.env_remove(name);
        }
    }
    command.args(args).envs(env.iter().copied());
    command.output().expect("idem runs")
}

/// `idem config`'s lines as key → (value, source).
fn report(out: &Output) -> BTreeMap<String, (String, String)> {
    assert!(
        out.status.success(),
        "idem config failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (setting, source) = l.rsplit_once("  # ").unwrap_or_else(|| panic!("{l:?}"));
            let (key, value) = setting.split_once(" = ").unwrap_or_else(|| panic!("{l:?}"));
            (key.to_owned(), (value.to_owned(), source.to_owned()))
        })
        .collect()
}

fn entry(map: &BTreeMap<String, (String, String)>, key: &str) -> (String, String) {
    map.get(key)
        .cloned()
        .unwrap_or_else(|| panic!("{key} missing from {map:?}"))
}

#[test]
fn every_serve_option_has_an_idem_environment_variable() {
    let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
    let mut seen = 0;
    for arg in
        config::configurable(&cmd).chain(cmd.get_arguments().filter(|a| a.get_id() == "config"))
    {
        let id = arg.get_id().as_str();
        let wanted = format!("IDEM_{}", id.to_ascii_uppercase());
        assert_eq!(
            arg.get_env().map(|e| e.to_string_lossy().into_owned()),
            Some(wanted.clone()),
            "--{id} must have `env = \"{wanted}\"`"
        );
        // `--help` prints env values: a secret's must not be.
        if config::is_secret(id) || id.contains("url") {
            assert!(
                arg.is_hide_env_values_set(),
                "--{id} must hide its env value in --help"
            );
        }
        seen += 1;
    }
    assert!(seen >= 25, "only {seen} options found");
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let dir = scratch("precedence");
    let file = dir.join("idem.toml");
    std::fs::write(
        &file,
        "lease_ms = 1111\nrecovery_interval_ms = 2222\nmax_attempts = 3\nnode = \"from-file\"\n\
         log_format = \"json\"\nsqlite_full_sync = false\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let env = [
        ("IDEM_LEASE_MS", "4444"),
        ("IDEM_RECOVERY_INTERVAL_MS", "5555"),
        ("IDEM_WAIT_TIMEOUT_MS", "6666"),
    ];
    let out = idem(&["config", "--config", path, "--lease-ms", "7777"], &env);
    let got = report(&out);
    let source = |v: &str, s: &str| (v.to_owned(), s.to_owned());
    assert_eq!(entry(&got, "lease_ms"), source("7777", "flag --lease-ms"));
    assert_eq!(
        entry(&got, "recovery_interval_ms"),
        source("5555", "env IDEM_RECOVERY_INTERVAL_MS")
    );
    assert_eq!(
        entry(&got, "wait_timeout_ms"),
        source("6666", "env IDEM_WAIT_TIMEOUT_MS")
    );
    assert_eq!(entry(&got, "max_attempts"), source("3", "file"));
    assert_eq!(entry(&got, "node"), source("\"from-file\"", "file"));
    assert_eq!(entry(&got, "log_format"), source("\"json\"", "file"));
    assert_eq!(entry(&got, "sqlite_full_sync"), source("false", "file"));
    assert_eq!(entry(&got, "request_timeout_ms"), source("5000", "default"));
    assert_eq!(entry(&got, "log_level"), source("\"info\"", "default"));

    // RUST_LOG decides the log level whatever log_level says, and the report says so.
    let noted = idem(&["config"], &[("RUST_LOG", "debug")]);
    let text = String::from_utf8_lossy(&noted.stdout);
    assert!(
        text.contains("# RUST_LOG=debug is set: it overrides log_level"),
        "{text}"
    );

    // The file named by IDEM_CONFIG, and what `idem config` prints read back as a file:
    // the same values, all from the file now.
    let printed = dir.join("printed.toml");
    std::fs::write(&printed, &out.stdout).unwrap();
    let again = report(&idem(
        &["config"],
        &[("IDEM_CONFIG", printed.to_str().unwrap())],
    ));
    for (key, (value, _)) in &got {
        assert_eq!(
            entry(&again, key),
            (value.clone(), "file".to_owned()),
            "{key}"
        );
    }
}

#[test]
fn a_bad_file_is_an_error_naming_the_key_and_the_file() {
    let dir = scratch("bad");
    let cases = [
        ("leese_ms = 1\n", "unknown key `leese_ms`"),
        ("lease-ms = 1\n", "keys are snake_case: `lease_ms`"),
        ("config = \"other.toml\"\n", "unknown key `config`"),
        ("lease_ms = \"15000\"\n", "`lease_ms`"),
        ("max_branches = 0\n", "`max_branches`"),
        ("sqlite_full_sync = \"yes\"\n", "`sqlite_full_sync`"),
        ("log_format = \"xml\"\n", "`log_format`"),
        ("log_level = \"debg\"\n", "`log_level`"),
        ("listen = 8686\n", "`listen`"),
        ("lease_ms = [\n", "not valid TOML"),
    ];
    for (text, wanted) in cases {
        let file = dir.join("idem.toml");
        std::fs::write(&file, text).unwrap();
        for command in ["config", "serve"] {
            let out = idem(
                &[command, "--config", file.to_str().unwrap()],
                &[("IDEM_DATABASE_URL", "sqlite::memory:")],
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command} with {text:?}: {stderr}"
            );
            assert!(stderr.contains(wanted), "{text:?}: {stderr}");
            assert!(stderr.contains("idem.toml"), "{text:?}: {stderr}");
        }
    }
    let missing = idem(&["config", "--config", "/nonexistent/idem.toml"], &[]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/idem.toml"));
}

/// Settings as a test gives them: a file's text, flags and environment variables.
struct Given<'a> {
    file: &'a str,
    flags: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
}

/// A retention window shorter than the clients' retry period would let a late repeat run
/// a transaction's steps again: `serve` (and `config`, which shows what `serve` would run
/// with) refuse it before anything starts, however each value is given.
#[test]
fn a_retention_window_below_the_clients_retry_period_is_refused_at_start() {
    let dir = scratch("retention_floor");
    let file = dir.join("idem.toml");
    let path = file.to_str().unwrap();
    const HOUR: &str = "3600000";
    let given = |file, flags, env| Given { file, flags, env };
    // What is given, and the two values the message names.
    let refused = [
        (
            given("", &["--retention-ms", HOUR], &[]),
            [HOUR, "86400000"],
        ),
        (
            given("", &[], &[("IDEM_RETENTION_MS", HOUR)]),
            [HOUR, "86400000"],
        ),
        (
            given("retention_ms = 3600000\n", &[], &[]),
            [HOUR, "86400000"],
        ),
        (
            given("", &["--client-retry-period-ms", "700000000"], &[]),
            ["604800000", "700000000"],
        ),
        (
            given("", &[], &[("IDEM_CLIENT_RETRY_PERIOD_MS", "700000000")]),
            ["604800000", "700000000"],
        ),
        (
            given(
                "retention_ms = 3600000\nclient_retry_period_ms = 3600001\n",
                &[],
                &[],
            ),
            [HOUR, "3600001"],
        ),
    ];
    for (g, values) in refused {
        std::fs::write(&file, g.file).unwrap();
        for command in ["serve", "config"] {
            let mut args = vec![command, "--config", path, "--listen", "127.0.0.1:0"];
            args.extend(g.flags);
            let mut env = g.env.to_vec();
            env.push(("IDEM_DATABASE_URL", "sqlite::memory:"));
            let out = idem(&args, &env);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let case = format!("{command} {:?} {:?} {:?}", g.file, g.flags, g.env);
            assert_eq!(out.status.code(), Some(2), "{case}: {stderr}");
            for named in [
                "--retention-ms",
                "retention_ms",
                "--client-retry-period-ms",
                "client_retry_period_ms",
            ] {
                assert!(stderr.contains(named), "{case}: {named} in {stderr}");
            }
            for value in values {
                assert!(stderr.contains(&format!("{value} ms")), "{case}: {stderr}");
            }
        }
    }
    // 0 keeps everything; a window as long as the period is enough; each value is read
    // from wherever it is given, as every option is.
    let accepted = [
        given(
            "client_retry_period_ms = 2592000000\n",
            &["--retention-ms", "0"],
            &[],
        ),
        given(
            "retention_ms = 3600000\n",
            &[],
            &[("IDEM_CLIENT_RETRY_PERIOD_MS", HOUR)],
        ),
        given(
            "",
            &["--retention-ms", HOUR, "--client-retry-period-ms", HOUR],
            &[],
        ),
    ];
    for g in accepted {
        std::fs::write(&file, g.file).unwrap();
        let mut args = vec!["config", "--config", path];
        args.extend(g.flags);
        let got = report(&idem(&args, g.env));
        let (period, _) = entry(&got, "client_retry_period_ms");
        let (window, _) = entry(&got, "retention_ms");
        assert!(
            window == "0" || window.parse::<u64>().unwrap() >= period.parse().unwrap(),
            "{:?} {:?}: {window} {period}",
            g.file,
            g.flags
        );
    }
    let got = report(&idem(&["config"], &[]));
    assert_eq!(
        entry(&got, "client_retry_period_ms"),
        ("86400000".to_owned(), "default".to_owned())
    );
}

#[test]
fn idem_config_redacts_database_passwords() {
    let dir = scratch("redact");
    let file = dir.join("idem.toml");
    std::fs::write(
        &file,
        "database_url = \"postgres://idem:hunter2@db.internal/idem\"\n",
    )
    .unwrap();
    let out = idem(&["config", "--config", file.to_str().unwrap()], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("hunter2"), "{text}");
    let got = report(&out);
    assert_eq!(
        entry(&got, "database_url").0,
        "\"postgres://idem:***@db.internal/idem\""
    );
    let env = [("IDEM_DATABASE_URL", "mysql://root:s3cret@127.0.0.1/idem")];
    let out = idem(&["config"], &env);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cret"));
    // A password can also come as a query parameter (libpq's `password=`).
    let query = "postgres://idem@db.internal/idem?sslmode=disable&password=hunter3";
    let out = idem(&["config", "--database-url", query], &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("hunter3"), "{text}");
    assert_eq!(
        entry(&report(&out), "database_url").0,
        "\"postgres://idem@db.internal/idem?sslmode=disable&password=***\""
    );
}

// A command shaped like `serve`, with the kinds of options a later one may add: the
// mechanism must cover them with no code of their own.
#[derive(Debug, Parser)]
struct Later {
    #[command(subcommand)]
    command: LaterCommand,
}

#[derive(Debug, Subcommand)]
enum LaterCommand {
    Serve(LaterArgs),
}

#[derive(Debug, Args)]
struct LaterArgs {
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    otlp_endpoint: Option<String>,
    #[arg(long)]
    otlp_token: Option<String>,
    #[arg(long, default_value_t = 7)]
    retention_days: u32,
    #[arg(long)]
    verbose_calls: bool,
    #[arg(long)]
    tag: Vec<String>,
    #[arg(long, default_value_t = 0.5)]
    ratio: f64,
}

fn later(file: &str, args: &[&str]) -> Result<config::Loaded<Later>, config::LoadError> {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = scratch(&format!("later-{n}"));
    let path = dir.join("later.toml");
    std::fs::write(&path, file).unwrap();
    let argv = ["later", "serve", "--config", path.to_str().unwrap()];
    config::load::<Later>(argv.iter().copied().chain(args.iter().copied()))
}

#[test]
fn options_added_later_are_read_from_the_file_and_redacted() {
    let file = "otlp_endpoint = \"http://127.0.0.1:4318\"\notlp_token = \"abc\"\n\
                retention_days = 30\nverbose_calls = true\ntag = [\"a\", \"b\"]\nratio = 2\n";
    let loaded = later(file, &["--retention-days", "9"]).unwrap();
    let LaterCommand::Serve(args) = &loaded.cli.command;
    assert_eq!(args.otlp_endpoint.as_deref(), Some("http://127.0.0.1:4318"));
    assert_eq!(args.retention_days, 9);
    assert!(args.verbose_calls);
    assert_eq!(args.tag, ["a", "b"]);
    assert_eq!(args.ratio, 2.0);
    let printed = config::render(&loaded);
    assert!(!printed.contains("abc"), "{printed}");
    assert!(
        printed.contains("otlp_token = \"***\"  # file"),
        "{printed}"
    );
    assert!(
        printed.contains("retention_days = 9  # flag --retention-days"),
        "{printed}"
    );
    assert!(
        printed.contains("tag = [\"a\", \"b\"]  # file"),
        "{printed}"
    );

    // Without the file, the defaults; an unset option is printed as a comment.
    let loaded = later("", &[]).unwrap();
    let LaterCommand::Serve(args) = &loaded.cli.command;
    assert_eq!((args.retention_days, args.verbose_calls), (7, false));
    assert!(config::render(&loaded).contains("# otlp_token is not set  # default"));

    for bad in [
        "retention_days = -1\n",
        "verbose_calls = 1\n",
        "tag = [1]\n",
        "ratio = \"x\"\n",
    ] {
        match later(bad, &[]) {
            Err(config::LoadError::File(e)) => {
                let key = bad.split(' ').next().unwrap();
                assert!(e.contains(&format!("`{key}`")), "{bad:?}: {e}");
            }
            other => panic!("{bad:?} accepted: {:?}", other.map(|l| l.cli)),
        }
    }
}

#[test]
fn migrate_reads_the_database_url_from_the_same_file() {
    let dir = scratch("migrate");
    let db = dir.join("from-file.db");
    let file = dir.join("idem.toml");
    let url = format!("sqlite://{}?mode=rwc", db.display());
    // Keys only `serve` has are fine in the file `migrate` reads.
    std::fs::write(
        &file,
        format!("database_url = \"{url}\"\nlease_ms = 5000\n"),
    )
    .unwrap();
    let out = idem(&["migrate", "--config", file.to_str().unwrap()], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("from-file.db"));
    assert!(db.exists(), "migrate did not use the file's database_url");

    std::fs::write(
        &file,
        format!("database_url = \"{url}\"\nleese_ms = 5000\n"),
    )
    .unwrap();
    let out = idem(&["migrate", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown key `leese_ms`"));
}

#[test]
fn the_example_file_loads_and_shows_every_option() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/idem.example.toml");
    let got = report(&idem(&["config", "--config", example], &[]));
    assert_eq!(
        entry(&got, "log_format"),
        ("\"json\"".into(), "file".into())
    );
    let text = std::fs::read_to_string(example).unwrap();
    let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
    for arg in config::configurable(&cmd).filter(|a| !a.is_hide_set()) {
        let id = arg.get_id().as_str();
        let shown = text.lines().any(|l| {
            let l = l.trim_start_matches("# ");
            l.starts_with(&format!("{id} = "))
        });
        assert!(
            shown,
            "idem.example.toml does not show `{id}` (commented out is fine)"
        );
    }
}

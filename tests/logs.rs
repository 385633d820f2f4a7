//! `idem serve`'s log as an operator collects it: stderr redirected to a file, JSON lines
//! that parse, text without terminal colour codes, `RUST_LOG` over `--log-level`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-logs-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `idem serve` on an SQLite file in `dir`, stderr to `dir/stderr.log`, none of the
/// developer's `IDEM_…` variables or `RUST_LOG`.
fn spawn(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let url = format!("sqlite://{}?mode=rwc", dir.join("idem.db").display());
    let stderr = std::fs::File::create(dir.join("stderr.log")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if name.starts_with("IDEM_") || name == "RUST_LOG" || name == "NO_COLOR" {
            command.env_remove(name);
        }
    }
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--sqlite-full-sync",
            "false",
        ])
        .args(["--database-url", &url])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("idem starts")
}

/// Waits for the address it prints, sends a request it refuses and one it serves, then
/// SIGTERM; returns what it logged.
fn run_and_stop(dir: &Path, mut child: Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("unexpected first line from idem: {line:?}"))
        .to_owned();
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let refused = http(addr, "POST /api/v1/transactions", "{not json");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let ready = http(addr, "GET /health/ready", "");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "idem did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(dir.join("stderr.log")).unwrap()
}

/// One request on its own connection; the whole answer.
fn http(addr: &str, request_line: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let head = format!(
        "{request_line} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    answer
}

/// Every line a JSON object with a level and a message; the messages, in order.
fn json_messages(log: &str) -> Vec<String> {
    assert!(!log.is_empty(), "nothing logged");
    log.lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
            let level = v["level"]
                .as_str()
                .unwrap_or_else(|| panic!("no level: {line}"));
            assert!(
                ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
                "{line}"
            );
            assert!(v["timestamp"].is_string(), "no timestamp: {line}");
            v["message"]
                .as_str()
                .unwrap_or_else(|| panic!("no message: {line}"))
                .to_owned()
        })
        .collect()
}

#[test]
fn json_lines_from_the_config_file_parse() {
    let dir = scratch("json");
    // The format comes from the file: the log is set up after the configuration is read.
    let file = dir.join("idem.toml");
    std::fs::write(&file, "log_format = \"json\"\n").unwrap();
    let child = spawn(&dir, &["--config", file.to_str().unwrap()], &[]);
    let log = run_and_stop(&dir, child);
    let messages = json_messages(&log);
    assert!(
        messages.iter().any(|m| m == "configuration file read"),
        "{log}"
    );
    assert!(messages.iter().any(|m| m == "idem is serving"), "{log}");
    assert!(messages.iter().any(|m| m == "shutting down"), "{log}");
    assert!(!log.contains('\x1b'), "{log}");
}

#[test]
fn json_lines_include_the_error_that_stops_idem() {
    let dir = scratch("fatal");
    // A database URL no waiting can cure: idem stops at once, and says why in JSON.
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    let out = command
        .env_remove("RUST_LOG")
        .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0"])
        .args(["--database-url", "nosuchdb://x", "--database-wait-ms", "0"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let log = String::from_utf8(out.stderr).unwrap();
    json_messages(&log);
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["level"], "ERROR", "{log}");
    assert!(
        last["message"].as_str().unwrap().contains("nosuchdb"),
        "{log}"
    );
}

#[test]
fn text_in_a_file_has_no_colour_codes() {
    let dir = scratch("text");
    // RUST_LOG, when set, overrides --log-level: `error` alone would hide the start-up line.
    let child = spawn(&dir, &["--log-level", "error"], &[("RUST_LOG", "info")]);
    let log = run_and_stop(&dir, child);
    assert!(log.contains("idem is serving"), "{log}");
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains("\x1b["), "{log:?}");
}

#[test]
fn the_log_level_filters_without_rust_log() {
    let dir = scratch("level");
    let child = spawn(&dir, &["--log-level", "warn"], &[]);
    let log = run_and_stop(&dir, child);
    assert!(!log.contains("idem is serving"), "{log}");
    assert!(!log.contains("INFO"), "{log}");
}

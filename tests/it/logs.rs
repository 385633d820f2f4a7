//! `idem serve`'s log as an operator collects it: stderr redirected to a file, JSON lines
//! that parse, text without terminal colour codes, `RUST_LOG` over `--log-level`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem_participant::testing::{IdemProcess, IdemServe};

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("idem-logs-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `idem serve` on an SQLite file in `dir`, stderr to `dir/stderr.log`, none of the
/// developer's `IDEM_…` variables or `RUST_LOG`; returns once it serves.
async fn serve(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> IdemProcess {
    let url = format!("sqlite://{}?mode=rwc", dir.join("idem.db").display());
    let command = IdemServe::new(env!("CARGO_BIN_EXE_idem"), &url)
        .default_flag("--sqlite-full-sync", false)
        .without_inherited_env()
        .args(args)
        .log_to(dir.join("stderr.log"), false);
    env.iter()
        .fold(command, |command, (key, value)| command.env(key, value))
        .start(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Sends a request it refuses and one it serves, then SIGTERM; returns what it logged.
async fn run_and_stop(dir: &Path, mut idem: IdemProcess) -> String {
    let addr = idem
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let refused = http(&addr, "POST /api/v1/transactions", "{not json");
    assert!(refused.starts_with("HTTP/1.1 400"), "{refused}");
    let ready = http(&addr, "GET /health/ready", "");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    idem.terminate(Duration::from_secs(30))
        .await
        .expect("idem stops on SIGTERM");
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

#[tokio::test]
async fn json_lines_from_the_config_file_parse() {
    let dir = scratch("json");
    // The format comes from the file: the log is set up after the configuration is read.
    let file = dir.join("idem.toml");
    std::fs::write(&file, "log_format = \"json\"\n").unwrap();
    let child = serve(&dir, &["--config", file.to_str().unwrap()], &[]).await;
    let log = run_and_stop(&dir, child).await;
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

#[tokio::test]
async fn text_in_a_file_has_no_colour_codes() {
    let dir = scratch("text");
    // RUST_LOG, when set, overrides --log-level: `error` alone would hide the start-up line.
    let child = serve(&dir, &["--log-level", "error"], &[("RUST_LOG", "info")]).await;
    let log = run_and_stop(&dir, child).await;
    assert!(log.contains("idem is serving"), "{log}");
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains("\x1b["), "{log:?}");
}

#[tokio::test]
async fn the_log_level_filters_without_rust_log() {
    let dir = scratch("level");
    let child = serve(&dir, &["--log-level", "warn"], &[]).await;
    let log = run_and_stop(&dir, child).await;
    assert!(!log.contains("idem is serving"), "{log}");
    assert!(!log.contains("INFO"), "{log}");
}

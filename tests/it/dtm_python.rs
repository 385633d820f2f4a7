//! DTM's own Python client (dtmcli 1.7.7.0) against a real `idem serve`: without
//! authentication, and through DTM's door without a token (`--auth tokens --dtm-tenant`)
//! from loopback, as DTM's clients, which send no token, use it.
//!
//! Needs a Python with dtmcli installed: `scripts/test` makes a virtualenv and points
//! `IDEM_DTMCLI_PYTHON` at it. Without that variable the test prints that it skipped.

use crate::common;

use common::Child;
use idem_participant::testing::{Backend, TestDatabase};

/// Runs the dtmcli script against a fresh `idem serve` with `extra` flags.
async fn dtmcli_drives(python: &str, test: &str, extra: &[&str]) {
    let db = TestDatabase::create(Backend::Sqlite, test).await;
    let server = Child::serve(&db.url, "dtm", extra).await;
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/it/dtm_python/dtmcli_test.py"
    );
    let out = tokio::process::Command::new(python)
        .arg(script)
        .env("IDEM_DTM_URL", format!("{}/api/dtmsvr", server.url))
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{test} {extra:?}:\n{stdout}");
    assert!(
        out.status.success(),
        "dtmcli test failed with {extra:?}:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    drop(server);
    db.drop_database().await;
}

#[tokio::test]
async fn dtmcli_python_client_drives_idem() {
    // A test that cannot run fails with the reason: it is never counted as passed.
    let python = std::env::var("IDEM_DTMCLI_PYTHON").unwrap_or_else(|_| {
        panic!(
            "not run: set IDEM_DTMCLI_PYTHON to a python with dtmcli==1.7.7.0 \
             (scripts/test makes one in .venv-dtm)"
        )
    });
    dtmcli_drives(&python, "dtmcli", &[]).await;
    // The script's participants listen on loopback: allowed explicitly, whatever the
    // default outbound policy with tokens is.
    let policy = std::env::temp_dir().join(format!("dtmcli-{}.toml", std::process::id()));
    std::fs::write(&policy, "[default]\ncidrs = [\"127.0.0.0/8\"]\n").unwrap();
    let flags = [
        "--auth",
        "tokens",
        "--dtm-tenant",
        "legacy",
        "--outbound-policy",
        policy.to_str().unwrap(),
    ];
    dtmcli_drives(&python, "dtmcli_tokenless", &flags).await;
    let _ = std::fs::remove_file(&policy);
}

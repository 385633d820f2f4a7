//! DTM's own Python client (dtmcli 1.7.7.0) against a real `idem serve`.
//!
//! Needs a Python with dtmcli installed: `.ci/run` makes a virtualenv and points
//! `IDEM_DTMCLI_PYTHON` at it. Without that variable the test prints that it skipped.

mod common;

use common::Child;
use idem_participant::testing::{Backend, TestDatabase};

#[tokio::test]
async fn dtmcli_python_client_drives_idem() {
    let Ok(python) = std::env::var("IDEM_DTMCLI_PYTHON") else {
        println!(
            "SKIPPED dtmcli_python_client_drives_idem: set IDEM_DTMCLI_PYTHON to a python with dtmcli==1.7.7.0 (.ci/run does)"
        );
        return;
    };
    let db = TestDatabase::create(Backend::Sqlite, "dtmcli")
        .await
        .unwrap();
    let server = Child::serve(&db.url, "dtm", &[]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/dtm/dtmcli_test.py");
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .env("IDEM_DTM_URL", format!("{}/api/dtmsvr", server.url))
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "dtmcli test failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
    drop(server);
    db.drop_database().await;
}

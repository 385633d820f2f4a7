//! A test that must be the only one in its process, in a binary whose tests share one.
//!
//! Each crate's integration tests are one binary, so its tests run side by side in one
//! process. A few read what is process-wide: a `metrics` recorder (one per process, and
//! counters that every test's code moves) or the global log subscriber. Such a test calls
//! [`in_own_process`] first: run by the harness with the others, it runs itself again in a
//! child process of the same binary, alone, and passes or fails with it.

use std::process::Command;

/// Names, in a child process, the one test it runs.
const CHILD_ENV: &str = "IDEM_TEST_OWN_PROCESS";

/// `test` is the calling test's full name in its binary (`module::function`).
///
/// In the binary's ordinary run: runs this binary again with only `test` (`--exact`) and
/// panics, with the child's output, unless the child ran exactly that one test and it
/// passed; then returns `false`, and the caller returns. In that child: returns `true`, and
/// the caller goes on with its steps, alone in the process.
pub fn in_own_process(test: &str) -> bool {
    if std::env::var(CHILD_ENV).is_ok_and(|t| t == test) {
        return true;
    }
    let binary = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(binary)
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, test)
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // A name that matches no test runs none and passes: the summary must count this one.
    let ran = stdout.contains("test result: ok. 1 passed;");
    assert!(
        out.status.success() && ran,
        "{test}, run alone in a child process: {}\n--- its stdout\n{stdout}\n--- its stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

//! Names the commit `idem --version` reports (`IDEM_COMMIT`): the short hash of the checkout
//! being built, or `unknown` when it is not a git checkout (a source tarball). A release
//! build may set `IDEM_COMMIT` itself.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    println!("cargo:rerun-if-env-changed=IDEM_COMMIT");
    let commit = std::env::var("IDEM_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=IDEM_COMMIT={commit}");
    // A new commit or checkout changes HEAD or the branch it names.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{reference}");
        }
        println!("cargo:rerun-if-changed={dir}/packed-refs");
    }
}

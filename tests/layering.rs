//! The layering, checked: the crate graph and the pure core's imports, as ARCHITECTURE.md
//! draws them. A new dependency that breaks a rule fails here, not in review.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `package|features` of every package in `package`'s normal (non-dev, non-build)
/// dependency tree, with features resolved as a build of that package alone resolves them.
fn normal_tree(package: &str) -> Vec<(String, String)> {
    normal_tree_with(package, &[])
}

/// [`normal_tree`] with `features` of `package` turned on.
fn normal_tree_with(package: &str, features: &[&str]) -> Vec<(String, String)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root())
        .args([
            "tree",
            "--locked",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
        ])
        .args(features.iter().flat_map(|f| ["--features", f]))
        .args(["--prefix", "none", "-f", "{p}|{f}"])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('|'))
        .map(|(p, f)| {
            let name = p.split_whitespace().next().unwrap_or("").to_owned();
            (name, f.trim().to_owned())
        })
        .collect()
}

fn names(tree: &[(String, String)]) -> Vec<&str> {
    tree.iter().map(|(n, _)| n.as_str()).collect()
}

#[test]
fn the_coordinator_links_no_lab_no_demo_and_no_test_support() {
    let tree = normal_tree("idem");
    let names = names(&tree);
    // The parse sees the tree (a rule over an empty list would pass for nothing).
    assert!(
        names.contains(&"tokio") && names.contains(&"sqlx"),
        "{names:?}"
    );
    // The store's SQL plumbing comes from idem-sql; the SDK is the participants' crate.
    for forbidden in [
        "idem-lab",
        "idem-demo",
        "idem-participant",
        "indicatif",
        "proptest",
    ] {
        assert!(
            !names.contains(&forbidden),
            "idem depends on {forbidden}: {names:?}"
        );
    }
    for (name, features) in &tree {
        if name == "idem-participant" {
            assert!(
                !features.split(',').any(|f| f == "testing"),
                "idem links the SDK's test support: {features}"
            );
        }
    }
}

#[test]
fn the_sdk_the_demo_and_the_client_do_not_depend_on_the_coordinator() {
    for package in ["idem-participant", "idem-demo", "idem-client"] {
        let tree = normal_tree(package);
        let names = names(&tree);
        for forbidden in ["idem", "idem-lab"] {
            assert!(
                !names.contains(&forbidden),
                "{package} depends on {forbidden}"
            );
        }
    }
}

/// The SQL plumbing both sides share sits below both: it knows sqlx and tokio, not idem.
#[test]
fn the_shared_sql_crate_depends_on_neither_side() {
    let tree = normal_tree("idem-sql");
    let names = names(&tree);
    assert!(names.contains(&"sqlx"), "{names:?}");
    for forbidden in [
        "idem",
        "idem-participant",
        "idem-types",
        "idem-lab",
        "idem-demo",
    ] {
        assert!(
            !names.contains(&forbidden),
            "idem-sql depends on {forbidden}"
        );
    }
}

/// The signing scheme both sides share is one small crate of its own: no runtime, no
/// HTTP, no database, so a participant in any framework can use it.
#[test]
fn the_shared_signing_crate_needs_only_its_hashes() {
    let tree = normal_tree("idem-signing");
    let names = names(&tree);
    assert!(names.contains(&"hmac"), "{names:?}");
    for forbidden in [
        "idem",
        "idem-participant",
        "idem-sql",
        "idem-types",
        "tokio",
        "axum",
        "sqlx",
        "reqwest",
    ] {
        assert!(
            !names.contains(&forbidden),
            "idem-signing depends on {forbidden}"
        );
    }
}

/// The request hash both sides compute is one small crate: JSON and SHA-256, nothing that
/// would tie a participant to the coordinator's runtime.
#[test]
fn the_canonical_json_crate_needs_only_json_and_sha2() {
    let tree = normal_tree("idem-canonical");
    let names = names(&tree);
    assert!(
        names.contains(&"serde_json") && names.contains(&"sha2"),
        "{names:?}"
    );
    for forbidden in [
        "idem",
        "idem-participant",
        "idem-sql",
        "idem-types",
        "tokio",
        "axum",
        "sqlx",
        "reqwest",
    ] {
        assert!(
            !names.contains(&forbidden),
            "idem-canonical depends on {forbidden}"
        );
    }
}

/// What clients and the core share is plain data.
#[test]
fn the_shared_types_need_nothing_but_serde() {
    let tree = normal_tree("idem-types");
    let allowed = [
        "idem-types",
        "serde",
        "serde_core",
        "serde_derive",
        "thiserror",
        "thiserror-impl",
        "proc-macro2",
        "quote",
        "syn",
        "unicode-ident",
    ];
    for name in names(&tree) {
        assert!(allowed.contains(&name), "idem-types depends on {name}");
    }
}

/// The `openapi` feature (the views' JSON schemas, which the coordinator turns on for its
/// OpenAPI description) adds utoipa and what it needs, and nothing a client would not
/// expect of a schema library.
#[test]
fn the_shared_types_openapi_feature_adds_only_utoipa() {
    let tree = normal_tree_with("idem-types", &["openapi"]);
    let names = names(&tree);
    assert!(names.contains(&"utoipa"), "{names:?}");
    let allowed = [
        "idem-types",
        "serde",
        "serde_core",
        "serde_derive",
        "serde_json",
        "thiserror",
        "thiserror-impl",
        "proc-macro2",
        "quote",
        "syn",
        "unicode-ident",
        "utoipa",
        "utoipa-gen",
        "indexmap",
        "equivalent",
        "hashbrown",
        "itoa",
        "memchr",
        "zmij",
        "ryu",
    ];
    for name in names {
        assert!(
            allowed.contains(&name),
            "idem-types/openapi depends on {name}"
        );
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The core is pure: no I/O, no runtime, no clock, and nothing from the layers around it.
/// Its tests (under `tests/`) may use what they like.
#[test]
fn the_core_does_no_io_reads_no_clock_and_imports_no_outer_layer() {
    let core = root().join("src/core");
    let mut files = Vec::new();
    rust_files(&core, &mut files);
    assert!(files.len() >= 3, "the core's files: {files:?}");
    let forbidden = [
        "tokio",
        "sqlx",
        "reqwest",
        "axum",
        "hyper",
        "std::fs",
        "std::net",
        "std::thread",
        "SystemTime",
        "Instant::now",
        "crate::store",
        "crate::engine",
        "crate::api",
        "crate::transport",
        "crate::server",
        "crate::cli",
    ];
    let mut found = Vec::new();
    for file in files.iter().filter(|f| {
        !f.components().any(|c| c.as_os_str() == "tests")
            && f.file_name().is_some_and(|n| n != "tests.rs")
    }) {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                if code.contains(word) {
                    found.push(format!("{}:{}: {word}", file.display(), n + 1));
                }
            }
        }
    }
    assert!(found.is_empty(), "the core reaches outside: {found:#?}");
}

//! The layering, checked: the crate graph as ARCHITECTURE.md draws it (`cargo tree`), and
//! the floors inside `idem` as `src/lib.rs` lists them (every `crate::` path under `src/`).
//! A new dependency or import that breaks a rule fails here, not in review.

use std::collections::BTreeMap;
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

/// Fails, naming the first, if `package`'s tree `names` holds any of `forbidden`.
fn depends_on_none_of(package: &str, names: &[&str], forbidden: &[&str]) {
    for name in forbidden {
        assert!(
            !names.contains(name),
            "{package} depends on {name}: {names:?}"
        );
    }
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
    depends_on_none_of(
        "idem",
        &names,
        &[
            "idem-lab",
            "idem-demo",
            "idem-participant",
            "indicatif",
            "proptest",
        ],
    );
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
        depends_on_none_of(package, &names, &["idem", "idem-lab"]);
    }
}

/// The SQL plumbing both sides share sits below both: it knows sqlx and tokio, not idem.
#[test]
fn the_shared_sql_crate_depends_on_neither_side() {
    let tree = normal_tree("idem-sql");
    let names = names(&tree);
    assert!(names.contains(&"sqlx"), "{names:?}");
    depends_on_none_of(
        "idem-sql",
        &names,
        &[
            "idem",
            "idem-participant",
            "idem-types",
            "idem-lab",
            "idem-demo",
        ],
    );
}

/// What a small crate both sides share must not bring: either side, a runtime, HTTP or a
/// database.
const SHARED_LEAF_MUST_NOT: &[&str] = &[
    "idem",
    "idem-participant",
    "idem-sql",
    "idem-types",
    "tokio",
    "axum",
    "sqlx",
    "reqwest",
];

/// The signing scheme both sides share is one small crate of its own: no runtime, no
/// HTTP, no database, so a participant in any framework can use it.
#[test]
fn the_shared_signing_crate_needs_only_its_hashes() {
    let tree = normal_tree("idem-signing");
    let names = names(&tree);
    assert!(names.contains(&"hmac"), "{names:?}");
    depends_on_none_of("idem-signing", &names, SHARED_LEAF_MUST_NOT);
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
    depends_on_none_of("idem-canonical", &names, SHARED_LEAF_MUST_NOT);
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

/// The pure core's whole tree is plain data: `idem-types`, serde and thiserror, with what
/// they are built from. Nothing that does I/O, keeps time, draws random numbers, logs or
/// counts can come in, directly or through another crate.
#[test]
fn the_core_depends_on_types_serde_and_thiserror_only() {
    let tree = normal_tree("idem-core");
    let names = names(&tree);
    assert!(names.contains(&"idem-types"), "{names:?}");
    depends_on_none_of(
        "idem-core",
        &names,
        &[
            "tokio",
            "sqlx",
            "reqwest",
            "hyper",
            "axum",
            "rand",
            "getrandom",
            "tracing",
            "metrics",
            "futures",
            "mio",
            "socket2",
            "libc",
            "idem-sql",
            "idem-store",
            "idem",
        ],
    );
    let allowed = [
        "idem-core",
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
    for name in names {
        assert!(allowed.contains(&name), "idem-core depends on {name}");
    }
}

/// The store sits below the engine and the API: it knows the core and its databases, not
/// the coordinator around it, nor HTTP.
#[test]
fn the_store_depends_on_the_core_and_its_databases_not_on_the_coordinator() {
    let tree = normal_tree("idem-store");
    let names = names(&tree);
    assert!(
        names.contains(&"idem-core") && names.contains(&"sqlx"),
        "{names:?}"
    );
    depends_on_none_of(
        "idem-store",
        &names,
        &[
            "idem",
            "idem-lab",
            "idem-participant",
            "idem-client",
            "idem-demo",
            "axum",
            "hyper",
            "reqwest",
            "clap",
        ],
    );
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

/// A unit-test file (`tests.rs`, or anything under a `tests/` folder) below `src`: built
/// only into the test binary, so it may reach where the module it tests may not.
fn is_test_file(src: &Path, file: &Path) -> bool {
    let relative = file.strip_prefix(src).unwrap_or(file);
    relative.file_name().is_some_and(|n| n == "tests.rs")
        || relative
            .parent()
            .is_some_and(|p| p.components().any(|c| c.as_os_str() == "tests"))
}

/// The core is pure beyond its dependencies too: std gives files, sockets, threads,
/// processes and the clock without any crate, so its code is read for them. Its tests may
/// use what they like.
#[test]
fn the_core_touches_no_file_socket_thread_or_clock_of_std() {
    let core = root().join("crates/core/src");
    let mut files = Vec::new();
    rust_files(&core, &mut files);
    assert!(files.len() >= 3, "the core's files: {files:?}");
    let forbidden = [
        "std::fs",
        "std::net",
        "std::thread",
        "std::process",
        "std::env",
        "std::io",
        "SystemTime",
        "Instant",
    ];
    let mut found = Vec::new();
    for file in files.iter().filter(|f| !is_test_file(&core, f)) {
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

/// The floors of `idem`'s modules, lowest first, as `src/lib.rs` writes them down: its
/// lines `//! N. `a`, `b`: what they are`.
fn floors(lib_rs: &str) -> BTreeMap<String, usize> {
    let mut floors = BTreeMap::new();
    for line in lib_rs.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((number, rest)) = rest.split_once(". ") else {
            continue;
        };
        let Ok(floor) = number.parse::<usize>() else {
            continue;
        };
        let names = rest.split(':').next().unwrap_or("");
        for name in names.split(',') {
            let name = name.trim().trim_matches('`');
            assert!(!name.is_empty(), "floor {floor}: an empty name in {line:?}");
            let before = floors.insert(name.to_owned(), floor);
            assert!(before.is_none(), "{name} is on two floors");
        }
    }
    floors
}

/// Every import in `src` from a module to one on its own floor or above (another module
/// beside it would make a circle possible; one above is one), and every module no floor
/// names, as `file:line: what`. Unit-test files are left out ([`is_test_file`]); so are
/// comments. `crate::{a, b}` is refused: one `use` per module keeps the paths readable
/// here.
fn upward_imports(src: &Path, floors: &BTreeMap<String, usize>) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap().to_path_buf();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" || is_test_file(src, &file) {
            continue;
        }
        let shown = Path::new("src").join(&relative);
        let Some(&own) = floors.get(&module) else {
            found.push(format!(
                "{}: module {module} is on no floor (list it in src/lib.rs)",
                shown.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (at, _) in code.match_indices("crate::") {
                let after = &code[at + "crate::".len()..];
                if after.starts_with('{') {
                    found.push(format!(
                        "{}:{}: crate::{{..}} (write one use per module)",
                        shown.display(),
                        n + 1
                    ));
                    continue;
                }
                let target: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if target.is_empty() || target == module {
                    continue;
                }
                match floors.get(&target) {
                    Some(&floor) if floor < own => {}
                    Some(&floor) => found.push(format!(
                        "{}:{}: {module} (floor {own}) imports {target} (floor {floor})",
                        shown.display(),
                        n + 1
                    )),
                    None => found.push(format!(
                        "{}:{}: {module} imports {target}, which is on no floor",
                        shown.display(),
                        n + 1
                    )),
                }
            }
        }
    }
    found
}

fn idem_floors() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    floors(&lib)
}

/// Inside `idem`, a module imports only from floors below its own, so no two modules
/// import each other, directly or around a circle.
#[test]
fn idem_imports_only_from_lower_floors() {
    let floors = idem_floors();
    // The list is read (a rule over an empty list would pass for nothing).
    let floor = |name: &str| {
        *floors
            .get(name)
            .unwrap_or_else(|| panic!("{name}: {floors:?}"))
    };
    assert_eq!((floor("core"), floor("store")), (0, 0), "{floors:?}");
    assert!(
        floor("store") < floor("engine")
            && floor("engine") < floor("api")
            && floor("api") < floor("server")
            && floor("server") < floor("cli"),
        "{floors:?}"
    );
    let found = upward_imports(&root().join("src"), &floors);
    assert!(found.is_empty(), "imports against the floors: {found:#?}");
}

/// The test of the test: an import from a lower floor to a higher one, written into a
/// scratch `src`, is caught with its file and line, as are a module on no floor and
/// `crate::{..}`; the same import in a comment or a unit-test file is not.
#[test]
fn an_upward_import_in_a_scratch_tree_is_caught() {
    let floors = idem_floors();
    let src = std::env::temp_dir().join(format!("idem-layering-{}/src", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "pub mod engine;\npub mod api;\n");
    write(
        "engine/mod.rs",
        "use crate::store::Store;\nuse crate::transport::Transport;\n// see crate::api\n",
    );
    write(
        "engine/drive.rs",
        "fn f() {\n    crate::api::router();\n}\n",
    );
    write("engine/tests.rs", "use crate::server::start;\n");
    write(
        "api/mod.rs",
        "use crate::engine::Engine;\nuse crate::{engine, metrics};\n",
    );
    write("annex.rs", "use crate::core::Status;\n");
    let mut found = upward_imports(&src, &floors);
    found.sort();
    let _ = std::fs::remove_dir_all(src.parent().unwrap());
    let drive = Path::new("src/engine/drive.rs").display().to_string();
    let api = Path::new("src/api/mod.rs").display().to_string();
    let annex = Path::new("src/annex.rs").display().to_string();
    assert_eq!(
        found,
        [
            format!("{annex}: module annex is on no floor (list it in src/lib.rs)"),
            format!("{api}:2: crate::{{..}} (write one use per module)"),
            format!(
                "{drive}:2: engine (floor {}) imports api (floor {})",
                floors["engine"], floors["api"]
            ),
        ]
    );
}

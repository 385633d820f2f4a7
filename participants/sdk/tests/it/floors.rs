//! The SDK's floors are a wall, not a convention: every `crate::` import (and every
//! `super::` that climbs to the crate root) in `src/` goes to a floor below the importing
//! module's, as the table in `src/lib.rs`'s documentation assigns them. An import from a
//! floor above, or from another module on the same floor, would let two modules import
//! each other; the test names the file and line of each.
//!
//! The scan reads the source as text: comments and string literals are blanked first, so
//! that neither a doc link nor a message that mentions `crate::x` counts as an import.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[test]
fn no_module_imports_from_its_own_floor_or_above() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors = floors_of(&src);
    assert!(
        floors.len() >= 10,
        "the floors table in src/lib.rs was not found or lost modules: {floors:?}"
    );
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "imports that break the floors of src/lib.rs:\n{}",
        found.join("\n")
    );
}

/// The test of the test: a small crate whose imports break the floors in each way the scan
/// must catch, beside ones it must let pass.
#[test]
fn a_deliberate_violation_is_caught_with_its_file_and_line() {
    let root = std::env::temp_dir().join(format!("idem-floors-{}", uuid::Uuid::new_v4()));
    let src = root.join("src");
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "//! # Floors\n//!\n//! | floor | modules | what |\n//! |---|---|---|\n\
         //! | 0 | `low` | the ground |\n//! | 1 | `high`, `side` | above it |\n\
         pub mod high;\npub mod low;\npub mod side;\npub mod nowhere;\n",
    );
    write(
        "low.rs",
        "//! [`crate::high`] in a doc comment is no import.\n\
         use crate::high::Thing;\n\
         const S: &str = \"crate::high in a string is none either\"; /* nor crate::high here */\n\
         #[cfg(test)]\nmod tests {\n    use super::S;\n}\n",
    );
    write(
        "high.rs",
        "use crate::{\n    low::A,\n    side::B,\n};\nfn f() -> char { '{' }\n",
    );
    write(
        "side/mod.rs",
        "mod deep;\nuse crate::low::A;\n#[cfg(test)]\nmod tests {\n    use super::deep::C;\n}\n",
    );
    write("side/deep.rs", "pub use super::super::high::C;\n");
    write("nowhere.rs", "use crate::Thing;\n");

    let found = violations(&src);
    std::fs::remove_dir_all(&root).unwrap();
    let expected = [
        "high.rs:3: `high` (floor 1) imports `side` beside it on floor 1",
        "low.rs:2: `low` (floor 0) imports `high` from floor 1 above it",
        "nowhere.rs: `nowhere` is on no floor of the table in src/lib.rs",
        "nowhere.rs:1: `nowhere` imports `Thing` through the crate root: name its module",
        "side/deep.rs:1: `side` (floor 1) imports `high` beside it on floor 1",
    ];
    assert_eq!(found, expected);
}

/// Each module's floor, from the table under `# Floors` in `src/lib.rs`: rows
/// `//! | <floor> | `a`, `b` | ... |`.
fn floors_of(src: &Path) -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let mut floors = BTreeMap::new();
    let rows = lib
        .lines()
        .skip_while(|line| line.trim() != "//! # Floors")
        .filter_map(|line| line.strip_prefix("//! |"));
    for row in rows {
        let mut cells = row.split('|');
        let (Some(floor), Some(modules)) = (cells.next(), cells.next()) else {
            continue;
        };
        let Ok(floor) = floor.trim().parse::<usize>() else {
            continue;
        };
        for name in modules.split(',') {
            floors.insert(name.trim().trim_matches('`').to_owned(), floor);
        }
    }
    floors
}

/// Every import that breaks the floors, as `path:line: what`, sorted.
fn violations(src: &Path) -> Vec<String> {
    let floors = floors_of(src);
    let mut found = Vec::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).unwrap();
        let shown = relative.to_string_lossy().replace('\\', "/");
        if shown == "lib.rs" {
            // The root declares the modules and re-exports them: it stands on them all.
            continue;
        }
        let path = module_path(relative);
        let module = &path[0];
        let floor = floors.get(module).copied();
        if floor.is_none() {
            found.push(format!(
                "{shown}: `{module}` is on no floor of the table in src/lib.rs"
            ));
        }
        let text = blank_comments_and_strings(&std::fs::read_to_string(&file).unwrap());
        for (line, target) in imports(&text, &path) {
            let place = format!("{shown}:{line}: `{module}`");
            if target == *module {
                continue;
            }
            if !is_module(src, &target) {
                found.push(format!(
                    "{place} imports `{target}` through the crate root: name its module"
                ));
                continue;
            }
            // A module on no floor is reported once, above, as a file.
            let (Some(floor), Some(&to)) = (floor, floors.get(&target)) else {
                continue;
            };
            if to > floor {
                found.push(format!(
                    "{place} (floor {floor}) imports `{target}` from floor {to} above it"
                ));
            } else if to == floor {
                found.push(format!(
                    "{place} (floor {floor}) imports `{target}` beside it on floor {to}"
                ));
            }
        }
    }
    found.sort();
    found
}

/// Every `.rs` file below `src`.
fn rust_files(src: &Path) -> Vec<PathBuf> {
    let (mut dirs, mut files) = (vec![src.to_path_buf()], Vec::new());
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            match path.extension() {
                _ if path.is_dir() => dirs.push(path),
                Some(ext) if ext == "rs" => files.push(path),
                _ => {}
            }
        }
    }
    files
}

fn is_module(src: &Path, name: &str) -> bool {
    src.join(format!("{name}.rs")).is_file() || src.join(name).join("mod.rs").is_file()
}

/// The module a file is, as a path from the crate root: `barrier/lease/sql.rs` is
/// `barrier::lease::sql`, `kit/mod.rs` is `kit`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if path.last().is_some_and(|last| last == "mod") {
        path.pop();
    }
    path
}

/// The top-level modules `text` (blanked) imports, with their lines: the first name after
/// each `crate::` (each item's, for a `crate::{..}` group), and after each run of
/// `super::` that climbs from `path` (plus the inline `mod x { }` blocks around it) to the
/// crate root.
fn imports(text: &str, path: &[String]) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let line_of = |at: usize| 1 + bytes[..at].iter().filter(|&&b| b == b'\n').count();
    let mut inline = Vec::new(); // brace depth at which each open inline module began
    let mut depth = 0usize;
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_ident(bytes[i - 1]);
        match bytes[i] {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            _ if starts_word && text[i..].starts_with("mod ") => {
                let name_end = skip_ident(bytes, skip_space(bytes, i + 4));
                if bytes.get(skip_space(bytes, name_end)) == Some(&b'{') {
                    inline.push(depth);
                }
            }
            _ if starts_word && text[i..].starts_with("crate::") => {
                found.extend(names_after(text, i + "crate::".len(), &line_of));
            }
            _ if starts_word && text[i..].starts_with("super::") => {
                let mut at = i;
                let mut climbs = 0;
                while text[at..].starts_with("super::") {
                    climbs += 1;
                    at = skip_space(bytes, at + "super::".len());
                }
                if climbs >= path.len() + inline.len() {
                    found.extend(names_after(text, at, &line_of));
                }
                i = at;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The name at `at`, or each item's first name in a `{..}` group there.
fn names_after(text: &str, at: usize, line_of: &dyn Fn(usize) -> usize) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let at = skip_space(bytes, at);
    if bytes.get(at) != Some(&b'{') {
        let end = skip_ident(bytes, at);
        return Vec::from_iter((end > at).then(|| (line_of(at), text[at..end].to_owned())));
    }
    let mut names = Vec::new();
    let (mut nesting, mut item_start) = (0usize, true);
    for (offset, b) in bytes[at + 1..].iter().enumerate() {
        let here = at + 1 + offset;
        match b {
            b'{' => nesting += 1,
            b'}' if nesting == 0 => break,
            b'}' => nesting -= 1,
            b',' if nesting == 0 => item_start = true,
            b if item_start && is_ident(*b) => {
                item_start = false;
                let end = skip_ident(bytes, here);
                names.push((line_of(here), text[here..end].to_owned()));
            }
            _ => {}
        }
    }
    names
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn skip_ident(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && is_ident(bytes[at]) {
        at += 1;
    }
    at
}

fn skip_space(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && bytes[at].is_ascii_whitespace() {
        at += 1;
    }
    at
}

/// `text` with every comment, string and character literal turned into spaces (line
/// breaks kept, so lines still count), leaving only code to scan.
fn blank_comments_and_strings(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let rest = |k: usize| chars.get(i + k).copied().unwrap_or('\0');
        let end = match chars[i] {
            '/' if rest(1) == '/' => (i..chars.len()).find(|&k| chars[k] == '\n'),
            '/' if rest(1) == '*' => block_comment_end(&chars, i),
            '"' => quoted_end(&chars, i + 1, '"'),
            'r' if (rest(1) == '"' || rest(1) == '#') && starts_literal(&chars, i) => {
                raw_string_end(&chars, i)
            }
            // A character literal ('x', '\n', '{'); a lifetime ('a) has no closing quote.
            '\'' if rest(2) == '\'' || (rest(1) == '\\' && rest(3) == '\'') => {
                quoted_end(&chars, i + 1, '\'')
            }
            _ => None,
        };
        match end {
            Some(end) => {
                out.extend(chars[i..end].iter().map(|&c| blank(c)));
                i = end;
            }
            None => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Whether the `r` at `i` begins a raw string (`r"`, `br"`), not ends a name (`for"`).
fn starts_literal(chars: &[char], i: usize) -> bool {
    let before = |k: usize| i.checked_sub(k).map(|k| chars[k]);
    match before(1) {
        None => true,
        Some('b') => !before(2).is_some_and(is_ident_char),
        Some(c) => !is_ident_char(c),
    }
}

/// Just past the closing `quote` of a literal whose text starts at `from`.
fn quoted_end(chars: &[char], from: usize, quote: char) -> Option<usize> {
    let mut k = from;
    while k < chars.len() {
        match chars[k] {
            '\\' => k += 2,
            c if c == quote => return Some(k + 1),
            _ => k += 1,
        }
    }
    Some(chars.len())
}

/// Just past a raw string `r#"..."#` starting at `start` (the `r`).
fn raw_string_end(chars: &[char], start: usize) -> Option<usize> {
    let hashes = chars[start + 1..].iter().take_while(|&&c| c == '#').count();
    if chars.get(start + 1 + hashes) != Some(&'"') {
        return None;
    }
    let closing: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let body = start + 2 + hashes;
    (body..chars.len())
        .find(|&k| chars[k..].starts_with(&closing))
        .map(|k| k + closing.len())
        .or(Some(chars.len()))
}

/// Just past a (possibly nested) block comment starting at `start`.
fn block_comment_end(chars: &[char], start: usize) -> Option<usize> {
    let (mut k, mut nesting) = (start, 0usize);
    while k + 1 < chars.len() {
        match (chars[k], chars[k + 1]) {
            ('/', '*') => {
                nesting += 1;
                k += 2;
            }
            ('*', '/') => {
                nesting -= 1;
                k += 2;
                if nesting == 0 {
                    return Some(k);
                }
            }
            _ => k += 1,
        }
    }
    Some(chars.len())
}

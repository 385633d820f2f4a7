//! Every relative link in the repository's Markdown resolves: the file or directory it
//! names exists, and its `#anchor`, when it has one and points into a Markdown file, is
//! the slug of a heading there (GitHub's rule: lower case, punctuation dropped, spaces to
//! `-`, a repeated heading numbered `-1`, `-2`...). A document moved or a heading renamed
//! fails here with the file, the line and the link, not in a reader's browser.
//!
//! Links to other sites (`https:`, `mailto:`...) are not followed. Text inside code spans
//! and fenced code blocks is not a link.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Directories never walked: build output, git's own, and the virtualenvs `scripts/test`
/// and `.ci/run` create (their packages carry Markdown of their own).
fn skipped(name: &str) -> bool {
    name == "target" || name == ".git" || name == "node_modules" || name.starts_with(".venv")
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !skipped(&name) {
                markdown_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The lines of a Markdown text with its fenced code blocks blanked, so a `#` in a shell
/// example is no heading and a `[x](y)` in a code sample no link. Line numbers are kept.
fn prose_lines(text: &str) -> Vec<String> {
    let mut fence: Option<(char, usize)> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
            let run = marker.map_or(0, |m| trimmed.chars().take_while(|c| *c == m).count());
            match (fence, marker) {
                (None, Some(m)) if run >= 3 => {
                    fence = Some((m, run));
                    String::new()
                }
                (Some((m, n)), Some(c))
                    if c == m && run >= n && trimmed[run..].trim().is_empty() =>
                {
                    fence = None;
                    String::new()
                }
                (Some(_), _) => String::new(),
                (None, _) => line.to_owned(),
            }
        })
        .collect()
}

/// A line with its code spans (`` `...` ``, any number of backticks) removed.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let run = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + run..];
        let closing = "`".repeat(run);
        match after.find(&closing) {
            Some(end) => rest = &after[end + run..],
            None => {
                // An unmatched run is literal text.
                out.push_str(&rest[start..start + run]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// GitHub's anchor for a heading's text: markup removed, lower case, everything but
/// letters, digits, `-`, `_` and spaces dropped, spaces turned into `-`.
fn slug(heading: &str) -> String {
    let text = link_texts(heading).replace(['`', '*'], "");
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](url)` as `text`, as a heading shows it.
fn link_texts(s: &str) -> String {
    let mut out = s.to_owned();
    while let Some((start, text, end)) = first_link(&out).map(|l| (l.start, l.text, l.end)) {
        out.replace_range(start..end, &text);
    }
    out
}

/// The anchors a Markdown file offers: its headings' slugs, numbered when repeated, and
/// any `id="..."` or `name="..."` of its HTML.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for line in prose_lines(text) {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() <= 3 && trimmed.starts_with('#') {
            let level = trimmed.chars().take_while(|c| *c == '#').count();
            let rest = &trimmed[level..];
            if level <= 6 && (rest.is_empty() || rest.starts_with(' ')) {
                let heading = rest.trim().trim_end_matches('#').trim();
                let base = slug(heading);
                let n = seen.entry(base.clone()).or_insert(0);
                out.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
        }
        for attr in ["id=\"", "name=\""] {
            let mut rest = line.as_str();
            while let Some(i) = rest.find(attr) {
                rest = &rest[i + attr.len()..];
                if let Some(end) = rest.find('"') {
                    out.insert(rest[..end].to_owned());
                }
            }
        }
    }
    out
}

struct Link {
    start: usize,
    end: usize,
    text: String,
    target: String,
}

/// The first inline link or image `[text](target)` of a line, if any.
fn first_link(line: &str) -> Option<Link> {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(i) = line[from..].find("](").map(|i| i + from) {
        // The opening bracket of this text, brackets nested inside it balanced.
        let mut depth = 0usize;
        let mut open = None;
        for j in (0..i).rev() {
            match bytes[j] {
                b']' => depth += 1,
                b'[' if depth == 0 => {
                    open = Some(j);
                    break;
                }
                b'[' => depth -= 1,
                _ => {}
            }
        }
        // The closing parenthesis of the target, parentheses inside it balanced.
        let mut depth = 0usize;
        let mut close = None;
        for (k, b) in bytes.iter().enumerate().skip(i + 2) {
            match b {
                b'(' => depth += 1,
                b')' if depth == 0 => {
                    close = Some(k);
                    break;
                }
                b')' => depth -= 1,
                _ => {}
            }
        }
        if let (Some(open), Some(close)) = (open, close) {
            let start = if open > 0 && bytes[open - 1] == b'!' {
                open - 1
            } else {
                open
            };
            let inside = line[i + 2..close].trim();
            // `<target>` or `target "title"`.
            let target = match inside.strip_prefix('<') {
                Some(rest) => rest.split('>').next().unwrap_or(""),
                None => inside.split_whitespace().next().unwrap_or(""),
            };
            return Some(Link {
                start,
                end: close + 1,
                text: line[open + 1..i].to_owned(),
                target: target.to_owned(),
            });
        }
        from = i + 2;
    }
    None
}

/// Every link target of a line: inline links and images, and reference definitions
/// (`[label]: target`).
fn targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() <= 3
        && trimmed.starts_with('[')
        && let Some(end) = trimmed.find("]:")
        && !trimmed[1..end].contains(']')
    {
        if let Some(target) = trimmed[end + 2..].split_whitespace().next() {
            out.push(target.trim_matches(['<', '>']).to_owned());
        }
        return out;
    }
    let mut rest = line.to_owned();
    while let Some(link) = first_link(&rest) {
        out.push(link.target.clone());
        // The text may hold a link of its own (an image inside a link).
        out.extend(targets(&link.text));
        rest = rest[link.end..].to_owned();
    }
    out
}

/// Whether a target leaves the repository: a URL with a scheme, or an e-mail address.
fn external(target: &str) -> bool {
    let scheme = target.split(':').next().unwrap_or("");
    target.contains(':')
        && !scheme.is_empty()
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
}

/// `%20` and the like decoded, as a browser does before asking for the file.
fn percent_decoded(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every broken relative link of the Markdown under `root`, as `file:line: target (why)`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    markdown_files(root, &mut files);
    files.sort();
    let mut anchor_cache: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let shown = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (n, line) in prose_lines(&text).iter().enumerate() {
            for target in targets(&without_code_spans(line)) {
                if target.is_empty() || external(&target) {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else if let Some(from_root) = path.strip_prefix('/') {
                    root.join(percent_decoded(from_root))
                } else {
                    file.parent().unwrap_or(root).join(percent_decoded(path))
                };
                if !resolved.exists() {
                    broken.push(format!("{shown}:{}: {target} (no such file)", n + 1));
                    continue;
                }
                let Some(anchor) = anchor.filter(|a| !a.is_empty()) else {
                    continue;
                };
                if resolved.extension().is_none_or(|e| e != "md") {
                    // Anchors into source files (`#L10`) are the host's business.
                    continue;
                }
                let known = anchor_cache.entry(resolved.clone()).or_insert_with(|| {
                    anchors(&std::fs::read_to_string(&resolved).unwrap_or_default())
                });
                if !known.contains(&percent_decoded(anchor).to_lowercase()) {
                    broken.push(format!("{shown}:{}: {target} (no such heading)", n + 1));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    // The walk sees the documents (a check over no files would pass for nothing).
    assert!(
        files.iter().any(|f| f.ends_with("README.md"))
            && files.iter().any(|f| f.ends_with("ARCHITECTURE.md"))
            && files.len() > 10,
        "{files:?}"
    );
    let broken = broken_links(&root);
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The check itself: a directory with broken and sound links of every kind reports exactly
/// the broken ones.
#[test]
fn a_broken_link_or_anchor_is_reported_and_a_sound_one_is_not() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("idem-doc-links-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::create_dir_all(dir.join("target")).unwrap();
    std::fs::write(
        dir.join("docs/guide.md"),
        "# The guide\n\n## Run it: `idem serve`\n\n## Notes\n\n## Notes\n\n\
         ```sh\n# not a heading\n```\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("README.md"),
        "# Top\n\n\
         [guide](docs/guide.md), [run](docs/guide.md#run-it-idem-serve), \
         [second notes](docs/guide.md#notes-1), [self](#top), [dir](docs/), \
         [site](https://example.com/x.md), ![img](docs/guide.md)\n\
         [gone](docs/missing.md) and [bad anchor](docs/guide.md#not-there)\n\
         [in a span `[x](nowhere.md)`] `[y](nowhere-either.md)`\n\
         ```md\n[fenced](nowhere-at-all.md)\n```\n\
         [ref]: docs/also-missing.md\n\
         [not a heading](docs/guide.md#not-a-heading)\n",
    )
    .unwrap();
    // Markdown under a build directory is not checked.
    std::fs::write(dir.join("target/x.md"), "[x](nowhere.md)\n").unwrap();

    let broken = broken_links(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        broken,
        [
            "README.md:4: docs/missing.md (no such file)",
            "README.md:4: docs/guide.md#not-there (no such heading)",
            "README.md:9: docs/also-missing.md (no such file)",
            "README.md:10: docs/guide.md#not-a-heading (no such heading)",
        ],
        "{broken:#?}"
    );
}

#[test]
fn headings_become_githubs_anchors() {
    assert_eq!(slug("From Rust: `idem-client`"), "from-rust-idem-client");
    assert_eq!(
        slug("Consumer log — `idem_participant::consumer` (seed §16)"),
        "consumer-log--idem_participantconsumer-seed-16"
    );
    assert_eq!(slug("[Signed](x.md) calls"), "signed-calls");
    assert_eq!(
        slug("Issue 28: 200 bodies of 1 MiB"),
        "issue-28-200-bodies-of-1-mib"
    );
}

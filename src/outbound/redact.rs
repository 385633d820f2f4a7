//! Userinfo (`user:password@`) out of every text a person or a log reads.

use std::borrow::Cow;

/// `text` with the userinfo of every URL in it replaced by `***`
/// (`http://u:p@h/x` → `http://***@h/x`). Works on free text too (an error message that
/// quotes a URL): after each `://`, the authority runs to the first `/`, `?`, `#`, `\`
/// or line break, and everything before its last `@` is userinfo, as the URL parser
/// reads it. Text that merely resembles one may be over-redacted, never under-redacted.
pub fn redact_userinfo(text: &str) -> Cow<'_, str> {
    if !text.contains('@') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut changed = false;
    while let Some(at) = rest.find("://") {
        let start = at + 3;
        let len = rest[start..]
            .find(['/', '?', '#', '\\', '\n', '\r'])
            .unwrap_or(rest.len() - start);
        let authority = &rest[start..start + len];
        out.push_str(&rest[..start]);
        match authority.rfind('@') {
            Some(i) => {
                changed |= &authority[..i] != "***";
                out.push_str("***");
                out.push_str(&authority[i..]);
            }
            None => out.push_str(authority),
        }
        rest = &rest[start + len..];
    }
    if !changed {
        return Cow::Borrowed(text);
    }
    out.push_str(rest);
    Cow::Owned(out)
}

/// A transaction's `branch_headers` as every view shows them: the names, each value as
/// `***`. The values are credentials more often than not (`Authorization`, API keys), and
/// a view is read by every client of the tenant and by operators; the participants still
/// receive them as given.
pub fn redact_header_values(
    headers: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    headers
        .keys()
        .map(|name| (name.clone(), "***".to_owned()))
        .collect()
}

/// [`redact_userinfo`] of an optional text, owned (the views' fields).
pub fn redacted(text: &Option<String>) -> Option<String> {
    text.as_deref().map(|t| redact_userinfo(t).into_owned())
}

//! `?` placeholders, rewritten for backends that number theirs.
//!
//! SQL in idem is written once with `?` and sent to SQLite and MySQL as it is; PostgreSQL
//! wants `$1, $2, ...`. `sqlx::Any` passes SQL through untouched, so the rewriting cannot be
//! left to the driver.

/// How a backend marks a statement's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placeholders {
    /// `?` for every parameter, in order (SQLite, MySQL).
    QuestionMark,
    /// `$1, $2, ...` (PostgreSQL).
    Numbered,
}

/// `text`, written with `?` placeholders, in the `style` given.
///
/// Question marks inside string literals, quoted identifiers and comments are left alone.
pub fn rewrite_placeholders(text: &str, style: Placeholders) -> String {
    match style {
        Placeholders::QuestionMark => text.to_owned(),
        Placeholders::Numbered => numbered(text),
    }
}

/// Replaces each `?` outside literals and comments by `$n`, counting from 1.
fn numbered(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut n = 0u32;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                // A quoted literal or identifier; a doubled quote is an escaped quote and is
                // simply copied as "close then reopen".
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == c {
                        break;
                    }
                }
            }
            '-' if chars.peek() == Some(&'-') => {
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                out.push(c);
                out.push(chars.next().expect("peeked"));
                let mut prev = '\0';
                for d in chars.by_ref() {
                    out.push(d);
                    if prev == '*' && d == '/' {
                        break;
                    }
                    prev = d;
                }
            }
            '?' => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(text: &str) -> String {
        rewrite_placeholders(text, Placeholders::Numbered)
    }

    #[test]
    fn placeholders_are_numbered() {
        assert_eq!(
            numbered("UPDATE t SET a = ?, b = ? WHERE k = ?"),
            "UPDATE t SET a = $1, b = $2 WHERE k = $3"
        );
    }

    #[test]
    fn question_marks_stay_for_the_other_style() {
        let q = "SELECT a FROM t WHERE k = ? AND j = '?'";
        assert_eq!(rewrite_placeholders(q, Placeholders::QuestionMark), q);
    }

    #[test]
    fn literals_identifiers_and_comments_are_left_alone() {
        assert_eq!(
            numbered(
                "SELECT '?', 'it''s?', \"we?ird\" FROM t -- why?\nWHERE k = ? /* ? */ AND j = ?"
            ),
            "SELECT '?', 'it''s?', \"we?ird\" FROM t -- why?\nWHERE k = $1 /* ? */ AND j = $2"
        );
    }

    // What the coordinator's store sends: string literals between placeholders, IN lists,
    // PostgreSQL casts right after a placeholder, and more than nine parameters.
    #[test]
    fn the_stores_statements_are_numbered() {
        assert_eq!(
            numbered("a = ? AND b = '?' AND c IN (?, ?)"),
            "a = $1 AND b = '?' AND c IN ($2, $3)"
        );
        assert_eq!(
            numbered("WHERE status IN ('prepared', 'running') AND substr(owner_token, 1, ?) = ?"),
            "WHERE status IN ('prepared', 'running') AND substr(owner_token, 1, $1) = $2"
        );
        assert_eq!(
            numbered("(VALUES (?::varchar, ?::int, ?::text))"),
            "(VALUES ($1::varchar, $2::int, $3::text))"
        );
        let twelve = ["?"; 12].join(", ");
        let expected = (1..=12).map(|n| format!("${n}")).collect::<Vec<_>>();
        assert_eq!(numbered(&twelve), expected.join(", "));
    }

    #[test]
    fn an_unclosed_literal_or_comment_keeps_the_rest() {
        assert_eq!(numbered("a = ? AND b = 'x?"), "a = $1 AND b = 'x?");
        assert_eq!(numbered("a = ? /* ?"), "a = $1 /* ?");
        assert_eq!(numbered("a = ? -- ?"), "a = $1 -- ?");
    }

    #[test]
    fn a_lone_dash_or_slash_is_not_a_comment() {
        assert_eq!(
            numbered("SELECT a - ?, b / ? FROM t"),
            "SELECT a - $1, b / $2 FROM t"
        );
    }
}

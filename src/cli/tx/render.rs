//! Tables for people, from the API's JSON (the same for both ways in, so a server and a
//! database print alike). Times are RFC 3339 in UTC; `--json` prints the JSON untouched.

use serde::Deserialize;
use serde_json::Value;

use super::BoxError;
use crate::core::Millis;
use crate::timestamp::rfc3339;

/// The fields of the API's transaction view that the tables show.
#[derive(Debug, Deserialize)]
struct Tx {
    gid: String,
    #[serde(default = "default_tenant")]
    tenant: String,
    kind: String,
    status: String,
    #[serde(default)]
    stalled_from: Option<String>,
    reason: Option<String>,
    last_error: Option<String>,
    attempts: i64,
    #[serde(default)]
    calls: i64,
    #[serde(default)]
    history_total: i64,
    #[serde(default)]
    history_dropped: i64,
    timeout_at: Option<Millis>,
    next_attempt_at: Option<Millis>,
    created_at: Millis,
    updated_at: Millis,
    finished_at: Option<Millis>,
    #[serde(default)]
    options: Value,
    #[serde(default)]
    branches: Vec<Branch>,
    #[serde(default)]
    history: Option<Vec<Attempt>>,
}

#[derive(Debug, Deserialize)]
struct Branch {
    branch_id: String,
    action: String,
    url: String,
    status: String,
    attempts: i64,
    next_attempt_at: Option<Millis>,
    last_error: Option<String>,
    updated_at: Millis,
}

#[derive(Debug, Deserialize)]
struct Attempt {
    #[serde(default)]
    number: i64,
    branch_id: String,
    action: String,
    attempt: i64,
    started_at: Millis,
    duration_ms: i64,
    outcome: String,
    detail: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Page {
    transactions: Vec<Tx>,
    next_cursor: Option<String>,
}

fn default_tenant() -> String {
    crate::tenant::DEFAULT_TENANT.to_owned()
}

fn parse<T: serde::de::DeserializeOwned>(value: &Value, what: &str) -> Result<T, BoxError> {
    T::deserialize(value).map_err(|e| format!("unexpected {what} from the coordinator: {e}").into())
}

pub(super) fn json(value: &Value) -> Result<String, BoxError> {
    Ok(format!("{}\n", serde_json::to_string_pretty(value)?))
}

pub(super) fn list(value: &Value) -> Result<String, BoxError> {
    let page: Page = parse(value, "list")?;
    let rows = page
        .transactions
        .iter()
        .map(|tx| {
            vec![
                // The key `idem tx --database-url` takes: `tenant/gid` outside the default.
                crate::tenant::scoped_key(&tx.tenant, &tx.gid),
                tx.kind.clone(),
                tx.status.clone(),
                tx.attempts.to_string(),
                rfc3339(tx.created_at),
                rfc3339(tx.updated_at),
                text(&tx.last_error),
            ]
        })
        .collect();
    let mut out = table(
        &[
            "GID",
            "KIND",
            "STATUS",
            "ATTEMPTS",
            "CREATED",
            "UPDATED",
            "LAST ERROR",
        ],
        rows,
    );
    if let Some(cursor) = &page.next_cursor {
        out.push_str(&format!("more: --cursor {cursor}\n"));
    }
    Ok(out)
}

pub(super) fn show(value: &Value) -> Result<String, BoxError> {
    let tx: Tx = parse(value, "transaction")?;
    let status = match &tx.stalled_from {
        Some(from) => format!("{} (from {from})", tx.status),
        None => tx.status.clone(),
    };
    let fields = [
        ("gid", tx.gid.clone()),
        ("tenant", tx.tenant.clone()),
        ("kind", tx.kind.clone()),
        ("status", status),
        ("attempts", tx.attempts.to_string()),
        ("calls", tx.calls.to_string()),
        ("created", rfc3339(tx.created_at)),
        ("updated", rfc3339(tx.updated_at)),
        ("next attempt", time(tx.next_attempt_at)),
        ("timeout", time(tx.timeout_at)),
        ("finished", time(tx.finished_at)),
        ("reason", text(&tx.reason)),
        ("last error", text(&tx.last_error)),
        ("options", clean(&tx.options.to_string())),
    ];
    let mut out = String::new();
    for (name, value) in fields {
        out.push_str(&format!("{name:<13}{value}\n"));
    }
    out.push_str("\nbranches\n");
    let rows = tx
        .branches
        .iter()
        .map(|b| {
            vec![
                b.branch_id.clone(),
                b.action.clone(),
                b.status.clone(),
                b.attempts.to_string(),
                time(b.next_attempt_at),
                rfc3339(b.updated_at),
                clean(&b.url),
                text(&b.last_error),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "BRANCH",
            "ACTION",
            "STATUS",
            "ATTEMPTS",
            "NEXT ATTEMPT",
            "UPDATED",
            "URL",
            "LAST ERROR",
        ],
        rows,
    ));
    if let Some(history) = &tx.history {
        out.push_str("\ncalls that did not succeed\n");
        out.push_str(&history_note(&tx, history.len()));
        let rows = history
            .iter()
            .map(|a| {
                vec![
                    a.number.to_string(),
                    a.branch_id.clone(),
                    a.action.clone(),
                    a.attempt.to_string(),
                    rfc3339(a.started_at),
                    format!("{} ms", a.duration_ms),
                    a.outcome.clone(),
                    text(&a.detail),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "#", "BRANCH", "ACTION", "ATTEMPT", "STARTED", "DURATION", "OUTCOME", "DETAIL",
            ],
            rows,
        ));
    }
    Ok(out)
}

/// What of the history the table leaves out: the oldest records the server no longer
/// keeps, and the kept ones older than those shown.
fn history_note(tx: &Tx, shown: usize) -> String {
    let mut note = String::new();
    if tx.history_dropped > 0 {
        note.push_str(&format!(
            "{} older not kept (the server keeps the newest {} of each transaction)\n",
            tx.history_dropped,
            tx.history_total - tx.history_dropped
        ));
    }
    let kept = tx.history_total - tx.history_dropped;
    if (shown as i64) < kept {
        note.push_str(&format!(
            "the newest {shown} of {kept} kept; all: GET /api/v1/transactions/{}/attempts\n",
            tx.gid
        ));
    }
    note
}

/// One line for a command that changed a transaction: `gid: status`.
pub(super) fn outcome(value: &Value) -> Result<String, BoxError> {
    let tx: Tx = parse(value, "transaction")?;
    Ok(format!("{}: {}", tx.gid, tx.status))
}

/// A bulk action's answer: one row per selected transaction, then what the call did.
pub(super) fn bulk(value: &Value) -> Result<String, BoxError> {
    #[derive(serde::Deserialize)]
    struct Item {
        gid: String,
        before: String,
        after: Option<String>,
        error: Option<ErrorItem>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        code: String,
        message: String,
    }
    #[derive(serde::Deserialize)]
    struct Bulk {
        operation: String,
        dry_run: bool,
        more: bool,
        results: Vec<Item>,
    }
    let bulk: Bulk = parse(value, "bulk action")?;
    let refused = bulk.results.iter().filter(|i| i.error.is_some()).count();
    let rows = bulk
        .results
        .iter()
        .map(|item| {
            let outcome = match (&item.after, &item.error) {
                (_, Some(e)) => format!("refused: {}: {}", e.code, clean(&e.message)),
                (Some(after), None) => after.clone(),
                (None, None) => format!("would {}", bulk.operation.replace('_', "-")),
            };
            vec![clean(&item.gid), item.before.clone(), outcome]
        })
        .collect();
    let mut out = table(&["GID", "BEFORE", "OUTCOME"], rows);
    let n = bulk.results.len();
    out.push_str(&if bulk.dry_run {
        format!("dry run: {n} selected, nothing changed")
    } else {
        format!("{n} selected, {} done, {refused} refused", n - refused)
    });
    if bulk.more {
        out.push_str("; more match: run the command again for the next ones");
    }
    out.push('\n');
    Ok(out)
}

fn time(ms: Option<Millis>) -> String {
    ms.map(rfc3339).unwrap_or_else(|| "-".into())
}

fn text(value: &Option<String>) -> String {
    value.as_deref().map(clean).unwrap_or_else(|| "-".into())
}

/// Error texts come from participants and may hold anything: line breaks would break
/// the table's rows, and escape sequences would reach the operator's terminal.
fn clean(value: &str) -> String {
    value
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Columns as wide as their widest cell; the last one is not padded.
fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
        out
    };
    let mut out = line(headers.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn view() -> Value {
        json!({
            "gid": "order-1", "kind": "tcc", "status": "stalled", "stalled_from": "committing",
            "reason": null, "last_error": "exhausted 2 attempts:\nHTTP 500\u{1b}[31m",
            "attempts": 2, "timeout_at": null, "next_attempt_at": null,
            "created_at": 1_796_006_802_500_i64, "updated_at": 1_796_006_803_000_i64,
            "finished_at": null, "options": {"max_attempts": 2},
            "branches": [{"branch_id": "01", "action": "confirm", "url": "http://p/confirm",
                "payload": "{}", "status": "stalled", "attempts": 2, "next_attempt_at": null,
                "last_error": "HTTP 500", "in_progress_since": null,
                "updated_at": 1_796_006_803_000_i64, "finished_at": null}],
            "history": [{"branch_id": "01", "action": "confirm", "attempt": 1,
                "started_at": 1_796_006_802_600_i64, "duration_ms": 3, "outcome": "unknown",
                "detail": "HTTP 500"}],
        })
    }

    #[test]
    fn lists_show_rfc3339_times_one_row_per_transaction() {
        let page = json!({"transactions": [view()], "next_cursor": "1796006802500:order-1"});
        let out = list(&page).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert!(lines[0].starts_with("GID      KIND  STATUS   ATTEMPTS  CREATED"));
        assert!(lines[1].contains("2026-11-30T02:46:42.500Z"), "{out}");
        assert!(!out.contains("1796006802500  "), "raw milliseconds: {out}");
        // The control characters of the error text are gone, so the row stays one line.
        assert!(
            lines[1].ends_with("exhausted 2 attempts: HTTP 500 [31m"),
            "{out}"
        );
        assert_eq!(lines[2], "more: --cursor 1796006802500:order-1");
    }

    #[test]
    fn show_has_the_fields_the_branches_and_the_history() {
        let out = show(&view()).unwrap();
        assert!(
            out.contains("status       stalled (from committing)\n"),
            "{out}"
        );
        assert!(
            out.contains("created      2026-11-30T02:46:42.500Z\n"),
            "{out}"
        );
        assert!(out.contains("next attempt -\n"), "{out}");
        assert!(
            out.contains("01      confirm  stalled  2         -             2026-11-30T02:46:43.000Z  http://p/confirm  HTTP 500\n"),
            "{out}"
        );
        assert!(
            out.contains("2026-11-30T02:46:42.600Z  3 ms      unknown  HTTP 500\n"),
            "{out}"
        );
    }

    #[test]
    fn show_says_what_of_the_history_is_not_kept_or_not_shown() {
        let mut tx = view();
        assert!(!show(&tx).unwrap().contains("not kept"));
        tx["calls"] = json!(250);
        tx["history_total"] = json!(250);
        tx["history_dropped"] = json!(150);
        tx["history"][0]["number"] = json!(250);
        let out = show(&tx).unwrap();
        assert!(out.contains("calls        250\n"), "{out}");
        assert!(
            out.contains(
                "150 older not kept (the server keeps the newest 100 of each transaction)\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "the newest 1 of 100 kept; all: GET /api/v1/transactions/order-1/attempts\n"
            ),
            "{out}"
        );
        assert!(out.contains("\n250  01      confirm"), "{out}");
    }

    #[test]
    fn an_operation_prints_the_gid_and_its_status() {
        assert_eq!(outcome(&view()).unwrap(), "order-1: stalled");
        let err = outcome(&json!({"gid": 1})).unwrap_err().to_string();
        assert!(err.starts_with("unexpected transaction"), "{err}");
    }
}

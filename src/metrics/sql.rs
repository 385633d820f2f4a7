//! The SQL statement counter the benchmark reads: statements and commits per transaction,
//! counted from sqlx's own log events rather than estimated.

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// SQL statements executed by this process, as sqlx reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SqlCounts {
    pub reads: u64,
    pub writes: u64,
    pub begins: u64,
    pub commits: u64,
    pub rollbacks: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    begins: AtomicU64,
    commits: AtomicU64,
    rollbacks: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> SqlCounts {
        SqlCounts {
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            begins: self.begins.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
            rollbacks: self.rollbacks.load(Ordering::Relaxed),
        }
    }
}

static SQL: Counters = Counters {
    reads: AtomicU64::new(0),
    writes: AtomicU64::new(0),
    begins: AtomicU64::new(0),
    commits: AtomicU64::new(0),
    rollbacks: AtomicU64::new(0),
};
static SQL_COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The counts in Prometheus' text format, for `/metrics` (only once counting was on).
pub(super) fn render_counts() -> Option<String> {
    let c = SQL.snapshot();
    if c == SqlCounts::default() && !SQL_COUNTING.load(Ordering::Relaxed) {
        return None;
    }
    Some(format!(
        "# HELP idem_sql_statements_total SQL statements this process executed (counted only while IDEM_COUNT_SQL=1), by kind.\n\
         # TYPE idem_sql_statements_total counter\n\
         idem_sql_statements_total{{kind=\"read\"}} {}\n\
         idem_sql_statements_total{{kind=\"write\"}} {}\n\
         # HELP idem_sql_commits_total COMMIT statements this process executed (counted only while IDEM_COUNT_SQL=1).\n\
         # TYPE idem_sql_commits_total counter\n\
         idem_sql_commits_total {}\n\
         # HELP idem_sql_begins_total BEGIN statements this process executed (counted only while IDEM_COUNT_SQL=1).\n\
         # TYPE idem_sql_begins_total counter\n\
         idem_sql_begins_total {}\n",
        c.reads, c.writes, c.commits, c.begins
    ))
}

/// What this process has executed so far (zero unless counting is on).
pub fn sql_counts() -> SqlCounts {
    SQL.snapshot()
}

/// Turns statement counting on or off for this process.
pub fn set_sql_counting(on: bool) {
    SQL_COUNTING.store(on, Ordering::Relaxed);
}

pub fn sql_counting() -> bool {
    SQL_COUNTING.load(Ordering::Relaxed)
}

/// A tracing layer that counts the statements sqlx logs (target `sqlx::query`), so that
/// statements and commits per transaction are counted, not estimated. It is installed
/// with [`counting_filter`], so that while counting is off sqlx does not even build the
/// log events; the benchmark counts in a separate pass from the one it times.
pub struct SqlCountingLayer;

/// The per-layer filter for [`SqlCountingLayer`]: sqlx's query events, while counting is on.
/// Its interest in sqlx's callsites is "sometimes", so that turning counting on later in
/// the process takes effect (a cached "never" would not).
pub fn counting_filter() -> CountingFilter {
    CountingFilter
}

pub struct CountingFilter;

impl<S> tracing_subscriber::layer::Filter<S> for CountingFilter {
    fn enabled(&self, meta: &tracing::Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        meta.target() == "sqlx::query" && SQL_COUNTING.load(Ordering::Relaxed)
    }

    fn callsite_enabled(
        &self,
        meta: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if meta.target() == "sqlx::query" {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

/// sqlx puts a short statement in `summary` and leaves `db.statement` empty; a long one
/// is cut in `summary` and whole in `db.statement`. Either starts with the keyword.
#[derive(Default)]
struct StatementText {
    summary: Option<String>,
    statement: Option<String>,
}

impl StatementText {
    fn record(&mut self, field: &Field, value: String) {
        match field.name() {
            "summary" => self.summary = Some(value),
            "db.statement" if !value.trim().is_empty() => self.statement = Some(value),
            _ => {}
        }
    }

    fn text(self) -> Option<String> {
        self.statement.or(self.summary)
    }
}

impl Visit for StatementText {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for SqlCountingLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut text = StatementText::default();
        event.record(&mut text);
        let Some(text) = text.text() else { return };
        let head = text
            .trim_start_matches(|c: char| c.is_whitespace() || c == '"' || c == '\n')
            .to_ascii_uppercase();
        let counter = if head.starts_with("BEGIN") || head.starts_with("START TRANSACTION") {
            &SQL.begins
        } else if head.starts_with("COMMIT") {
            &SQL.commits
        } else if head.starts_with("ROLLBACK") {
            &SQL.rollbacks
        } else if head.starts_with("SELECT")
            || head.starts_with("SHOW")
            || head.starts_with("PRAGMA")
        {
            &SQL.reads
        } else {
            &SQL.writes
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

//! The log's settings and its set-up: text or JSON lines on stderr, at a level that
//! `RUST_LOG` overrides.

use std::io::IsTerminal;
use std::str::FromStr;

use clap::{Args, ValueEnum};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::LevelFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, message, target and the event's fields.
    Json,
}

#[derive(Debug, Args, Clone)]
pub struct LogArgs {
    /// Log lines as text or as JSON objects (one per line), on stderr.
    #[arg(long, env = "IDEM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The least severe level logged (error, warn, info, debug, trace, off), or a tracing
    /// filter such as `info,idem::engine=debug`. `RUST_LOG`, when set, overrides it.
    #[arg(long, env = "IDEM_LOG_LEVEL", default_value = "info", value_parser = parse_level)]
    pub log_level: String,
}

/// A bare word must be a level: as a filter it would name a target, so a misspelt
/// `debg` would silently log nothing.
fn parse_level(value: &str) -> Result<String, String> {
    if value.trim().is_empty() {
        return Err("expected error, warn, info, debug, trace or off".to_owned());
    }
    if value.contains(['=', ',', '[']) {
        EnvFilter::builder()
            .parse(value)
            .map_err(|e| format!("not a log filter: {e}"))?;
    } else {
        LevelFilter::from_str(value.trim())
            .map_err(|_| "expected error, warn, info, debug, trace or off".to_owned())?;
    }
    Ok(value.to_owned())
}

/// `RUST_LOG` when it is set and not empty.
pub fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// Logs to stderr in `format` at `level` (a level or a filter; `RUST_LOG` overrides it),
/// with colours only on a terminal, and counts SQL statements for `/metrics` when
/// `IDEM_COUNT_SQL=1` (the benchmark's counting pass); spans go to `otlp` too when it runs
/// (`--otlp-endpoint`). Both binaries start this way, once their configuration is read.
pub fn init_logging(format: LogFormat, level: &str, otlp: Option<&crate::telemetry::Otlp>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};

    let fallback = || EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let mut refused = None;
    let filter = match rust_log() {
        Some(directives) => EnvFilter::try_new(&directives).unwrap_or_else(|e| {
            refused = Some(e);
            fallback()
        }),
        None => fallback(),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colours());
    let log: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Text => fmt.boxed(),
        // Flattened, so that every line has `message` and the event's fields at the top.
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    crate::metrics::set_sql_counting(std::env::var("IDEM_COUNT_SQL").is_ok_and(|v| v == "1"));
    let counting = crate::metrics::SqlCountingLayer.with_filter(crate::metrics::counting_filter());
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .with(counting)
        .with(otlp.map(|o| o.layer()))
        .init();
    if format == LogFormat::Json {
        // A panic's text would be the one line a collector cannot parse.
        std::panic::set_hook(Box::new(|info| {
            let backtrace = std::backtrace::Backtrace::capture();
            tracing::error!(target: "idem", panic = %info, %backtrace, "panicked");
        }));
    }
    if let Some(e) = refused {
        tracing::warn!(error = %e, level, "RUST_LOG is not a valid filter; using the log level");
    }
}

/// Escape codes only for a person at a terminal: a file, a pipe or a log collector would
/// store them as garbage. `NO_COLOR` turns them off there too.
fn colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Reports the error that ends the process: as `bin: error` in text, as a log line in
/// JSON, so that a collector reading stderr parses every line.
pub fn report_fatal(bin: &str, format: LogFormat, error: &dyn std::fmt::Display) {
    match format {
        LogFormat::Text => eprintln!("{bin}: {error}"),
        LogFormat::Json => tracing::error!(target: "idem", "{error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_filters_are_checked() {
        for ok in [
            "info",
            "warn",
            "off",
            "TRACE",
            "info,idem=debug",
            "idem::engine=debug",
        ] {
            assert_eq!(parse_level(ok).as_deref(), Ok(ok), "{ok}");
        }
        for bad in ["debg", "", "info,idem=loud"] {
            assert!(parse_level(bad).is_err(), "{bad:?} accepted");
        }
    }
}

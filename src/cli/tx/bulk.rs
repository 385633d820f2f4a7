//! `idem tx retry|force-stop|abort` by filter instead of by gid: every transaction of a
//! status (and kind, and age) at once, at most `--limit` per call, with `--dry-run` to see
//! what would change. Through a coordinator it is the API's `POST /api/v1/bulk`; on a
//! database (`--database-url`) the engine's same bulk action, over every tenant unless
//! `--tenant` names one.

use std::time::Duration;

use clap::Args;
use serde_json::{Value, json};

use super::{Operation, Target, TargetArgs, render};
use crate::cli::BoxError;
use crate::core::{Kind, Status};
use crate::engine::BulkOperation;

/// Which transactions a bulk action selects.
#[derive(Debug, Args, Clone, Default)]
pub struct SelectArgs {
    /// Act on every transaction in this status instead of one gid.
    #[arg(long, conflicts_with = "gid")]
    pub status: Option<Status>,
    /// Only this kind.
    #[arg(long, requires = "status")]
    pub kind: Option<Kind>,
    /// Only those created at least this long ago: `90s`, `10m`, `2h`, `1d`.
    #[arg(long, requires = "status", value_parser = parse_age, value_name = "AGE")]
    pub older_than: Option<Duration>,
    /// Only this tenant's. Through a coordinator a token acts in its own tenant, which
    /// this must name; on a database every tenant's unless this names one.
    #[arg(long, requires = "status")]
    pub tenant: Option<String>,
    /// Print what would change, and change nothing.
    #[arg(long, requires = "status")]
    pub dry_run: bool,
    /// At most this many per call (1-500; default 100). Run again for the next ones.
    #[arg(long, requires = "status")]
    pub limit: Option<u32>,
}

/// `90s`, `10m`, `2h`, `1d` (a number alone is seconds).
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?}: a number and s, m, h or d (10m)"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d (10m)")),
    };
    n.checked_mul(seconds)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("{text:?} is too long"))
}

impl Operation {
    pub(super) fn bulk(self) -> BulkOperation {
        match self {
            Operation::Retry => BulkOperation::Retry,
            Operation::ForceStop => BulkOperation::ForceStop,
            Operation::Abort => BulkOperation::Abort,
        }
    }
}

/// The API's request for `select` and `op`.
pub(super) fn request(select: &SelectArgs, op: Operation, reason: Option<&str>) -> Value {
    let mut body = json!({
        "operation": crate::api::native::operation_name(op.bulk()),
        "status": select.status,
        "dry_run": select.dry_run,
    });
    if let Some(kind) = select.kind {
        body["kind"] = json!(kind);
    }
    if let Some(age) = select.older_than {
        body["older_than_ms"] = json!(age.as_millis() as u64);
    }
    if let Some(tenant) = &select.tenant {
        body["tenant"] = json!(tenant);
    }
    if let Some(reason) = reason {
        body["reason"] = json!(reason);
    }
    if let Some(limit) = select.limit {
        body["limit"] = json!(limit);
    }
    body
}

pub(super) async fn run(
    args: &TargetArgs,
    select: &SelectArgs,
    op: Operation,
    reason: Option<&str>,
    json: bool,
) -> Result<String, BoxError> {
    let target = Target::open(args).await?;
    let answer = match &target {
        Target::Server(remote) => remote.bulk(&request(select, op, reason)).await?,
        Target::Database(direct) => direct.bulk(select, op, reason).await?,
    };
    if json {
        render::json(&answer)
    } else {
        render::bulk(&answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_take_a_unit() {
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_age("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_age("30"), Ok(Duration::from_secs(30)));
        assert!(parse_age("10w").is_err());
        assert!(parse_age("m").is_err());
        assert!(parse_age("99999999999999999999d").is_err());
    }

    #[test]
    fn the_request_says_only_what_was_given() {
        let select = SelectArgs {
            status: Some(Status::Stalled),
            older_than: Some(Duration::from_secs(600)),
            dry_run: true,
            ..SelectArgs::default()
        };
        let body = request(&select, Operation::Retry, None);
        assert_eq!(
            body,
            json!({"operation": "retry", "status": "stalled", "dry_run": true, "older_than_ms": 600000})
        );
    }
}

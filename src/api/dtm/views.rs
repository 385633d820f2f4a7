//! How the DTM door shows a transaction and its branches: DTM's names and shapes, with
//! idem's additions (retry counts, last error, why it stalled).

use serde_json::{Value, json};

use crate::core::{Action, Branch, BranchStatus, Status};
use crate::engine::StoredTx;
use crate::engine::views::{base64, shown_payload};
use crate::outbound::redact::{redact_header_values, redact_userinfo, redacted};
use crate::timestamp::rfc3339;

/// DTM's name for a status. `stalled` has no DTM equivalent and is shown as such.
pub fn dtm_status(status: Status) -> &'static str {
    match status {
        Status::Prepared => "prepared",
        Status::Running | Status::Committing => "submitted",
        Status::Aborting => "aborting",
        Status::Succeeded => "succeed",
        Status::Failed => "failed",
        Status::Stalled => "stalled",
    }
}

/// The statuses a DTM status name selects (`submitted` is idem's running and committing).
pub(super) fn from_dtm_status(name: &str) -> Option<Vec<Status>> {
    Some(match name {
        "prepared" => vec![Status::Prepared],
        "submitted" => vec![Status::Running, Status::Committing],
        "aborting" => vec![Status::Aborting],
        "succeed" => vec![Status::Succeeded],
        "failed" => vec![Status::Failed],
        "stalled" => vec![Status::Stalled],
        other => return other.parse().ok().map(|s| vec![s]),
    })
}

pub(super) fn global_view(stored: &StoredTx) -> Value {
    let tx = &stored.tx;
    let actions: Vec<&Branch> = tx
        .branches
        .iter()
        .filter(|b| b.action == Action::Action)
        .collect();
    let steps: Vec<Value> = actions
        .iter()
        .map(|a| {
            let compensate = tx
                .branches
                .iter()
                .find(|b| b.action == Action::Compensate && b.branch_id == a.branch_id);
            match compensate {
                Some(c) => json!({"action": redact_userinfo(&a.url), "compensate": redact_userinfo(&c.url)}),
                None => json!({"action": redact_userinfo(&a.url)}),
            }
        })
        .collect();
    // DTM shows text; bytes that are not text (from a gRPC client) as base64.
    let payloads: Vec<String> = actions
        .iter()
        .map(|a| shown_payload(&a.payload).0)
        .collect();
    let query_prepared = tx
        .branches
        .iter()
        .find(|b| b.action == Action::QueryPrepared)
        .map(|b| redact_userinfo(&b.url));
    let mut view = json!({
        "gid": crate::tenant::client_gid(&tx.gid),
        "trans_type": tx.kind.as_str(),
        "status": dtm_status(tx.status),
        "protocol": "http",
        "create_time": rfc3339(tx.created_at),
        "update_time": rfc3339(tx.updated_at),
        "options": serde_json::to_string(&json!({
            "timeout_to_fail": tx.options.timeout_ms.map(|t| t / 1_000),
            "request_timeout": tx.options.request_timeout_ms / 1_000,
            "retry_interval": tx.options.retry_interval_ms / 1_000,
            "retry_limit": tx.options.max_attempts,
            "branch_headers": redact_header_values(&tx.options.branch_headers),
        })).expect("serialisable"),
        // idem's additions: retry count, last error, and why it stalled.
        "retry_count": tx.attempts,
        "last_error": redacted(&tx.last_error),
    });
    let map = view.as_object_mut().expect("object");
    if !steps.is_empty() {
        map.insert("steps".into(), json!(steps));
        map.insert("payloads".into(), json!(payloads));
    }
    if let Some(q) = query_prepared {
        map.insert("query_prepared".into(), json!(q));
    }
    if let Some(at) = tx.finished_at {
        map.insert("finish_time".into(), json!(rfc3339(at)));
    }
    if let (Status::Failed | Status::Aborting, Some(reason)) = (tx.status, &tx.reason) {
        map.insert("rollback_reason".into(), json!(redact_userinfo(reason)));
    }
    if let Some(at) = tx.next_attempt_at {
        map.insert("next_cron_time".into(), json!(rfc3339(at)));
    }
    if let Some(from) = tx.stalled_from {
        map.insert("stalled_from".into(), json!(dtm_status(from)));
    }
    if tx.options.concurrent {
        map.insert(
            "custom_data".into(),
            json!(
                serde_json::to_string(&json!({"orders": tx.options.orders, "concurrent": true}))
                    .expect("serialisable")
            ),
        );
    }
    view
}

pub(super) fn branch_view(gid: &str, b: &Branch) -> Value {
    let status = match b.status {
        BranchStatus::Succeeded => "succeed",
        BranchStatus::Failed => "failed",
        BranchStatus::Pending | BranchStatus::Skipped | BranchStatus::Stalled => "prepared",
    };
    let mut view = json!({
        "gid": gid,
        "url": redact_userinfo(&b.url),
        "bin_data": base64(b.payload.as_bytes()),
        "branch_id": b.branch_id,
        "op": b.action.op(),
        "status": status,
        "update_time": rfc3339(b.updated_at),
        "attempts": b.attempts,
        "last_error": redacted(&b.last_error),
    });
    if let Some(at) = b.finished_at {
        view["finish_time"] = json!(rfc3339(at));
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_go() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(br#"{"amount": 30}"#), "eyJhbW91bnQiOiAzMH0=");
    }

    #[test]
    fn statuses_map_both_ways() {
        for s in Status::ALL {
            let back = from_dtm_status(dtm_status(s)).unwrap();
            assert!(back.contains(&s), "{s}");
        }
    }
}

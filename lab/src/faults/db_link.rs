//! Database-link faults as data: what happens to the connections between a coordinator and
//! its database, and when.
//!
//! The scenario runner puts a TCP proxy it controls between each coordinator process and
//! the database server (`idem_participant::testing::TcpProxy`) and applies these rules to
//! it. Like database restarts, a rule fires when the run reaches an order (`at_order`), not
//! at a wall-clock time, so it lands while orders are in flight at any speed of the machine.

use serde::{Deserialize, Serialize};

/// One fault on the database link of one coordinator, or of all of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DbLinkRule {
    /// Fires when the runner starts this order (0-based, in the scenario's order)...
    pub at_order: usize,
    /// ... and this long after it (so that a fault can land in the middle of the orders
    /// already started, rather than on their creation).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub after_ms: u64,
    /// Only the link of the coordinator with this node name (`c0`, `c1`, ...); every
    /// coordinator's link when unset.
    #[serde(default)]
    pub node: Option<String>,
    pub fault: DbLinkFault,
}

fn is_zero(ms: &u64) -> bool {
    *ms == 0
}

/// What happens to the link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum DbLinkFault {
    /// No byte passes either way for `ms`, the connections staying open (new ones are
    /// accepted and hear nothing); then everything held is delivered. On SQLite, which
    /// has no link, another process holds the database's write lock for `ms` instead.
    Freeze { ms: u64 },
    /// Every chunk of bytes waits `to_server_ms` on its way to the server and
    /// `to_client_ms` on its way back, for `for_ms`.
    Latency {
        #[serde(default)]
        to_server_ms: u64,
        #[serde(default)]
        to_client_ms: u64,
        for_ms: u64,
    },
    /// Every open connection is reset (RST); new ones are accepted as usual.
    Cut,
}

impl DbLinkFault {
    pub fn label(&self) -> String {
        match self {
            DbLinkFault::Freeze { ms } => format!("freeze {ms} ms"),
            DbLinkFault::Latency {
                to_server_ms,
                to_client_ms,
                for_ms,
            } => format!("latency +{to_server_ms}/+{to_client_ms} ms per chunk for {for_ms} ms"),
            DbLinkFault::Cut => "cut (reset every connection)".into(),
        }
    }

    /// How long the link stays disturbed after the fault fires.
    pub fn lasts_ms(&self) -> u64 {
        match self {
            DbLinkFault::Freeze { ms } => *ms,
            DbLinkFault::Latency { for_ms, .. } => *for_ms,
            DbLinkFault::Cut => 0,
        }
    }

    /// Whether SQLite can stage it: a freeze (a held write lock); it has no connection to
    /// slow down or reset.
    pub fn on_sqlite(&self) -> bool {
        matches!(self, DbLinkFault::Freeze { .. })
    }
}

/// The rules' own consistency: faults that last must say for how long.
pub(super) fn check(rules: &[DbLinkRule]) -> Result<(), String> {
    for (i, rule) in rules.iter().enumerate() {
        match rule.fault {
            DbLinkFault::Freeze { ms: 0 } => {
                return Err(format!("db_link[{i}]: a freeze needs ms > 0"));
            }
            DbLinkFault::Latency {
                to_server_ms: 0,
                to_client_ms: 0,
                ..
            } => {
                return Err(format!(
                    "db_link[{i}]: a latency needs to_server_ms or to_client_ms > 0"
                ));
            }
            DbLinkFault::Latency { for_ms: 0, .. } => {
                return Err(format!("db_link[{i}]: a latency needs for_ms > 0"));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::FaultPlan;
    use super::*;

    #[test]
    fn db_link_rules_parse_and_are_checked() {
        let plan = FaultPlan::parse(
            r#"{"db_link": [
                {"at_order": 40, "fault": {"type": "freeze", "ms": 8000}},
                {"at_order": 60, "node": "c1", "fault": {"type": "latency", "to_server_ms": 30, "for_ms": 2000}},
                {"at_order": 80, "fault": {"type": "cut"}}
            ]}"#,
            false,
        )
        .unwrap();
        assert_eq!(plan.db_link.len(), 3);
        assert_eq!(plan.db_link[0].fault, DbLinkFault::Freeze { ms: 8_000 });
        assert_eq!(plan.db_link[1].node.as_deref(), Some("c1"));
        assert_eq!(plan.db_link[1].fault.lasts_ms(), 2_000);
        assert!(!plan.db_link[2].fault.on_sqlite());
        let toml = "[[db_link]]\nat_order = 3\nfault = { type = \"freeze\", ms = 500 }\n";
        assert_eq!(
            FaultPlan::parse(toml, true).unwrap().db_link[0]
                .fault
                .label(),
            "freeze 500 ms"
        );
        for bad in [
            r#"{"db_link": [{"at_order": 1, "fault": {"type": "freeze", "ms": 0}}]}"#,
            r#"{"db_link": [{"at_order": 1, "fault": {"type": "latency", "for_ms": 10}}]}"#,
            r#"{"db_link": [{"at_order": 1, "fault": {"type": "latency", "to_client_ms": 5, "for_ms": 0}}]}"#,
            r#"{"db_link": [{"at_order": 1, "fault": {"type": "unplug"}}]}"#,
        ] {
            assert!(FaultPlan::parse(bad, false).is_err(), "{bad}");
        }
        // A plan without database-link faults is written as before.
        let plain = serde_json::to_value(FaultPlan::default()).unwrap();
        assert!(plain.get("db_link").is_none(), "{plain}");
    }
}

//! Fault plans as data: which calls go wrong, how, and where the coordinator crashes.
//!
//! A plan is a list of rules matched on (gid pattern, branch id, op, attempt). Matching is
//! deterministic: a rule with a `probability` decides by hashing the plan's seed with the
//! call's identity, not by drawing in arrival order, so the same plan against the same
//! workload fires the same faults however the calls interleave. That is what makes a
//! recorded run replayable.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::db_link::{self, DbLinkRule};

/// A fault plan, as written in a JSON (or TOML) file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPlan {
    #[serde(default)]
    pub name: String,
    /// Feeds the deterministic choice of `probability` rules.
    #[serde(default)]
    pub seed: u64,
    /// Faults on calls to participants. The first matching rule fires.
    #[serde(default)]
    pub rules: Vec<FaultRule>,
    /// Points where the coordinator process stops dead.
    #[serde(default)]
    pub crashes: Vec<CrashRule>,
    /// Faults on the links between the coordinators and their database, applied by the
    /// scenario runner (see [`DbLinkRule`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub db_link: Vec<DbLinkRule>,
}

/// Which calls a rule applies to. Unset fields match anything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// A pattern where `*` matches any run of characters.
    #[serde(default)]
    pub gid: Option<String>,
    #[serde(default)]
    pub branch_id: Option<String>,
    /// `try`, `confirm`, `cancel`, `action`, `compensate` or `msg` (the back-check).
    #[serde(default)]
    pub op: Option<String>,
    /// Only this attempt (1 = the first call of this branch operation).
    #[serde(default)]
    pub attempt: Option<u32>,
    /// Only attempts up to this one.
    #[serde(default)]
    pub max_attempt: Option<u32>,
}

/// Where a fault is applied: in the coordinator's transport (the call never leaves idem,
/// or its answer is lost on the way back), or in a layer in front of a participant service
/// (the call arrives; what the participant does with it is disturbed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    #[default]
    Coordinator,
    Participant,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    #[serde(default, rename = "match")]
    pub matches: Match,
    #[serde(default)]
    pub side: Side,
    /// Fire for this share of the matching calls (0..=1), chosen deterministically.
    #[serde(default)]
    pub probability: Option<f64>,
    /// Fire at most this many times in one process (e.g. a participant down for the
    /// first three calls, whatever their attempt numbers).
    #[serde(default)]
    pub times: Option<u32>,
    pub fault: Fault,
}

/// What goes wrong with a call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// Answer with this status; the participant never sees the call.
    Status { status: u16 },
    /// Wait this long before delivering. Longer than the request timeout: a timeout.
    Delay { ms: u64 },
    /// Deliver the call; the participant commits its step, but its answer is lost and the
    /// coordinator sees an unknown result.
    CommitThenDrop,
    /// Deliver the call twice, concurrently (a duplicate from the network or a retry).
    Duplicate,
    /// Participant side: hold the call until the same branch's `op` has been delivered
    /// (e.g. hold a Try until its Cancel arrived: Cancel overtakes Try).
    HoldUntil { op: String },
}

impl Fault {
    pub fn label(&self) -> String {
        match self {
            Fault::Status { status } => format!("status {status}"),
            Fault::Delay { ms } => format!("delay {ms} ms"),
            Fault::CommitThenDrop => "commit then drop the response".into(),
            Fault::Duplicate => "deliver twice".into(),
            Fault::HoldUntil { op } => format!("hold until {op} delivered"),
        }
    }
}

pub use idem::engine::Point as CrashPoint;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashRule {
    pub point: CrashPoint,
    /// Only the coordinator with this node name (`idem serve --node`).
    #[serde(default)]
    pub node: Option<String>,
    /// What happens there (default: the process dies).
    #[serde(default)]
    pub action: CrashAction,
    /// A gid pattern (`*` wildcard); any gid when unset.
    #[serde(default)]
    pub gid: Option<String>,
    /// Crash the n-th time the point is reached for a matching gid (default: the first).
    #[serde(default)]
    pub nth: Option<u32>,
}

/// What a crash rule does to the coordinator process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum CrashAction {
    /// Stop dead, as SIGKILL would: no shutdown, no lease handed back.
    #[default]
    Crash,
    /// Freeze the whole process (SIGSTOP) for this long, as a long GC pause, a VM
    /// migration or a partition would; it then continues as if nothing happened.
    Pause { ms: u64 },
}

/// The identity of one delivery of a branch operation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallKey {
    pub gid: String,
    pub branch_id: String,
    pub op: String,
    pub attempt: u32,
}

impl FaultPlan {
    /// Parses a plan from JSON, or from TOML when `toml_syntax` (a `.toml` file).
    pub fn parse(text: &str, toml_syntax: bool) -> Result<FaultPlan, String> {
        let plan: FaultPlan = if toml_syntax {
            toml::from_str(text).map_err(|e| e.to_string())?
        } else {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        };
        plan.check()?;
        Ok(plan)
    }

    fn check(&self) -> Result<(), String> {
        for (i, rule) in self.rules.iter().enumerate() {
            if let Some(p) = rule.probability
                && !(0.0..=1.0).contains(&p)
            {
                return Err(format!("rules[{i}].probability must be within 0..=1"));
            }
            if matches!(rule.fault, Fault::HoldUntil { .. }) && rule.side != Side::Participant {
                return Err(format!(
                    "rules[{i}]: hold_until reorders deliveries, so it needs side \"participant\""
                ));
            }
        }
        db_link::check(&self.db_link)
    }

    /// The rule for this call on this side, if one fires (by index, so that callers can
    /// count `times`), ignoring rules whose `times` are used up per `used`.
    pub fn rule_for(
        &self,
        side: Side,
        call: &CallKey,
        used: impl Fn(usize) -> u32,
    ) -> Option<(usize, &FaultRule)> {
        self.rules.iter().enumerate().find(|(i, r)| {
            r.side == side
                && r.matches.matches(call)
                && r.times.is_none_or(|t| used(*i) < t)
                // Each rule draws on its own, so two 10 % rules fire on about 19 % of calls.
                && r.probability.is_none_or(|p| chance(self.seed ^ rule_salt(*i), call) < p)
        })
    }

    /// The fault for this call on this side, if a rule fires (ignoring `times`).
    pub fn fault_for(&self, side: Side, call: &CallKey) -> Option<&Fault> {
        self.rule_for(side, call, |_| 0).map(|(_, r)| &r.fault)
    }

    /// What to do at `point` for `gid` on `node`, the `reached`-th time (1-based) this
    /// process reaches the point for that gid.
    pub fn crash_at(
        &self,
        point: CrashPoint,
        node: &str,
        gid: &str,
        reached: u32,
    ) -> Option<CrashAction> {
        self.crashes
            .iter()
            .find(|c| {
                c.point == point
                    && c.node.as_deref().is_none_or(|n| n == node)
                    && c.gid.as_deref().is_none_or(|p| glob(p, gid))
                    && c.nth.unwrap_or(1) == reached
            })
            .map(|c| c.action)
    }
}

impl Match {
    pub fn matches(&self, call: &CallKey) -> bool {
        self.gid.as_deref().is_none_or(|p| glob(p, &call.gid))
            && self
                .branch_id
                .as_deref()
                .is_none_or(|b| b == call.branch_id)
            && self.op.as_deref().is_none_or(|o| o == call.op)
            && self.attempt.is_none_or(|a| a == call.attempt)
            && self.max_attempt.is_none_or(|a| call.attempt <= a)
    }
}

fn rule_salt(index: usize) -> u64 {
    (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A number in [0, 1) fixed by the seed and the call, so a replay decides alike.
pub fn chance(seed: u64, call: &CallKey) -> f64 {
    let mut h = Sha256::new();
    h.update(seed.to_le_bytes());
    for part in [&call.gid, &call.branch_id, &call.op] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(call.attempt.to_le_bytes());
    let digest = h.finalize();
    let n = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
    (n >> 11) as f64 / (1u64 << 53) as f64
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(gid: &str, op: &str, attempt: u32) -> CallKey {
        CallKey {
            gid: gid.into(),
            branch_id: "01".into(),
            op: op.into(),
            attempt,
        }
    }

    #[test]
    fn glob_matches_stars() {
        assert!(glob("*", "anything"));
        assert!(glob("order-*", "order-17"));
        assert!(!glob("order-*", "orders-17"));
        assert!(glob("*-17", "order-17"));
        assert!(glob("o*r*7", "order-17"));
        assert!(!glob("o*x*7", "order-17"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(glob("a*a", "aa"));
        assert!(!glob("a*a", "a"));
    }

    #[test]
    fn first_matching_rule_fires() {
        let plan: FaultPlan = serde_json::from_value(serde_json::json!({
            "rules": [
                {"match": {"op": "confirm", "attempt": 1}, "fault": {"type": "commit_then_drop"}},
                {"match": {"gid": "order-*"}, "fault": {"type": "status", "status": 500}},
                {"match": {"op": "try"}, "side": "participant", "fault": {"type": "hold_until", "op": "cancel"}}
            ]
        }))
        .unwrap();
        assert_eq!(
            plan.fault_for(Side::Coordinator, &key("order-1", "confirm", 1)),
            Some(&Fault::CommitThenDrop)
        );
        assert_eq!(
            plan.fault_for(Side::Coordinator, &key("order-1", "confirm", 2)),
            Some(&Fault::Status { status: 500 })
        );
        assert_eq!(
            plan.fault_for(Side::Coordinator, &key("x", "confirm", 2)),
            None
        );
        assert_eq!(plan.fault_for(Side::Coordinator, &key("x", "try", 1)), None);
        assert!(
            plan.fault_for(Side::Participant, &key("x", "try", 1))
                .is_some()
        );
    }

    #[test]
    fn probability_is_deterministic_and_close_to_its_share() {
        let plan = FaultPlan {
            seed: 7,
            rules: vec![FaultRule {
                matches: Match::default(),
                side: Side::Coordinator,
                probability: Some(0.25),
                times: None,
                fault: Fault::Status { status: 503 },
            }],
            ..FaultPlan::default()
        };
        let fired: Vec<bool> = (0..4_000)
            .map(|i| {
                plan.fault_for(Side::Coordinator, &key(&format!("g{i}"), "action", 1))
                    .is_some()
            })
            .collect();
        let again: Vec<bool> = (0..4_000)
            .map(|i| {
                plan.fault_for(Side::Coordinator, &key(&format!("g{i}"), "action", 1))
                    .is_some()
            })
            .collect();
        assert_eq!(fired, again);
        let share = fired.iter().filter(|f| **f).count() as f64 / 4_000.0;
        assert!((0.22..0.28).contains(&share), "{share}");
    }

    #[test]
    fn probabilistic_rules_draw_independently() {
        let rule = |status| FaultRule {
            matches: Match::default(),
            side: Side::Coordinator,
            probability: Some(0.1),
            times: None,
            fault: Fault::Status { status },
        };
        let plan = FaultPlan {
            seed: 1,
            rules: vec![rule(500), rule(503)],
            ..FaultPlan::default()
        };
        let fired = (0..10_000)
            .filter(|i| {
                plan.fault_for(Side::Coordinator, &key(&format!("g{i}"), "action", 1))
                    .is_some()
            })
            .count() as f64
            / 10_000.0;
        assert!((0.17..0.21).contains(&fired), "{fired}");
    }

    #[test]
    fn plans_are_checked() {
        let bad = r#"{"rules": [{"fault": {"type": "hold_until", "op": "cancel"}}]}"#;
        assert!(
            FaultPlan::parse(bad, false)
                .unwrap_err()
                .contains("participant")
        );
        let bad = r#"{"rules": [{"probability": 2, "fault": {"type": "duplicate"}}]}"#;
        assert!(FaultPlan::parse(bad, false).is_err());
        let unknown = r#"{"rules": [{"fault": {"type": "explode"}}]}"#;
        assert!(FaultPlan::parse(unknown, false).is_err());
        let toml = "seed = 3\n[[rules]]\nmatch = { op = \"confirm\", attempt = 1 }\nfault = { type = \"commit_then_drop\" }\n";
        let plan = FaultPlan::parse(toml, true).unwrap();
        assert_eq!(plan.rules[0].fault, Fault::CommitThenDrop);
    }

    #[test]
    fn crash_rules_count_per_gid() {
        let plan: FaultPlan = serde_json::from_value(serde_json::json!({
            "crashes": [{"point": "after_decision_stored", "gid": "order-*", "nth": 2}]
        }))
        .unwrap();
        let at = |p, gid, n| plan.crash_at(p, "c0", gid, n);
        assert_eq!(at(CrashPoint::AfterDecisionStored, "order-1", 1), None);
        assert_eq!(
            at(CrashPoint::AfterDecisionStored, "order-1", 2),
            Some(CrashAction::Crash)
        );
        assert_eq!(at(CrashPoint::AfterRoundStored, "order-1", 2), None);
        assert_eq!(at(CrashPoint::AfterDecisionStored, "other", 2), None);
        let paused: FaultPlan = serde_json::from_value(serde_json::json!({
            "crashes": [{"point": "after_calls_before_record", "node": "c1", "action": {"type": "pause", "ms": 50}}]
        }))
        .unwrap();
        assert_eq!(
            paused.crash_at(CrashPoint::AfterCallsBeforeRecord, "c0", "g", 1),
            None
        );
        assert_eq!(
            paused.crash_at(CrashPoint::AfterCallsBeforeRecord, "c1", "g", 1),
            Some(CrashAction::Pause { ms: 50 })
        );
    }
}

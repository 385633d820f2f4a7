//! The coordinator's own rows, watched while a run goes on: no branch row ever goes back.
//!
//! A write the coordinator gave up on can land later over newer state: a branch that had
//! succeeded reads `pending` again, its attempts count drops, a finished transaction reads
//! unfinished. Reading the rows only at the end can miss it (a later write may hide it), so
//! the runner samples them during the run ([`super::sampler`]) and feeds each sample to a
//! [`RowWatch`], which keeps the last sight of every row and notes each step back. These
//! are pure functions over what was read; the reading is elsewhere.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use idem::core::Millis;

/// One `idem_branch` row as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchRow {
    pub gid: String,
    pub branch_id: String,
    /// The operation: `action`, `compensate`, `try`, `confirm`, `cancel`, ...
    pub action: String,
    pub status: String,
    pub attempts: i32,
    pub updated_at: i64,
}

/// One `idem_global` row as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GlobalRow {
    pub gid: String,
    pub kind: String,
    pub status: String,
}

/// One reading of the rows: when it started and ended (the runner's clock) and what it
/// found.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub started: Millis,
    pub ended: Millis,
    pub globals: Vec<GlobalRow>,
    pub branches: Vec<BranchRow>,
}

/// What one sample saw of one row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sight {
    pub status: String,
    /// Branch rows only.
    pub attempts: Option<i32>,
    pub updated_at: Option<i64>,
    /// The sample's start and end.
    pub started: Millis,
    pub ended: Millis,
}

impl std::fmt::Display for Sight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.status)?;
        if let Some(a) = self.attempts {
            write!(f, "#{a}")?;
        }
        if let Some(u) = self.updated_at {
            write!(f, " (updated_at {u})")?;
        }
        write!(f, " read at {}..{}", self.started, self.ended)
    }
}

/// A row seen going back between two samples.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepBack {
    pub gid: String,
    /// `branch_id/action`, or `global` for the transaction's own row.
    pub row: String,
    pub before: Sight,
    pub after: Sight,
}

impl StepBack {
    /// Only the attempts count dropped (the status is the same or moved on): what an
    /// operator's retry does to a stalled branch.
    fn attempts_only(&self) -> bool {
        !went_back(&self.before.status, &self.after.status)
    }
}

/// A status a row must never leave once it has it.
fn settled(status: &str) -> bool {
    matches!(status, "succeeded" | "failed")
}

fn went_back(before: &str, after: &str) -> bool {
    settled(before) && before != after
}

/// The last sight of every row, and every step back seen so far.
#[derive(Default)]
pub struct RowWatch {
    branches: HashMap<(String, String, String), Sight>,
    globals: HashMap<String, Sight>,
    pub samples: usize,
    pub step_backs: Vec<StepBack>,
    /// The last sample, for the final-state checks.
    pub last: Sample,
}

impl RowWatch {
    pub fn observe(&mut self, sample: Sample) {
        self.samples += 1;
        let (started, ended) = (sample.started, sample.ended);
        for g in &sample.globals {
            let now = Sight {
                status: g.status.clone(),
                attempts: None,
                updated_at: None,
                started,
                ended,
            };
            if let Some(before) = self.globals.insert(g.gid.clone(), now.clone())
                && went_back(&before.status, &now.status)
            {
                self.step_backs.push(StepBack {
                    gid: g.gid.clone(),
                    row: "global".into(),
                    before,
                    after: now,
                });
            }
        }
        for b in &sample.branches {
            let now = Sight {
                status: b.status.clone(),
                attempts: Some(b.attempts),
                updated_at: Some(b.updated_at),
                started,
                ended,
            };
            let key = (b.gid.clone(), b.branch_id.clone(), b.action.clone());
            if let Some(before) = self.branches.insert(key, now.clone())
                && (went_back(&before.status, &now.status) || now.attempts < before.attempts)
            {
                self.step_backs.push(StepBack {
                    gid: b.gid.clone(),
                    row: format!("{}/{}", b.branch_id, b.action),
                    before,
                    after: now,
                });
            }
        }
        self.last = sample;
    }
}

/// An operator's retry of a transaction: sent, and answered (the runner's clock).
pub type OperatorRetry = (Millis, Millis);

/// The steps back as violations, leaving out attempts counts that dropped because an
/// operator retried the transaction between the two samples (a retry gives a stalled
/// branch fresh attempts; it never reopens a succeeded or failed one).
pub fn step_backs(
    seen: &[StepBack],
    retries: &BTreeMap<String, Vec<OperatorRetry>>,
) -> Vec<String> {
    seen.iter()
        .filter(|s| {
            let retried = retries.get(&s.gid).is_some_and(|r| {
                r.iter()
                    .any(|(sent, answered)| s.before.started <= *answered && *sent <= s.after.ended)
            });
            !(s.attempts_only() && retried)
        })
        .map(|s| {
            format!(
                "{}: {} went back: {} -> {} (a write older than the state it replaced)",
                s.gid, s.row, s.before, s.after
            )
        })
        .collect()
}

/// The final rows agree with each transaction's outcome: a succeeded transaction's forward
/// steps (saga and msg actions, TCC confirms) all succeeded; a failed saga compensated
/// every action that succeeded.
pub fn final_state(last: &Sample) -> Vec<String> {
    let mut by_gid: BTreeMap<&str, Vec<&BranchRow>> = BTreeMap::new();
    for b in &last.branches {
        by_gid.entry(b.gid.as_str()).or_default().push(b);
    }
    let mut v = Vec::new();
    for g in &last.globals {
        let rows = by_gid.get(g.gid.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        let row = |branch: &str, action: &str| {
            rows.iter()
                .find(|r| r.branch_id == branch && r.action == action)
        };
        for r in rows {
            let forward = matches!(r.action.as_str(), "action" | "confirm");
            if g.status == "succeeded" && forward && r.status != "succeeded" {
                v.push(format!(
                    "{}: succeeded, but its branch {}/{} reads {}#{} (updated_at {})",
                    g.gid, r.branch_id, r.action, r.status, r.attempts, r.updated_at
                ));
            }
            if g.status == "failed"
                && g.kind == "saga"
                && r.action == "action"
                && r.status == "succeeded"
            {
                let undo = row(&r.branch_id, "compensate");
                if undo.is_none_or(|u| u.status != "succeeded") {
                    v.push(format!(
                        "{}: failed, but its step {} succeeded and its compensation reads {}",
                        g.gid,
                        r.branch_id,
                        undo.map_or("nothing".to_owned(), |u| format!(
                            "{}#{}",
                            u.status, u.attempts
                        ))
                    ));
                }
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn branch(gid: &str, id: &str, action: &str, status: &str, attempts: i32) -> BranchRow {
        BranchRow {
            gid: gid.into(),
            branch_id: id.into(),
            action: action.into(),
            status: status.into(),
            attempts,
            updated_at: 1_000 + attempts as i64,
        }
    }

    fn global(gid: &str, kind: &str, status: &str) -> GlobalRow {
        GlobalRow {
            gid: gid.into(),
            kind: kind.into(),
            status: status.into(),
        }
    }

    fn sample(at: Millis, globals: Vec<GlobalRow>, branches: Vec<BranchRow>) -> Sample {
        Sample {
            started: at,
            ended: at + 5,
            globals,
            branches,
        }
    }

    #[test]
    fn rows_moving_forward_are_fine() {
        let mut watch = RowWatch::default();
        watch.observe(sample(
            0,
            vec![global("g", "saga", "running")],
            vec![branch("g", "01", "action", "pending", 0)],
        ));
        watch.observe(sample(
            100,
            vec![global("g", "saga", "running")],
            vec![branch("g", "01", "action", "pending", 1)],
        ));
        watch.observe(sample(
            200,
            vec![global("g", "saga", "succeeded")],
            vec![branch("g", "01", "action", "succeeded", 2)],
        ));
        assert_eq!(watch.samples, 3);
        assert!(watch.step_backs.is_empty(), "{:?}", watch.step_backs);
        assert!(step_backs(&watch.step_backs, &BTreeMap::new()).is_empty());
        assert!(final_state(&watch.last).is_empty());
    }

    /// The issue's own sighting: `03/action succeeded#2 -> pending#1`, and a finished
    /// transaction read unfinished again.
    #[test]
    fn a_row_going_back_is_caught_with_both_sights() {
        let mut watch = RowWatch::default();
        watch.observe(sample(
            0,
            vec![global("g", "saga", "succeeded")],
            vec![branch("g", "03", "action", "succeeded", 2)],
        ));
        watch.observe(sample(
            300,
            vec![global("g", "saga", "running")],
            vec![branch("g", "03", "action", "pending", 1)],
        ));
        let v = step_backs(&watch.step_backs, &BTreeMap::new());
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].starts_with("g: global went back: succeeded read at 0..5 -> running"));
        assert!(
            v[1].contains("g: 03/action went back: succeeded#2 (updated_at 1002) read at 0..5 -> pending#1 (updated_at 1001) read at 300..305"),
            "{}",
            v[1]
        );
        // An operator's retry never excuses a status going back.
        let retries = BTreeMap::from([("g".to_owned(), vec![(100, 200)])]);
        assert_eq!(step_backs(&watch.step_backs, &retries).len(), 2);
    }

    #[test]
    fn fewer_attempts_are_caught_unless_an_operator_retried_in_between() {
        let mut watch = RowWatch::default();
        for (at, status, attempts) in [(0, "pending", 3), (100, "stalled", 4), (200, "pending", 0)]
        {
            watch.observe(sample(
                at,
                vec![],
                vec![branch("g", "01", "compensate", status, attempts)],
            ));
        }
        assert_eq!(watch.step_backs.len(), 1);
        let v = step_backs(&watch.step_backs, &BTreeMap::new());
        assert!(v[0].contains("stalled#4"), "{v:?}");
        // Retried between the two samples: fresh attempts, as designed.
        let between = BTreeMap::from([("g".to_owned(), vec![(120, 150)])]);
        assert!(step_backs(&watch.step_backs, &between).is_empty());
        // A retry long before or after explains nothing.
        for (sent, answered) in [(10, 50), (400, 410)] {
            let elsewhere = BTreeMap::from([("g".to_owned(), vec![(sent, answered)])]);
            assert_eq!(step_backs(&watch.step_backs, &elsewhere).len(), 1);
        }
    }

    #[test]
    fn final_rows_must_agree_with_the_outcome() {
        let last = sample(
            0,
            vec![
                global("ok", "saga", "succeeded"),
                global("undone", "saga", "failed"),
                global("half", "saga", "failed"),
                global("tcc", "tcc", "succeeded"),
            ],
            vec![
                branch("ok", "01", "action", "succeeded", 1),
                branch("ok", "02", "action", "pending", 1),
                branch("ok", "02", "compensate", "pending", 0),
                branch("undone", "01", "action", "succeeded", 1),
                branch("undone", "01", "compensate", "succeeded", 1),
                branch("undone", "02", "action", "failed", 1),
                branch("half", "01", "action", "succeeded", 1),
                branch("half", "01", "compensate", "pending", 2),
                branch("tcc", "01", "confirm", "succeeded", 1),
                branch("tcc", "01", "cancel", "pending", 0),
            ],
        );
        let v = final_state(&last);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].contains("ok: succeeded, but its branch 02/action reads pending#1"));
        assert!(v[1].contains(
            "half: failed, but its step 01 succeeded and its compensation reads pending#2"
        ));
    }
}

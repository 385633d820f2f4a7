//! The timeline of a run: every call, fault, status change and crash as JSON lines.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use idem::core::{Millis, Status};
use idem::engine::{Observer, Point};
use idem::transport::{CallRequest, CallResult};

use super::*;

/// One thing that happened in a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TimelineEvent {
    Call {
        at: Millis,
        gid: String,
        branch_id: String,
        op: String,
        attempt: u32,
        outcome: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        fault: Option<String>,
        duration_ms: u64,
        /// The coordinator process that made the call: its node name and process id.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
    },
    Status {
        at: Millis,
        gid: String,
        from: Status,
        to: Status,
    },
    /// Only recorded when the plan crashes or pauses the process there.
    Crash {
        at: Millis,
        gid: String,
        point: Point,
        node: String,
        action: CrashAction,
    },
    /// A coordinator's write was refused: another one owns the transaction now.
    Fenced {
        at: Millis,
        gid: String,
        node: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pid: Option<u32>,
    },
    /// A coordinator's recovery loop took a transaction over from another process (the
    /// previous owner's lease ran out or was handed back).
    Takeover {
        at: Millis,
        gid: String,
        node: String,
        pid: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        previous_owner: Option<String>,
    },
    /// A driver found its lease taken when renewing it, and stopped.
    LeaseLost {
        at: Millis,
        gid: String,
        node: String,
        pid: u32,
    },
}

impl TimelineEvent {
    pub fn at(&self) -> Millis {
        match self {
            TimelineEvent::Call { at, .. }
            | TimelineEvent::Status { at, .. }
            | TimelineEvent::Crash { at, .. }
            | TimelineEvent::Fenced { at, .. }
            | TimelineEvent::Takeover { at, .. }
            | TimelineEvent::LeaseLost { at, .. } => *at,
        }
    }

    pub fn gid(&self) -> &str {
        match self {
            TimelineEvent::Call { gid, .. }
            | TimelineEvent::Status { gid, .. }
            | TimelineEvent::Crash { gid, .. }
            | TimelineEvent::Fenced { gid, .. }
            | TimelineEvent::Takeover { gid, .. }
            | TimelineEvent::LeaseLost { gid, .. } => gid,
        }
    }

    /// One line for people.
    pub fn describe(&self) -> String {
        match self {
            TimelineEvent::Call {
                gid,
                branch_id,
                op,
                attempt,
                outcome,
                detail,
                fault,
                duration_ms,
                ..
            } => {
                let mut line = format!("{gid} {branch_id}/{op} #{attempt} -> {outcome}");
                if let Some(d) = detail {
                    line.push_str(&format!(" ({d})"));
                }
                line.push_str(&format!(" in {duration_ms} ms"));
                if let Some(f) = fault {
                    line.push_str(&format!("  [fault: {f}]"));
                }
                line
            }
            TimelineEvent::Status { gid, from, to, .. } => format!("{gid} {from} => {to}"),
            TimelineEvent::Crash {
                gid,
                point,
                node,
                action,
                ..
            } => match action {
                CrashAction::Crash => {
                    format!("{gid} CRASH of {node} at {} [fault plan]", point.as_str())
                }
                CrashAction::Pause { ms } => {
                    format!(
                        "{gid} PAUSE of {node} for {ms} ms at {} [fault plan]",
                        point.as_str()
                    )
                }
            },
            TimelineEvent::Fenced { gid, node, .. } => {
                format!("{gid} {node}'s stale write refused: another coordinator owns it")
            }
            TimelineEvent::Takeover {
                gid,
                node,
                previous_owner,
                ..
            } => format!(
                "{gid} taken over by {node} from {}",
                previous_owner.as_deref().unwrap_or("nobody")
            ),
            TimelineEvent::LeaseLost { gid, node, .. } => {
                format!("{gid} {node}'s driver found its lease taken and stopped")
            }
        }
    }
}

/// Records a run's timeline in memory and, if asked, as JSON lines in a file (flushed per
/// line, so a crash loses nothing written before it).
pub struct Timeline {
    node: String,
    /// This process's id: a restarted coordinator keeps its node name, not its pid.
    pid: u32,
    events: Mutex<Vec<TimelineEvent>>,
    file: Option<Mutex<std::fs::File>>,
}

impl Timeline {
    pub fn in_memory(node: &str) -> Arc<Timeline> {
        Arc::new(Timeline {
            node: node.to_owned(),
            pid: std::process::id(),
            events: Mutex::new(Vec::new()),
            file: None,
        })
    }

    /// Appends to `path` (created if missing).
    pub fn to_file(node: &str, path: &Path) -> std::io::Result<Arc<Timeline>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Arc::new(Timeline {
            node: node.to_owned(),
            pid: std::process::id(),
            events: Mutex::new(Vec::new()),
            file: Some(Mutex::new(file)),
        }))
    }

    pub fn events(&self) -> Vec<TimelineEvent> {
        self.events.lock().expect("poisoned").clone()
    }

    pub fn push(&self, event: TimelineEvent) {
        if let Some(file) = &self.file {
            let mut line = serde_json::to_string(&event).expect("serialisable");
            line.push('\n');
            let mut file = file.lock().expect("poisoned");
            let _ = file.write_all(line.as_bytes());
            let _ = file.flush();
        }
        self.events.lock().expect("poisoned").push(event);
    }

    /// Reads a timeline file written by [`Timeline::to_file`].
    pub fn read(path: &Path) -> std::io::Result<Vec<TimelineEvent>> {
        let text = std::fs::read_to_string(path)?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }
}

impl Observer for Timeline {
    fn call(&self, request: &CallRequest, result: &CallResult, started_at: Millis) {
        self.push(TimelineEvent::Call {
            at: started_at,
            gid: request.gid.clone(),
            branch_id: request.branch_id.clone(),
            op: request.action.op().to_owned(),
            attempt: request.attempt,
            outcome: result.outcome.label().to_owned(),
            detail: result.outcome.detail().map(str::to_owned),
            fault: result.fault.clone(),
            duration_ms: result.duration.as_millis() as u64,
            node: Some(self.node.clone()),
            pid: Some(self.pid),
        });
    }

    fn status(&self, gid: &str, from: Status, to: Status, at: Millis) {
        self.push(TimelineEvent::Status {
            at,
            gid: gid.to_owned(),
            from,
            to,
        });
    }

    fn fenced(&self, gid: &str) {
        self.push(TimelineEvent::Fenced {
            at: now(),
            gid: gid.to_owned(),
            node: self.node.clone(),
            pid: Some(self.pid),
        });
    }

    fn claimed(&self, tx: &idem::core::Transaction, previous_owner: Option<&str>, takeover: bool) {
        // Claims of rows this process handed back itself are routine; a takeover is not.
        if takeover {
            self.push(TimelineEvent::Takeover {
                at: now(),
                gid: tx.gid.clone(),
                node: self.node.clone(),
                pid: self.pid,
                previous_owner: previous_owner.map(str::to_owned),
            });
        }
    }

    fn lease_lost(&self, gid: &str) {
        self.push(TimelineEvent::LeaseLost {
            at: now(),
            gid: gid.to_owned(),
            node: self.node.clone(),
            pid: self.pid,
        });
    }
}

/// The faults of a timeline, in a canonical order: what a replay must reproduce however
/// the calls interleaved.
pub fn fault_signature(events: &[TimelineEvent]) -> Vec<(CallKey, String)> {
    let mut out: Vec<(CallKey, String)> = events
        .iter()
        .filter_map(|e| match e {
            TimelineEvent::Call {
                gid,
                branch_id,
                op,
                attempt,
                fault: Some(f),
                ..
            } => Some((
                CallKey {
                    gid: gid.clone(),
                    branch_id: branch_id.clone(),
                    op: op.clone(),
                    attempt: *attempt,
                },
                f.clone(),
            )),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

//! Failure replay: fault plans, where they are applied, and the timeline of a run.
//!
//! - [`FaultyTransport`] wraps the coordinator's transport: calls answered without being
//!   delivered, delayed past their timeout, delivered with the answer lost, delivered twice.
//! - [`participant_faults`] is an axum middleware in front of a participant service: the
//!   same faults as seen from the participant, plus holding a call until another operation
//!   of the same branch has been delivered (a Cancel overtaking its Try).
//! - [`CrashOnPlan`] stops the coordinator process dead at a named point.
//! - [`Timeline`] records every call, fault, status change and crash as JSON lines.
//!
//! Real participants and real HTTP are exercised throughout: a fault changes what happens
//! to a call, never replaces the participant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem::core::{CallOutcome, Millis};
use idem::engine::{Observer, Point};
use idem::transport::{CallRequest, CallResult, Transport, classify};

mod db_link;
mod participant;
mod plan;
mod timeline;

pub use db_link::{DbLinkFault, DbLinkRule};
pub use participant::{Delivery, ParticipantFaults, participant_faults};
pub use plan::*;
pub use timeline::{Timeline, TimelineEvent, fault_signature};

// ---- coordinator side ------------------------------------------------------------------

/// The coordinator's transport with a fault plan applied.
pub struct FaultyTransport {
    inner: Arc<dyn Transport>,
    plan: Arc<FaultPlan>,
    fired: RuleCounts,
}

impl FaultyTransport {
    pub fn new(inner: Arc<dyn Transport>, plan: Arc<FaultPlan>) -> FaultyTransport {
        FaultyTransport {
            inner,
            plan,
            fired: RuleCounts::default(),
        }
    }
}

/// How often each rule fired in this process, for rules limited by `times`.
#[derive(Default)]
struct RuleCounts(Mutex<HashMap<usize, u32>>);

impl RuleCounts {
    /// Picks the rule for a call and counts it, atomically, so that concurrent calls never
    /// fire a `times`-limited rule more often than allowed.
    fn fire(&self, plan: &FaultPlan, side: Side, call: &CallKey) -> Option<Fault> {
        let mut counts = self.0.lock().expect("poisoned");
        let (index, rule) = plan.rule_for(side, call, |i| *counts.get(&i).unwrap_or(&0))?;
        *counts.entry(index).or_insert(0) += 1;
        Some(rule.fault.clone())
    }
}

fn call_key(request: &CallRequest) -> CallKey {
    CallKey {
        gid: request.gid.clone(),
        branch_id: request.branch_id.clone(),
        op: request.action.op().to_owned(),
        attempt: request.attempt,
    }
}

#[async_trait::async_trait]
impl Transport for FaultyTransport {
    async fn call(&self, request: &CallRequest) -> CallResult {
        let Some(fault) = self
            .fired
            .fire(&self.plan, Side::Coordinator, &call_key(request))
        else {
            return self.inner.call(request).await;
        };
        let started = Instant::now();
        let label = Some(fault.label());
        let mut result = match &fault {
            Fault::Status { status } => CallResult {
                outcome: classify(request.protocol, *status, "injected by the fault plan"),
                status: Some(*status),
                duration: started.elapsed(),
                fault: None,
            },
            Fault::Delay { ms } => {
                let delay = Duration::from_millis(*ms);
                if delay < request.timeout {
                    tokio::time::sleep(delay).await;
                    let mut late = request.clone();
                    late.timeout = request.timeout - delay;
                    self.inner.call(&late).await
                } else {
                    // The call is still on its way when the coordinator gives up on it: it
                    // reaches the participant late, as a slow network would deliver it.
                    let inner = Arc::clone(&self.inner);
                    let mut late = request.clone();
                    late.timeout = Duration::from_secs(30);
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        inner.call(&late).await
                    });
                    tokio::time::sleep(request.timeout).await;
                    CallResult {
                        outcome: CallOutcome::Unknown("timed out".into()),
                        status: None,
                        duration: started.elapsed(),
                        fault: None,
                    }
                }
            }
            Fault::CommitThenDrop => {
                let delivered = self.inner.call(request).await;
                CallResult {
                    outcome: CallOutcome::Unknown("the response was lost".into()),
                    status: None,
                    duration: delivered.duration,
                    fault: None,
                }
            }
            Fault::Duplicate => {
                let (first, _second) =
                    futures::join!(self.inner.call(request), self.inner.call(request));
                first
            }
            Fault::HoldUntil { .. } => {
                // Rejected by FaultPlan::check; deliver normally if one slips through.
                self.inner.call(request).await
            }
        };
        result.fault = label;
        result
    }
}

// ---- crashes ---------------------------------------------------------------------------

/// Stops the process dead (no destructors, no lease handed back: as SIGKILL would) when
/// the plan names the point reached.
pub struct CrashOnPlan {
    plan: Arc<FaultPlan>,
    node: String,
    reached: Mutex<HashMap<(Point, String), u32>>,
    /// Told first, so the crash is on record before the process goes.
    timeline: Option<Arc<Timeline>>,
}

impl CrashOnPlan {
    pub fn new(plan: Arc<FaultPlan>, node: &str, timeline: Option<Arc<Timeline>>) -> CrashOnPlan {
        CrashOnPlan {
            plan,
            node: node.to_owned(),
            reached: Mutex::new(HashMap::new()),
            timeline,
        }
    }
}

impl Observer for CrashOnPlan {
    fn point(&self, point: Point, gid: &str) {
        let n = {
            let mut reached = self.reached.lock().expect("poisoned");
            let n = reached.entry((point, gid.to_owned())).or_insert(0);
            *n += 1;
            *n
        };
        let Some(action) = self.plan.crash_at(point, &self.node, gid, n) else {
            return;
        };
        if let Some(timeline) = &self.timeline {
            timeline.push(TimelineEvent::Crash {
                at: now(),
                gid: gid.to_owned(),
                point,
                node: self.node.clone(),
                action,
            });
        }
        match action {
            CrashAction::Crash => {
                eprintln!(
                    "idem: crash point {} reached for {gid}: stopping (fault plan)",
                    point.as_str()
                );
                std::process::abort();
            }
            CrashAction::Pause { ms } => pause_process(ms),
        }
    }
}

/// Freezes this whole process for `ms` with SIGSTOP; a detached shell sends SIGCONT.
///
/// The stop is raised on this thread, so it takes effect before this thread goes on: sent
/// by a `kill` child instead, it was handled by whichever thread of the process the kernel
/// woke, and on a loaded machine the driver ran on for a millisecond or two first, into
/// the middle of the write the pause was meant to precede (its row locked throughout).
fn pause_process(ms: u64) {
    let pid = std::process::id().to_string();
    let wake = format!("sleep {}; kill -CONT {pid}", ms as f64 / 1_000.0);
    let spawned = std::process::Command::new("sh").args(["-c", &wake]).spawn();
    if spawned.is_ok() {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}

pub(crate) fn now() -> Millis {
    use idem::engine::Clock;
    idem::engine::SystemClock.now()
}

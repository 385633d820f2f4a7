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
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use idem::core::{CallOutcome, Millis, Status};
use idem::engine::{Observer, Point};
use idem::transport::{CallRequest, CallResult, Transport, classify};

mod plan;

pub use plan::*;

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

// ---- participant side ------------------------------------------------------------------

/// State of the participant-side fault layer: the plan and what has been delivered.
pub struct ParticipantFaults {
    plan: Arc<FaultPlan>,
    arrivals: Mutex<HashMap<(String, String, String), u32>>,
    completed: Mutex<HashMap<(String, String, String), u32>>,
    changed: Notify,
    /// Longest a `hold_until` waits, so that a plan that waits for something that never
    /// comes cannot hang a test.
    pub hold_limit: Duration,
    counts: RuleCounts,
    deliveries: Mutex<Vec<Delivery>>,
}

/// One call as the participant-side layer saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub call: CallKey,
    /// The fault applied, if any.
    pub fault: Option<String>,
    /// The status code the caller got.
    pub status: u16,
}

impl ParticipantFaults {
    pub fn new(plan: Arc<FaultPlan>) -> Arc<ParticipantFaults> {
        Arc::new(ParticipantFaults {
            plan,
            arrivals: Mutex::new(HashMap::new()),
            completed: Mutex::new(HashMap::new()),
            changed: Notify::new(),
            hold_limit: Duration::from_secs(10),
            counts: RuleCounts::default(),
            deliveries: Mutex::new(Vec::new()),
        })
    }

    /// Every call seen so far, in arrival order of their answers.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().expect("poisoned").clone()
    }

    fn completed(&self, key: &(String, String, String)) -> u32 {
        *self
            .completed
            .lock()
            .expect("poisoned")
            .get(key)
            .unwrap_or(&0)
    }
}

#[derive(Deserialize)]
struct CallParams {
    #[serde(default)]
    gid: String,
    #[serde(default)]
    branch_id: String,
    #[serde(default)]
    op: String,
}

/// axum middleware applying the participant-side rules of a plan:
/// `router.layer(axum::middleware::from_fn_with_state(faults, participant_faults))`.
pub async fn participant_faults(
    State(faults): State<Arc<ParticipantFaults>>,
    request: Request,
    next: Next,
) -> Response {
    let params: Option<CallParams> = request.uri().query().and_then(parse_call_params);
    let Some(params) = params.filter(|p| !p.gid.is_empty() && !p.op.is_empty()) else {
        return next.run(request).await;
    };
    let id = (
        params.gid.clone(),
        params.branch_id.clone(),
        params.op.clone(),
    );
    let attempt = {
        let mut arrivals = faults.arrivals.lock().expect("poisoned");
        let n = arrivals.entry(id.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let key = CallKey {
        gid: params.gid,
        branch_id: params.branch_id,
        op: params.op,
        attempt,
    };
    let fault = faults.counts.fire(&faults.plan, Side::Participant, &key);
    // The delivery runs on its own task: once a call has reached the participant, it is
    // processed even if the caller gives up waiting (a held Try still arrives late).
    let deliver = tokio::spawn(deliver(faults, id, key, fault, request, next));
    match deliver.await {
        Ok(response) => response,
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("delivery failed: {e}"),
        )
            .into_response(),
    }
}

async fn deliver(
    faults: Arc<ParticipantFaults>,
    id: (String, String, String),
    key: CallKey,
    fault: Option<Fault>,
    request: Request,
    next: Next,
) -> Response {
    let label = fault.as_ref().map(Fault::label);
    let response = match fault {
        None => next.run(request).await,
        Some(Fault::Status { status }) => {
            let status = axum::http::StatusCode::from_u16(status)
                .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            (status, "injected by the fault plan").into_response()
        }
        Some(Fault::Delay { ms }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            next.run(request).await
        }
        Some(Fault::CommitThenDrop) => {
            let _ = next.run(request).await;
            (
                axum::http::StatusCode::BAD_GATEWAY,
                "the response was lost (injected by the fault plan)",
            )
                .into_response()
        }
        Some(Fault::Duplicate) => {
            let (parts, body) = request.into_parts();
            let bytes = axum::body::to_bytes(body, usize::MAX)
                .await
                .unwrap_or_default();
            let copy = Request::from_parts(parts.clone(), Body::from(bytes.clone()));
            let original = Request::from_parts(parts, Body::from(bytes));
            let (first, _second) = futures::join!(next.clone().run(original), next.run(copy));
            first
        }
        Some(Fault::HoldUntil { op }) => {
            let awaited = (key.gid.clone(), key.branch_id.clone(), op);
            let deadline = tokio::time::Instant::now() + faults.hold_limit;
            loop {
                let changed = faults.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if faults.completed(&awaited) > 0 {
                    break;
                }
                if tokio::time::timeout_at(deadline, changed).await.is_err() {
                    break;
                }
            }
            next.run(request).await
        }
    };
    *faults
        .completed
        .lock()
        .expect("poisoned")
        .entry(id)
        .or_insert(0) += 1;
    faults.deliveries.lock().expect("poisoned").push(Delivery {
        call: key,
        fault: label,
        status: response.status().as_u16(),
    });
    faults.changed.notify_waiters();
    response
}

/// Reads `gid`, `branch_id` and `op` from a query string.
fn parse_call_params(query: &str) -> Option<CallParams> {
    let mut params = CallParams {
        gid: String::new(),
        branch_id: String::new(),
        op: String::new(),
    };
    for (k, v) in reqwest::Url::parse(&format!("http://x/?{query}"))
        .ok()?
        .query_pairs()
    {
        match k.as_ref() {
            "gid" => params.gid = v.into_owned(),
            "branch_id" => params.branch_id = v.into_owned(),
            "op" => params.op = v.into_owned(),
            _ => {}
        }
    }
    Some(params)
}

fn now() -> Millis {
    use idem::engine::Clock;
    idem::engine::SystemClock.now()
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
fn pause_process(ms: u64) {
    let pid = std::process::id().to_string();
    let wake = format!("sleep {}; kill -CONT {pid}", ms as f64 / 1_000.0);
    let spawned = std::process::Command::new("sh").args(["-c", &wake]).spawn();
    if spawned.is_ok() {
        let _ = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status();
    }
}

// ---- timeline --------------------------------------------------------------------------

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
    },
}

impl TimelineEvent {
    pub fn at(&self) -> Millis {
        match self {
            TimelineEvent::Call { at, .. }
            | TimelineEvent::Status { at, .. }
            | TimelineEvent::Crash { at, .. }
            | TimelineEvent::Fenced { at, .. } => *at,
        }
    }

    pub fn gid(&self) -> &str {
        match self {
            TimelineEvent::Call { gid, .. }
            | TimelineEvent::Status { gid, .. }
            | TimelineEvent::Crash { gid, .. }
            | TimelineEvent::Fenced { gid, .. } => gid,
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
        }
    }
}

/// Records a run's timeline in memory and, if asked, as JSON lines in a file (flushed per
/// line, so a crash loses nothing written before it).
pub struct Timeline {
    node: String,
    events: Mutex<Vec<TimelineEvent>>,
    file: Option<Mutex<std::fs::File>>,
}

impl Timeline {
    pub fn in_memory(node: &str) -> Arc<Timeline> {
        Arc::new(Timeline {
            node: node.to_owned(),
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

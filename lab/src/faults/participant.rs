//! The participant side: the same faults as seen from the participant, plus holding a
//! call until another operation of its branch has been delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::*;

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
    /// Orders arrivals and answers of all calls on one scale (see [`Delivery::arrived`]).
    sequence: std::sync::atomic::AtomicU64,
}

/// One call as the participant-side layer saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub call: CallKey,
    /// The fault applied, if any.
    pub fault: Option<String>,
    /// The status code the caller got.
    pub status: u16,
    /// The status the participant's handler answered; none when the layer answered in its
    /// place (an injected status). It differs from `status` when the answer was lost on
    /// the way (`commit_then_drop`): the handler acted, the caller never heard of it.
    #[serde(default)]
    pub handled: Option<u16>,
    /// When the call arrived and when it was answered, on one sequence shared by every
    /// call to every participant of the layer: call B arrived after call A was answered
    /// exactly when `B.arrived > A.answered`.
    #[serde(default)]
    pub arrived: u64,
    #[serde(default)]
    pub answered: u64,
    /// Wall-clock time of the arrival, for people reading a violation.
    #[serde(default)]
    pub at: Millis,
    /// The caller's User-Agent (idem's names its coordinator node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

impl Delivery {
    /// Whether the participant's handler answered with success (it acted).
    pub fn acted(&self) -> bool {
        self.handled.is_some_and(|s| (200..300).contains(&s))
    }

    /// Whether the caller got a success answer.
    pub fn answered_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
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
            sequence: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// `router` with these rules in front of it (the [`participant_faults`] middleware).
    pub fn layer(self: &Arc<Self>, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(
            Arc::clone(self),
            participant_faults,
        ))
    }

    /// Every call seen so far, in arrival order of their answers.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.deliveries.lock().expect("poisoned").clone()
    }

    fn next(&self) -> u64 {
        self.sequence
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1
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

/// axum middleware applying the participant-side rules of a plan (see
/// [`ParticipantFaults::layer`]).
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
    let arrival = Delivery {
        call: key,
        arrived: faults.next(),
        at: now(),
        agent: request
            .headers()
            .get(axum::http::header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        ..Delivery::default()
    };
    let fault = faults
        .counts
        .fire(&faults.plan, Side::Participant, &arrival.call);
    // The delivery runs on its own task: once a call has reached the participant, it is
    // processed even if the caller gives up waiting (a held Try still arrives late).
    let deliver = tokio::spawn(deliver(faults, id, arrival, fault, request, next));
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
    mut delivery: Delivery,
    fault: Option<Fault>,
    request: Request,
    next: Next,
) -> Response {
    let label = fault.as_ref().map(Fault::label);
    let mut handled = None;
    let response = match fault {
        None => next.run(request).await,
        Some(Fault::Status { status }) => {
            let status = axum::http::StatusCode::from_u16(status)
                .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            handled = Some(None);
            (status, "injected by the fault plan").into_response()
        }
        Some(Fault::Delay { ms }) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            next.run(request).await
        }
        Some(Fault::CommitThenDrop) => {
            let acted = next.run(request).await;
            handled = Some(Some(acted.status().as_u16()));
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
            let awaited = (
                delivery.call.gid.clone(),
                delivery.call.branch_id.clone(),
                op,
            );
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
    delivery.status = response.status().as_u16();
    // Unless the layer stood in for the handler, the handler's answer is the caller's.
    delivery.handled = handled.unwrap_or(Some(delivery.status));
    delivery.fault = label;
    delivery.answered = faults.next();
    faults.deliveries.lock().expect("poisoned").push(delivery);
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

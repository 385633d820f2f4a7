//! Long outages: a participant that refuses the calls that must succeed (Confirm, Cancel,
//! compensation) for some orders, for longer than any retry budget.
//!
//! A random 503 now and then is absorbed by retries; a participant down for a deploy, a
//! migration or a lost disk outlasts them, and then the coordinator has to stop (`stalled`)
//! and wait for an operator rather than retry forever or give up on its own. To make that
//! replayable, an outage is not a time window (which would hit different calls on every
//! run) but a gid pattern and a runner-side phase: every matching call to the participant
//! is refused until every order matching the pattern has settled (ended, or stalled), and
//! only then does the runner heal it and play the operator who retries what stalled. So an
//! order whose must-succeed call met the outage cannot have finished before the heal: it
//! stalled, or the coordinator is wrong.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{Participant, Report, Scenario};
use crate::faults::glob;
use idem::core::Millis;

/// A participant down for some orders until the runner heals it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outage {
    pub name: String,
    /// The orders it hits (`*` matches any run of characters).
    pub gid: String,
    pub participant: Participant,
    /// The operations refused; by default those that must succeed.
    #[serde(default = "must_succeed")]
    pub ops: Vec<String>,
    #[serde(default = "unavailable")]
    pub status: u16,
}

fn must_succeed() -> Vec<String> {
    ["confirm", "cancel", "compensate"]
        .map(String::from)
        .to_vec()
}

fn unavailable() -> u16 {
    503
}

impl Outage {
    pub fn new(name: &str, gid: &str, participant: Participant) -> Outage {
        Outage {
            name: name.to_owned(),
            gid: gid.to_owned(),
            participant,
            ops: must_succeed(),
            status: unavailable(),
        }
    }
}

/// One call an outage refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutageHit {
    pub outage: String,
    pub gid: String,
    pub branch_id: String,
    pub op: String,
    pub at: Millis,
}

/// The outages of a run while it runs: which are still on, and what they refused.
pub(super) struct Outages {
    live: Vec<Live>,
    hits: Mutex<Vec<OutageHit>>,
}

struct Live {
    outage: Outage,
    /// Orders matching the outage that have not settled yet; at zero it heals.
    unsettled: AtomicUsize,
    healed: tokio::sync::watch::Sender<Option<Millis>>,
}

impl Outages {
    pub(super) fn new(scenario: &Scenario) -> Arc<Outages> {
        let live = scenario
            .outages
            .iter()
            .map(|outage| {
                let matching = scenario
                    .orders
                    .iter()
                    .filter(|o| glob(&outage.gid, &o.gid))
                    .count();
                // An outage that matches no order has nothing to wait for.
                let healed = (matching == 0).then(now);
                Live {
                    outage: outage.clone(),
                    unsettled: AtomicUsize::new(matching),
                    healed: tokio::sync::watch::Sender::new(healed),
                }
            })
            .collect();
        Arc::new(Outages {
            live,
            hits: Mutex::new(Vec::new()),
        })
    }

    /// Wraps a participant's router: matching calls are refused while their outage is on.
    pub(super) fn layer(
        self: &Arc<Self>,
        participant: Participant,
        router: axum::Router,
    ) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(
            (Arc::clone(self), participant),
            refuse_while_down,
        ))
    }

    /// The order `gid` ended or stalled (or its client gave up on it): called once per order.
    pub(super) fn settled(&self, gid: &str) {
        for live in self.live.iter().filter(|l| glob(&l.outage.gid, gid)) {
            if live.unsettled.fetch_sub(1, Ordering::SeqCst) == 1 {
                live.healed.send_replace(Some(now()));
            }
        }
    }

    /// Returns once every outage that hits `gid` has healed.
    pub(super) async fn healed(&self, gid: &str) {
        for live in self.live.iter().filter(|l| glob(&l.outage.gid, gid)) {
            let mut rx = live.healed.subscribe();
            let _ = rx.wait_for(Option::is_some).await;
        }
    }

    /// What the outages did, for the report.
    pub(super) fn record(&self, report: &mut Report) {
        report.outage_hits = self.hits.lock().expect("poisoned").clone();
        for live in &self.live {
            if let Some(at) = *live.healed.borrow() {
                report.healed_at.insert(live.outage.name.clone(), at);
            }
        }
    }

    fn refuses(&self, participant: Participant, gid: &str, op: &str) -> Option<(&Outage, u16)> {
        self.live
            .iter()
            .find(|l| {
                l.outage.participant == participant
                    && l.outage.ops.iter().any(|o| o == op)
                    && glob(&l.outage.gid, gid)
                    && l.healed.borrow().is_none()
            })
            .map(|l| (&l.outage, l.outage.status))
    }
}

async fn refuse_while_down(
    State((outages, participant)): State<(Arc<Outages>, Participant)>,
    request: Request,
    next: Next,
) -> Response {
    let (mut gid, mut branch_id, mut op) = (String::new(), String::new(), String::new());
    let url = request
        .uri()
        .query()
        .and_then(|q| reqwest::Url::parse(&format!("http://x/?{q}")).ok());
    if let Some(url) = url {
        for (k, v) in url.query_pairs() {
            match k.as_ref() {
                "gid" => gid = v.into_owned(),
                "branch_id" => branch_id = v.into_owned(),
                "op" => op = v.into_owned(),
                _ => {}
            }
        }
    }
    let Some((outage, status)) = outages.refuses(participant, &gid, &op) else {
        return next.run(request).await;
    };
    outages.hits.lock().expect("poisoned").push(OutageHit {
        outage: outage.name.clone(),
        gid,
        branch_id,
        op,
        at: now(),
    });
    let status = axum::http::StatusCode::from_u16(status)
        .unwrap_or(axum::http::StatusCode::SERVICE_UNAVAILABLE);
    (status, "down for a long outage (scenario)").into_response()
}

fn now() -> Millis {
    use idem::engine::Clock;
    idem::engine::SystemClock.now()
}

/// What an outage must have caused: each one met some order; every order it met was seen
/// stalled before the operator's retry: it neither went on retrying while the participant
/// was down nor ended on its own.
pub(super) fn check(scenario: &Scenario, report: &Report, v: &mut Vec<String>) {
    let mut met: BTreeMap<&str, &str> = BTreeMap::new();
    for hit in &report.outage_hits {
        met.entry(&hit.gid).or_insert(&hit.outage);
    }
    for outage in &scenario.outages {
        if !report.outage_hits.iter().any(|h| h.outage == outage.name) {
            v.push(format!(
                "outage {} met no order: it tested nothing",
                outage.name
            ));
        }
        if !report.healed_at.contains_key(&outage.name) {
            v.push(format!("outage {} never healed", outage.name));
        }
    }
    for (gid, outage) in &met {
        if !report.stalled_seen.iter().any(|g| g == gid) {
            v.push(format!(
                "{gid} met outage {outage} but was not seen stalled before the operator's retry"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::faults::TimelineEvent;
    use crate::scenario::{Order, RetryOptions};
    use idem::core::{Kind, Status};

    fn scenario() -> Scenario {
        let order = |gid: &str| Order {
            gid: gid.into(),
            kind: Kind::Tcc,
            branches: Vec::new(),
            abort: false,
            late_try: false,
            retry_if_stalled: true,
            options: Some(RetryOptions {
                max_attempts: Some(4),
                ..RetryOptions::default()
            }),
        };
        Scenario {
            orders: vec![order("out-1"), order("out-2"), order("other")],
            outages: vec![Outage::new("down", "out-*", Participant::Inventory)],
            ..Scenario::default()
        }
    }

    #[tokio::test]
    async fn an_outage_refuses_until_every_order_it_hits_has_settled() {
        let scenario = scenario();
        let outages = Outages::new(&scenario);
        let inv = Participant::Inventory;
        assert!(outages.refuses(inv, "out-1", "confirm").is_some());
        assert!(outages.refuses(inv, "out-1", "compensate").is_some());
        // Trys, other orders and other participants go through.
        assert!(outages.refuses(inv, "out-1", "try").is_none());
        assert!(outages.refuses(inv, "other", "cancel").is_none());
        assert!(
            outages
                .refuses(Participant::Payment, "out-1", "cancel")
                .is_none()
        );
        outages.settled("out-1");
        outages.settled("other");
        assert!(outages.refuses(inv, "out-2", "cancel").is_some());
        let waiting = tokio::time::timeout(Duration::from_millis(50), outages.healed("out-1"));
        assert!(waiting.await.is_err(), "healed before out-2 settled");
        outages.settled("out-2");
        outages.healed("out-1").await;
        assert!(outages.refuses(inv, "out-2", "cancel").is_none());
        let mut report = Report::default();
        outages.record(&mut report);
        assert!(report.healed_at.contains_key("down"));
    }

    fn checked(report: &mut Report) -> Vec<String> {
        let scenario = scenario();
        for order in &scenario.orders {
            report.statuses.insert(order.gid.clone(), Status::Succeeded);
        }
        report.healed_at.insert("down".into(), 1);
        crate::scenario::check(&scenario, report);
        std::mem::take(&mut report.violations)
    }

    fn hit(gid: &str) -> OutageHit {
        OutageHit {
            outage: "down".into(),
            gid: gid.into(),
            branch_id: "01".into(),
            op: "confirm".into(),
            at: 0,
        }
    }

    #[test]
    fn an_order_that_met_the_outage_must_have_stalled() {
        let mut report = Report {
            outage_hits: vec![hit("out-1")],
            stalled_seen: vec!["out-1".into()],
            ..Report::default()
        };
        assert_eq!(checked(&mut report), Vec::<String>::new());
        report.outage_hits.push(hit("out-2"));
        let v = checked(&mut report);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("out-2 met outage down but was not seen stalled"));
        let mut idle = Report::default();
        assert!(
            checked(&mut idle)
                .iter()
                .any(|v| v.contains("met no order"))
        );
    }

    #[test]
    fn no_call_may_go_past_its_attempt_cap() {
        let call = |gid: &str, attempt| TimelineEvent::Call {
            at: 0,
            gid: gid.into(),
            branch_id: "01".into(),
            op: "confirm".into(),
            attempt,
            outcome: "unknown".into(),
            detail: None,
            fault: None,
            duration_ms: 1,
            node: None,
            pid: None,
        };
        let mut report = Report {
            outage_hits: vec![hit("out-1")],
            stalled_seen: vec!["out-1".into()],
            // "other" has the same cap of 4; the coordinators' default (8) does not apply.
            timeline: vec![call("out-1", 4), call("other", 5)],
            ..Report::default()
        };
        let v = checked(&mut report);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("other: 01/confirm called as attempt 5, past its cap of 4"));
    }
}

//! What every run must satisfy, and what a scenario expects.
//!
//! Invariants, whatever the faults: every transaction ends succeeded or failed (or stalled
//! where the scenario allows it); stock is conserved per SKU and never negative; balances
//! never go negative; a succeeded order's effects are applied exactly once and a failed
//! order's are fully undone, checked on each participant's ledger row; no coupon is issued
//! twice; no branch operation is called past its attempt cap. With long outages: each met
//! some order, and every order it met was seen stalled before the operator's retry. With
//! database restarts: each one happened, and the server came back. And whatever happened
//! to the database link: no coordinator row ever went back ([`super::rows`]), saga steps
//! were called in order, no process called again a step it saw succeed, no coordinator
//! running alone was taken over from, failed sagas compensated what they executed, and
//! each failed call is once in its history ([`super::calls`]).

use std::collections::BTreeMap;

use super::{Error, Order, Participant, Participants, Report, Scenario, calls, rows};
use crate::faults::TimelineEvent;
use idem::core::{Kind, Status};
use idem_demo::{coupon, inventory, payment};

/// Reads the participants' final state into the report and checks each order's ledger rows.
pub(super) async fn collect(
    scenario: &Scenario,
    participants: &Participants,
    report: &mut Report,
) -> Result<(), Error> {
    for s in inventory::all_stock(participants.pool(Participant::Inventory)?).await? {
        report
            .stock
            .insert(s.sku.clone(), [s.available, s.reserved, s.sold]);
    }
    for b in payment::balances(participants.pool(Participant::Payment)?).await? {
        report.balances.insert(b.account.clone(), b.balance);
        if b.frozen != 0 && report.statuses.values().all(|s| s.is_terminal()) {
            report.violations.push(format!(
                "{}: {} still frozen after every order ended",
                b.account, b.frozen
            ));
        }
        if b.balance < 0 || b.frozen < 0 || b.frozen > b.balance {
            report.violations.push(format!(
                "{}: balance {} frozen {} is impossible",
                b.account, b.balance, b.frozen
            ));
        }
    }
    let users: Vec<String> = scenario
        .orders
        .iter()
        .flat_map(|o| &o.branches)
        .filter(|b| b.participant == Participant::Coupon)
        .filter_map(|b| b.payload["user"].as_str().map(str::to_owned))
        .collect();
    for user in users {
        let issued = coupon::coupons_of(participants.pool(Participant::Coupon)?, &user)
            .await?
            .iter()
            .filter(|c| c.status == "issued")
            .count();
        report.coupons.insert(user, issued);
    }
    for order in &scenario.orders {
        let status = report.statuses.get(&order.gid).copied();
        check_order(order, status, participants, report).await?;
    }
    Ok(())
}

/// One order's effects on each participant's ledger, given how it ended.
async fn check_order(
    order: &Order,
    status: Option<Status>,
    participants: &Participants,
    report: &mut Report,
) -> Result<(), Error> {
    let Some(status) = status.filter(|s| s.is_terminal()) else {
        return Ok(());
    };
    let ok = status == Status::Succeeded;
    for (i, branch) in order.branches.iter().enumerate() {
        let id = super::branch_id(i);
        let gid = &order.gid;
        let state = match branch.participant {
            Participant::Inventory => {
                inventory::reservation(participants.pool(Participant::Inventory)?, gid, &id)
                    .await?
                    .map(|r| r.status)
            }
            Participant::Payment => {
                payment::ledger_entry(participants.pool(Participant::Payment)?, gid, &id)
                    .await?
                    .map(|l| l.status)
            }
            Participant::Coupon => {
                coupon::coupon_of_branch(participants.pool(Participant::Coupon)?, gid, &id)
                    .await?
                    .map(|c| c.status)
            }
        };
        let allowed: &[Option<&str>] = match (order.kind, branch.participant, ok) {
            (Kind::Saga, Participant::Inventory, true) => &[Some("sold")],
            (Kind::Saga, Participant::Inventory, false) => &[None, Some("returned")],
            (Kind::Saga, Participant::Coupon, true) => &[Some("issued")],
            (Kind::Saga, Participant::Coupon, false) => &[None, Some("revoked")],
            (_, Participant::Inventory, true) => &[Some("confirmed")],
            (_, Participant::Inventory, false) => &[None, Some("cancelled")],
            (_, Participant::Payment, true) => &[Some("debited")],
            (_, Participant::Payment, false) => &[None, Some("released")],
            (_, Participant::Coupon, _) => &[None],
        };
        if !allowed.contains(&state.as_deref()) {
            report.violations.push(format!(
                "{gid}: {status} but {:?} branch {id} is {:?} (expected one of {allowed:?})",
                branch.participant, state
            ));
        }
    }
    Ok(())
}

/// Conservation and the scenario's own expectations.
pub fn check(scenario: &Scenario, report: &mut Report) {
    let mut v = Vec::new();
    for order in &scenario.orders {
        match report.statuses.get(&order.gid) {
            Some(s) if s.is_terminal() => {}
            Some(Status::Stalled)
                if scenario.expect.status.get(&order.gid) == Some(&Status::Stalled) => {}
            other => v.push(format!(
                "{}: ended {other:?}, not succeeded or failed",
                order.gid
            )),
        }
    }
    // Stock: conserved, never negative, and sold exactly what succeeded orders bought.
    let mut bought: BTreeMap<String, i64> = BTreeMap::new();
    for order in &scenario.orders {
        if report.statuses.get(&order.gid) == Some(&Status::Succeeded) {
            for b in order
                .branches
                .iter()
                .filter(|b| b.participant == Participant::Inventory)
            {
                let sku = b.payload["sku"].as_str().unwrap_or_default().to_owned();
                *bought.entry(sku).or_default() += b.payload["quantity"].as_i64().unwrap_or(0);
            }
        }
    }
    for (sku, seeded) in &scenario.stock {
        let [available, reserved, sold] = report.stock.get(sku).copied().unwrap_or([0, 0, 0]);
        if available + reserved + sold != *seeded {
            v.push(format!(
                "{sku}: {available}+{reserved}+{sold} != {seeded}: stock not conserved"
            ));
        }
        if available < 0 || reserved < 0 || sold < 0 {
            v.push(format!(
                "{sku}: negative stock {available}/{reserved}/{sold}"
            ));
        }
        let expected_sold = bought.get(sku).copied().unwrap_or(0);
        if sold != expected_sold && report.statuses.values().all(|s| s.is_terminal()) {
            v.push(format!(
                "{sku}: sold {sold}, but succeeded orders bought {expected_sold}"
            ));
        }
    }
    // Money: each account lost exactly what its succeeded orders paid.
    let mut paid: BTreeMap<String, i64> = BTreeMap::new();
    for order in &scenario.orders {
        if report.statuses.get(&order.gid) == Some(&Status::Succeeded) {
            for b in order
                .branches
                .iter()
                .filter(|b| b.participant == Participant::Payment)
            {
                let account = b.payload["account"].as_str().unwrap_or_default().to_owned();
                *paid.entry(account).or_default() += b.payload["amount"].as_i64().unwrap_or(0);
            }
        }
    }
    for (account, seeded) in &scenario.accounts {
        let balance = report.balances.get(account).copied().unwrap_or(0);
        let expected = seeded - paid.get(account).copied().unwrap_or(0);
        if balance != expected && report.statuses.values().all(|s| s.is_terminal()) {
            v.push(format!(
                "{account}: balance {balance}, expected {expected} after the succeeded orders"
            ));
        }
    }
    // Coupons: one per succeeded saga step, never two.
    let mut granted: BTreeMap<String, usize> = BTreeMap::new();
    for order in &scenario.orders {
        if report.statuses.get(&order.gid) == Some(&Status::Succeeded) {
            for b in order
                .branches
                .iter()
                .filter(|b| b.participant == Participant::Coupon)
            {
                *granted
                    .entry(b.payload["user"].as_str().unwrap_or_default().to_owned())
                    .or_default() += 1;
            }
        }
    }
    for (user, issued) in &report.coupons {
        let expected = granted.get(user).copied().unwrap_or(0);
        if *issued != expected {
            v.push(format!(
                "{user}: {issued} coupons issued, {expected} expected"
            ));
        }
    }
    bounded_attempts(scenario, report, &mut v);
    super::outage::check(scenario, report, &mut v);
    super::restarts::check(scenario, report, &mut v);
    super::db_link::check(scenario, report, &mut v);
    // Unknown outcomes resolved, never redone blindly, never regressed.
    v.extend(rows::step_backs(
        &report.step_backs,
        &report.operator_retry_at,
    ));
    v.extend(calls::saga_order(&scenario.orders, &report.deliveries));
    v.extend(calls::recalled_after_success(&report.timeline));
    v.extend(calls::alone_yet_taken_over(
        &report.timeline,
        &report.processes,
    ));
    v.extend(calls::uncompensated(
        &scenario.orders,
        &report.statuses,
        &report.deliveries,
    ));

    let e = &scenario.expect;
    for (gid, want) in &e.status {
        let got = report.statuses.get(gid);
        if got != Some(want) {
            v.push(format!("{gid}: expected {want}, got {got:?}"));
        }
    }
    for (sku, want) in &e.stock {
        if report.stock.get(sku) != Some(want) {
            v.push(format!(
                "{sku}: expected stock {want:?}, got {:?}",
                report.stock.get(sku)
            ));
        }
    }
    for (account, want) in &e.balances {
        if report.balances.get(account) != Some(want) {
            v.push(format!(
                "{account}: expected balance {want}, got {:?}",
                report.balances.get(account)
            ));
        }
    }
    for (user, want) in &e.coupons {
        if report.coupons.get(user) != Some(want) {
            v.push(format!(
                "{user}: expected {want} coupons, got {:?}",
                report.coupons.get(user)
            ));
        }
    }
    if report.faults() < e.min_faults {
        v.push(format!(
            "expected at least {} faults, {} fired",
            e.min_faults,
            report.faults()
        ));
    }
    if report.restarts < e.min_restarts {
        v.push(format!(
            "expected at least {} restarts, saw {}",
            e.min_restarts, report.restarts
        ));
    }
    let fenced = report
        .timeline
        .iter()
        .any(|t| matches!(t, TimelineEvent::Fenced { .. }));
    if e.fenced && !fenced {
        v.push("expected a stale coordinator's write to be refused; none was".into());
    }
    for (call, want) in &e.answers {
        let got: Vec<u16> = report
            .deliveries
            .iter()
            .filter(|d| format!("{}/{}/{}", d.call.gid, d.call.branch_id, d.call.op) == *call)
            .map(|d| d.status)
            .collect();
        if got != *want {
            v.push(format!(
                "{call}: participant answered {got:?}, expected {want:?}"
            ));
        }
    }
    for gid in &e.stalled {
        if !report.stalled_seen.contains(gid) {
            v.push(format!(
                "{gid}: expected to stall before the operator's retry"
            ));
        }
    }
    if let Some(least) = e.min_failed_calls_per_step {
        min_failed_calls_per_step(scenario, report, least, &mut v);
    }
    for (gid, want) in &e.min_attempts {
        let got = report.attempts.get(gid).copied().unwrap_or(0);
        if got < *want {
            v.push(format!(
                "{gid}: expected at least {want} failed attempts, recorded {got}"
            ));
        }
    }
    report.violations.extend(v);
}

/// Bounded retries, from the coordinators' own record: a call goes out as attempt
/// "attempts so far + 1", so none may go past the transaction's cap (an operator's retry
/// starts the count again).
fn bounded_attempts(scenario: &Scenario, report: &Report, v: &mut Vec<String>) {
    let caps: BTreeMap<&str, u32> = scenario
        .orders
        .iter()
        .map(|o| {
            let cap = o
                .options
                .as_ref()
                .and_then(|b| b.max_attempts)
                .unwrap_or(scenario.settings.max_attempts);
            (o.gid.as_str(), cap)
        })
        .collect();
    let mut over: BTreeMap<(&str, &str, &str), u32> = BTreeMap::new();
    for event in &report.timeline {
        if let TimelineEvent::Call {
            gid,
            branch_id,
            op,
            attempt,
            ..
        } = event
            && caps.get(gid.as_str()).is_some_and(|cap| attempt > cap)
        {
            let worst = over.entry((gid, branch_id, op)).or_default();
            *worst = (*worst).max(*attempt);
        }
    }
    for ((gid, branch_id, op), attempt) in over {
        v.push(format!(
            "{gid}: {branch_id}/{op} called as attempt {attempt}, past its cap of {}",
            caps[gid]
        ));
    }
}

/// Each saga step's action has at least `least` failed calls in its transaction's history:
/// a failed call the participant answered must not be lost from it (that each is there only
/// once is checked for every run).
fn min_failed_calls_per_step(
    scenario: &Scenario,
    report: &Report,
    least: usize,
    v: &mut Vec<String>,
) {
    for order in scenario.orders.iter().filter(|o| o.kind == Kind::Saga) {
        let Some(history) = report.failed_calls.get(&order.gid) else {
            continue;
        };
        for k in 0..order.branches.len() {
            let step = format!("{}/action", super::branch_id(k));
            let got = history.get(&step).copied().unwrap_or(0);
            if got < least {
                v.push(format!(
                    "{}: step {step} has {got} failed calls in its history, expected at least {least}",
                    order.gid
                ));
            }
        }
    }
}

//! What the console shows first: who the caller is, and its tenant's overview (counts,
//! what waits longest, throughput, the coordinators seen). Read through the engine, like
//! every other answer.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use serde::{Deserialize, Serialize};

use super::views::{TxView, tx_view};
use crate::api::AppState;
use crate::api::auth::Caller;
use crate::api::error::ApiError;
use crate::auth::{AuthMode, Role};
use crate::core::{Millis, Status};

/// Transactions each of the overview's lists shows, at most.
const LIST: u32 = 10;
/// Minutes of throughput by default and at most.
const DEFAULT_MINUTES: u32 = 15;
const MAX_MINUTES: u32 = 120;
const MINUTE_MS: Millis = 60_000;
/// A coordinator not seen for this long is left out.
const SEEN_WITHIN_MS: Millis = 24 * 3_600_000;

/// The caller as the API sees it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhoamiView {
    /// The tenant its transactions belong to.
    pub tenant: String,
    /// `client`, `operator` or `admin`.
    pub role: String,
    /// `none` (every caller is the default tenant's admin) or `tokens`.
    pub auth: String,
}

#[utoipa::path(
    get,
    path = "/api/v1/whoami",
    operation_id = "whoami",
    tag = "console",
    responses((status = 200, description = "The caller's tenant and role", body = WhoamiView))
)]
pub(super) async fn whoami(State(app): State<Arc<AppState>>, caller: Caller) -> Json<WhoamiView> {
    let auth = match app.auth.config.mode {
        AuthMode::None => "none",
        AuthMode::Tokens => "tokens",
    };
    Json(WhoamiView {
        tenant: caller.tenant().to_owned(),
        role: caller.0.role.to_string(),
        auth: auth.to_owned(),
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct OverviewQuery {
    /// Minutes of throughput, 1 to 120 (15 if absent).
    #[param(minimum = 1, maximum = 120)]
    minutes: Option<u32>,
}

/// The caller's tenant at a glance.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OverviewView {
    pub counts: CountsView,
    /// Up to 10 stalled transactions, oldest first (without branches).
    pub stalled: Vec<TxView>,
    /// Up to 10 active ones (neither stalled nor finished), oldest first.
    pub oldest_in_progress: Vec<TxView>,
    /// One entry per minute, oldest first, the current minute last.
    pub throughput: Vec<MinuteView>,
    /// The coordinators seen in the last day (empty for a client-role caller).
    pub coordinators: Vec<CoordinatorView>,
    /// The database's clock when this was read.
    pub now: Millis,
}

/// The tenant's transactions per status.
#[derive(Debug, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CountsView {
    pub prepared: u64,
    pub running: u64,
    pub committing: u64,
    pub aborting: u64,
    pub stalled: u64,
    pub succeeded: u64,
    pub failed: u64,
}

/// One minute of throughput.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MinuteView {
    /// The minute's start (epoch ms).
    pub minute: Millis,
    /// Transactions created in it.
    pub created: u64,
    /// Transactions that finished (succeeded or failed) in it.
    pub finished: u64,
}

/// A coordinator as its recovery loop last recorded itself.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CoordinatorView {
    pub node: String,
    pub last_seen_at: Millis,
    /// When its recovery loop last claimed transactions, if it has.
    pub last_claim_at: Option<Millis>,
}

#[utoipa::path(
    get,
    path = "/api/v1/overview",
    operation_id = "overview",
    tag = "console",
    params(OverviewQuery),
    responses((status = 200, description = "The caller's tenant at a glance", body = OverviewView))
)]
pub(super) async fn overview(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    query: Result<Query<OverviewQuery>, QueryRejection>,
) -> Result<Json<OverviewView>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))?;
    let minutes = q.minutes.unwrap_or(DEFAULT_MINUTES);
    if !(1..=MAX_MINUTES).contains(&minutes) {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("minutes must be 1 to {MAX_MINUTES}"),
        ));
    }
    let now = app.engine.now();
    let first = now - now % MINUTE_MS - Millis::from(minutes - 1) * MINUTE_MS;
    let read = app.reads().overview(caller.tenant(), first, LIST).await?;
    // Node names are the operator's business.
    let coordinators = if caller.0.role >= Role::Operator {
        app.reads().coordinators(now - SEEN_WITHIN_MS).await?
    } else {
        Vec::new()
    };
    let mut counts = CountsView::default();
    for (status, n) in read.counts {
        *match status {
            Status::Prepared => &mut counts.prepared,
            Status::Running => &mut counts.running,
            Status::Committing => &mut counts.committing,
            Status::Aborting => &mut counts.aborting,
            Status::Stalled => &mut counts.stalled,
            Status::Succeeded => &mut counts.succeeded,
            Status::Failed => &mut counts.failed,
        } += n;
    }
    let in_minute = |rows: &[(Millis, u64)], minute: Millis| {
        rows.iter().find(|(m, _)| *m == minute).map_or(0, |r| r.1)
    };
    let throughput = (0..Millis::from(minutes))
        .map(|i| {
            let minute = first + i * MINUTE_MS;
            MinuteView {
                minute,
                created: in_minute(&read.created, minute),
                finished: in_minute(&read.finished, minute),
            }
        })
        .collect();
    Ok(Json(OverviewView {
        counts,
        stalled: read.stalled.iter().map(|s| tx_view(s, None)).collect(),
        oldest_in_progress: read
            .oldest_active
            .iter()
            .map(|s| tx_view(s, None))
            .collect(),
        throughput,
        coordinators: coordinators
            .into_iter()
            .map(|c| CoordinatorView {
                node: c.node,
                last_seen_at: c.last_seen_at,
                last_claim_at: c.last_claim_at,
            })
            .collect(),
        now,
    }))
}

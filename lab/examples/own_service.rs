//! Failure replay against a service of your own: a loyalty-points service whose saga step
//! adds points and whose compensation takes them back, made exactly-once by the SDK's
//! barrier, driven by an in-process coordinator whose calls are duplicated, whose answers
//! are lost and whose deliveries are doubled again in front of the service. The invariant
//! is the service's own: every account holds exactly the points of its succeeded orders.
//!
//! `cargo run -p idem-lab --example own_service` runs it on SQLite;
//! `lab/tests/it/own_service.rs` runs the same code in CI.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::post;
use idem_lab::faults::FaultPlan;
use idem_lab::harness::{Harness, Step};
use idem_participant::{BranchCall, Op, ParticipantError, create_barrier_table};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

#[derive(Deserialize)]
struct AddPoints {
    account: String,
    points: i64,
}

#[derive(Serialize, Deserialize)]
struct Applied {
    points: i64,
}

/// The service under test: one route for the action and the compensation.
fn points_service(pool: SqlitePool) -> Router {
    Router::new()
        .route("/points", post(step))
        .with_state(Arc::new(pool))
}

async fn step(
    State(pool): State<Arc<SqlitePool>>,
    call: BranchCall,
    body: Bytes,
) -> axum::response::Response {
    let add: AddPoints = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return ParticipantError::refused(format!("bad payload: {e}")).into_response(),
    };
    let sign = match call.op() {
        Op::Action => 1,
        Op::Compensate => -1,
        _ => return ParticipantError::refused("action or compensate only").into_response(),
    };
    // The business refuses some orders: the coordinator must then take back the earlier
    // step's points (and the refused step's compensation must change nothing).
    if sign == 1 && add.account == "blocked" {
        return ParticipantError::refused("this account takes no points").into_response();
    }
    let account = add.account.clone();
    let delta = sign * add.points;
    let result = call
        .barrier()
        .run(pool.as_ref(), |tx| {
            let account = account.clone();
            async move {
                sqlx::query(tx.sql(
                    "INSERT INTO points (account, points) VALUES (?, ?) \
                     ON CONFLICT (account) DO UPDATE SET points = points + excluded.points",
                ))
                .bind(&account)
                .bind(delta)
                .execute(&mut *tx.conn())
                .await?;
                Ok(Applied { points: delta })
            }
        })
        .await;
    match result {
        Ok(outcome) => outcome.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Runs `orders` sagas of two steps each (the same account twice) under the plan, then
/// checks the service's invariant. Returns (succeeded, deliveries the service saw).
pub async fn run(
    orders: usize,
) -> Result<(usize, usize), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::temp_dir().join(format!("idem-own-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let db = format!("sqlite://{}?mode=rwc", dir.join("points.db").display());
    let pool = SqlitePool::connect(&db).await?;
    sqlx::query("CREATE TABLE points (account TEXT PRIMARY KEY, points INTEGER NOT NULL)")
        .execute(&pool)
        .await?;
    create_barrier_table(&pool).await?;

    // idem sends every action twice, the network doubles every delivery again, and the
    // first answer to each compensation is lost after the service committed it.
    let plan = FaultPlan::parse(
        r#"{"rules": [
            {"match": {"op": "action"}, "fault": {"type": "duplicate"}},
            {"match": {"op": "compensate", "attempt": 1}, "fault": {"type": "commit_then_drop"}},
            {"side": "participant", "fault": {"type": "duplicate"}}
        ]}"#,
        false,
    )?;
    let coordinator = format!("sqlite://{}?mode=rwc", dir.join("idem.db").display());
    let harness = Harness::start(&coordinator, plan).await?;
    let service = harness.serve(points_service(pool.clone())).await?;
    let url = service.url("/points");

    let mut succeeded = 0;
    let mut expected = std::collections::BTreeMap::<String, i64>::new();
    for n in 0..orders {
        let account = format!("acct-{}", n % 5);
        let payload = serde_json::json!({"account": account, "points": 10});
        // A third of the orders fail at their second step.
        let fails = n % 3 == 0;
        let second = if fails {
            serde_json::json!({"account": "blocked", "points": 10})
        } else {
            payload.clone()
        };
        let steps = [
            Step::new(&url, &url, payload),
            Step::new(&url, &url, second),
        ];
        let outcome = harness.saga(&format!("order-{n}"), &steps).await?;
        match (fails, outcome.status.as_str()) {
            (false, "succeeded") => {
                succeeded += 1;
                *expected.entry(account).or_default() += 20;
            }
            (true, "failed") => {}
            (_, other) => {
                return Err(format!("order-{n} ended {other}: {:?}", outcome.view).into());
            }
        }
    }

    // The service's own invariant, on its own database.
    let rows: Vec<(String, i64)> = sqlx::query_as("SELECT account, points FROM points")
        .fetch_all(&pool)
        .await?;
    for (account, points) in &rows {
        let want = expected.get(account).copied().unwrap_or(0);
        if *points != want {
            return Err(format!("{account} holds {points} points, its orders make {want}").into());
        }
    }
    let deliveries = harness.deliveries().len();
    harness.stop().await?;
    let _ = service.stop().await;
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok((succeeded, deliveries))
}

#[allow(dead_code)] // run by `cargo run --example`; the test calls `run` itself
#[tokio::main]
async fn main() {
    match run(30).await {
        Ok((succeeded, deliveries)) => println!(
            "30 orders, {succeeded} succeeded, the rest failed and were compensated; \
             the service saw {deliveries} deliveries and applied each step once"
        ),
        Err(e) => {
            eprintln!("own_service: {e}");
            std::process::exit(1);
        }
    }
}

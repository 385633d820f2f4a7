//! Two tenants of one coordinator may both run gid `order-1` against one shared participant
//! (issue 28, point 4): on every backend, the barrier, the msg back-check and lease mode
//! keep each tenant's rows apart, and over real HTTP the tenant comes from the call's
//! `Idem-Tenant` header (absent: `default`; malformed: 400 and nothing written).

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use common::{bump, counter, gid, setup, tcc};
use idem_participant::barrier::{Claimed, Completion, Fact, FactSource, LeasedStep, StepRef};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{
    Barrier, BranchCall, DEFAULT_TENANT, ManualClock, MsgState, Op, Outcome, ParticipantError,
    Payload, barrier_records, query_prepared,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::AnyPool;

fn at(tenant: &str, g: &str, op: Op) -> Barrier {
    tcc(g, op).with_tenant(tenant).unwrap()
}

async fn done(db: TestDatabase, pool: AnyPool) {
    pool.close().await;
    db.drop_database().await;
}

/// The collision of the issue, at the barrier: acme's Try then beta's Try both run; beta's
/// Cancel undoes beta's only; acme's Confirm still finds acme's Try; each repeat gets its
/// own tenant's stored result; a guard in one tenant turns away no other tenant's Try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_with_one_gid_keep_their_own_rows() {
    for db in testing::all("tenants_one_gid").await {
        let pool = setup(&db).await;
        let name = db.backend.name();
        let g = gid("order");
        let run = |tenant: &'static str, op: Op, delta: i64| {
            let (pool, g) = (pool.clone(), g.clone());
            async move {
                at(tenant, &g, op)
                    .run(&pool, |tx| async move { bump(&tx, delta).await })
                    .await
                    .unwrap()
            }
        };
        let Outcome::Executed(acme_try) = run("acme", Op::Try, 2).await else {
            panic!("{name}: acme's Try runs");
        };
        let Outcome::Executed(beta_try) = run("beta", Op::Try, 3).await else {
            panic!("{name}: beta's Try runs too, not answered with acme's result");
        };
        assert_eq!(counter(&pool).await, 5, "{name}");
        assert!(matches!(
            run("beta", Op::Cancel, -3).await,
            Outcome::Executed(_)
        ));
        assert_eq!(counter(&pool).await, 2, "{name}: beta's reservation only");
        assert!(
            matches!(run("acme", Op::Confirm, 0).await, Outcome::Executed(_)),
            "{name}: beta's Cancel left acme's Try alone"
        );
        assert_eq!(
            run("acme", Op::Try, 100).await,
            Outcome::Duplicate(acme_try),
            "{name}"
        );
        assert_eq!(
            run("beta", Op::Try, 100).await,
            Outcome::Duplicate(beta_try),
            "{name}"
        );
        // The default tenant has no row of this gid: its Cancel is an empty rollback whose
        // guard rejects the default tenant's late Try, and no one else's.
        assert_eq!(
            run(DEFAULT_TENANT, Op::Cancel, -1).await,
            Outcome::EmptyRollback
        );
        assert_eq!(run(DEFAULT_TENANT, Op::Try, 1).await, Outcome::Rejected);
        assert!(matches!(
            run("gamma", Op::Try, 1).await,
            Outcome::Executed(_)
        ));
        assert_eq!(counter(&pool).await, 3, "{name}");

        let rows: Vec<_> = barrier_records(&pool, &g)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.tenant, r.op, r.reason, r.outcome))
            .collect();
        let want = [
            ("acme", "confirm", "confirm", "executed"),
            ("acme", "try", "try", "executed"),
            ("beta", "cancel", "cancel", "executed"),
            ("beta", "try", "try", "executed"),
            ("default", "cancel", "cancel", "empty_rollback"),
            ("default", "try", "cancel", "guard"),
            ("gamma", "try", "try", "executed"),
        ]
        .map(|(t, o, r, x)| (t.to_owned(), o.to_owned(), r.to_owned(), x.to_owned()));
        assert_eq!(rows, want, "{name}");
        done(db, pool).await;
    }
}

/// The back-check of a two-phase message reads (and, when it finds nothing, guards) its own
/// tenant's row: another tenant's committed local transaction of the same gid neither
/// answers it nor is blocked by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_msg_back_check_reads_its_own_tenants_row() {
    for db in testing::all("tenants_msg").await {
        let pool = setup(&db).await;
        let name = db.backend.name();
        let g = gid("msg");
        let local = |tenant: &str| Barrier::msg(&g).unwrap().with_tenant(tenant).unwrap();
        let ran = local("acme")
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert!(matches!(ran, Outcome::Executed(_)), "{name}");
        let check = |tenant: &'static str| query_prepared(&pool, tenant, &g);
        assert_eq!(check("beta").await.unwrap(), MsgState::RolledBack, "{name}");
        assert_eq!(check("acme").await.unwrap(), MsgState::Committed, "{name}");
        assert_eq!(
            check(DEFAULT_TENANT).await.unwrap(),
            MsgState::RolledBack,
            "{name}"
        );
        // beta's back-check left beta's guard: beta's late local transaction is turned
        // away, and acme's answer is unchanged.
        let late = local("beta")
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected, "{name}");
        assert_eq!(check("acme").await.unwrap(), MsgState::Committed, "{name}");
        assert_eq!(counter(&pool).await, 1, "{name}");
        let bad = query_prepared(&pool, "Not A Tenant", &g).await.unwrap_err();
        assert_eq!(bad.status_code(), 409, "{name}: {bad}");
        done(db, pool).await;
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Charged {
    by: String,
}

fn charged(by: &str) -> Charged {
    Charged { by: by.into() }
}

/// A fact source that answers `Happened` for every step, and keeps the steps it was asked
/// about.
#[derive(Default)]
struct Provider {
    asked: Mutex<Vec<StepRef>>,
}

impl FactSource<Charged> for Provider {
    async fn check(&self, step: &StepRef) -> Fact<Charged> {
        self.asked.lock().unwrap().push(step.clone());
        Fact::Happened(charged(&format!("provider:{}", step.external_key())))
    }
}

/// Lease mode keyed by tenant: beta's claim of acme's gid is beta's own (not "in
/// progress"), the two steps carry different external keys for the provider, and an expired
/// claim is settled by asking about its own tenant's step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_keeps_each_tenants_claim() {
    for db in testing::all("tenants_lease").await {
        let pool = setup(&db).await;
        let name = db.backend.name();
        let g = gid("pay");
        let clock = ManualClock::at(1_000);
        let leased = |tenant: &str| -> LeasedStep {
            at(tenant, &g, Op::Try)
                .with_lease(Duration::from_secs(30))
                .with_clock(Arc::new(clock.clone()))
        };
        let provider = Provider::default();
        let claim = |tenant: &'static str| {
            let step = leased(tenant);
            let (pool, provider) = (&pool, &provider);
            async move { step.claim::<_, Charged, _>(pool, provider).await }
        };
        let Claimed::Acquired(acme) = claim("acme").await.unwrap() else {
            panic!("{name}: acme claims");
        };
        let Claimed::Acquired(beta) = claim("beta").await.unwrap() else {
            panic!("{name}: beta's claim is its own, not acme's claim in progress");
        };
        assert_eq!(acme.step.external_key(), format!("acme/{g}:01:try:01"));
        assert_eq!(beta.step.external_key(), format!("beta/{g}:01:try:01"));
        assert!(matches!(
            claim("acme").await,
            Err(ParticipantError::InProgress(_))
        ));
        let recorded = leased("beta")
            .complete(&pool, &beta, &charged("beta"))
            .await
            .unwrap();
        assert_eq!(recorded, Completion::Recorded, "{name}");
        // acme's claim is still open: beta's record is no answer to it.
        assert!(matches!(
            claim("acme").await,
            Err(ParticipantError::InProgress(_))
        ));
        clock.advance(60_000);
        let settled = claim("acme").await.unwrap();
        let by = format!("provider:acme/{g}:01:try:01");
        assert_eq!(
            settled,
            Claimed::Settled(Outcome::Duplicate(charged(&by))),
            "{name}"
        );
        let asked = provider.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{name}");
        assert_eq!(
            (asked[0].tenant.as_str(), asked[0].gid.as_str()),
            ("acme", &*g)
        );
        assert_eq!(
            claim("beta").await.unwrap(),
            Claimed::Settled(Outcome::Duplicate(charged("beta"))),
            "{name}"
        );
        // A late completion of acme's expired claim is refused: the fact source settled it.
        let late = leased("acme")
            .complete(&pool, &acme, &charged("late"))
            .await
            .unwrap();
        assert!(matches!(late, Completion::Stale { .. }), "{name}");
        done(db, pool).await;
    }
}

/// The widest names the coordinator gives fit the barrier's columns on every backend: a
/// 32-character tenant, a 128-character gid and branch id (MySQL/MariaDB refuse what does
/// not fit, SQLite would keep it, so the round trip is checked too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_widest_tenant_and_gid_fit() {
    for db in testing::all("tenants_widest").await {
        let pool = setup(&db).await;
        let (tenant, g, branch) = ("t".repeat(32), "g".repeat(128), "b".repeat(128));
        let barrier = Barrier::new(idem_participant::TransType::Tcc, &g, &branch, Op::Try)
            .unwrap()
            .with_tenant(tenant.clone())
            .unwrap();
        let first = barrier
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        let again = barrier
            .run(&pool, |tx| async move { bump(&tx, 1).await })
            .await
            .unwrap();
        assert_eq!(
            Some(first.result().unwrap()),
            again.result(),
            "{}",
            db.backend
        );
        let rows = barrier_records(&pool, &g).await.unwrap();
        assert_eq!(rows.len(), 1, "{}", db.backend);
        assert_eq!((&rows[0].tenant, &rows[0].branch_id), (&tenant, &branch));
        done(db, pool).await;
    }
}

#[derive(Deserialize)]
struct Deposit {
    amount: i64,
}

#[derive(Serialize, Deserialize)]
struct Receipt {
    tenant: String,
    amount: i64,
    token: u64,
}

/// A participant as the SDK documents it: the tenant is the call's, never the handler's.
async fn deposit(
    State(pool): State<AnyPool>,
    call: BranchCall,
    Payload(req): Payload<Deposit>,
) -> Result<Outcome<Receipt>, ParticipantError> {
    let amount = if call.op() == Op::Cancel {
        -req.amount
    } else {
        req.amount
    };
    call.barrier()
        .run(&pool, |tx| async move {
            let token = bump(&tx, amount).await?;
            Ok(Receipt {
                tenant: tx.call().tenant().to_owned(),
                amount,
                token,
            })
        })
        .await
}

async fn back_check(
    State(pool): State<AnyPool>,
    call: BranchCall,
) -> Result<MsgState, ParticipantError> {
    query_prepared(&pool, call.tenant(), call.gid()).await
}

/// Real HTTP: the same gid under `Idem-Tenant: acme`, `beta`, none and `default`, repeats
/// answered with their own tenant's result, the back-check per tenant, and malformed
/// tenant headers refused with 400 before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_carry_their_tenant_over_http() {
    for db in testing::all("tenants_http").await {
        let pool = setup(&db).await;
        let name = db.backend.name();
        let app = Router::new()
            .route("/deposit", post(deposit))
            .route("/check", get(back_check))
            .with_state(pool.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let g = gid("order");
        let send = |tenants: &[&str], op: &str, amount: i64| {
            let mut request = client
                .post(format!(
                    "{base}/deposit?gid={g}&trans_type=tcc&branch_id=01&op={op}"
                ))
                .body(format!(r#"{{"amount":{amount}}}"#));
            for tenant in tenants {
                request = request.header("Idem-Tenant", *tenant);
            }
            async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                (status, response.json::<Value>().await.unwrap())
            }
        };

        let (status, acme) = send(&["acme"], "try", 2).await;
        assert_eq!(
            (status, &acme["outcome"]),
            (200, &"executed".into()),
            "{name}: {acme}"
        );
        assert_eq!(acme["result"]["tenant"], "acme");
        let (status, beta) = send(&["beta"], "try", 3).await;
        assert_eq!(
            (status, &beta["outcome"]),
            (200, &"executed".into()),
            "{name}: {beta}"
        );
        assert_eq!(beta["result"]["tenant"], "beta");
        let (status, plain) = send(&[], "try", 4).await;
        assert_eq!(plain["outcome"], "executed", "{name}: {status} {plain}");
        assert_eq!(plain["result"]["tenant"], DEFAULT_TENANT);
        // Naming the default tenant is the same as naming none.
        let (_, named) = send(&[DEFAULT_TENANT], "try", 9).await;
        assert_eq!(named["outcome"], "duplicate", "{name}: {named}");
        assert_eq!(named["result"], plain["result"]);
        assert_eq!(counter(&pool).await, 9, "{name}");

        let (status, cancel) = send(&["beta"], "cancel", 3).await;
        assert_eq!(
            (status, &cancel["outcome"]),
            (200, &"executed".into()),
            "{name}"
        );
        assert_eq!(
            counter(&pool).await,
            6,
            "{name}: beta's 3 released, acme's 2 kept"
        );
        for (tenant, first) in [("acme", &acme), ("beta", &beta)] {
            let (status, again) = send(&[tenant], "try", 50).await;
            assert_eq!(status, 200, "{name}");
            assert_eq!(again["outcome"], "duplicate", "{name}: {again}");
            assert_eq!(again["result"], first["result"], "{name}: {tenant}");
        }

        let rows_before = barrier_records(&pool, &g).await.unwrap().len();
        for bad in [&["Acme"][..], &["acme/x"], &[""], &["acme", "beta"]] {
            let (status, body) = send(bad, "try", 7).await;
            assert_eq!(status, 400, "{name}: {bad:?} {body}");
            assert_eq!(body["error"], "invalid_callback", "{name}");
            let message = body["message"].as_str().unwrap();
            assert!(message.contains("Idem-Tenant"), "{message}");
        }
        let long = "t".repeat(33);
        assert_eq!(send(&[&long], "try", 7).await.0, 400, "{name}");
        assert_eq!(
            counter(&pool).await,
            6,
            "{name}: a refused call changes nothing"
        );
        assert_eq!(
            barrier_records(&pool, &g).await.unwrap().len(),
            rows_before,
            "{name}"
        );

        // The msg back-check: acme's local transaction committed, beta's never ran.
        let m = gid("msg");
        Barrier::msg(&m)
            .unwrap()
            .with_tenant("acme")
            .unwrap()
            .run(&pool, |_tx| async { Ok(()) })
            .await
            .unwrap();
        let check = |tenant: &'static str| {
            client
                .get(format!(
                    "{base}/check?gid={m}&trans_type=msg&branch_id=00&op=msg"
                ))
                .header("idem-tenant", tenant)
                .send()
        };
        assert_eq!(
            check("acme").await.unwrap().status().as_u16(),
            200,
            "{name}"
        );
        assert_eq!(
            check("beta").await.unwrap().status().as_u16(),
            409,
            "{name}"
        );
        server.abort();
        done(db, pool).await;
    }
}

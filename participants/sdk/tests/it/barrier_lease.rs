//! The barrier's lease mode on every backend: a Try with an external call claims its row
//! PROCESSING and commits before the call; repeats wait (425) while the lease lives; after
//! it expired the fact source decides (happened → recorded, no second call; not happened →
//! one re-run under a new token; unknown → still 425); a stale owner cannot overwrite;
//! a Cancel racing the claim waits, and settles an expired one through the fact source.

use crate::common;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{age_rows, create_old_barrier, gid, insert_old_row, setup, tcc};
use idem_participant::barrier::{Claimed, upgrade_barrier_table_for_lease};
use idem_participant::barrier::{Completion, Fact, FactSource, LeaseTicket, LeasedStep, StepRef};
use idem_participant::testing::{self, TestDatabase};
use idem_participant::{
    ManualClock, Op, Outcome, ParticipantError, barrier_records, barrier_records_in, purge_barriers,
};
use serde::{Deserialize, Serialize};
use sqlx::AnyPool;
use tokio::sync::oneshot;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Charged {
    by: String,
}

fn charged(by: &str) -> Charged {
    Charged { by: by.into() }
}

/// A fact source whose answer the test sets, counting how often it was asked.
struct Facts {
    answer: Mutex<Fact<Charged>>,
    asked: AtomicUsize,
    last: Mutex<Option<StepRef>>,
}

impl Facts {
    fn new(answer: Fact<Charged>) -> Arc<Facts> {
        Arc::new(Facts {
            answer: Mutex::new(answer),
            asked: AtomicUsize::new(0),
            last: Mutex::new(None),
        })
    }
    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

impl FactSource<Charged> for Facts {
    async fn check(&self, step: &StepRef) -> Fact<Charged> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap() = Some(step.clone());
        self.answer.lock().unwrap().clone()
    }
}

const LEASE: Duration = Duration::from_secs(30);

fn leased(g: &str, op: Op, clock: &ManualClock) -> LeasedStep {
    tcc(g, op)
        .with_lease(LEASE)
        .with_clock(Arc::new(clock.clone()))
}

/// A Try whose external call blocks until `release` fires, after telling `started` it holds
/// the claim. Returns the task and the ticket it ran under.
struct Blocked {
    task: tokio::task::JoinHandle<Result<Outcome<Charged>, ParticipantError>>,
    ticket: LeaseTicket,
    release: oneshot::Sender<()>,
}

async fn blocked_try(
    pool: &AnyPool,
    step: &LeasedStep,
    facts: &Arc<Facts>,
    calls: &Arc<AtomicUsize>,
    by: &str,
) -> Blocked {
    let (started_tx, started_rx) = oneshot::channel();
    let (release_tx, release_rx) = oneshot::channel::<()>();
    let (pool, step, facts, calls, by) = (
        pool.clone(),
        step.clone(),
        facts.clone(),
        calls.clone(),
        by.to_owned(),
    );
    let task = tokio::spawn(async move {
        step.run(&pool, &*facts, |ticket| async move {
            calls.fetch_add(1, Ordering::SeqCst);
            started_tx.send(ticket).unwrap();
            release_rx.await.unwrap();
            Ok(charged(&by))
        })
        .await
    });
    let ticket = started_rx.await.expect("the first call claims and starts");
    Blocked {
        task,
        ticket,
        release: release_tx,
    }
}

async fn try_row(pool: &AnyPool, g: &str) -> (String, String, Option<String>) {
    let rows = barrier_records(pool, g).await.unwrap();
    let row = rows
        .iter()
        .find(|r| r.op == "try")
        .expect("the try row exists");
    (row.reason.clone(), row.outcome.clone(), row.result.clone())
}

async fn done(db: TestDatabase, pool: AnyPool) {
    pool.close().await;
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_try_holds_its_claim_and_an_expired_one_that_happened_is_not_called_again() {
    for db in testing::all("lease_happened").await {
        let pool = setup(&db).await;
        let g = gid("lh");
        let clock = ManualClock::at(1_000_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Happened(charged("provider")));
        let calls = Arc::new(AtomicUsize::new(0));
        let first = blocked_try(&pool, &step, &facts, &calls, "first").await;
        // Committed before the external call: another connection sees it.
        assert_eq!(try_row(&pool, &g).await.1, "processing", "{}", db.backend);
        assert_eq!(first.ticket.lease_until_ms, 1_000_000 + 30_000);

        // A repeat while the lease lives: 425, nothing called, nobody asked.
        let repeat = step
            .run(&pool, &*facts, |_t| async {
                panic!("must not run while the claim lives")
            })
            .await;
        let err = repeat.expect_err("in progress");
        assert_eq!(err.status_code(), 425, "{}: {err}", db.backend);
        assert_eq!(facts.asked(), 0);

        // Lease over: the fact source says it happened; recorded, no second call.
        clock.advance(30_000);
        let after = step
            .run(&pool, &*facts, |_t| async {
                panic!("the effect happened: no second call")
            })
            .await
            .unwrap();
        assert_eq!(
            after,
            Outcome::Duplicate(charged("provider")),
            "{}",
            db.backend
        );
        assert_eq!(facts.asked(), 1);
        assert_eq!(
            facts.last.lock().unwrap().as_ref().unwrap().external_key(),
            format!("{g}:01:try:01")
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        // The stale first owner finishes late: refused, answered with the recorded result.
        first.release.send(()).unwrap();
        let late = first.task.await.unwrap().unwrap();
        assert_eq!(
            late,
            Outcome::Duplicate(charged("provider")),
            "{}",
            db.backend
        );
        let (_, outcome, result) = try_row(&pool, &g).await;
        assert_eq!(outcome, "executed");
        assert_eq!(result.as_deref(), Some(r#"{"by":"provider"}"#));
        // And further repeats are plain duplicates without asking anyone.
        let again = step
            .run(&pool, &*facts, |_t| async { panic!("settled") })
            .await
            .unwrap();
        assert_eq!(again, Outcome::Duplicate(charged("provider")));
        assert_eq!(facts.asked(), 1);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_happened_reruns_once_under_a_new_token_and_the_stale_owner_is_refused() {
    for db in testing::all("lease_not_happened").await {
        let pool = setup(&db).await;
        let g = gid("ln");
        let clock = ManualClock::at(5_000_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::NotHappened);
        let calls = Arc::new(AtomicUsize::new(0));
        let first = blocked_try(&pool, &step, &facts, &calls, "first").await;
        clock.advance(30_001);
        let first_token = first.ticket.owner_token.clone();
        let rerun = step
            .run(&pool, &*facts, |ticket| {
                let calls = calls.clone();
                let first_token = first_token.clone();
                async move {
                    assert!(ticket.taken_over);
                    assert_ne!(ticket.owner_token, first_token);
                    calls.fetch_add(1, Ordering::SeqCst);
                    Ok(charged("second"))
                }
            })
            .await
            .unwrap();
        assert_eq!(
            rerun,
            Outcome::Executed(charged("second")),
            "{}",
            db.backend
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one re-run, in this call");
        assert_eq!(facts.asked(), 1);

        // The stale owner's completion, through the lower-level API: refused.
        let stale = step
            .complete(&pool, &first.ticket, &charged("first"))
            .await
            .unwrap();
        assert_eq!(
            stale,
            Completion::Stale {
                current: Some(Outcome::Duplicate(charged("second")))
            },
            "{}",
            db.backend
        );
        first.release.send(()).unwrap();
        assert_eq!(
            first.task.await.unwrap().unwrap(),
            Outcome::Duplicate(charged("second"))
        );
        assert_eq!(
            try_row(&pool, &g).await.2.as_deref(),
            Some(r#"{"by":"second"}"#),
            "{}: the stale owner overwrote nothing",
            db.backend
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_stays_in_progress_and_the_holder_still_records() {
    for db in testing::all("lease_unknown").await {
        let pool = setup(&db).await;
        let g = gid("lu");
        let clock = ManualClock::at(9_000_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Unknown);
        let calls = Arc::new(AtomicUsize::new(0));
        let first = blocked_try(&pool, &step, &facts, &calls, "first").await;
        clock.advance(60_000);
        let err = step
            .run(&pool, &*facts, |_t| async {
                panic!("unknown: never a blind re-run")
            })
            .await
            .expect_err("unknown is in progress");
        assert_eq!(err.status_code(), 425, "{}", db.backend);
        assert_eq!(facts.asked(), 1);
        assert_eq!(try_row(&pool, &g).await.1, "processing");
        // Nobody took the claim over, so the (slow) holder's result is the step's.
        first.release.send(()).unwrap();
        assert_eq!(
            first.task.await.unwrap().unwrap(),
            Outcome::Executed(charged("first")),
            "{}",
            db.backend
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_let_exactly_one_through() {
    for db in testing::all("lease_concurrent").await {
        let pool = setup(&db).await;
        let g = gid("lc");
        let clock = ManualClock::at(1_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Unknown);
        let start = Arc::new(tokio::sync::Barrier::new(10));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (pool, step, facts, start) =
                (pool.clone(), step.clone(), facts.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                step.claim::<_, Charged, _>(&pool, &*facts).await
            }));
        }
        let (mut acquired, mut in_progress) = (0, 0);
        for task in tasks {
            match task.await.unwrap() {
                Ok(Claimed::Acquired(_)) => acquired += 1,
                Err(ParticipantError::InProgress(_)) => in_progress += 1,
                other => panic!("{}: unexpected {other:?}", db.backend),
            }
        }
        assert_eq!((acquired, in_progress), (1, 9), "{}", db.backend);
        assert_eq!(facts.asked(), 0);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_a_processing_try_waits_then_compensates() {
    for db in testing::all("lease_cancel_waits").await {
        let pool = setup(&db).await;
        let g = gid("lw");
        let clock = ManualClock::at(1_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Unknown);
        let calls = Arc::new(AtomicUsize::new(0));
        let first = blocked_try(&pool, &step, &facts, &calls, "first").await;
        let undone = Arc::new(AtomicUsize::new(0));
        let cancel_barrier = tcc(&g, Op::Cancel);
        let cancel = |undone: Arc<AtomicUsize>| {
            cancel_barrier.run(&pool, move |_tx| {
                let undone = undone.clone();
                async move {
                    undone.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
        };
        // The ordinary barrier's Cancel: 425, nothing written, nothing undone.
        let err = cancel(undone.clone()).await.expect_err("waits");
        assert_eq!(err.status_code(), 425, "{}: {err}", db.backend);
        assert_eq!(undone.load(Ordering::SeqCst), 0);
        let rows = barrier_records(&pool, &g).await.unwrap();
        assert_eq!(
            rows.len(),
            1,
            "{}: only the try's claim: {rows:?}",
            db.backend
        );
        // A Confirm is not let through either (503, retryable).
        let confirm = tcc(&g, Op::Confirm)
            .run(&pool, |_tx| async {
                panic!("no confirm before the try is recorded") as Result<(), _>
            })
            .await;
        assert!(confirm.unwrap_err().is_confirm_without_try());
        // The Try lands; the retried Cancel undoes it.
        first.release.send(()).unwrap();
        assert_eq!(
            first.task.await.unwrap().unwrap(),
            Outcome::Executed(charged("first"))
        );
        assert_eq!(
            cancel(undone.clone()).await.unwrap(),
            Outcome::Executed(()),
            "{}",
            db.backend
        );
        assert_eq!(undone.load(Ordering::SeqCst), 1);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compensation_settles_an_expired_try_through_the_fact_source() {
    for db in testing::all("lease_cancel_settles").await {
        let pool = setup(&db).await;
        let clock = ManualClock::at(1_000);
        let calls = Arc::new(AtomicUsize::new(0));
        let undone = Arc::new(AtomicUsize::new(0));
        let undo = |undone: Arc<AtomicUsize>| {
            move |_tx| {
                let undone = undone.clone();
                async move {
                    undone.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            }
        };

        // Not happened: the Cancel is an empty rollback, the late Try is rejected.
        let g = gid("ls");
        let facts = Facts::new(Fact::NotHappened);
        let first = blocked_try(&pool, &leased(&g, Op::Try, &clock), &facts, &calls, "first").await;
        let cancel = leased(&g, Op::Cancel, &clock);
        let live = cancel
            .run_compensation::<_, (), Charged, _, _, _>(&pool, &*facts, undo(undone.clone()))
            .await;
        assert_eq!(
            live.unwrap_err().status_code(),
            425,
            "{}: live claim",
            db.backend
        );
        assert_eq!(facts.asked(), 0);
        clock.advance(30_000);
        let settled = cancel
            .run_compensation::<_, (), Charged, _, _, _>(&pool, &*facts, undo(undone.clone()))
            .await
            .unwrap();
        assert_eq!(settled, Outcome::EmptyRollback, "{}", db.backend);
        assert_eq!(undone.load(Ordering::SeqCst), 0);
        assert_eq!(
            try_row(&pool, &g).await.0,
            "cancel",
            "the try row is the cancel's guard"
        );
        first.release.send(()).unwrap();
        assert_eq!(
            first.task.await.unwrap().unwrap(),
            Outcome::Rejected,
            "{}",
            db.backend
        );
        assert_eq!(try_row(&pool, &g).await.1, "guard");

        // Happened: the Try is recorded with the fact's result and the Cancel undoes it.
        let g = gid("lt");
        let facts = Facts::new(Fact::Happened(charged("provider")));
        let first = blocked_try(&pool, &leased(&g, Op::Try, &clock), &facts, &calls, "first").await;
        clock.advance(30_000);
        let cancel = leased(&g, Op::Cancel, &clock);
        let undid = cancel
            .run_compensation::<_, (), Charged, _, _, _>(&pool, &*facts, undo(undone.clone()))
            .await
            .unwrap();
        assert_eq!(undid, Outcome::Executed(()), "{}", db.backend);
        assert_eq!(undone.load(Ordering::SeqCst), 1);
        let (_, outcome, result) = try_row(&pool, &g).await;
        assert_eq!(
            (outcome.as_str(), result.as_deref()),
            ("executed", Some(r#"{"by":"provider"}"#))
        );
        first.release.send(()).unwrap();
        assert_eq!(
            first.task.await.unwrap().unwrap(),
            Outcome::Duplicate(charged("provider"))
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "one external call per Try, none repeated"
        );
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_external_call_releases_the_claim_for_an_empty_rollback() {
    for db in testing::all("lease_refused").await {
        let pool = setup(&db).await;
        let g = gid("lr");
        let clock = ManualClock::at(1_000);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Unknown);
        let err = step
            .run(&pool, &*facts, |_t| async {
                Err::<Charged, _>(ParticipantError::refused("card declined"))
            })
            .await
            .unwrap_err();
        assert_eq!(err.status_code(), 409);
        assert!(
            barrier_records(&pool, &g).await.unwrap().is_empty(),
            "{}",
            db.backend
        );
        let cancel = tcc(&g, Op::Cancel)
            .run(&pool, |_tx| async { Ok(()) })
            .await
            .unwrap();
        assert_eq!(cancel, Outcome::EmptyRollback, "{}", db.backend);
        let late = step
            .run(&pool, &*facts, |_t| async {
                panic!("anti-suspension: the late try never runs")
            })
            .await
            .unwrap();
        assert_eq!(late, Outcome::Rejected);
        // A failure without a verdict (a timeout) keeps the claim for the fact source.
        let g = gid("lx");
        let step = leased(&g, Op::Try, &clock);
        let err = step
            .run(&pool, &*facts, |_t| async {
                Err::<Charged, _>(ParticipantError::transient("timeout"))
            })
            .await
            .unwrap_err();
        assert_eq!(err.status_code(), 503);
        assert_eq!(try_row(&pool, &g).await.1, "processing", "{}", db.backend);
        done(db, pool).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_barrier_table_is_upgraded_and_the_purge_keeps_open_claims() {
    for db in testing::all("lease_upgrade").await {
        let pool = setup(&db).await;
        // The barrier table as created before lease mode, with a row its SDK wrote.
        create_old_barrier(&pool, &db, 1, "old_barrier").await;
        let g0 = gid("lo");
        let executed = ("try", "try", "executed");
        insert_old_row(&pool, &db, "old_barrier", &g0, executed, Some("1")).await;
        upgrade_barrier_table_for_lease(&pool, "old_barrier")
            .await
            .unwrap();
        upgrade_barrier_table_for_lease(&pool, "old_barrier")
            .await
            .expect("runs again");
        let clock = ManualClock::at(1_000);
        let g = gid("lu");
        let step = tcc(&g, Op::Try)
            .with_table("old_barrier")
            .unwrap()
            .with_lease(LEASE)
            .with_clock(Arc::new(clock.clone()));
        let facts = Facts::new(Fact::Unknown);
        let got = step
            .run(&pool, &*facts, |_t| async { Ok(charged("up")) })
            .await
            .unwrap();
        assert_eq!(got, Outcome::Executed(charged("up")), "{}", db.backend);
        // The row written before the upgrade survives it and still answers its repeat.
        let rows = barrier_records_in(&pool, "old_barrier", &g0).await.unwrap();
        assert_eq!(rows[0].result.as_deref(), Some("1"));
        let repeat = tcc(&g0, Op::Try)
            .with_table("old_barrier")
            .unwrap()
            .run(&pool, |_tx| async { Ok(2) })
            .await
            .unwrap();
        assert_eq!(repeat, Outcome::Duplicate(1), "{}", db.backend);

        // Purge: an old open claim stays, an old executed row goes.
        let (gp, gx) = (gid("lp"), gid("lq"));
        let calls = Arc::new(AtomicUsize::new(0));
        let open = blocked_try(&pool, &leased(&gp, Op::Try, &clock), &facts, &calls, "p").await;
        tcc(&gx, Op::Try)
            .run(&pool, |_tx| async { Ok(2) })
            .await
            .unwrap();
        age_rows(&pool, &db, &gp, 30).await;
        age_rows(&pool, &db, &gx, 30).await;
        let purged = purge_barriers(&pool, "idem_barrier", Duration::from_secs(86_400))
            .await
            .unwrap();
        assert_eq!(purged, 1, "{}", db.backend);
        assert_eq!(try_row(&pool, &gp).await.1, "processing");
        assert!(barrier_records(&pool, &gx).await.unwrap().is_empty());
        open.release.send(()).unwrap();
        open.task.await.unwrap().unwrap();
        done(db, pool).await;
    }
}

/// The child role of the crash test: claims the step in a real process of its own, says
/// so on stdout, and blocks in its "external call" until the parent kills it with SIGKILL.
/// Does nothing unless the parent set `IDEM_LEASE_CHILD_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child_role() {
    let Ok(url) = std::env::var("IDEM_LEASE_CHILD_URL") else {
        return;
    };
    let g = std::env::var("IDEM_LEASE_CHILD_GID").expect("gid");
    let pool = idem_participant::connect(&url, 2)
        .await
        .expect("child connects");
    let step = leased(&g, Op::Try, &ManualClock::at(1_000));
    let facts = Facts::new(Fact::Unknown);
    let result = step
        .run(&pool, &*facts, |ticket| async move {
            use std::io::Write;
            println!("CLAIMED {}", ticket.owner_token);
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
            Ok(charged("child"))
        })
        .await;
    panic!("the parent kills this process during the external call; got {result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_survives_a_kill_9_and_the_restarted_service_asks_the_fact_source() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    for db in testing::all("lease_kill9").await {
        let pool = setup(&db).await;
        let g = gid("lk");
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "barrier_lease::crash_child_role",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("IDEM_LEASE_CHILD_URL", &db.url)
            .env("IDEM_LEASE_CHILD_GID", &g)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the child");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // A bound on a child that never claims, so that the test fails instead of hanging.
        let claimed = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let line = lines
                    .next_line()
                    .await
                    .unwrap()
                    .expect("the child claims before it exits");
                // libtest prints "test barrier_lease::crash_child_role ... " without a line
                // end first.
                if let Some((_, token)) = line.split_once("CLAIMED ") {
                    break token.trim().to_owned();
                }
            }
        });
        let token = claimed.await.expect("the child claimed within 60 s");
        child.kill().await.expect("SIGKILL");
        let status = child.wait().await.unwrap();
        assert!(!status.success(), "{}: killed", db.backend);
        // The claim was committed before the external call: it outlived its process.
        assert_eq!(try_row(&pool, &g).await.1, "processing", "{}", db.backend);

        // The restarted service: before the lease ends, 425; after it, the fact source.
        let clock = ManualClock::at(1_000 + 29_999);
        let step = leased(&g, Op::Try, &clock);
        let facts = Facts::new(Fact::Happened(charged("provider")));
        let early = step
            .run(&pool, &*facts, |_t| async { panic!("live claim") })
            .await;
        assert_eq!(early.unwrap_err().status_code(), 425, "{}", db.backend);
        clock.advance(1);
        let after = step
            .run(&pool, &*facts, |_t| async {
                panic!("the effect happened: no second call")
            })
            .await
            .unwrap();
        assert_eq!(
            after,
            Outcome::Duplicate(charged("provider")),
            "{}",
            db.backend
        );
        assert_eq!(facts.asked(), 1);
        // The dead owner's token can no longer write.
        let ghost = LeaseTicket {
            step: facts.last.lock().unwrap().clone().unwrap(),
            owner_token: token,
            lease_until_ms: 31_000,
            taken_over: false,
        };
        assert!(matches!(
            step.complete(&pool, &ghost, &charged("ghost"))
                .await
                .unwrap(),
            Completion::Stale {
                current: Some(Outcome::Duplicate(_))
            }
        ));
        done(db, pool).await;
    }
}

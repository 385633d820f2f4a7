//! A job run killed in the middle, then rerun under a new execution id, on every backend:
//! a real child process (this test binary run again with `IDEM_JOBS_CHILD` set) works a
//! chunked unit up to a checkpoint, finishes three one-transaction units, and aborts
//! inside the fourth one's transaction. The rerun skips the three, does the rest, takes the
//! chunked unit over once its lease ran out (by the rerun's clock, no sleeping) and resumes
//! it from the checkpoint. Every item of every unit is booked exactly once.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use idem_participant::jobs::{
    ChunkOutcome, JobUnits, Progress, UnitClaim, UnitKey, UnitOutcome, UnitStatus,
    create_job_tables,
};
use idem_participant::{Clock, LocalTx, ManualClock, ParticipantError, SystemClock, testing};
use sqlx::Any;

use crate::kit_support::ledger;
use ledger::{book, booked};

const CHILD_ENV: &str = "IDEM_JOBS_CHILD";
const DATE: &str = "2026-11-30";
const UNITS: i64 = 6;
/// The one-transaction unit inside whose transaction the child dies.
const CRASH_UNIT: i64 = 3;
const ITEMS: i64 = 3;
const CHUNKED_ITEMS: i64 = 10;

fn units() -> JobUnits {
    JobUnits::new("nightly-settlement", DATE)
        .unwrap()
        .with_lease(Duration::from_secs(60))
}

fn unit(i: i64) -> UnitKey {
    UnitKey::new(i % 2, format!("merchant-{i}"), "page-1")
}

fn chunked() -> UnitKey {
    UnitKey::new(9, "big-file", "all")
}

async fn next_chunk(
    tx: LocalTx<'static, Any>,
    checkpoint: Option<String>,
) -> Result<Progress, ParticipantError> {
    ledger::two_items(tx, "big-file", checkpoint, CHUNKED_ITEMS).await
}

/// The first run, in the child: two chunks of the big unit, then units until the crash.
#[test]
fn child_job_run() {
    let Ok(url) = std::env::var(CHILD_ENV) else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let pool = idem_participant::connect(&url, 2).await.unwrap();
        let units = units();
        let UnitClaim::Acquired(mut lease) = units.claim(&pool, "exec-1", chunked()).await.unwrap()
        else {
            panic!("child: claim")
        };
        for _ in 0..2 {
            let got = units.chunk(&pool, &mut lease, next_chunk).await.unwrap();
            assert_eq!(got, ChunkOutcome::Continued);
        }
        for i in 0..UNITS {
            let name = format!("unit-{i}");
            units
                .run_unit(&pool, "exec-1", unit(i), |tx| {
                    let name = name.clone();
                    async move {
                        book(&tx, &name, 0, ITEMS).await?;
                        if i == CRASH_UNIT {
                            // Killed with the unit's writes made and not committed.
                            std::process::abort();
                        }
                        Ok(None)
                    }
                })
                .await
                .unwrap();
        }
        unreachable!("the child dies in unit {CRASH_UNIT}");
    });
}

#[test]
fn a_rerun_after_a_crashed_run_does_each_unit_once_and_resumes_the_chunked_one() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    for db in rt.block_on(testing::all("jobs_crash_rerun")) {
        let pool = rt.block_on(async {
            let pool = idem_participant::connect(&db.url, 4).await.unwrap();
            create_job_tables(&pool).await.unwrap();
            ledger::create(&pool).await;
            pool
        });
        let status = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "jobs_crash::child_job_run",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &db.url)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(6),
            "{}: the child aborted: {status:?}",
            db.backend
        );

        rt.block_on(async {
            let before = units().units(&pool).await.unwrap();
            let status_of = |key: &UnitKey| before.iter().find(|u| &u.key == key).map(|u| u.status);
            for i in 0..CRASH_UNIT {
                assert_eq!(
                    status_of(&unit(i)),
                    Some(UnitStatus::Done),
                    "{} unit {i}",
                    db.backend
                );
            }
            assert_eq!(
                status_of(&unit(CRASH_UNIT)),
                Some(UnitStatus::Pending),
                "rolled back"
            );
            assert_eq!(booked(&pool, &format!("unit-{CRASH_UNIT}")).await, (0, 0));
            assert_eq!(
                status_of(&chunked()),
                Some(UnitStatus::Running),
                "left mid-unit"
            );

            // The rerun, two minutes later by its clock: the dead run's lease has run out.
            let clock = ManualClock::at(SystemClock.now_ms() + 120_000);
            let rerun = units().with_clock(Arc::new(clock));
            for i in 0..UNITS {
                let name = format!("unit-{i}");
                let got = rerun
                    .run_unit(&pool, "exec-2", unit(i), |tx| {
                        let name = name.clone();
                        async move {
                            book(&tx, &name, 0, ITEMS).await?;
                            Ok(None)
                        }
                    })
                    .await
                    .unwrap();
                let expected = if i < CRASH_UNIT {
                    UnitOutcome::AlreadyDone {
                        by_execution: "exec-1".into(),
                    }
                } else {
                    UnitOutcome::Done
                };
                assert_eq!(got, expected, "{} unit {i}", db.backend);
                assert_eq!(
                    booked(&pool, &name).await,
                    (ITEMS, ITEMS),
                    "{} unit {i}",
                    db.backend
                );
            }
            let UnitClaim::Acquired(mut lease) =
                rerun.claim(&pool, "exec-2", chunked()).await.unwrap()
            else {
                panic!("{}: the dead run's unit is taken over", db.backend)
            };
            assert_eq!((lease.checkpoint.as_deref(), lease.attempt), (Some("4"), 2));
            while rerun.chunk(&pool, &mut lease, next_chunk).await.unwrap()
                == ChunkOutcome::Continued
            {}
            assert_eq!(
                booked(&pool, "big-file").await,
                (CHUNKED_ITEMS, CHUNKED_ITEMS),
                "{}",
                db.backend
            );
            assert_eq!(rerun.summary(&pool).await.unwrap().done, UNITS as u64 + 1);
            pool.close().await;
        });
        rt.block_on(db.drop_database());
    }
}

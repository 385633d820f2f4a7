//! Job units: a scheduled job or batch that a rerun cannot apply twice (seed §22).
//!
//! A job is cut into units, each keyed by what it processes: **job name, business date,
//! shard, source id, batch** ([`JobUnits`] + [`UnitKey`]), never by the scheduler's
//! execution id, since a manual rerun gets a new execution id for the same business date.
//! Each unit has its own status in `idem_job_unit` (PENDING, RUNNING, DONE, FAILED), so a
//! rerun skips what a previous run finished and picks up the rest.
//!
//! Two ways to run a unit:
//!
//! * **In one local transaction** ([`JobUnits::run_unit`]): the unit is claimed, the
//!   business change is made and the unit becomes DONE in one transaction (seed §11's
//!   mode 1 applied to a unit). It commits whole or not at all; a concurrent runner of the
//!   same unit waits on the unit's row and then finds it DONE ([`UnitOutcome::AlreadyDone`]).
//!   A failed run rolls back and leaves the unit FAILED, to be retried by the next run.
//! * **In chunks, with a checkpoint** ([`JobUnits::claim`], [`JobUnits::chunk`]): for a unit
//!   too big for one transaction. The claim commits RUNNING with an owner token and a lease;
//!   each chunk is one local transaction that first renews the lease under the owner token
//!   (so an owner that was taken over writes nothing: [`ChunkOutcome::Lost`]), then makes its
//!   business change and stores the checkpoint it reached, together. A runner that dies
//!   leaves the unit RUNNING; once its lease ran out (by the tool's
//!   [`Clock`](crate::Clock)) another runner claims it and resumes from the last committed
//!   checkpoint.
//!
//! Use one way per unit: [`JobUnits::run_unit`] on a unit whose chunked holder's lease ran
//! out takes it over and runs it whole, without its checkpoint.
//!
//! Metrics (seed §28): [`JOB_UNITS_TOTAL`] by job and outcome, [`JOB_UNITS_PURGED_TOTAL`];
//! [`JobUnits::summary`] gives the counts by status for a gauge. No unit key is a label.
//!
//! What it does not do: schedule anything, or pick the units (page by a stable cursor or
//! business key, seed §22 rule 1). A chunk's business writes must themselves be safe to
//! redo from the checkpoint, which they are when the checkpoint commits with them. A unit
//! that keeps failing stays FAILED and is re-run by every run: count `attempts` and move it
//! to your own exception table when it is final. A scheduler's lock is not needed for
//! correctness, and does not replace this table (rule 6).
//!
//! Retention ([`purge_job_units`]) deletes only DONE units, older than the range of
//! business dates that may still be rerun (seed §24); a purged unit would be run again.

mod rows;
mod table;
mod types;

pub use table::{JobUnitStats, create_job_tables, job_unit_stats, purge_job_units};
pub use types::{
    ChunkOutcome, JobSummary, Progress, UnitClaim, UnitKey, UnitLease, UnitOutcome, UnitRecord,
    UnitStatus,
};

use std::future::Future;
use std::time::Duration;

use crate::backend::Arg;
use crate::error::ParticipantError;
use crate::kit::check_key;
use crate::kit::{
    LocalTx, RetryPolicy, SharedClock, StepConnections, new_owner_token, run_local, system_clock,
};

/// The job units' table.
pub const JOB_UNIT_TABLE: &str = "idem_job_unit";
/// Longest job name.
pub const MAX_JOB_LEN: usize = 64;
/// Longest source id.
pub const MAX_SOURCE_ID_LEN: usize = 128;
/// Longest batch name.
pub const MAX_BATCH_LEN: usize = 64;
/// Longest execution id.
pub const MAX_EXECUTION_ID_LEN: usize = 64;
/// The lease of a unit worked in chunks, unless [`JobUnits::with_lease`] says otherwise.
pub const DEFAULT_UNIT_LEASE: Duration = Duration::from_secs(60);
/// The shortest retention [`purge_job_units`] accepts: a rerun of yesterday's business date
/// must still find its units DONE.
pub const MIN_JOB_UNIT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Units run, by job and outcome (`done`, `skipped`, `busy`, `failed`, `lost`).
pub const JOB_UNITS_TOTAL: &str = "idem_participant_job_units_total";
/// Job units deleted by retention.
pub const JOB_UNITS_PURGED_TOTAL: &str = "idem_participant_job_units_purged_total";

/// Gives this module's metrics their HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        JOB_UNITS_TOTAL,
        "Job units by job and outcome: done, skipped (finished by an earlier run), busy (another runner holds it), failed, lost (a chunk whose lease was taken over)."
    );
    metrics::describe_counter!(JOB_UNITS_PURGED_TOTAL, "Job units deleted by retention.");
}

/// The units of one job's business date.
#[derive(Clone)]
pub struct JobUnits {
    job: String,
    business_date: String,
    clock: SharedClock,
    lease: Duration,
    retry: RetryPolicy,
}

impl std::fmt::Debug for JobUnits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobUnits")
            .field("job", &self.job)
            .field("business_date", &self.business_date)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl JobUnits {
    /// The units of `job` (a configured name, 1 to 64 characters: also a metrics label) for
    /// `business_date` (`YYYY-MM-DD`).
    pub fn new(
        job: impl Into<String>,
        business_date: impl Into<String>,
    ) -> Result<JobUnits, ParticipantError> {
        let job = job.into();
        let business_date = business_date.into();
        check_key("job", &job, MAX_JOB_LEN)?;
        if !is_date(&business_date) {
            return Err(ParticipantError::refused(format!(
                "invalid business date `{}`: expected YYYY-MM-DD",
                business_date.chars().take(16).collect::<String>()
            )));
        }
        Ok(JobUnits {
            job,
            business_date,
            clock: system_clock(),
            lease: DEFAULT_UNIT_LEASE,
            retry: RetryPolicy::default(),
        })
    }

    /// Measures leases and stamps rows with `clock`.
    pub fn with_clock(mut self, clock: SharedClock) -> JobUnits {
        self.clock = clock;
        self
    }

    /// The lease of a claimed unit, renewed by each chunk.
    pub fn with_lease(mut self, lease: Duration) -> JobUnits {
        self.lease = lease;
        self
    }

    /// Retries lost lock conflicts under `retry`.
    pub fn with_retry(mut self, retry: RetryPolicy) -> JobUnits {
        self.retry = retry;
        self
    }

    /// Records `units` as PENDING (those not yet known), so that [`JobUnits::summary`] shows
    /// what is left; returns how many were new. Optional: running a unit records it too.
    pub async fn plan<S: StepConnections>(
        &self,
        pool: &S,
        units: &[UnitKey],
    ) -> Result<u64, ParticipantError> {
        for unit in units {
            unit.check()?;
        }
        let now = self.clock.now_ms();
        run_local(pool, self.retry, "job units plan", |tx| {
            let keys: Vec<Vec<Arg>> = units.iter().map(|u| self.key_args(u)).collect();
            async move {
                let mut new = 0;
                for key in keys {
                    new += u64::from(rows::ensure(&tx, key, now).await?);
                }
                Ok(new)
            }
        })
        .await
    }

    /// Runs unit `key` for run `execution_id` with `work`, in one local transaction: see the
    /// [module](self) docs. `work` returns what to keep as the unit's checkpoint (a count, a
    /// last id; `None` for nothing) and must change nothing outside its transaction.
    ///
    /// When `work` fails, its change rolls back, the unit is left FAILED (the next run
    /// retries it) and the error is returned.
    pub async fn run_unit<S, F, Fut>(
        &self,
        pool: &S,
        execution_id: &str,
        key: UnitKey,
        mut work: F,
    ) -> Result<UnitOutcome, ParticipantError>
    where
        S: StepConnections,
        F: FnMut(LocalTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<Option<String>, ParticipantError>>,
    {
        check_key("execution id", execution_id, MAX_EXECUTION_ID_LEN)?;
        key.check()?;
        self.plan(pool, std::slice::from_ref(&key)).await?;
        let key = &key;
        let result = run_local(pool, self.retry, "job unit", |tx| {
            let business = work(tx.clone());
            let args = self.key_args(key);
            let token = new_owner_token();
            let now = self.clock.now_ms();
            let lease_until = now.saturating_add(lease_ms(self.lease));
            async move {
                rows::claim(&tx, args.clone(), &token, execution_id, now, lease_until).await?;
                let row = rows::read(&tx, args.clone(), true).await?;
                let row = row.ok_or_else(|| missing(key))?;
                if let Some(other) = not_ours(&row, &token) {
                    drop(business);
                    return Ok(other);
                }
                let checkpoint = business.await?;
                rows::finish(&tx, args, &token, UnitStatus::Done, checkpoint, now).await?;
                Ok(UnitOutcome::Done)
            }
        })
        .await;
        if result.is_err() {
            let args = self.key_args(key);
            let now = self.clock.now_ms();
            let marked = run_local(pool, self.retry, "job unit failed", |tx| {
                let args = args.clone();
                async move { rows::mark_failed(&tx, args, execution_id, now).await }
            })
            .await;
            if let Err(e) = marked {
                tracing::warn!(job = %self.job, error = %e, "could not mark a failed job unit FAILED");
            }
        }
        self.count(match &result {
            Ok(UnitOutcome::Done) => "done",
            Ok(UnitOutcome::AlreadyDone { .. }) => "skipped",
            Ok(UnitOutcome::Busy { .. }) => "busy",
            Err(_) => "failed",
        });
        result
    }

    /// Claims unit `key` for run `execution_id`, to work it in chunks: commits it RUNNING
    /// under a new owner token and a lease. A unit whose holder's lease ran out is taken
    /// over, with its last checkpoint.
    pub async fn claim<S: StepConnections>(
        &self,
        pool: &S,
        execution_id: &str,
        key: UnitKey,
    ) -> Result<UnitClaim, ParticipantError> {
        check_key("execution id", execution_id, MAX_EXECUTION_ID_LEN)?;
        key.check()?;
        self.plan(pool, std::slice::from_ref(&key)).await?;
        let claim = run_local(pool, self.retry, "job unit claim", |tx| {
            let args = self.key_args(&key);
            let token = new_owner_token();
            let now = self.clock.now_ms();
            let lease_until = now.saturating_add(lease_ms(self.lease));
            let key = key.clone();
            async move {
                rows::claim(&tx, args.clone(), &token, execution_id, now, lease_until).await?;
                let row = rows::read(&tx, args, true).await?;
                let row = row.ok_or_else(|| missing(&key))?;
                Ok(match not_ours(&row, &token) {
                    Some(UnitOutcome::AlreadyDone { by_execution }) => {
                        UnitClaim::AlreadyDone { by_execution }
                    }
                    Some(UnitOutcome::Busy { lease_until_ms }) => {
                        UnitClaim::Busy { lease_until_ms }
                    }
                    _ => UnitClaim::Acquired(UnitLease {
                        key,
                        owner_token: token,
                        execution_id: execution_id.to_owned(),
                        checkpoint: row.checkpoint,
                        attempt: row.attempts,
                    }),
                })
            }
        })
        .await?;
        match &claim {
            UnitClaim::AlreadyDone { .. } => self.count("skipped"),
            UnitClaim::Busy { .. } => self.count("busy"),
            UnitClaim::Acquired(_) => {}
        }
        Ok(claim)
    }

    /// Works one chunk of a claimed unit in one local transaction: renews the lease under
    /// the lease's owner token, runs `work` from the last checkpoint, and stores the
    /// checkpoint it returns (or DONE, for [`Progress::Finished`]) with its change.
    /// `lease.checkpoint` follows.
    pub async fn chunk<S, F, Fut>(
        &self,
        pool: &S,
        lease: &mut UnitLease,
        mut work: F,
    ) -> Result<ChunkOutcome, ParticipantError>
    where
        S: StepConnections,
        F: FnMut(LocalTx<'static, S::Database>, Option<String>) -> Fut,
        Fut: Future<Output = Result<Progress, ParticipantError>>,
    {
        let held: &UnitLease = lease;
        let done = run_local(pool, self.retry, "job unit chunk", |tx| {
            let business = work(tx.clone(), held.checkpoint.clone());
            let args = self.key_args(&held.key);
            let now = self.clock.now_ms();
            let lease_until = now.saturating_add(lease_ms(self.lease));
            async move {
                let token = &held.owner_token;
                rows::renew(&tx, args.clone(), token, now, lease_until).await?;
                let row = rows::read(&tx, args.clone(), true).await?;
                let ours = row.is_some_and(|r| {
                    r.status == UnitStatus::Running && r.owner_token.as_deref() == Some(token)
                });
                if !ours {
                    drop(business);
                    return Ok(None);
                }
                let progress = business.await?;
                let (status, checkpoint) = match &progress {
                    Progress::Continue(c) => (UnitStatus::Running, Some(c.clone())),
                    Progress::Finished(c) => (UnitStatus::Done, c.clone()),
                };
                rows::finish(&tx, args, token, status, checkpoint, now).await?;
                Ok(Some(progress))
            }
        })
        .await;
        let outcome = match done {
            Ok(None) => ChunkOutcome::Lost,
            Ok(Some(Progress::Continue(checkpoint))) => {
                lease.checkpoint = Some(checkpoint);
                return Ok(ChunkOutcome::Continued);
            }
            Ok(Some(Progress::Finished(checkpoint))) => {
                lease.checkpoint = checkpoint;
                ChunkOutcome::Finished
            }
            Err(e) => return Err(e),
        };
        self.count(match outcome {
            ChunkOutcome::Finished => "done",
            _ => "lost",
        });
        Ok(outcome)
    }

    /// Gives a claimed unit up as FAILED (the next run retries it from its checkpoint).
    /// False, with nothing written, when it was no longer this lease's.
    pub async fn fail<S: StepConnections>(
        &self,
        pool: &S,
        lease: &UnitLease,
    ) -> Result<bool, ParticipantError> {
        let now = self.clock.now_ms();
        let still_ours = run_local(pool, self.retry, "job unit fail", |tx| {
            let args = self.key_args(&lease.key);
            async move {
                let token = &lease.owner_token;
                let row = rows::read(&tx, args.clone(), true).await?;
                let ours = row.is_some_and(|r| {
                    r.status == UnitStatus::Running && r.owner_token.as_deref() == Some(token)
                });
                if ours {
                    let checkpoint = lease.checkpoint.clone();
                    rows::finish(&tx, args, token, UnitStatus::Failed, checkpoint, now).await?;
                }
                Ok(ours)
            }
        })
        .await?;
        if still_ours {
            self.count("failed");
        }
        Ok(still_ours)
    }

    /// The row of unit `key`, if it is known.
    pub async fn unit<S: StepConnections>(
        &self,
        pool: &S,
        key: &UnitKey,
    ) -> Result<Option<UnitRecord>, ParticipantError> {
        let args = self.key_args(key);
        run_local(pool, self.retry, "job unit read", |tx| {
            let args = args.clone();
            async move { rows::read(&tx, args, false).await }
        })
        .await
    }

    /// Every unit of this job's business date, in key order.
    pub async fn units<S: StepConnections>(
        &self,
        pool: &S,
    ) -> Result<Vec<UnitRecord>, ParticipantError> {
        run_local(pool, self.retry, "job units read", |tx| async move {
            rows::read_all(&tx, &self.job, &self.business_date).await
        })
        .await
    }

    /// How many units of this job's business date are in each status (seed §28: counts by
    /// status; a service exports them as gauges if it wants them).
    pub async fn summary<S: StepConnections>(
        &self,
        pool: &S,
    ) -> Result<JobSummary, ParticipantError> {
        let mut summary = JobSummary::default();
        for unit in self.units(pool).await? {
            match unit.status {
                UnitStatus::Pending => summary.pending += 1,
                UnitStatus::Running => summary.running += 1,
                UnitStatus::Done => summary.done += 1,
                UnitStatus::Failed => summary.failed += 1,
            }
        }
        Ok(summary)
    }

    fn key_args(&self, key: &UnitKey) -> Vec<Arg> {
        rows::key_args(&self.job, &self.business_date, key)
    }

    fn count(&self, outcome: &'static str) {
        metrics::counter!(JOB_UNITS_TOTAL, "job" => self.job.clone(), "outcome" => outcome)
            .increment(1);
    }
}

/// Whether the unit read after a claim belongs to someone else, and how to answer then.
fn not_ours(row: &UnitRecord, token: &str) -> Option<UnitOutcome> {
    match row.status {
        UnitStatus::Running if row.owner_token.as_deref() == Some(token) => None,
        UnitStatus::Done => Some(UnitOutcome::AlreadyDone {
            by_execution: row.execution_id.clone().unwrap_or_default(),
        }),
        _ => Some(UnitOutcome::Busy {
            lease_until_ms: row.lease_until_ms.unwrap_or_default(),
        }),
    }
}

fn missing(key: &UnitKey) -> ParticipantError {
    ParticipantError::internal(format!(
        "job unit (shard {}, source {}, batch {}) vanished after it was recorded",
        key.shard, key.source_id, key.batch
    ))
}

pub(super) fn lease_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' || !digits(0..4) {
        return false;
    }
    if !digits(5..7) || !digits(8..10) {
        return false;
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    let day = (b[8] - b'0') * 10 + (b[9] - b'0');
    (1..=12).contains(&month) && (1..=31).contains(&day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn business_dates_are_checked() {
        assert!(is_date("2026-12-01"));
        for bad in [
            "2026-13-01",
            "2026-00-10",
            "2026-1-01",
            "20261201",
            "2026-12-32",
            "x",
        ] {
            assert!(!is_date(bad), "{bad}");
            assert!(JobUnits::new("billing", bad).is_err());
        }
        assert!(JobUnits::new("j".repeat(65), "2026-12-01").is_err());
    }

    #[test]
    fn unit_keys_are_checked() {
        assert!(UnitKey::new(-1, "a", "b").check().is_err());
        assert!(UnitKey::new(0, "", "b").check().is_err());
        assert!(UnitKey::new(0, "a", "b".repeat(65)).check().is_err());
        assert!(
            UnitKey::new(3, "a".repeat(128), "b".repeat(64))
                .check()
                .is_ok()
        );
    }
}

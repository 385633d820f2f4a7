//! The job units' public types: keys, statuses, rows and what each call answers.

use super::{MAX_BATCH_LEN, MAX_SOURCE_ID_LEN};
use crate::error::ParticipantError;
use crate::kit::check_key;

/// Which unit of a job's business date.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnitKey {
    /// The shard (partition, bucket) the unit belongs to; 0 when the job has none.
    pub shard: i64,
    /// The source the unit reads (an account, a merchant, a file), 1 to 128 characters.
    pub source_id: String,
    /// The batch within the source (a page, a file part), 1 to 64 characters.
    pub batch: String,
}

impl UnitKey {
    /// The unit of `source_id`'s `batch` in `shard`.
    pub fn new(shard: i64, source_id: impl Into<String>, batch: impl Into<String>) -> UnitKey {
        UnitKey {
            shard,
            source_id: source_id.into(),
            batch: batch.into(),
        }
    }

    pub(super) fn check(&self) -> Result<(), ParticipantError> {
        if self.shard < 0 {
            return Err(ParticipantError::refused(
                "invalid shard: must be 0 or more",
            ));
        }
        check_key("source id", &self.source_id, MAX_SOURCE_ID_LEN)?;
        check_key("batch", &self.batch, MAX_BATCH_LEN)
    }
}

/// A unit's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnitStatus {
    /// Planned, not yet run.
    Pending,
    /// Held by a runner working it in chunks, under a lease.
    Running,
    /// Finished; every later run skips it.
    Done,
    /// The last attempt failed; the next run tries again.
    Failed,
}

impl UnitStatus {
    /// The status as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            UnitStatus::Pending => "PENDING",
            UnitStatus::Running => "RUNNING",
            UnitStatus::Done => "DONE",
            UnitStatus::Failed => "FAILED",
        }
    }

    pub(super) fn parse(text: &str) -> Option<UnitStatus> {
        Some(match text {
            "PENDING" => UnitStatus::Pending,
            "RUNNING" => UnitStatus::Running,
            "DONE" => UnitStatus::Done,
            "FAILED" => UnitStatus::Failed,
            _ => return None,
        })
    }
}

/// One row of `idem_job_unit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitRecord {
    /// Which unit.
    pub key: UnitKey,
    /// Its status.
    pub status: UnitStatus,
    /// The run that last claimed it (once DONE: the run that finished it).
    pub execution_id: Option<String>,
    /// The token of the runner holding (or last holding) it.
    pub owner_token: Option<String>,
    /// Until when the holder of a RUNNING unit may keep it, Unix milliseconds.
    pub lease_until_ms: Option<i64>,
    /// Where its next chunk starts (or what its finished run left).
    pub checkpoint: Option<String>,
    /// Attempts so far.
    pub attempts: i64,
    /// Last change, Unix milliseconds.
    pub updated_at_ms: i64,
}

/// What [`JobUnits::run_unit`](super::JobUnits::run_unit) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitOutcome {
    /// This call ran the unit; its business change committed with DONE.
    Done,
    /// An earlier (or concurrent) run finished it; nothing ran.
    AlreadyDone {
        /// The execution that finished it.
        by_execution: String,
    },
    /// A chunked runner holds it under a live lease; nothing ran.
    Busy {
        /// When that lease runs out, Unix milliseconds.
        lease_until_ms: i64,
    },
}

/// What [`JobUnits::claim`](super::JobUnits::claim) got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnitClaim {
    /// The unit is this runner's until its lease runs out; work it with [`JobUnits::chunk`](super::JobUnits::chunk).
    Acquired(UnitLease),
    /// An earlier run finished it.
    AlreadyDone {
        /// The execution that finished it.
        by_execution: String,
    },
    /// Another runner holds it under a live lease.
    Busy {
        /// When that lease runs out, Unix milliseconds.
        lease_until_ms: i64,
    },
}

/// A claimed unit: the owner token that fences its chunks and the checkpoint to resume from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitLease {
    /// Which unit.
    pub key: UnitKey,
    /// The token every chunk names; a takeover replaces it.
    pub owner_token: String,
    /// The run holding it.
    pub execution_id: String,
    /// The last committed checkpoint (a previous owner's, after a takeover).
    pub checkpoint: Option<String>,
    /// Which attempt this is (1 for the first claim).
    pub attempt: i64,
}

/// What a chunk's work reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Progress {
    /// More to do; the next chunk starts from this checkpoint.
    Continue(String),
    /// The unit is finished (with an optional last checkpoint, e.g. a count).
    Finished(Option<String>),
}

/// What [`JobUnits::chunk`](super::JobUnits::chunk) did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChunkOutcome {
    /// The chunk committed with its checkpoint; the unit is still this runner's.
    Continued,
    /// The last chunk committed with DONE.
    Finished,
    /// The unit was taken over (the lease ran out) or finished by someone else: nothing
    /// was written and the work did not run. Stop working this unit.
    Lost,
}

/// Units by status, for one job's business date.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobSummary {
    /// PENDING units.
    pub pending: u64,
    /// RUNNING units.
    pub running: u64,
    /// DONE units.
    pub done: u64,
    /// FAILED units.
    pub failed: u64,
}

//! A batch of queued writes as the rows it writes, table by table: the one decomposition
//! every database's batch statements start from (PostgreSQL binds them as arrays, SQLite
//! as JSON). Rows borrow from the batch; nothing of a transaction is copied but the
//! options' JSON text.

use serde::Serialize;

use super::binds::{clip, payload_bin, payload_text};
use super::branch_groups;
use super::group_commit::Work;
use crate::{Guard, Result, StoreError};
use idem_core::Branch;

fn hex_bytes<S: serde::Serializer>(bytes: &Option<&[u8]>, s: S) -> Result<S::Ok, S::Error> {
    match bytes {
        Some(bytes) => s.serialize_str(&hex::encode(bytes)),
        None => s.serialize_none(),
    }
}

/// A created transaction's global row (`GLOBAL_COLUMNS` but the version, which is 0).
#[derive(Serialize)]
pub struct NewGlobal<'a> {
    pub gid: &'a str,
    pub kind: &'a str,
    pub status: &'a str,
    pub stalled_from: Option<&'a str>,
    pub request_hash: &'a str,
    pub options: String,
    pub timeout_at: Option<i64>,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub owner_token: Option<&'a str>,
    pub lease_until: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub tokenless: bool,
}

/// A created transaction's branch row (`BRANCH_COLUMNS`).
#[derive(Serialize)]
pub struct NewBranch<'a> {
    pub gid: &'a str,
    pub branch_id: &'a str,
    pub action: &'a str,
    pub seq: i32,
    pub url: &'a str,
    pub payload: &'a str,
    /// As hex in the JSON that SQLite's and MariaDB's batches read.
    #[serde(serialize_with = "hex_bytes")]
    pub payload_bin: Option<&'a [u8]>,
    #[serde(flatten)]
    pub values: BranchValues<'a>,
}

/// What a save sets on a branch row (`BRANCH_SET`).
#[derive(Serialize)]
pub struct BranchValues<'a> {
    pub status: &'a str,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<&'a str>,
    pub in_progress_since: Option<i64>,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
}

impl<'a> BranchValues<'a> {
    fn of(b: &'a Branch) -> BranchValues<'a> {
        BranchValues {
            status: b.status.as_str(),
            attempts: b.attempts,
            next_attempt_at: b.next_attempt_at,
            last_error: clip(&b.last_error),
            in_progress_since: b.in_progress_since,
            updated_at: b.updated_at,
            finished_at: b.finished_at,
        }
    }
}

/// A save's conditional update of its global row: the guard (the expected status, and
/// the owner token or the version), then the new values (`GLOBAL_SET`).
#[derive(Clone, Serialize)]
pub struct GlobalChange<'a> {
    pub gid: &'a str,
    pub expected: &'a str,
    /// The owner a driver's save expects (`None`: a request's save, which takes the row
    /// over from whoever holds it).
    pub guard_token: Option<&'a str>,
    /// The version every save expects.
    pub guard_version: i64,
    pub status: &'a str,
    pub stalled_from: Option<&'a str>,
    pub attempts: i32,
    pub next_attempt_at: Option<i64>,
    pub last_error: Option<&'a str>,
    pub reason: Option<&'a str>,
    pub timeout_at: Option<i64>,
    pub updated_at: i64,
    pub finished_at: Option<i64>,
    pub owner_token: Option<&'a str>,
    pub lease_until: Option<i64>,
    pub calls: i64,
    pub history: i64,
    pub history_dropped: i64,
}

/// A branch row a save changed: its key and its new values.
#[derive(Serialize)]
pub struct BranchChange<'a> {
    pub gid: &'a str,
    pub branch_id: &'a str,
    pub action: &'a str,
    #[serde(flatten)]
    pub values: BranchValues<'a>,
}

/// An attempt row of a save.
#[derive(Serialize)]
pub struct NewAttempt<'a> {
    pub gid: &'a str,
    pub number: i64,
    pub branch_id: &'a str,
    pub action: &'a str,
    pub attempt: i32,
    pub started_at: i64,
    pub duration_ms: i64,
    pub outcome: &'a str,
    pub detail: Option<&'a str>,
}

/// The oldest records of a saved transaction's history that go: numbers 1 to `upto`
/// (its new `history_dropped`). Only a save that moved `history_dropped` has one, so a
/// transaction within its bound costs no statement.
#[derive(Serialize)]
pub struct Trim<'a> {
    pub gid: &'a str,
    pub upto: i64,
}

/// A lease renewed (or released) by its owner.
#[derive(Serialize)]
pub struct LeaseChange<'a> {
    pub gid: &'a str,
    pub token: &'a str,
    pub until: i64,
    /// 1: a release, which may end the lease sooner; 0: a renewal, which never does.
    pub is_release: i32,
}

/// The rows of one batch. The branch and attempt rows of a create or save are written
/// only if its global row was (inserted, or matched its guard).
#[derive(Default)]
pub struct BatchRows<'a> {
    pub created: Vec<NewGlobal<'a>>,
    pub new_branches: Vec<NewBranch<'a>>,
    pub changed: Vec<GlobalChange<'a>>,
    pub changed_branches: Vec<BranchChange<'a>>,
    pub attempts: Vec<NewAttempt<'a>>,
    pub trims: Vec<Trim<'a>>,
    pub leases: Vec<LeaseChange<'a>>,
}

impl<'a> BatchRows<'a> {
    pub fn of(works: &'a [Work]) -> Result<BatchRows<'a>> {
        let mut rows = BatchRows::default();
        for work in works {
            match work {
                Work::Create(create) => rows.push_create(create)?,
                Work::Save(save) => rows.push_save(save.borrow()),
                Work::Renew(r) => rows.leases.push(LeaseChange {
                    gid: &r.gid,
                    token: &r.token,
                    until: r.until,
                    is_release: i32::from(r.release),
                }),
            }
        }
        Ok(rows)
    }

    fn push_create(&mut self, create: &'a super::group_commit::OwnedCreate) -> Result<()> {
        let (tx, lease) = (&create.tx, create.lease.as_ref());
        self.created.push(NewGlobal {
            gid: &tx.gid,
            kind: tx.kind.as_str(),
            status: tx.status.as_str(),
            stalled_from: tx.stalled_from.map(|s| s.as_str()),
            request_hash: &create.request_hash,
            options: serde_json::to_string(&tx.options)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            timeout_at: tx.timeout_at,
            attempts: tx.attempts,
            next_attempt_at: tx.next_attempt_at,
            last_error: clip(&tx.last_error),
            reason: clip(&tx.reason),
            owner_token: lease.map(|l| l.token.as_str()),
            lease_until: lease.map(|l| l.until),
            created_at: tx.created_at,
            updated_at: tx.updated_at,
            finished_at: tx.finished_at,
            traceparent: tx.trace.as_ref().map(|t| t.traceparent.as_str()),
            tracestate: tx.trace.as_ref().and_then(|t| t.tracestate.as_deref()),
            tokenless: tx.tokenless,
        });
        for b in &tx.branches {
            self.new_branches.push(NewBranch {
                gid: &tx.gid,
                branch_id: &b.branch_id,
                action: b.action.as_str(),
                seq: b.seq,
                url: &b.url,
                payload: payload_text(&b.payload),
                payload_bin: payload_bin(&b.payload),
                values: BranchValues::of(b),
            });
        }
        Ok(())
    }

    fn push_save(&mut self, save: crate::Save<'a>) {
        let (before, after) = (save.before, save.after);
        let gid = after.gid.as_str();
        let (guard_token, guard_version) = match save.guard {
            Guard::Owner(token, version) => (Some(token), version),
            Guard::Version(version) => (None, version),
        };
        self.changed.push(GlobalChange {
            gid,
            expected: before.status.as_str(),
            guard_token,
            guard_version,
            status: after.status.as_str(),
            stalled_from: after.stalled_from.map(|s| s.as_str()),
            attempts: after.attempts,
            next_attempt_at: after.next_attempt_at,
            last_error: clip(&after.last_error),
            reason: clip(&after.reason),
            timeout_at: after.timeout_at,
            updated_at: after.updated_at,
            finished_at: after.finished_at,
            owner_token: save.lease.map(|l| l.token.as_str()),
            lease_until: save.lease.map(|l| l.until),
            calls: after.calls,
            history: after.history,
            history_dropped: after.history_dropped,
        });
        if let Some(upto) = trim_upto(&save) {
            self.trims.push(Trim { gid, upto });
        }
        for group in branch_groups(before, after) {
            for branch_id in group.branch_ids {
                self.changed_branches.push(BranchChange {
                    gid,
                    branch_id,
                    action: group.values.action.as_str(),
                    values: BranchValues::of(group.values),
                });
            }
        }
        for a in save.attempts {
            self.attempts.push(NewAttempt {
                gid,
                number: a.number,
                branch_id: &a.branch_id,
                action: a.action.as_str(),
                attempt: a.attempt,
                started_at: a.started_at,
                duration_ms: a.duration_ms,
                outcome: &a.outcome,
                detail: clip(&a.detail),
            });
        }
    }
}

/// Where a save's trim of the history ends: the new `history_dropped`, when the save
/// moved it. The save's own records are all above it (the engine keeps only those).
pub fn trim_upto(save: &crate::Save<'_>) -> Option<i64> {
    (save.after.history_dropped > save.before.history_dropped).then_some(save.after.history_dropped)
}

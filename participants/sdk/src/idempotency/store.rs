//! The record protocol: claim, lease renewal, the end writes fenced by the owner token, and
//! mode 1 (everything in one local transaction). Settling records nobody runs is in
//! `settle.rs`.
//!
//! Every operation is one local transaction ([`crate::kit::run_local`]): on MySQL/MariaDB
//! (REPEATABLE READ) a plain read after a conditional UPDATE that matched nothing may show
//! the transaction's snapshot instead of the newest row, so "did my UPDATE win" is decided
//! by comparing the row's owner token with the fresh token this call just wrote: a snapshot
//! can never show a token nobody else knows. A lost race re-runs the whole transaction.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::Pool;

use super::rows::{
    End, Row, end_args, end_sql, insert_if_absent, read_row, reclaim_sql, renew_sql,
};
use super::{
    Claim, IdempotencyError, MAX_RESOURCE_ID_LEN, Status, StoredResult, TABLE, Ticket,
    check_inputs, count, invalid,
};
use crate::backend::{Arg, BarrierDatabase, CellKind};
use crate::error::ParticipantError;
use crate::kit::local::exec;
use crate::kit::{LocalTx, RetryPolicy, SharedClock, db_now_ms, new_owner_token, run_local};

/// How many times a claim re-runs after losing a race to another claim of the same record
/// before it answers "in progress" (each loss means someone else just changed the row).
const RACE_ATTEMPTS: u32 = 8;

/// The default lease of a mode-2 claim.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default bound of a stored result body, in bytes.
const DEFAULT_MAX_RESULT_BODY: usize = 1024 * 1024;
/// The largest bound a store accepts: what MySQL's MEDIUMBLOB / MEDIUMTEXT hold.
pub const MAX_RESULT_BODY_LIMIT: usize = 16 * 1024 * 1024 - 1;
/// How long the recovery hook may take before its answer counts as "unknown".
const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Idempotency records in the service's database (table `idem_idempotency`, created by
/// [`create_idempotency_tables`](super::create_idempotency_tables)).
pub struct IdempotencyStore<DB: BarrierDatabase> {
    pub(super) pool: Pool<DB>,
    clock: Option<SharedClock>,
    lease: Duration,
    max_result_body: usize,
    recovery_timeout: Duration,
    pub(super) retry: RetryPolicy,
}

impl<DB: BarrierDatabase> Clone for IdempotencyStore<DB> {
    fn clone(&self) -> Self {
        IdempotencyStore {
            pool: self.pool.clone(),
            clock: self.clock.clone(),
            lease: self.lease,
            max_result_body: self.max_result_body,
            recovery_timeout: self.recovery_timeout,
            retry: self.retry,
        }
    }
}

/// What [`IdempotencyStore::run_local`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalOutcome {
    /// The work ran and committed with its record; this is its result.
    First(StoredResult),
    /// The work did not run: the record answered (never [`Claim::Acquired`]).
    Repeat(Claim),
}

/// One claim attempt's end.
enum Step {
    Done(Claim),
    /// Another claim changed the row between this one's read and write: run again.
    Raced,
}

impl<DB: BarrierDatabase> IdempotencyStore<DB> {
    /// A store on `pool`: leases on the database's clock, 30 s long, result bodies up to
    /// 1 MiB, the recovery hook given 10 s.
    pub fn new(pool: Pool<DB>) -> Self {
        IdempotencyStore {
            pool,
            clock: None,
            lease: DEFAULT_LEASE,
            max_result_body: DEFAULT_MAX_RESULT_BODY,
            recovery_timeout: DEFAULT_RECOVERY_TIMEOUT,
            retry: RetryPolicy::default(),
        }
    }

    /// Reads the time on `clock` instead of the database's: a `ManualClock`, in tests that
    /// expire leases by moving it. Every instance of a service must then share one clock,
    /// or a skewed one judges a live lease expired; in production leave the database's.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How long a mode-2 claim holds the record before a repeat may ask the recovery hook.
    /// The layer renews it every third of its length while the handler runs, so it only
    /// needs to outlast a stall of this process or of its database link.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The largest result body stored, in bytes; a larger one is refused
    /// (`result_too_large`).
    ///
    /// # Panics
    /// Above [`MAX_RESULT_BODY_LIMIT`], what MySQL's columns hold (MySQL's and MariaDB's
    /// `max_allowed_packet` must also exceed the bound).
    pub fn with_max_result_body(mut self, bytes: usize) -> Self {
        assert!(
            bytes <= MAX_RESULT_BODY_LIMIT,
            "a result body bound of {bytes} bytes is over the {MAX_RESULT_BODY_LIMIT} the columns hold"
        );
        self.max_result_body = bytes;
        self
    }

    /// How long [`claim_with_recovery`](Self::claim_with_recovery) and the [`Settler`]
    /// wait for the recovery hook; a slower answer counts as [`Recovery::Unknown`].
    ///
    /// [`Settler`]: super::Settler
    /// [`Recovery::Unknown`]: super::Recovery::Unknown
    pub fn with_recovery_timeout(mut self, timeout: Duration) -> Self {
        self.recovery_timeout = timeout;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The clock given with [`with_clock`](Self::with_clock); `None` when the database's
    /// clock decides.
    pub fn clock(&self) -> Option<&SharedClock> {
        self.clock.as_ref()
    }

    /// The lease of a mode-2 claim.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The largest stored result body, in bytes.
    pub fn max_result_body(&self) -> usize {
        self.max_result_body
    }

    /// How long the recovery hook is given.
    pub fn recovery_timeout(&self) -> Duration {
        self.recovery_timeout
    }

    pub(super) fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// SQL for now in Unix ms: the database's clock, or the given clock's reading as a
    /// literal (an integer of ours, never input).
    pub(super) fn now_sql(&self) -> String {
        match &self.clock {
            None => db_now_ms(DB::pool_dialect(&self.pool)).to_owned(),
            Some(clock) => {
                let integer = match DB::pool_dialect(&self.pool) {
                    idem_sql::Backend::Mysql => "SIGNED",
                    _ => "BIGINT",
                };
                format!("CAST({} AS {integer})", clock.now_ms())
            }
        }
    }

    /// Mode 2: claims (scope, key) for the request with digest `hash`, committing a
    /// `PROCESSING` row with a lease when it is new (or re-claims `FAILED_RETRYABLE`); any
    /// other state answers without running anything. See [`Claim`].
    pub async fn claim(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
    ) -> Result<Claim, IdempotencyError> {
        check_inputs(scope, key, hash)?;
        for _ in 0..RACE_ATTEMPTS {
            let token = new_owner_token();
            let step = run_local(&self.pool, self.retry, "idempotency claim", |tx| {
                let token = token.clone();
                async move { self.claim_in(&tx, scope, key, hash, &token).await }
            })
            .await?;
            if let Step::Done(claim) = step {
                count_claim(scope, &claim);
                return Ok(claim);
            }
        }
        count(scope, "in_progress");
        Ok(Claim::InProgress {
            retry_after: Duration::from_secs(1),
        })
    }

    /// Mode 2: extends the ticket's lease to a full lease from now, while its handler
    /// runs. `false` when the ticket no longer holds the record (its lease ran out and
    /// someone settled or took it): the owner's end write will then be refused.
    pub async fn renew(&self, ticket: &Ticket) -> Result<bool, IdempotencyError> {
        let (scope, key) = (ticket.scope.as_str(), ticket.key.as_str());
        let args = vec![
            Arg::Int(self.lease_ms()),
            Arg::Text(scope.into()),
            Arg::Text(key.into()),
            Arg::Text(ticket.owner_token.clone()),
        ];
        let row = self
            .write_then_read(
                "idempotency renew",
                &renew_sql(&self.now_sql()),
                args,
                scope,
                key,
            )
            .await?;
        let held = row.is_some_and(|row| {
            row.status == Status::Processing && row.owner_token == ticket.owner_token
        });
        if !held {
            count(scope, "lease_lost");
        }
        Ok(held)
    }

    /// Mode 2: records that the ticket's request succeeded with `result`. Refused with
    /// [`IdempotencyError::StaleOwner`] (nothing written) when the ticket no longer holds
    /// the record, and with `result_too_large` when the body is over the bound. Calling it
    /// twice with the same ticket is fine.
    pub async fn complete(
        &self,
        ticket: &Ticket,
        result: StoredResult,
    ) -> Result<(), IdempotencyError> {
        self.check_result(&result)?;
        self.finish(ticket, End::with_result(Status::Succeeded, &result))
            .await
    }

    /// Mode 2: records that the request failed before it changed anything (a retry may
    /// cure it); the next request with this key re-claims it under a new owner token and
    /// runs it again. Only for failures known to have had no effect: otherwise
    /// [`mark_unknown`](Self::mark_unknown).
    pub async fn fail_retryable(&self, ticket: &Ticket) -> Result<(), IdempotencyError> {
        self.finish(ticket, End::bare(Status::FailedRetryable, None))
            .await
    }

    /// Mode 2: records that the request failed for good with `result`; every repeat gets it.
    pub async fn fail_final(
        &self,
        ticket: &Ticket,
        result: StoredResult,
    ) -> Result<(), IdempotencyError> {
        self.check_result(&result)?;
        self.finish(ticket, End::with_result(Status::FailedFinal, &result))
            .await
    }

    /// Mode 2: records that the run ended without a known outcome after it may have acted
    /// (`answered`: the status it answered, if it answered). The record becomes `UNKNOWN`:
    /// repeats ask the recovery hook, or answer "outcome unknown", and never run it again
    /// until the fact source says the effect did not happen.
    pub async fn mark_unknown(
        &self,
        ticket: &Ticket,
        answered: Option<u16>,
    ) -> Result<(), IdempotencyError> {
        self.finish(ticket, End::bare(Status::Unknown, answered))
            .await
    }

    async fn finish(&self, ticket: &Ticket, end: End<'_>) -> Result<(), IdempotencyError> {
        let (scope, key) = (ticket.scope.as_str(), ticket.key.as_str());
        let token = ticket.owner_token.as_str();
        let args = end_args(&end, token, scope, key, Status::Processing, token);
        let row = self
            .write_then_read(
                "idempotency finish",
                &end_sql(&self.now_sql(), ""),
                args,
                scope,
                key,
            )
            .await?;
        match row {
            Some(row) if row.owner_token == token && row.status == end.status => {
                match end.status {
                    Status::Succeeded => {}
                    Status::Unknown => count(scope, "ended_unknown"),
                    _ => count(scope, "failed"),
                }
                Ok(())
            }
            _ => {
                count(scope, "stale_owner");
                tracing::warn!(
                    scope,
                    "a late write of an idempotency record by a stale owner was refused"
                );
                Err(IdempotencyError::StaleOwner {
                    scope: scope.into(),
                    key: key.into(),
                })
            }
        }
    }

    /// Mode 1: claims (scope, key), runs `work` and records its result in ONE local
    /// transaction, so the business change and the record commit together; no
    /// `PROCESSING` row is ever committed. A concurrent repeat waits for the row's lock
    /// and then reads the stored result. A result status of 400 or more is stored as
    /// `FAILED_FINAL` (with whatever `work` wrote); a retryable failure must be an `Err`,
    /// which rolls everything back, record included.
    ///
    /// `work` must do its writes in the future it returns (it is called, and its future
    /// dropped unpolled, when the record answers instead); it may be called again when the
    /// transaction loses a lock conflict.
    pub async fn run_local<F, Fut>(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        work: F,
    ) -> Result<LocalOutcome, IdempotencyError>
    where
        F: FnMut(LocalTx<'static, DB>) -> Fut + Send,
        Fut: Future<Output = Result<StoredResult, ParticipantError>> + Send,
    {
        check_inputs(scope, key, hash)?;
        let work = Mutex::new(work);
        let work = &work;
        for _ in 0..RACE_ATTEMPTS {
            let token = new_owner_token();
            let step = run_local(&self.pool, self.retry, "idempotency local", |tx| {
                let token = token.clone();
                async move {
                    match self.claim_in(&tx, scope, key, hash, &token).await? {
                        Step::Raced => Ok(None),
                        Step::Done(Claim::Acquired(ticket)) => {
                            let pending = {
                                let mut work = work.lock().unwrap_or_else(|p| p.into_inner());
                                (*work)(tx.clone())
                            };
                            let result = pending.await?;
                            self.check_result(&result)
                                .map_err(|e| ParticipantError::internal(e.to_string()))?;
                            let status = if result.status >= 400 {
                                Status::FailedFinal
                            } else {
                                Status::Succeeded
                            };
                            // Our own uncommitted row, locked by this transaction: the
                            // UPDATE cannot miss it, so no read-back.
                            let token = ticket.owner_token.as_str();
                            let end = End::with_result(status, &result);
                            let args = end_args(&end, token, scope, key, Status::Processing, token);
                            exec(&tx, &end_sql(&self.now_sql(), ""), args).await?;
                            Ok(Some(LocalOutcome::First(result)))
                        }
                        Step::Done(other) => Ok(Some(LocalOutcome::Repeat(other))),
                    }
                }
            })
            .await?;
            match step {
                Some(LocalOutcome::First(result)) => {
                    count(scope, "first");
                    return Ok(LocalOutcome::First(result));
                }
                Some(LocalOutcome::Repeat(claim)) => {
                    count_claim(scope, &claim);
                    return Ok(LocalOutcome::Repeat(claim));
                }
                None => {}
            }
        }
        count(scope, "in_progress");
        Ok(LocalOutcome::Repeat(Claim::InProgress {
            retry_after: Duration::from_secs(1),
        }))
    }

    /// The record's status and attempts, if there is one (for waiting on a `PROCESSING`
    /// record, tests and operators); `None` when absent.
    pub async fn lookup(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Option<(Status, i64)>, IdempotencyError> {
        let rows = {
            let mut conn = self.pool.acquire().await?;
            DB::fetch_cells(
                &mut conn,
                DB::pool_dialect(&self.pool).rewrite(&format!(
                    "SELECT status, attempts FROM {TABLE} WHERE scope = ? AND idem_key = ?"
                )),
                vec![Arg::Text(scope.into()), Arg::Text(key.into())],
                &[CellKind::Text, CellKind::Int],
            )
            .await?
        };
        Ok(rows.first().and_then(|row| {
            let status = Status::parse(row[0].text()?)?;
            Some((status, row[1].int().unwrap_or(0)))
        }))
    }

    /// Runs one conditional write and reads the row back in the same local transaction:
    /// the caller decides by the owner token it finds, never by the affected-row count.
    pub(super) async fn write_then_read(
        &self,
        what: &'static str,
        sql: &str,
        args: Vec<Arg>,
        scope: &str,
        key: &str,
    ) -> Result<Option<Row>, ParticipantError> {
        run_local(&self.pool, self.retry, what, |tx| {
            let args = args.clone();
            async move {
                exec(&tx, sql, args).await?;
                read_row(&tx, &self.now_sql(), scope, key).await
            }
        })
        .await
    }

    pub(super) fn check_result(&self, result: &StoredResult) -> Result<(), IdempotencyError> {
        if result.body.len() > self.max_result_body {
            return Err(invalid(
                "result_too_large",
                format!(
                    "a result body of {} bytes is over the store's bound of {} bytes: it cannot be replayed, so it is not stored",
                    result.body.len(),
                    self.max_result_body
                ),
            ));
        }
        if result
            .resource_id
            .as_ref()
            .is_some_and(|id| id.chars().count() > MAX_RESOURCE_ID_LEN)
        {
            return Err(invalid(
                "invalid_resource_id",
                format!("a resource id has at most {MAX_RESOURCE_ID_LEN} characters"),
            ));
        }
        Ok(())
    }

    /// One claim attempt inside `tx`, writing `token` if it wins.
    async fn claim_in(
        &self,
        tx: &LocalTx<'static, DB>,
        scope: &str,
        key: &str,
        hash: &str,
        token: &str,
    ) -> Result<Step, ParticipantError> {
        let now = self.now_sql();
        if insert_if_absent(tx, &now, (scope, key, hash), token, self.lease_ms()).await? {
            return Ok(Step::Done(Claim::Acquired(Ticket {
                scope: scope.into(),
                key: key.into(),
                owner_token: token.into(),
                attempt: 1,
            })));
        }
        let Some(row) = read_row(tx, &now, scope, key).await? else {
            // Purged between the insert and the read: try again.
            return Ok(Step::Raced);
        };
        if row.request_hash != hash {
            return Ok(Step::Done(Claim::Conflict));
        }
        let claim = match row.status {
            Status::Succeeded => Claim::Replay(row.result()?),
            Status::FailedFinal => Claim::FailedFinal(row.result()?),
            Status::Processing | Status::Unknown => match row.unsettled(scope, key) {
                Some(expired) => Claim::Expired(expired),
                None => {
                    let left = row.lease_until_ms.unwrap_or(0) - row.now_ms;
                    Claim::InProgress {
                        retry_after: Duration::from_millis(u64::try_from(left).unwrap_or(0)),
                    }
                }
            },
            Status::FailedRetryable => {
                let sql = reclaim_sql(&now, "status = 'FAILED_RETRYABLE' AND version = ?");
                let args = vec![
                    Arg::Text(token.into()),
                    Arg::Int(self.lease_ms()),
                    Arg::Text(scope.into()),
                    Arg::Text(key.into()),
                    Arg::Int(row.version),
                ];
                exec(tx, &sql, args).await?;
                return Ok(match read_row(tx, &now, scope, key).await? {
                    Some(mine) if mine.owner_token == token => {
                        Step::Done(Claim::Acquired(Ticket {
                            scope: scope.into(),
                            key: key.into(),
                            owner_token: token.into(),
                            attempt: mine.attempts,
                        }))
                    }
                    _ => Step::Raced,
                });
            }
        };
        Ok(Step::Done(claim))
    }
}

fn count_claim(scope: &str, claim: &Claim) {
    let outcome = match claim {
        Claim::Acquired(t) if t.attempt == 1 => "first",
        Claim::Acquired(_) => "retry",
        Claim::Replay(_) => "replay",
        Claim::InProgress { .. } => "in_progress",
        Claim::Conflict => "conflict",
        Claim::Expired(_) => "expired",
        Claim::FailedFinal(_) => "failed_final",
    };
    count(scope, outcome);
}

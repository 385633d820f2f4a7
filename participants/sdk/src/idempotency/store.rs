//! The record protocol: claim, the end writes fenced by the owner token, recovery of an
//! expired claim, and mode 1 (everything in one local transaction).
//!
//! Every operation is one local transaction ([`crate::kit::run_local`]): on MySQL/MariaDB
//! (REPEATABLE READ) a plain read after a conditional UPDATE that matched nothing may show
//! the transaction's snapshot instead of the newest row, so "did my UPDATE win" is decided
//! by comparing the row's owner token with the fresh token this call just wrote: a snapshot
//! can never show a token nobody else knows. A lost race re-runs the whole transaction.

use std::sync::Mutex;
use std::time::Duration;

use sqlx::Pool;

use super::rows::{Row, end_args, end_sql, insert_if_absent, read_row};
use super::{
    Claim, ExpiredClaim, IdempotencyError, MAX_RESOURCE_ID_LEN, Recovery, RecoveryHook, Status,
    StoredResult, TABLE, Ticket, check_inputs, count, invalid,
};
use crate::backend::{Arg, BarrierDatabase, CellKind};
use crate::barrier::RetryPolicy;
use crate::error::ParticipantError;
use crate::kit::local::exec;
use crate::kit::{LocalTx, SharedClock, new_owner_token, run_local, system_clock};

/// How many times a claim re-runs after losing a race to another claim of the same record
/// before it answers "in progress" (each loss means someone else just changed the row).
const RACE_ATTEMPTS: u32 = 8;

/// The default lease of a mode-2 claim.
const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// The default bound of a stored result body, in bytes.
const DEFAULT_MAX_RESULT_BODY: usize = 64 * 1024;

/// Idempotency records in the service's database (table `idem_idempotency`, created by
/// [`create_idempotency_tables`](super::create_idempotency_tables)).
pub struct IdempotencyStore<DB: BarrierDatabase> {
    pool: Pool<DB>,
    clock: SharedClock,
    lease: Duration,
    max_result_body: usize,
    retry: RetryPolicy,
}

impl<DB: BarrierDatabase> Clone for IdempotencyStore<DB> {
    fn clone(&self) -> Self {
        IdempotencyStore {
            pool: self.pool.clone(),
            clock: self.clock.clone(),
            lease: self.lease,
            max_result_body: self.max_result_body,
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
    /// A store on `pool`, with the system clock, a 30 s lease and 64 KiB result bodies.
    pub fn new(pool: Pool<DB>) -> Self {
        IdempotencyStore {
            pool,
            clock: system_clock(),
            lease: DEFAULT_LEASE,
            max_result_body: DEFAULT_MAX_RESULT_BODY,
            retry: RetryPolicy::default(),
        }
    }

    /// Reads leases on `clock` (a `ManualClock` in tests).
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long a mode-2 claim holds the record before a repeat may ask the recovery hook.
    /// Longer than the handler's slowest run (its external call's timeout included).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The largest result body stored, in bytes; a larger one is refused (`result_too_large`).
    pub fn with_max_result_body(mut self, bytes: usize) -> Self {
        self.max_result_body = bytes;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }

    /// The clock.
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The lease of a mode-2 claim.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The largest stored result body, in bytes.
    pub fn max_result_body(&self) -> usize {
        self.max_result_body
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
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

    /// [`claim`](Self::claim), and when the lease of the record's owner ran out, asks
    /// `hook` what happened and settles the record accordingly ([`resolve_expired`](Self::resolve_expired)).
    pub async fn claim_with_recovery(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        hook: &dyn RecoveryHook,
    ) -> Result<Claim, IdempotencyError> {
        match self.claim(scope, key, hash).await? {
            Claim::Expired(expired) => {
                let recovery = hook.recover(&expired).await;
                self.resolve_expired(&expired, recovery).await
            }
            other => Ok(other),
        }
    }

    /// Settles an expired claim as the source of truth says: records the result
    /// (`Succeeded`, `FailedFinal`: answered as a replay), takes the record over under a
    /// new owner token (`NotHappened`: [`Claim::Acquired`], run it), or leaves it
    /// `PROCESSING` (`Unknown`: [`Claim::Expired`] again, answer "unknown, retry later").
    /// Each write names the expired owner's token, so of two repeats racing to recover one
    /// wins and the other answers from what the winner wrote.
    pub async fn resolve_expired(
        &self,
        expired: &ExpiredClaim,
        recovery: Recovery,
    ) -> Result<Claim, IdempotencyError> {
        let (scope, key) = (expired.scope.as_str(), expired.key.as_str());
        let token = new_owner_token();
        let now = self.clock.now_ms();
        let (sql, args, answer) = match recovery {
            Recovery::Unknown => {
                count(scope, "unknown");
                return Ok(Claim::Expired(expired.clone()));
            }
            Recovery::NotHappened => (
                format!(
                    "UPDATE {TABLE} SET owner_token = ?, lease_until_ms = ?, attempts = attempts + 1, version = version + 1, updated_at_ms = ? \
                     WHERE scope = ? AND idem_key = ? AND status = 'PROCESSING' AND owner_token = ? AND lease_until_ms <= ?"
                ),
                vec![
                    Arg::Text(token.clone()),
                    Arg::Int(now.saturating_add(self.lease_ms())),
                    Arg::Int(now),
                    Arg::Text(scope.into()),
                    Arg::Text(key.into()),
                    Arg::Text(expired.owner_token.clone()),
                    Arg::Int(now),
                ],
                None,
            ),
            Recovery::Succeeded(result) => {
                self.check_result(&result)?;
                let sql = end_sql("AND lease_until_ms <= ?");
                let mut args = end_args(Status::Succeeded, &token, &result, now, scope, key);
                args.push(Arg::Text(expired.owner_token.clone()));
                args.push(Arg::Int(now));
                (sql, args, Some(Claim::Replay(result)))
            }
            Recovery::FailedFinal(result) => {
                self.check_result(&result)?;
                let sql = end_sql("AND lease_until_ms <= ?");
                let mut args = end_args(Status::FailedFinal, &token, &result, now, scope, key);
                args.push(Arg::Text(expired.owner_token.clone()));
                args.push(Arg::Int(now));
                (sql, args, Some(Claim::FailedFinal(result)))
            }
        };
        let row = self
            .write_then_read("idempotency recovery", &sql, args, scope, key)
            .await?;
        match row {
            Some(row) if row.owner_token == token => {
                count(scope, "recovered");
                Ok(answer.unwrap_or(Claim::Acquired(Ticket {
                    scope: scope.into(),
                    key: key.into(),
                    owner_token: token,
                    attempt: row.attempts,
                })))
            }
            // Another repeat settled it first (or the row went): answer from what it wrote.
            _ => self.claim(scope, key, &expired.request_hash).await,
        }
    }

    /// Mode 2: records that the ticket's request succeeded with `result`. Refused with
    /// [`IdempotencyError::StaleOwner`] (nothing written) when the ticket no longer holds
    /// the record. Calling it twice with the same ticket is fine.
    pub async fn complete(
        &self,
        ticket: &Ticket,
        result: StoredResult,
    ) -> Result<(), IdempotencyError> {
        self.check_result(&result)?;
        self.finish(ticket, Status::Succeeded, Some(&result)).await
    }

    /// Mode 2: records that the request failed in a way a retry may cure; the next request
    /// with this key re-claims it under a new owner token and runs it again.
    pub async fn fail_retryable(&self, ticket: &Ticket) -> Result<(), IdempotencyError> {
        self.finish(ticket, Status::FailedRetryable, None).await
    }

    /// Mode 2: records that the request failed for good with `result`; every repeat gets it.
    pub async fn fail_final(
        &self,
        ticket: &Ticket,
        result: StoredResult,
    ) -> Result<(), IdempotencyError> {
        self.check_result(&result)?;
        self.finish(ticket, Status::FailedFinal, Some(&result))
            .await
    }

    async fn finish(
        &self,
        ticket: &Ticket,
        status: Status,
        result: Option<&StoredResult>,
    ) -> Result<(), IdempotencyError> {
        let (scope, key) = (ticket.scope.as_str(), ticket.key.as_str());
        let empty = StoredResult::default();
        let now = self.clock.now_ms();
        let sql = end_sql("");
        let mut args = end_args(
            status,
            &ticket.owner_token,
            result.unwrap_or(&empty),
            now,
            scope,
            key,
        );
        if result.is_none() {
            // A retryable failure keeps no result: the re-run's is the one that counts.
            args[1] = Arg::OptInt(None);
            args[2] = Arg::OptText(None);
            args[3] = Arg::OptText(None);
        }
        args.push(Arg::Text(ticket.owner_token.clone()));
        let row = self
            .write_then_read("idempotency finish", &sql, args, scope, key)
            .await?;
        match row {
            Some(row) if row.owner_token == ticket.owner_token && row.status == status => {
                if status != Status::Succeeded {
                    count(scope, "failed");
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
                            let mut args = end_args(
                                status,
                                &ticket.owner_token,
                                &result,
                                self.clock.now_ms(),
                                scope,
                                key,
                            );
                            args.push(Arg::Text(ticket.owner_token.clone()));
                            exec(&tx, &end_sql(""), args).await?;
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
    async fn write_then_read(
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
                read_row(&tx, scope, key).await
            }
        })
        .await
    }

    fn check_result(&self, result: &StoredResult) -> Result<(), IdempotencyError> {
        if result.body.len() > self.max_result_body {
            return Err(invalid(
                "result_too_large",
                format!(
                    "a result body of {} bytes is over the store's bound of {} bytes",
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
        let now = self.clock.now_ms();
        let lease_until = now.saturating_add(self.lease_ms());
        if insert_if_absent(tx, scope, key, hash, token, lease_until, now).await? {
            return Ok(Step::Done(Claim::Acquired(Ticket {
                scope: scope.into(),
                key: key.into(),
                owner_token: token.into(),
                attempt: 1,
            })));
        }
        let Some(row) = read_row(tx, scope, key).await? else {
            // Purged between the insert and the read: try again.
            return Ok(Step::Raced);
        };
        if row.request_hash != hash {
            return Ok(Step::Done(Claim::Conflict));
        }
        let claim = match row.status {
            Status::Succeeded => Claim::Replay(row.result()?),
            Status::FailedFinal => Claim::FailedFinal(row.result()?),
            Status::Processing => {
                let until = row.lease_until_ms.unwrap_or(0);
                if until > now {
                    let ms = u64::try_from(until - now).unwrap_or(0);
                    Claim::InProgress {
                        retry_after: Duration::from_millis(ms),
                    }
                } else {
                    Claim::Expired(ExpiredClaim {
                        scope: scope.into(),
                        key: key.into(),
                        request_hash: row.request_hash.clone(),
                        owner_token: row.owner_token.clone(),
                        attempt: row.attempts,
                        lease_until_ms: until,
                    })
                }
            }
            Status::FailedRetryable => {
                exec(
                    tx,
                    &format!(
                        "UPDATE {TABLE} SET status = 'PROCESSING', owner_token = ?, lease_until_ms = ?, attempts = attempts + 1, version = version + 1, updated_at_ms = ? \
                         WHERE scope = ? AND idem_key = ? AND status = 'FAILED_RETRYABLE' AND version = ?"
                    ),
                    vec![
                        Arg::Text(token.into()),
                        Arg::Int(lease_until),
                        Arg::Int(now),
                        Arg::Text(scope.into()),
                        Arg::Text(key.into()),
                        Arg::Int(row.version),
                    ],
                )
                .await?;
                return Ok(match read_row(tx, scope, key).await? {
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

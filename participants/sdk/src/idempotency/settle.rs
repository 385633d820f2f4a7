//! Settling the records nobody runs any more (an expired `PROCESSING` lease, an `UNKNOWN`
//! ending) from the service's fact source: on a repeat, by the [`Settler`](super::Settler),
//! or by an operator; listing them; and the backlog gauges.
//!
//! Every verdict is written by a conditional UPDATE naming the record's status and owner
//! token as they were seen (and, for `PROCESSING`, that the lease is still run out on the
//! store's clock), under a fresh owner token: of a repeat, the settler and an operator
//! settling one record at once, one write wins and the others find a token they do not
//! know, and the old owner's late end write is refused.

use std::time::Duration;

use super::rows::{End, end_args, end_sql, reclaim_sql};
use super::{
    Claim, ExpiredClaim, IdempotencyError, IdempotencyStore, PROCESSING_GAUGE,
    PROCESSING_OLDEST_GAUGE, Recovery, RecoveryHook, Status, TABLE, Ticket, UNKNOWN_GAUGE, count,
};
use crate::backend::{Arg, BarrierDatabase, Cell, CellKind};
use crate::kit::new_owner_token;

/// What [`IdempotencyStore::settle`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// The verdict was recorded: the record is now `SUCCEEDED`, `FAILED_FINAL`, or
    /// `FAILED_RETRYABLE` (the effect did not happen: the next request runs it).
    Recorded(Status),
    /// The fact source could not tell: the record stays as it was.
    StillUnknown,
    /// The record had moved on (settled by someone else, finished by its owner, purged):
    /// nothing written.
    Moved,
}

/// The records still open, as [`IdempotencyStore::backlog`] counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Records in `PROCESSING`.
    pub processing: u64,
    /// How long ago the oldest of them was claimed (zero when there is none).
    pub oldest_processing: Duration,
    /// Records in `UNKNOWN`.
    pub unknown: u64,
}

/// What the fact source's verdict does when it says the effect did not happen.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NotHappened {
    /// A repeat is waiting with the request: take the record over and run it.
    TakeOver,
    /// Nobody has the request at hand: leave it `FAILED_RETRYABLE` for the next repeat.
    Release,
}

const LIST_COLUMNS: &str = "id, scope, idem_key, request_hash, status, owner_token, lease_until_ms, result_status, attempts, updated_at_ms";
const LIST_KINDS: &[CellKind] = &[
    CellKind::Int,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Text,
    CellKind::Int,
    CellKind::Int,
    CellKind::Int,
    CellKind::Int,
];

impl<DB: BarrierDatabase> IdempotencyStore<DB> {
    /// [`claim`](Self::claim), and when nobody runs the record and its outcome is not
    /// recorded (an expired lease, an `UNKNOWN` ending), asks `hook` what happened and
    /// settles it accordingly ([`resolve_expired`](Self::resolve_expired)).
    pub async fn claim_with_recovery(
        &self,
        scope: &str,
        key: &str,
        hash: &str,
        hook: &dyn RecoveryHook,
    ) -> Result<Claim, IdempotencyError> {
        match self.claim(scope, key, hash).await? {
            Claim::Expired(expired) => {
                let recovery = self.ask(hook, &expired).await;
                match self.resolve_expired(&expired, recovery).await {
                    // A verdict the record cannot hold (a result over the bound) is no
                    // verdict: the outcome stays unknown, and the hook's bug is logged.
                    Err(IdempotencyError::Invalid { code, message }) => {
                        tracing::error!(%scope, code, %message,
                            "the recovery hook's answer cannot be recorded; the outcome stays unknown");
                        count(scope, "unknown");
                        Ok(Claim::Expired(expired))
                    }
                    other => other,
                }
            }
            other => Ok(other),
        }
    }

    /// Asks `hook` about `expired`, giving it the store's recovery timeout; no answer in
    /// time is [`Recovery::Unknown`].
    pub async fn ask(&self, hook: &dyn RecoveryHook, expired: &ExpiredClaim) -> Recovery {
        match tokio::time::timeout(self.recovery_timeout(), hook.recover(expired)).await {
            Ok(recovery) => recovery,
            Err(_) => {
                tracing::warn!(scope = %expired.scope, timeout = ?self.recovery_timeout(),
                    "the recovery hook did not answer in time; the outcome stays unknown");
                Recovery::Unknown
            }
        }
    }

    /// Settles an [`ExpiredClaim`] for the repeat that found it, as the source of truth
    /// says: records the result (`Succeeded`, `FailedFinal`: answered as a replay), takes
    /// the record over under a new owner token (`NotHappened`: [`Claim::Acquired`], run
    /// it), or leaves it as it is (`Unknown`: [`Claim::Expired`] again, answer "unknown,
    /// retry later"). Of two repeats racing to recover one record, one wins and the other
    /// answers from what the winner wrote.
    pub async fn resolve_expired(
        &self,
        expired: &ExpiredClaim,
        recovery: Recovery,
    ) -> Result<Claim, IdempotencyError> {
        let scope = expired.scope.as_str();
        let token = new_owner_token();
        let Some(won) = self
            .write_verdict(expired, &recovery, NotHappened::TakeOver, &token)
            .await?
        else {
            count(scope, "unknown");
            return Ok(Claim::Expired(expired.clone()));
        };
        let Some(attempt) = won else {
            // Another repeat settled it first (or the row went): answer from what it wrote.
            return self.claim(scope, &expired.key, &expired.request_hash).await;
        };
        count(scope, "recovered");
        Ok(match recovery {
            Recovery::Succeeded(result) => Claim::Replay(result),
            Recovery::FailedFinal(result) => Claim::FailedFinal(result),
            Recovery::NotHappened | Recovery::Unknown => Claim::Acquired(Ticket {
                scope: scope.into(),
                key: expired.key.clone(),
                owner_token: token,
                attempt,
            }),
        })
    }

    /// Records a verdict on an [`ExpiredClaim`] when no request is waiting (the
    /// [`Settler`](super::Settler), or an operator working through
    /// [`unsettled`](Self::unsettled)): `Succeeded` / `FailedFinal` are recorded and
    /// replayed to every repeat; `NotHappened` leaves the record `FAILED_RETRYABLE`, so the
    /// next repeat runs the request; `Unknown` changes nothing.
    pub async fn settle(
        &self,
        expired: &ExpiredClaim,
        recovery: Recovery,
    ) -> Result<Settled, IdempotencyError> {
        let token = new_owner_token();
        let written = self
            .write_verdict(expired, &recovery, NotHappened::Release, &token)
            .await?;
        Ok(match (written, recovery) {
            (None, _) => Settled::StillUnknown,
            (Some(None), _) => Settled::Moved,
            (Some(Some(_)), recovery) => {
                count(&expired.scope, "settled");
                Settled::Recorded(match recovery {
                    Recovery::Succeeded(_) => Status::Succeeded,
                    Recovery::FailedFinal(_) => Status::FailedFinal,
                    Recovery::NotHappened | Recovery::Unknown => Status::FailedRetryable,
                })
            }
        })
    }

    /// Writes `recovery` on `expired` under `token`: `None` for `Unknown` (nothing to
    /// write), `Some(None)` when the record had moved on, `Some(Some(attempt))` when this
    /// write won.
    async fn write_verdict(
        &self,
        expired: &ExpiredClaim,
        recovery: &Recovery,
        not_happened: NotHappened,
        token: &str,
    ) -> Result<Option<Option<i64>>, IdempotencyError> {
        let (scope, key) = (expired.scope.as_str(), expired.key.as_str());
        let now = self.now_sql();
        // The record is still the one the verdict is about: same status and owner, and a
        // PROCESSING lease still run out (its owner did not come back and renew it).
        let lease = if expired.status == Status::Processing {
            format!(" AND lease_until_ms <= {now}")
        } else {
            String::new()
        };
        let seen = (expired.status, expired.owner_token.as_str());
        let end = |end: End<'_>| {
            (
                end_sql(&now, &lease),
                end_args(&end, token, scope, key, seen.0, seen.1),
            )
        };
        let (sql, args) = match (recovery, not_happened) {
            (Recovery::Unknown, _) => return Ok(None),
            (Recovery::NotHappened, NotHappened::TakeOver) => (
                reclaim_sql(&now, &format!("status = ? AND owner_token = ?{lease}")),
                vec![
                    Arg::Text(token.into()),
                    Arg::Int(self.lease_ms()),
                    Arg::Text(scope.into()),
                    Arg::Text(key.into()),
                    Arg::Text(seen.0.as_str().into()),
                    Arg::Text(seen.1.into()),
                ],
            ),
            (Recovery::NotHappened, NotHappened::Release) => {
                end(End::bare(Status::FailedRetryable, None))
            }
            (Recovery::Succeeded(result), _) => {
                self.check_result(result)?;
                end(End::with_result(Status::Succeeded, result))
            }
            (Recovery::FailedFinal(result), _) => {
                self.check_result(result)?;
                end(End::with_result(Status::FailedFinal, result))
            }
        };
        let row = self
            .write_then_read("idempotency settle", &sql, args, scope, key)
            .await?;
        Ok(Some(
            row.filter(|row| row.owner_token == token)
                .map(|row| row.attempts),
        ))
    }

    /// The records an operator (or the settler) has to settle, oldest first, at most
    /// `limit`: every `UNKNOWN` record, and every `PROCESSING` one whose lease ran out.
    /// Settle one with [`settle`](Self::settle).
    pub async fn unsettled(&self, limit: u32) -> Result<Vec<ExpiredClaim>, IdempotencyError> {
        Ok(self
            .unsettled_after(0, limit)
            .await?
            .into_iter()
            .map(|(_, record)| record)
            .collect())
    }

    /// [`unsettled`](Self::unsettled) from the row id `after` on, with each row's id (the
    /// settler's cursor).
    pub(super) async fn unsettled_after(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, ExpiredClaim)>, IdempotencyError> {
        let now = self.now_sql();
        let sql = format!(
            "SELECT {LIST_COLUMNS} FROM {TABLE} \
             WHERE id > ? AND (status = 'UNKNOWN' OR (status = 'PROCESSING' AND lease_until_ms <= {now})) \
             ORDER BY id LIMIT {}",
            limit.max(1)
        );
        let rows = self.fetch(&sql, vec![Arg::Int(after)], LIST_KINDS).await?;
        Ok(rows
            .iter()
            .filter_map(|cells| {
                let text = |i: usize| cells[i].text().unwrap_or_default().to_owned();
                let status = Status::parse(cells[4].text()?)?;
                Some((
                    cells[0].int()?,
                    ExpiredClaim {
                        scope: text(1),
                        key: text(2),
                        request_hash: text(3),
                        owner_token: text(5),
                        attempt: cells[8].int().unwrap_or(1),
                        status,
                        lease_until_ms: cells[6].int(),
                        answered: cells[7].int().and_then(|s| u16::try_from(s).ok()),
                        since_ms: cells[9].int().unwrap_or(0),
                    },
                ))
            })
            .collect())
    }

    /// Counts the open records and sets the gauges [`PROCESSING_GAUGE`],
    /// [`PROCESSING_OLDEST_GAUGE`] and [`UNKNOWN_GAUGE`] from them (the [`Settler`] calls
    /// this on every pass).
    ///
    /// [`Settler`]: super::Settler
    pub async fn backlog(&self) -> Result<Backlog, IdempotencyError> {
        let now = self.now_sql();
        let sql = format!(
            "SELECT status, COUNT(*), MIN(updated_at_ms), MAX({now}) FROM {TABLE} \
             WHERE status IN ('PROCESSING', 'UNKNOWN') GROUP BY status"
        );
        let kinds = &[CellKind::Text, CellKind::Int, CellKind::Int, CellKind::Int];
        let mut backlog = Backlog::default();
        for cells in self.fetch(&sql, Vec::new(), kinds).await? {
            let n = u64::try_from(cells[1].int().unwrap_or(0)).unwrap_or(0);
            match cells[0].text().and_then(Status::parse) {
                Some(Status::Processing) => {
                    backlog.processing = n;
                    let oldest = cells[2].int().unwrap_or(0);
                    let age = cells[3].int().unwrap_or(oldest).saturating_sub(oldest);
                    backlog.oldest_processing =
                        Duration::from_millis(u64::try_from(age).unwrap_or(0));
                }
                Some(Status::Unknown) => backlog.unknown = n,
                _ => {}
            }
        }
        metrics::gauge!(PROCESSING_GAUGE).set(backlog.processing as f64);
        metrics::gauge!(PROCESSING_OLDEST_GAUGE).set(backlog.oldest_processing.as_secs_f64());
        metrics::gauge!(UNKNOWN_GAUGE).set(backlog.unknown as f64);
        Ok(backlog)
    }

    async fn fetch(
        &self,
        sql: &str,
        args: Vec<Arg>,
        kinds: &'static [CellKind],
    ) -> Result<Vec<Vec<Cell>>, IdempotencyError> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::fetch_cells(
            &mut conn,
            DB::pool_dialect(&self.pool).rewrite(sql),
            args,
            kinds,
        )
        .await?)
    }
}

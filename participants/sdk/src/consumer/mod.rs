//! The consumer log: a message handler that applies each business event once, however often
//! the broker delivers it (seed §16, §17).
//!
//! A broker delivers at least once: an ack lost after the business committed, a consumer
//! killed before it acked, a rebalance, an operator's replay, a producer that retried its
//! publish all hand the same event to a handler again (seed §3). [`ConsumerLog::handle`]
//! makes the repeat harmless:
//!
//! 1. it inserts the row `(consumer group, handler version, business event id)` into
//!    `idem_consumer_log`, in a local transaction ([`run_local`]);
//! 2. if the row already existed, the event was applied before: the business change is not
//!    run, the transaction commits nothing, and the answer is [`Handled::Duplicate`];
//! 3. otherwise the handler's business change runs in that same transaction, and the row and
//!    the change commit together, or roll back together when the handler fails.
//!
//! Both wrong orders of seed §17 are impossible: "logged but not applied" (an event lost
//! when the handler fails after the log was written) and "applied but not logged" (an event
//! applied twice when the consumer dies between the two commits).
//!
//! **Ack after `handle` returns `Ok`**, never before: a consumer that dies between the
//! commit and the ack gets the event again and answers it as a duplicate; one that acked
//! first and died before the commit has lost the event. On `Err` nothing was written: do not
//! ack (or nack it), and the broker redelivers. A [`ParticipantError::Refused`] is for good
//! (an invalid event id, or the handler's own refusal): ack or terminate it rather than let
//! it be redelivered for ever.
//!
//! The key is the **business event id** the producer put in the event, scoped by consumer
//! group and handler version, never the broker's message id (seed §16): a producer that
//! retries a publish gets a new message id for the same event. The broker's id is recorded
//! next to the row for diagnosis only. A new handler version is a new scope: bump it only
//! when the new handler must apply events the old one already applied (a replay on
//! purpose).
//!
//! What it does not do: make an external side effect (an HTTP call, a message to another
//! broker, a row in another database) exactly-once. Only what the handler writes through the
//! [`LocalTx`] commits with the log row; anything else needs its own idempotent key, an
//! outbox, or a saga step (seed §17's last rule).
//!
//! Retention ([`purge_consumer_log`]): a row must outlive every redelivery of its event: the
//! topic's retention, the longest replay an operator may run, the audit period (seed §24).
//! Purged earlier, a replayed event is applied again.
//!
//! Metrics (seed §28): [`CONSUMER_TOTAL`] by consumer group and outcome,
//! [`CONSUMER_PURGED_TOTAL`]. No event id is a label.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use sqlx::Pool;

use crate::backend::{Arg, BarrierDatabase, CellKind};
use crate::error::ParticipantError;
use crate::kit::{
    Clock, LocalTx, RetryPolicy, SharedClock, StepConnections, run_local, system_clock,
};

use crate::kit::{check_key, insert_if_absent, refuse_short_window, run_script};

/// The consumer log's table.
pub const CONSUMER_LOG_TABLE: &str = "idem_consumer_log";

const KEY_COLUMNS: &str = "consumer_group, handler_version, event_id";
const INSERT_COLUMNS: &str = "(consumer_group, handler_version, event_id, broker_message_id, processed_at_ms) VALUES (?, ?, ?, ?, ?)";
const SET_RESULT: &str = "UPDATE idem_consumer_log SET result = ? WHERE consumer_group = ? AND handler_version = ? AND event_id = ?";

/// Longest consumer group name.
pub const MAX_GROUP_LEN: usize = 128;
/// Longest handler version.
pub const MAX_HANDLER_VERSION_LEN: usize = 32;
/// Longest business event id.
pub const MAX_EVENT_ID_LEN: usize = 128;
/// Longest broker message id kept; a longer one is cut (it is only a diagnosis).
pub const MAX_BROKER_MESSAGE_ID_LEN: usize = 128;

/// The shortest retention [`purge_consumer_log`] accepts. Below a day, an ordinary
/// redelivery backlog (a consumer down overnight) outlives its log rows and is applied
/// twice; give the topic's retention or the replay range, whichever is longer.
pub const MIN_CONSUMER_LOG_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Events handled, by consumer group and outcome (`processed`, `duplicate`, `failed`).
pub const CONSUMER_TOTAL: &str = "idem_participant_consumer_total";
/// Consumer log rows deleted by retention.
pub const CONSUMER_PURGED_TOTAL: &str = "idem_participant_consumer_purged_total";

/// Gives this module's metrics their HELP text in the installed recorder.
pub fn describe() {
    metrics::describe_counter!(
        CONSUMER_TOTAL,
        "Events handled under the consumer log, by consumer group and outcome: processed, duplicate, failed."
    );
    metrics::describe_counter!(
        CONSUMER_PURGED_TOTAL,
        "Consumer log rows deleted by retention."
    );
}

/// What became of one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handled<T> {
    /// The first delivery of the event: the handler ran and its change committed with the
    /// log row. Carries what the handler returned.
    Processed(T),
    /// The event was applied before (by this or another instance): nothing ran.
    Duplicate,
}

impl<T> Handled<T> {
    /// True for [`Handled::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Handled::Duplicate)
    }
}

/// One row of the consumer log, for diagnosis and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// The business event id.
    pub event_id: String,
    /// The broker's id of the delivery that applied it (if the consumer gave one).
    pub broker_message_id: Option<String>,
    /// When it was applied, Unix milliseconds.
    pub processed_at_ms: i64,
    /// The handler's result as JSON, if it returned something other than `null`.
    pub result: Option<String>,
}

/// A consumer group's handler, applying each business event at most once.
#[derive(Clone)]
pub struct ConsumerLog {
    group: String,
    handler_version: String,
    clock: SharedClock,
    retry: RetryPolicy,
}

impl std::fmt::Debug for ConsumerLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerLog")
            .field("group", &self.group)
            .field("handler_version", &self.handler_version)
            .finish_non_exhaustive()
    }
}

impl ConsumerLog {
    /// The log of consumer group `group` (a configured name: it is also a metrics label)
    /// for handler version `handler_version`. Both must be 1 to 128 and 1 to 32 characters.
    pub fn new(
        group: impl Into<String>,
        handler_version: impl Into<String>,
    ) -> Result<ConsumerLog, ParticipantError> {
        let group = group.into();
        let handler_version = handler_version.into();
        check_key("consumer group", &group, MAX_GROUP_LEN)?;
        check_key("handler version", &handler_version, MAX_HANDLER_VERSION_LEN)?;
        Ok(ConsumerLog {
            group,
            handler_version,
            clock: system_clock(),
            retry: RetryPolicy::default(),
        })
    }

    /// Reads `processed_at_ms` from `clock` instead of the system clock.
    pub fn with_clock(mut self, clock: SharedClock) -> ConsumerLog {
        self.clock = clock;
        self
    }

    /// Retries lost lock conflicts under `retry` instead of the default policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> ConsumerLog {
        self.retry = retry;
        self
    }

    /// The consumer group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The handler version.
    pub fn handler_version(&self) -> &str {
        &self.handler_version
    }

    /// Applies business event `event_id` with `work`, once: see the [module](self) docs.
    ///
    /// `broker_message_id` is the broker's id of this delivery (the JetStream stream
    /// sequence, a Kafka offset), recorded for diagnosis, never part of the key. `work` runs
    /// inside the local transaction and must change nothing outside it: a lost lock conflict
    /// re-runs it. Its result is stored as JSON.
    ///
    /// An empty or too long `event_id` is [`ParticipantError::Refused`] (the event is
    /// malformed for good), with nothing written.
    pub async fn handle<S, T, F, Fut>(
        &self,
        pool: &S,
        event_id: &str,
        broker_message_id: Option<&str>,
        mut work: F,
    ) -> Result<Handled<T>, ParticipantError>
    where
        S: StepConnections,
        T: Serialize,
        F: FnMut(LocalTx<'static, S::Database>) -> Fut,
        Fut: Future<Output = Result<T, ParticipantError>>,
    {
        let result = async {
            check_key("event id", event_id, MAX_EVENT_ID_LEN)?;
            let broker = broker_message_id.map(|id| cut(id, MAX_BROKER_MESSAGE_ID_LEN));
            let key = self.key_args(event_id);
            run_local(pool, self.retry, "consumer log", |tx| {
                // Futures are lazy: the business change is only polled after the insert won.
                let business = work(tx.clone());
                let mut row = key.clone();
                row.push(Arg::OptText(broker.clone()));
                row.push(Arg::Int(self.clock.now_ms()));
                let key = key.clone();
                async move {
                    let first =
                        insert_if_absent(&tx, CONSUMER_LOG_TABLE, INSERT_COLUMNS, KEY_COLUMNS, row)
                            .await?;
                    if !first {
                        drop(business);
                        return Ok(Handled::Duplicate);
                    }
                    let value = business.await?;
                    let json = serde_json::to_string(&value).map_err(|e| {
                        ParticipantError::internal(format!("handler result is not JSON: {e}"))
                    })?;
                    if json != "null" {
                        let mut args = vec![Arg::Text(json)];
                        args.extend(key);
                        crate::kit::local::exec(&tx, SET_RESULT, args).await?;
                    }
                    Ok(Handled::Processed(value))
                }
            })
            .await
        }
        .await;
        let outcome = match &result {
            Ok(Handled::Processed(_)) => "processed",
            Ok(Handled::Duplicate) => "duplicate",
            Err(_) => "failed",
        };
        metrics::counter!(CONSUMER_TOTAL, "group" => self.group.clone(), "outcome" => outcome)
            .increment(1);
        result
    }

    /// The log row of `event_id` in this group and handler version, if it was applied.
    pub async fn record<S: StepConnections>(
        &self,
        pool: &S,
        event_id: &str,
    ) -> Result<Option<ConsumerRecord>, ParticipantError> {
        check_key("event id", event_id, MAX_EVENT_ID_LEN)?;
        let key = self.key_args(event_id);
        let rows = run_local(pool, self.retry, "consumer log read", |tx| {
            let key = key.clone();
            async move {
                Ok(crate::kit::local::fetch(
                    &tx,
                    "SELECT event_id, broker_message_id, processed_at_ms, result FROM idem_consumer_log WHERE consumer_group = ? AND handler_version = ? AND event_id = ?",
                    key,
                    &[CellKind::Text, CellKind::Text, CellKind::Int, CellKind::Text],
                )
                .await?)
            }
        })
        .await?;
        Ok(rows.into_iter().next().map(|row| ConsumerRecord {
            event_id: row[0].text().unwrap_or_default().to_owned(),
            broker_message_id: row[1].text().map(str::to_owned),
            processed_at_ms: row[2].int().unwrap_or_default(),
            result: row[3].text().map(str::to_owned),
        }))
    }

    fn key_args(&self, event_id: &str) -> Vec<Arg> {
        vec![
            Arg::Text(self.group.clone()),
            Arg::Text(self.handler_version.clone()),
            Arg::Text(event_id.to_owned()),
        ]
    }
}

/// Creates `idem_consumer_log` (if absent) on `pool`'s backend.
pub async fn create_consumer_tables<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<(), sqlx::Error> {
    run_script(
        pool,
        include_str!("../../sql/consumer.sqlite.sql"),
        include_str!("../../sql/consumer.postgres.sql"),
        include_str!("../../sql/consumer.mysql.sql"),
    )
    .await
}

/// Deletes consumer log rows applied more than `older_than` ago (by `clock`), `batch` rows
/// per statement; returns how many went.
///
/// Every row of the log is final (a row exists only once its event committed), so age is
/// the only test. A window shorter than [`MIN_CONSUMER_LOG_RETENTION`] is refused: the
/// window is the longest time the broker may still redeliver an event (seed §24).
pub async fn purge_consumer_log<DB: BarrierDatabase>(
    pool: &Pool<DB>,
    older_than: Duration,
    batch: u32,
    clock: &dyn Clock,
) -> Result<u64, ParticipantError> {
    refuse_short_window("consumer log", older_than, MIN_CONSUMER_LOG_RETENTION)?;
    let cutoff = clock
        .now_ms()
        .saturating_sub(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX));
    let deleted = crate::kit::delete_all_in_batches(
        pool,
        CONSUMER_LOG_TABLE,
        "processed_at_ms < ?",
        vec![Arg::Int(cutoff)],
        batch,
    )
    .await?;
    metrics::counter!(CONSUMER_PURGED_TOTAL).increment(deleted);
    Ok(deleted)
}

/// How big the consumer log is and how old its oldest row: with the retention window, the
/// cleanup lag (seed §28: table growth and cleanup delay). Counts the whole table; call it
/// from a periodic task, not per event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConsumerLogStats {
    /// Rows in the log.
    pub rows: u64,
    /// `processed_at_ms` of the oldest row, if any.
    pub oldest_processed_at_ms: Option<i64>,
}

/// Reads [`ConsumerLogStats`].
pub async fn consumer_log_stats<DB: BarrierDatabase>(
    pool: &Pool<DB>,
) -> Result<ConsumerLogStats, ParticipantError> {
    let mut conn = pool.acquire().await?;
    let sql = "SELECT COUNT(*), MIN(processed_at_ms) FROM idem_consumer_log".to_owned();
    let rows = DB::fetch_cells(&mut conn, sql, Vec::new(), &[CellKind::Int, CellKind::Int]).await?;
    let row = rows.first();
    Ok(ConsumerLogStats {
        rows: row
            .and_then(|r| r[0].int())
            .and_then(|n| u64::try_from(n).ok())
            .unwrap_or_default(),
        oldest_processed_at_ms: row.and_then(|r| r[1].int()),
    })
}

fn cut(value: &str, max: usize) -> String {
    value.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked_before_any_write() {
        assert!(ConsumerLog::new("", "v1").is_err());
        assert!(ConsumerLog::new("g", "v".repeat(33)).is_err());
        let log = ConsumerLog::new("g".repeat(128), "v".repeat(32)).expect("longest allowed");
        assert_eq!(log.handler_version().len(), 32);
        let err = check_key("event id", &"e".repeat(129), MAX_EVENT_ID_LEN).unwrap_err();
        assert!(err.is_refusal(), "{err}");
        assert!(
            check_key("event id", "é", 1).is_ok(),
            "characters, not bytes"
        );
    }

    #[test]
    fn a_long_broker_id_is_cut_not_refused() {
        assert_eq!(cut(&"m".repeat(200), 128).len(), 128);
        assert_eq!(cut("42", 128), "42");
    }
}

//! What the record protocol hands out and takes in: the states, the stored answer, the
//! claim's ticket, what a claim found, and the fact source's verdict.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::error::ParticipantError;

/// The values of the `status` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Claimed; the owner is running the request (mode 2) until its lease runs out.
    Processing,
    /// Finished; repeats get the stored result.
    Succeeded,
    /// Failed before anything happened; the next request re-claims under a new owner token
    /// and runs it again.
    FailedRetryable,
    /// Failed for good; repeats get the first failure again.
    FailedFinal,
    /// The run ended without a known outcome after the handler may have acted (a 5xx not
    /// marked "nothing happened", a panic, a client hang-up, an answer too large to store).
    /// Nobody runs it; the service's fact source ([`RecoveryHook`]) or an operator settles
    /// it, and until then every repeat is answered "outcome unknown", never run again.
    Unknown,
}

impl Status {
    /// The column text.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCEEDED",
            Status::FailedRetryable => "FAILED_RETRYABLE",
            Status::FailedFinal => "FAILED_FINAL",
            Status::Unknown => "UNKNOWN",
        }
    }

    /// Parses the column text.
    pub fn parse(text: &str) -> Option<Status> {
        [
            Status::Processing,
            Status::Succeeded,
            Status::FailedRetryable,
            Status::FailedFinal,
            Status::Unknown,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// The result a repeat is answered with: the first request's status, the headers the
/// service chose to keep, its body (any bytes, bounded by the store's maximum) and
/// optionally the id of the resource it created.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoredResult {
    /// The HTTP status (or any code the service uses).
    pub status: u16,
    /// Headers to replay, as (name, value).
    pub headers: Vec<(String, String)>,
    /// The body, replayed byte for byte.
    pub body: Vec<u8>,
    /// The created resource, if any (at most [`MAX_RESOURCE_ID_LEN`](super::MAX_RESOURCE_ID_LEN) characters).
    pub resource_id: Option<String>,
}

impl StoredResult {
    /// A result with a status and a body, no headers, no resource id.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> StoredResult {
        StoredResult {
            status,
            body: body.into(),
            ..StoredResult::default()
        }
    }

    /// The body as text, when it is UTF-8.
    pub fn body_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }
}

/// The right to run a request, won by a claim: who holds it (the owner token) and which
/// attempt this is. Every later write names the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// This owner's token (32 hex digits), written into the row by the claim.
    pub owner_token: String,
    /// 1 for the first run, +1 for each re-claim.
    pub attempt: i64,
}

/// A record nobody is running any more and whose outcome is not recorded: a `PROCESSING`
/// record whose lease ran out (its owner crashed, hung, or lost the database), or an
/// `UNKNOWN` one (its run ended after the handler may have acted). Whether its effect
/// happened is for the service's source of truth to say ([`RecoveryHook`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpiredClaim {
    /// The record's scope.
    pub scope: String,
    /// The record's key.
    pub key: String,
    /// The digest of the request the owner was running.
    pub request_hash: String,
    /// The owner token of the claim that expired or ended unknown.
    pub owner_token: String,
    /// Its attempt number.
    pub attempt: i64,
    /// [`Status::Processing`] (the lease ran out) or [`Status::Unknown`].
    pub status: Status,
    /// When its lease ran out, Unix ms on the store's clock (`None` for `UNKNOWN`).
    pub lease_until_ms: Option<i64>,
    /// The HTTP status the handler answered before the record became `UNKNOWN` (a 5xx,
    /// or a success too large to store); `None` after a panic, a hang-up or a crash.
    pub answered: Option<u16>,
    /// When the record last changed (its claim, or its unknown ending), Unix ms.
    pub since_ms: i64,
}

/// What a claim found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This caller won the right to run the request (first time, a re-claim of
    /// `FAILED_RETRYABLE`, or a takeover the recovery hook allowed).
    Acquired(Ticket),
    /// The request already succeeded: answer with its result (flagged as a replay).
    Replay(StoredResult),
    /// Another owner holds a live lease: answer 202 (or wait) and never run it again.
    InProgress {
        /// How long until the lease runs out.
        retry_after: std::time::Duration,
    },
    /// The key was used for another request (other digest): 409.
    Conflict,
    /// Nobody runs the request and its outcome is not recorded (an expired lease or an
    /// `UNKNOWN` record): ask the [`RecoveryHook`], or, when it could not tell or there is
    /// none, answer that the outcome is not known yet. Never run it again blindly.
    Expired(ExpiredClaim),
    /// The request failed for good: answer with the first failure again.
    FailedFinal(StoredResult),
}

/// What the service's source of truth says about an [`ExpiredClaim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// The effect happened: record this result and answer with it.
    Succeeded(StoredResult),
    /// The effect did not happen and will not: safe to run again, under a new owner token.
    NotHappened,
    /// The effect failed for good: record this failure and answer with it.
    FailedFinal(StoredResult),
    /// Cannot tell yet (the provider does not answer): the record stays as it is, and a
    /// repeat is answered "outcome unknown, retry later" (503).
    Unknown,
}

/// A boxed future, for [`RecoveryHook`] to stay usable as `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The service's way of finding out what happened to a request whose run ended without a
/// recorded outcome (§7, §13, §27: confirm the real state from the fact source, never a
/// blind re-run).
pub trait RecoveryHook: Send + Sync + 'static {
    /// Looks the request up in the source of truth (the service's own tables, the payment
    /// provider's query API, ...). Answer [`Recovery::NotHappened`] only when the source
    /// is sure the effect cannot still land (a provider idempotency key, an authoritative
    /// query): the request then runs again.
    fn recover<'a>(&'a self, expired: &'a ExpiredClaim) -> BoxFuture<'a, Recovery>;
}

/// One hook shared by the layer and the settler.
impl<T: RecoveryHook + ?Sized> RecoveryHook for Arc<T> {
    fn recover<'a>(&'a self, expired: &'a ExpiredClaim) -> BoxFuture<'a, Recovery> {
        (**self).recover(expired)
    }
}

/// What can go wrong with an idempotency record.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    /// Bad input (key, scope, digest or result too long or malformed): a 400-class answer.
    /// `code` is stable (`invalid_idempotency_key`, `invalid_scope`, `result_too_large`,
    /// ...).
    #[error("{code}: {message}")]
    Invalid {
        /// The stable error code.
        code: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The ticket's owner no longer holds the record: its lease ran out and another owner
    /// took over or recorded the outcome. Nothing was written.
    #[error("stale owner: the record {scope}/{key} is no longer held by this ticket")]
    StaleOwner {
        /// The record's scope.
        scope: String,
        /// The record's key.
        key: String,
    },
    /// The database failed (or another [`ParticipantError`]).
    #[error(transparent)]
    Store(#[from] ParticipantError),
}

impl From<sqlx::Error> for IdempotencyError {
    fn from(e: sqlx::Error) -> Self {
        IdempotencyError::Store(e.into())
    }
}

pub(crate) fn invalid(code: &'static str, message: impl Into<String>) -> IdempotencyError {
    IdempotencyError::Invalid {
        code,
        message: message.into(),
    }
}

//! Group commit: concurrent writes queued for one writer task, which runs as many as are
//! waiting in one transaction (one commit, one fsync, for all of them). SQLite has one
//! writer at a time; without this, concurrent writers would each wait for the lock and pay
//! a commit of their own.

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};

use tokio::sync::{mpsc, oneshot};

use crate::core::Transaction;
use crate::store::{AttemptRecord, Guard, Lease, Result, Save, Saved, StoreError};

/// Writes per shared commit, at most.
const GROUP_COMMIT_MAX: usize = 128;

/// Writes waiting for the writer task, at most.
const GROUP_COMMIT_QUEUE: usize = 1_024;

fn closed() -> StoreError {
    StoreError::Batch("the store's writer has stopped".into())
}

/// The queue of a store's writer task, made once; `None` if it exists already. Bounded:
/// when the disk falls behind, writers wait here (backpressure) instead of queueing without
/// limit in memory.
pub(super) fn queue(slot: &OnceLock<mpsc::Sender<Job>>) -> Option<mpsc::Receiver<Job>> {
    let (queue, jobs) = mpsc::channel::<Job>(GROUP_COMMIT_QUEUE);
    slot.set(queue).ok().map(|()| jobs)
}

/// Runs the writer task: takes the jobs waiting, up to [`GROUP_COMMIT_MAX`], and has
/// `write` run them in one transaction. Ends when `store` is dropped or the queue closes.
pub(super) fn spawn_writer<S, W, F>(store: Weak<S>, mut jobs: mpsc::Receiver<Job>, write: W)
where
    S: Send + Sync + 'static,
    W: Fn(Arc<S>, Vec<Job>) -> F + Send + 'static,
    F: Future<Output = (Vec<Job>, Result<Vec<JobResult>>)> + Send,
{
    tokio::spawn(async move {
        while let Some(first) = jobs.recv().await {
            let mut batch = vec![first];
            while batch.len() < GROUP_COMMIT_MAX {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let Some(store) = store.upgrade() else { return };
            match write(store.clone(), batch).await {
                (batch, Ok(results)) => {
                    for (job, result) in batch.into_iter().zip(results) {
                        job.answer(Ok(result));
                    }
                }
                // One bad write must not fail the others: retry each on its own.
                (batch, Err(_)) if batch.len() > 1 => {
                    for job in batch {
                        let (mut alone, result) = write(store.clone(), vec![job]).await;
                        let job = alone.pop().expect("the job written alone");
                        job.answer(result.map(|mut r| r.remove(0)));
                    }
                }
                // A batch of one: its own error, so the caller can tell a refused
                // write from a lost connection.
                (batch, Err(e)) => {
                    if let Some(job) = batch.into_iter().next() {
                        job.answer(Err(e));
                    }
                }
            }
        }
    });
}

/// Queues a create and waits for the writer's answer: true if inserted.
pub(super) async fn create(
    queue: &mpsc::Sender<Job>,
    tx: &Transaction,
    request_hash: &str,
    lease: Option<&Lease>,
) -> Result<bool> {
    let (reply, answer) = oneshot::channel();
    let job = Job::Create {
        tx: Box::new(tx.clone()),
        request_hash: request_hash.to_owned(),
        lease: lease.cloned(),
        reply,
    };
    queue.send(job).await.map_err(|_| closed())?;
    answer.await.map_err(|_| closed())?
}

/// Queues a save and waits for the writer's answer.
pub(super) async fn save(queue: &mpsc::Sender<Job>, save: &Save<'_>) -> Result<Saved> {
    let (reply, answer) = oneshot::channel();
    let job = Job::Save {
        save: Box::new(OwnedSave::of(save)),
        reply,
    };
    queue.send(job).await.map_err(|_| closed())?;
    answer.await.map_err(|_| closed())?
}

/// A write queued for the group-commit writer, with where to send its result.
pub enum Job {
    Create {
        tx: Box<Transaction>,
        request_hash: String,
        lease: Option<Lease>,
        reply: oneshot::Sender<Result<bool>>,
    },
    Save {
        save: Box<OwnedSave>,
        reply: oneshot::Sender<Result<Saved>>,
    },
}

/// What a job wrote, in the order of the batch.
pub enum JobResult {
    Created(bool),
    Saved(Saved),
}

impl Job {
    fn answer(self, result: Result<JobResult>) {
        match self {
            Job::Create { reply, .. } => {
                let _ = reply.send(result.map(|r| matches!(r, JobResult::Created(true))));
            }
            Job::Save { reply, .. } => {
                let _ = reply.send(result.map(|r| match r {
                    JobResult::Saved(s) => s,
                    JobResult::Created(_) => Saved::Lost,
                }));
            }
        }
    }
}

/// A [`Save`] that owns its data, to cross into the writer task.
pub struct OwnedSave {
    before: Transaction,
    after: Transaction,
    owner: Option<String>,
    version: i64,
    lease: Option<Lease>,
    attempts: Vec<AttemptRecord>,
}

impl OwnedSave {
    fn of(save: &Save<'_>) -> OwnedSave {
        let (owner, version) = match save.guard {
            Guard::Owner(token) => (Some(token.to_owned()), 0),
            Guard::Version(v) => (None, v),
        };
        OwnedSave {
            before: save.before.clone(),
            after: save.after.clone(),
            owner,
            version,
            lease: save.lease.cloned(),
            attempts: save.attempts.to_vec(),
        }
    }

    pub(super) fn borrow(&self) -> Save<'_> {
        Save {
            before: &self.before,
            after: &self.after,
            guard: match &self.owner {
                Some(token) => Guard::Owner(token),
                None => Guard::Version(self.version),
            },
            lease: self.lease.as_ref(),
            attempts: &self.attempts,
        }
    }
}

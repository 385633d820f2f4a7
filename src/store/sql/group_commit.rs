//! Group commit: concurrent writes queued for the store's writer tasks, each of which takes
//! as many as are waiting and writes them together: one commit (one WAL flush, one fsync)
//! for all of them, and on PostgreSQL one statement. Without it every saga step would be a
//! commit of its own: SQLite's writers would queue for its one lock, and a server would
//! spend a round trip, a statement and a commit record per step.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, mpsc, oneshot};

use crate::core::{Millis, Transaction};
use crate::store::{AttemptRecord, Guard, Lease, Result, Save, Saved, StoreError};

/// Writes per shared commit, at most.
pub(in crate::store) const GROUP_COMMIT_MAX: usize = 128;

/// Writes waiting for the writers, at most.
const GROUP_COMMIT_QUEUE: usize = 1_024;

fn closed() -> StoreError {
    StoreError::Batch("the store's writer has stopped".into())
}

/// How a store's writers run.
#[derive(Clone, Copy, Debug)]
pub struct WriterSettings {
    /// Writer tasks sharing the queue. SQLite: one (it has one writer at a time anyway).
    /// A server: a few, so that a batch is being collected while another is written.
    pub writers: usize,
    /// A batch not written within this is abandoned (its connection closed, never reused
    /// mid-statement) and its writes answered [`StoreError::TimedOut`], as ambiguous as a
    /// lost connection; `None`: no bound (SQLite, in this process).
    pub timeout: Option<Duration>,
}

/// The queue of a store's writers, made once; `None` if it exists already. Bounded: when
/// the database falls behind, writers wait here (backpressure) instead of queueing without
/// limit in memory.
pub(super) fn queue(slot: &OnceLock<mpsc::Sender<Job>>) -> Option<mpsc::Receiver<Job>> {
    let (queue, jobs) = mpsc::channel::<Job>(GROUP_COMMIT_QUEUE);
    slot.set(queue).ok().map(|()| jobs)
}

/// Runs the writer tasks: each takes the jobs waiting, up to [`GROUP_COMMIT_MAX`], at
/// most one per transaction, in the order of their gids (so two batches touching the same
/// rows lock them in the same order), and has `write` write them together. They end when
/// `store` is dropped or the queue closes.
pub(super) fn spawn_writers<S, W, F>(
    store: Weak<S>,
    jobs: mpsc::Receiver<Job>,
    settings: WriterSettings,
    write: W,
) where
    S: Send + Sync + 'static,
    W: Fn(Arc<S>, Arc<Vec<Work>>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<JobResult>>> + Send,
{
    let jobs = Arc::new(Mutex::new(jobs));
    let write = Arc::new(write);
    for _ in 0..settings.writers.max(1) {
        let (store, jobs, write) = (store.clone(), Arc::clone(&jobs), Arc::clone(&write));
        tokio::spawn(async move {
            let mut carried = Vec::new();
            while let Some(batch) = next_batch(&jobs, &mut carried).await {
                let Some(store) = store.upgrade() else { return };
                let started = Instant::now();
                let (works, replies): (Vec<Work>, Vec<Reply>) = batch
                    .into_iter()
                    .map(|j| {
                        crate::metrics::store_queued(started - j.queued);
                        (j.work, j.reply)
                    })
                    .unzip();
                let works = Arc::new(works);
                let written = bounded(settings.timeout, write(store.clone(), works.clone())).await;
                crate::metrics::store_batch(works.len(), started.elapsed());
                match written {
                    Ok(results) => {
                        for (reply, result) in replies.into_iter().zip(results) {
                            reply.send(Ok(result));
                        }
                    }
                    // One bad write must not fail the others: each again on its own.
                    Err(_) if replies.len() > 1 => {
                        for (work, reply) in works.iter().zip(replies) {
                            let alone = Arc::new(vec![work.clone()]);
                            let result =
                                bounded(settings.timeout, write(store.clone(), alone)).await;
                            reply.send(result.map(|mut r| r.remove(0)));
                        }
                    }
                    // A batch of one: its own error, so the caller can tell a refused
                    // write from a lost connection.
                    Err(e) => {
                        if let Some(reply) = replies.into_iter().next() {
                            reply.send(Err(e));
                        }
                    }
                }
            }
        });
    }
}

async fn bounded<T>(limit: Option<Duration>, write: impl Future<Output = Result<T>>) -> Result<T> {
    match limit {
        Some(limit) => tokio::time::timeout(limit, write)
            .await
            .unwrap_or(Err(StoreError::TimedOut(limit))),
        None => write.await,
    }
}

/// The next batch: the jobs carried over from the last one first, then those waiting;
/// a second job for a transaction already in the batch waits for the next. `None` once
/// the queue is closed and nothing is carried.
async fn next_batch(jobs: &Mutex<mpsc::Receiver<Job>>, carried: &mut Vec<Job>) -> Option<Vec<Job>> {
    let mut waiting = std::mem::take(carried);
    if waiting.is_empty() {
        let mut jobs = jobs.lock().await;
        waiting.push(jobs.recv().await?);
        drain(&mut jobs, &mut waiting);
    } else if let Ok(mut jobs) = jobs.try_lock() {
        // Only what is there already: the writer holding the queue may be waiting for the
        // next job, and the carried ones must not wait with it.
        drain(&mut jobs, &mut waiting);
    }
    let mut gids = HashSet::with_capacity(waiting.len());
    let mut batch = Vec::with_capacity(waiting.len());
    for job in waiting {
        if gids.insert(job.work.gid().to_owned()) {
            batch.push(job);
        } else {
            carried.push(job);
        }
    }
    batch.sort_by(|a, b| a.work.gid().cmp(b.work.gid()));
    Some(batch)
}

fn drain(jobs: &mut mpsc::Receiver<Job>, into: &mut Vec<Job>) {
    while into.len() < GROUP_COMMIT_MAX {
        match jobs.try_recv() {
            Ok(job) => into.push(job),
            Err(_) => break,
        }
    }
}

/// Queues a create and waits for the writer's answer: true if inserted.
pub(super) async fn create(
    queue: &mpsc::Sender<Job>,
    tx: &Transaction,
    request_hash: &str,
    lease: Option<&Lease>,
) -> Result<bool> {
    let work = Work::Create(Arc::new(OwnedCreate {
        tx: tx.clone(),
        request_hash: request_hash.to_owned(),
        lease: lease.cloned(),
    }));
    match submit(queue, work).await? {
        JobResult::Created(inserted) => Ok(inserted),
        _ => Err(StoreError::Batch(
            "a create answered as another write".into(),
        )),
    }
}

/// Queues a lease renewal (or, with `until` now, a release) and waits for the writer's
/// answer: false if `token` no longer owns the row.
pub(super) async fn renew(
    queue: &mpsc::Sender<Job>,
    gid: &str,
    token: &str,
    until: Millis,
) -> Result<bool> {
    let work = Work::Renew(Arc::new(Renewal {
        gid: gid.to_owned(),
        token: token.to_owned(),
        until,
    }));
    match submit(queue, work).await? {
        JobResult::Renewed(renewed) => Ok(renewed),
        _ => Err(StoreError::Batch(
            "a renewal answered as another write".into(),
        )),
    }
}

/// Queues a save and waits for the writer's answer.
pub(super) async fn save(queue: &mpsc::Sender<Job>, save: &Save<'_>) -> Result<Saved> {
    let work = Work::Save(Arc::new(OwnedSave::of(save)));
    match submit(queue, work).await? {
        JobResult::Saved(saved) => Ok(saved),
        _ => Err(StoreError::Batch("a save answered as another write".into())),
    }
}

async fn submit(queue: &mpsc::Sender<Job>, work: Work) -> Result<JobResult> {
    let op = match work {
        Work::Create(_) => "create",
        Work::Save(_) => "save",
        Work::Renew(_) => "renew",
    };
    let (reply, answer) = oneshot::channel();
    let queued = Instant::now();
    let job = Job {
        work,
        reply: Reply(reply),
        queued,
    };
    queue.send(job).await.map_err(|_| closed())?;
    let result = answer.await.map_err(|_| closed())?;
    crate::metrics::store_write(op, queued.elapsed());
    result
}

/// A write queued for the writers, with where to send its result.
pub struct Job {
    work: Work,
    reply: Reply,
    /// When it was queued: what waiting for the writers cost it.
    queued: Instant,
}

struct Reply(oneshot::Sender<Result<JobResult>>);

impl Reply {
    fn send(self, result: Result<JobResult>) {
        // The caller may have stopped waiting (its call was cut); the write stands.
        let _ = self.0.send(result);
    }
}

/// What one queued job writes. Cheap to clone: a write retried on its own after its
/// batch failed is the same data.
#[derive(Clone)]
pub enum Work {
    Create(Arc<OwnedCreate>),
    Save(Arc<OwnedSave>),
    Renew(Arc<Renewal>),
}

impl Work {
    /// The transaction it writes.
    pub fn gid(&self) -> &str {
        match self {
            Work::Create(c) => &c.tx.gid,
            Work::Save(s) => &s.after.gid,
            Work::Renew(r) => &r.gid,
        }
    }
}

/// Each write's result, from the gids its batch wrote: a create inserted, a save
/// matched. A batch holds one write per transaction, so a gid names one write.
pub(in crate::store) fn results(works: &[Work], written: &HashSet<String>) -> Vec<JobResult> {
    works
        .iter()
        .map(|work| {
            let matched = written.contains(work.gid());
            match work {
                Work::Create(_) => JobResult::Created(matched),
                Work::Save(_) => JobResult::Saved(if matched { Saved::Saved } else { Saved::Lost }),
                Work::Renew(_) => JobResult::Renewed(matched),
            }
        })
        .collect()
}

/// What a job wrote, in the order of the batch.
pub enum JobResult {
    Created(bool),
    Saved(Saved),
    Renewed(bool),
}

/// A lease renewal: the row's lease runs to `until` if `token` still owns it.
pub struct Renewal {
    pub gid: String,
    pub token: String,
    pub until: Millis,
}

/// A create that owns its data, to cross into a writer task.
pub struct OwnedCreate {
    pub tx: Transaction,
    pub request_hash: String,
    pub lease: Option<Lease>,
}

/// A [`Save`] that owns its data, to cross into a writer task.
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

    pub fn borrow(&self) -> Save<'_> {
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

//! Group commit: concurrent writes queued for the store's writer tasks, each of which takes
//! as many as are waiting and writes them together: one commit (one WAL flush, one fsync)
//! for all of them, and on PostgreSQL one statement. Without it every saga step would be a
//! commit of its own: SQLite's writers would queue for its one lock, and a server would
//! spend a round trip, a statement and a commit record per step.
//!
//! Three rules keep a write from landing where it must not:
//! - a write whose caller stopped waiting (its call was cut, it got `TimedOut`) is dropped
//!   from the queue, never written later: the caller has moved on and may have written
//!   something newer since;
//! - two writers never hold writes of the same transaction at once, so their batches touch
//!   disjoint rows and cannot deadlock each other, and each batch takes its rows in gid
//!   order;
//! - lease renewals and releases go ahead of creates and saves and are not held back by
//!   the queue's bound: a backlog of saves must not let a live driver's lease lapse.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};

use crate::{AttemptRecord, Guard, Lease, Result, Save, Saved, StoreError};
use idem_core::{Millis, Transaction};

/// Writes per shared commit, at most.
pub(crate) const GROUP_COMMIT_MAX: usize = 128;

/// Creates and saves waiting for the writers, at most; more wait to be queued
/// (backpressure) instead of queueing without limit in memory.
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

/// The queue of a store's writers. The store holds it; dropping the store closes it and
/// the writers end.
pub struct Queue {
    shared: Arc<Shared>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.shared.state.lock().expect("poisoned").closed = true;
        self.shared.ready.notify_waiters();
    }
}

struct Shared {
    state: Mutex<State>,
    /// A job was queued, a writer finished a batch, or the queue closed.
    ready: Notify,
    /// Room for creates and saves (see [`GROUP_COMMIT_QUEUE`]).
    room: Arc<Semaphore>,
}

#[derive(Default)]
struct State {
    /// Lease renewals and releases: taken first.
    leases: VecDeque<Job>,
    writes: VecDeque<Job>,
    /// Transactions in a batch being written by some writer.
    in_flight: HashSet<Arc<str>>,
    closed: bool,
}

impl Queue {
    /// A new, empty queue; [`spawn_writers`] starts the tasks that write what it holds.
    pub(super) fn new() -> Queue {
        Queue {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                ready: Notify::new(),
                room: Arc::new(Semaphore::new(GROUP_COMMIT_QUEUE)),
            }),
        }
    }
}

/// Runs the writer tasks: each takes the jobs waiting, up to [`GROUP_COMMIT_MAX`], at
/// most one per transaction and none of a transaction another writer holds, in the order
/// of their gids, and has `write` write them together. They end when `store` is dropped or
/// the queue closes.
pub(super) fn spawn_writers<S, W, F>(
    store: Weak<S>,
    queue: &Queue,
    settings: WriterSettings,
    write: W,
) where
    S: Send + Sync + 'static,
    W: Fn(Arc<S>, Arc<Vec<Work>>) -> F + Send + Sync + 'static,
    F: Future<Output = Result<Vec<JobResult>>> + Send,
{
    let write = Arc::new(write);
    for _ in 0..settings.writers.max(1) {
        let (store, shared, write) = (store.clone(), Arc::clone(&queue.shared), Arc::clone(&write));
        tokio::spawn(async move {
            while let Some(batch) = shared.next_batch().await {
                let Some(store) = store.upgrade() else { return };
                let gids: Vec<Arc<str>> = batch.iter().map(|j| j.gid.clone()).collect();
                write_batch(&*write, store, batch, settings.timeout).await;
                shared.done(&gids);
            }
        });
    }
}

/// Writes one batch and answers its callers. A failed batch is written again one write at
/// a time, for the callers still waiting only, so one bad write fails only itself.
async fn write_batch<S, W, F>(write: &W, store: Arc<S>, batch: Vec<Job>, limit: Option<Duration>)
where
    W: Fn(Arc<S>, Arc<Vec<Work>>) -> F,
    F: Future<Output = Result<Vec<JobResult>>>,
{
    let started = Instant::now();
    let (works, replies): (Vec<Work>, Vec<Reply>) = batch
        .into_iter()
        .map(|j| {
            crate::metrics::queued(started - j.queued);
            (j.work, j.reply)
        })
        .unzip();
    let works = Arc::new(works);
    let written = bounded(limit, write(store.clone(), works.clone())).await;
    crate::metrics::batch(works.len(), started.elapsed());
    match written {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                reply.send(Ok(result));
            }
        }
        Err(_) if replies.len() > 1 => {
            for (work, reply) in works.iter().zip(replies) {
                if reply.abandoned() {
                    continue;
                }
                let alone = Arc::new(vec![work.clone()]);
                let result = bounded(limit, write(store.clone(), alone)).await;
                reply.send(result.map(|mut r| r.remove(0)));
            }
        }
        // A batch of one: its own error, so the caller can tell a refused write from a
        // lost connection.
        Err(e) => {
            if let Some(reply) = replies.into_iter().next() {
                reply.send(Err(e));
            }
        }
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

impl Shared {
    /// The next batch, marked in flight; `None` once the queue is closed.
    async fn next_batch(&self) -> Option<Vec<Job>> {
        loop {
            let ready = self.ready.notified();
            tokio::pin!(ready);
            // Registered before looking, so a job queued in between is not missed.
            ready.as_mut().enable();
            {
                let mut state = self.state.lock().expect("poisoned");
                if state.closed {
                    return None;
                }
                let batch = state.take_batch();
                if !batch.is_empty() {
                    return Some(batch);
                }
            }
            ready.await;
        }
    }

    /// A writer wrote these: other writers may take their transactions' next writes.
    fn done(&self, gids: &[Arc<str>]) {
        let mut state = self.state.lock().expect("poisoned");
        for gid in gids {
            state.in_flight.remove(gid);
        }
        drop(state);
        self.ready.notify_waiters();
    }

    fn push(&self, job: Job) -> Result<()> {
        let mut state = self.state.lock().expect("poisoned");
        if state.closed {
            return Err(closed());
        }
        match job.work {
            Work::Renew(_) => state.leases.push_back(job),
            _ => state.writes.push_back(job),
        }
        drop(state);
        self.ready.notify_one();
        Ok(())
    }
}

impl State {
    /// Takes the leases first, then the other writes, in the order they came, skipping a
    /// transaction already in this batch or in another writer's (its job stays queued, in
    /// place); drops the jobs whose callers stopped waiting. Sorted by gid.
    fn take_batch(&mut self) -> Vec<Job> {
        let mut batch: Vec<Job> = Vec::new();
        let mut taken: HashSet<Arc<str>> = HashSet::new();
        for queue in [&mut self.leases, &mut self.writes] {
            let mut kept = VecDeque::with_capacity(queue.len());
            while let Some(job) = queue.pop_front() {
                if job.reply.abandoned() {
                    continue;
                }
                if batch.len() >= GROUP_COMMIT_MAX
                    || self.in_flight.contains(&job.gid)
                    || taken.contains(&job.gid)
                {
                    kept.push_back(job);
                    continue;
                }
                taken.insert(job.gid.clone());
                batch.push(job);
            }
            *queue = kept;
        }
        self.in_flight.extend(taken);
        batch.sort_by(|a, b| a.gid.cmp(&b.gid));
        batch
    }
}

/// Queues a create and waits for the writer's answer: true if inserted.
pub(super) async fn create(
    queue: &Queue,
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

/// Queues a lease renewal (or with `release`, a release: the lease ends at `until`, even
/// if that is sooner than it ran) and waits for the writer's answer: false if `token` no
/// longer owns the row. A renewal never shortens a lease: one that lands after a later
/// renewal leaves the later one standing.
pub(super) async fn renew(
    queue: &Queue,
    gid: &str,
    token: &str,
    until: Millis,
    release: bool,
) -> Result<bool> {
    let work = Work::Renew(Arc::new(Renewal {
        gid: gid.to_owned(),
        token: token.to_owned(),
        until,
        release,
    }));
    match submit(queue, work).await? {
        JobResult::Renewed(renewed) => Ok(renewed),
        _ => Err(StoreError::Batch(
            "a renewal answered as another write".into(),
        )),
    }
}

/// Queues a save and waits for the writer's answer.
pub(super) async fn save(queue: &Queue, save: &Save<'_>) -> Result<Saved> {
    let work = Work::Save(Arc::new(OwnedSave::of(save)));
    match submit(queue, work).await? {
        JobResult::Saved(saved) => Ok(saved),
        _ => Err(StoreError::Batch("a save answered as another write".into())),
    }
}

async fn submit(queue: &Queue, work: Work) -> Result<JobResult> {
    let op = match work {
        Work::Create(_) => "create",
        Work::Save(_) => "save",
        Work::Renew(_) => "renew",
    };
    let shared = &queue.shared;
    // Leases are not held back by the bound: there is at most one per live driver.
    let room = match work {
        Work::Renew(_) => None,
        _ => Some(
            Arc::clone(&shared.room)
                .acquire_owned()
                .await
                .map_err(|_| closed())?,
        ),
    };
    let (reply, answer) = oneshot::channel();
    let queued = Instant::now();
    shared.push(Job {
        gid: work.gid().into(),
        work,
        reply: Reply(reply),
        queued,
        _room: room,
    })?;
    let result = answer.await.map_err(|_| closed())?;
    crate::metrics::write(op, queued.elapsed());
    result
}

/// A write queued for the writers, with where to send its result.
pub struct Job {
    gid: Arc<str>,
    work: Work,
    reply: Reply,
    /// When it was queued: what waiting for the writers cost it.
    queued: Instant,
    /// Its place in the queue's bound, given back when the job is taken or dropped.
    _room: Option<OwnedSemaphorePermit>,
}

struct Reply(oneshot::Sender<Result<JobResult>>);

impl Reply {
    fn send(self, result: Result<JobResult>) {
        // The caller may have stopped waiting while its write was in flight: it was told
        // `TimedOut`, an unknown outcome, and the guards of its next write see to the rest.
        let _ = self.0.send(result);
    }

    /// The caller stopped waiting (its call was cut): the write must not be made now.
    fn abandoned(&self) -> bool {
        self.0.is_closed()
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
pub(crate) fn results(works: &[Work], written: &HashSet<String>) -> Vec<JobResult> {
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

/// A lease renewal: the row's lease runs to `until` (or later, if a later renewal landed
/// first) if `token` still owns it; a release ends it at `until`.
pub struct Renewal {
    pub gid: String,
    pub token: String,
    pub until: Millis,
    pub release: bool,
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
            Guard::Owner(token, version) => (Some(token.to_owned()), version),
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
                Some(token) => Guard::Owner(token, self.version),
                None => Guard::Version(self.version),
            },
            lease: self.lease.as_ref(),
            attempts: &self.attempts,
        }
    }
}

#[cfg(test)]
mod tests;

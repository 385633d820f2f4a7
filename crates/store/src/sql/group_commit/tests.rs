//! The writers' queue with a stand-in for the database: which writes reach a batch, and
//! when. The stand-in records each batch's gids and holds the batch until the test opens
//! the gate of its first gid.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};

use super::*;
use idem_core::{Kind, TxOptions};

/// A writer's stand-in: reports each batch's gids, then waits for a permit of the gate of
/// the batch's first gid.
struct Database {
    batches: mpsc::UnboundedSender<Vec<String>>,
    gates: Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
}

impl Database {
    fn gate(&self, gid: &str) -> Arc<Semaphore> {
        let mut gates = self.gates.lock().expect("poisoned");
        Arc::clone(
            gates
                .entry(gid.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(0))),
        )
    }

    fn open(&self, gid: &str) {
        self.gate(gid).add_permits(1);
    }
}

fn start(writers: usize) -> (Queue, Arc<Database>, mpsc::UnboundedReceiver<Vec<String>>) {
    let (batches, seen) = mpsc::unbounded_channel();
    let db = Arc::new(Database {
        batches,
        gates: Mutex::default(),
    });
    let queue = Queue::new();
    let settings = WriterSettings {
        writers,
        timeout: None,
    };
    spawn_writers(
        Arc::downgrade(&db),
        &queue,
        settings,
        |db: Arc<Database>, works| async move {
            let gids: Vec<String> = works.iter().map(|w| w.gid().to_owned()).collect();
            let gate = db.gate(&gids[0]);
            db.batches.send(gids).expect("the test listens");
            gate.acquire().await.expect("open").forget();
            let written: HashSet<String> = works.iter().map(|w| w.gid().to_owned()).collect();
            Ok(results(&works, &written))
        },
    );
    (queue, db, seen)
}

fn create(queue: &Arc<Queue>, gid: &str) -> tokio::task::JoinHandle<Result<bool>> {
    let queue = Arc::clone(queue);
    let tx = Transaction::prepared(gid, Kind::Tcc, TxOptions::default(), 0);
    tokio::spawn(async move { super::create(&queue, &tx, "h", None).await })
}

fn renew(queue: &Arc<Queue>, gid: &str) -> tokio::task::JoinHandle<Result<bool>> {
    let queue = Arc::clone(queue);
    let gid = gid.to_owned();
    tokio::spawn(async move { super::renew(&queue, &gid, "t", 1, false).await })
}

/// Until the queue holds `n` jobs.
async fn queued(queue: &Queue, n: usize) {
    loop {
        let held = {
            let state = queue.shared.state.lock().expect("poisoned");
            state.leases.len() + state.writes.len()
        };
        if held >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_write_whose_caller_stopped_waiting_is_never_written() {
    let (queue, db, mut seen) = start(1);
    let queue = Arc::new(queue);
    let first = create(&queue, "a");
    assert_eq!(seen.recv().await.unwrap(), vec!["a"]);
    // The writer is busy with "a": "b" waits in the queue, and its caller gives up.
    let abandoned = create(&queue, "b");
    queued(&queue, 1).await;
    abandoned.abort();
    assert!(abandoned.await.unwrap_err().is_cancelled());
    let kept = create(&queue, "c");
    queued(&queue, 2).await;
    db.open("a");
    assert!(first.await.unwrap().unwrap());
    assert_eq!(seen.recv().await.unwrap(), vec!["c"], "b was dropped");
    db.open("c");
    assert!(kept.await.unwrap().unwrap());
}

#[tokio::test]
async fn two_writers_never_hold_writes_of_one_transaction_at_once() {
    let (queue, db, mut seen) = start(2);
    let queue = Arc::new(queue);
    let first = create(&queue, "g");
    assert_eq!(seen.recv().await.unwrap(), vec!["g"]);
    // The second writer is free, but "g" is in the first one's batch: its renewal waits,
    // and a write of another transaction goes ahead of it.
    let same = renew(&queue, "g");
    queued(&queue, 1).await;
    let other = create(&queue, "h");
    assert_eq!(seen.recv().await.unwrap(), vec!["h"]);
    db.open("h");
    assert!(other.await.unwrap().unwrap());
    assert!(
        tokio::time::timeout(Duration::from_millis(50), seen.recv())
            .await
            .is_err(),
        "the renewal of g waits for g's batch"
    );
    db.open("g");
    assert!(first.await.unwrap().unwrap());
    assert_eq!(seen.recv().await.unwrap(), vec!["g"]);
    db.open("g");
    assert!(same.await.unwrap().unwrap());
}

#[tokio::test]
async fn leases_go_ahead_of_a_backlog_of_other_writes() {
    let (queue, db, mut seen) = start(1);
    let queue = Arc::new(queue);
    let busy = create(&queue, "busy");
    assert_eq!(seen.recv().await.unwrap(), vec!["busy"]);
    let backlog: Vec<_> = (0..GROUP_COMMIT_MAX + 10)
        .map(|i| create(&queue, &format!("w{i:04}")))
        .collect();
    queued(&queue, GROUP_COMMIT_MAX + 10).await;
    let lease = renew(&queue, "z-lease");
    queued(&queue, GROUP_COMMIT_MAX + 11).await;
    db.open("busy");
    busy.await.unwrap().unwrap();
    let next = seen.recv().await.unwrap();
    assert_eq!(next.len(), GROUP_COMMIT_MAX);
    assert!(
        next.contains(&"z-lease".to_owned()),
        "the renewal is in the first batch"
    );
    let mut sorted = next.clone();
    sorted.sort();
    assert_eq!(next, sorted, "a batch takes its rows in gid order");
    db.open(&next[0]);
    let rest = seen.recv().await.unwrap();
    db.open(&rest[0]);
    lease.await.unwrap().unwrap();
    for write in backlog {
        write.await.unwrap().unwrap();
    }
}

//! Retention on SQLite, PostgreSQL and MariaDB: finished transactions past the window go,
//! with their branch and attempt rows; unfinished, stalled and young ones stay, while
//! coordinators run a load and retention passes at the same time.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use idem::core::*;
use idem::retention::{ROWS_DELETED, RetentionConfig};
use idem::store::*;
use idem_client::Status as ClientStatus;
use sqlx::AnyPool;

const DAY: Millis = 86_400_000;
/// Saga steps per seeded transaction: two branch rows each (action, compensation).
const STEPS: usize = 2;

fn saga(gid: &str, base: &str, at: Millis) -> Transaction {
    let steps = (0..STEPS)
        .map(|i| SagaStep {
            action: format!("{base}/a{i}"),
            compensate: format!("{base}/c{i}"),
            payload: format!("{{\"i\":{i}}}").into(),
        })
        .collect();
    Transaction::saga(gid, steps, TxOptions::default(), at)
}

/// Stores a saga created at `at` in `status`, with `finished_at`, one attempt row if
/// `attempt`, and (if `owner`) a lease far in the future held by nobody here, so no
/// coordinator drives it.
async fn seed(
    store: &dyn Store,
    gid: &str,
    status: Status,
    (at, finished_at): (Millis, Option<Millis>),
    owner: bool,
    attempt: bool,
) {
    let mut tx = saga(gid, "http://127.0.0.1:9", at);
    tx.status = status;
    tx.finished_at = finished_at;
    tx.next_attempt_at = (!status.is_terminal() && status != Status::Stalled).then_some(at);
    let far = Lease {
        token: "someone-else".into(),
        until: at + 365 * DAY,
    };
    assert_eq!(
        store.create(&tx, "h", owner.then_some(&far)).await.unwrap(),
        Created::Inserted
    );
    if attempt {
        add_attempt(store, &tx).await;
    }
}

async fn add_attempt(store: &dyn Store, tx: &Transaction) {
    let mut after = tx.clone();
    after.attempts += 1;
    let record = AttemptRecord {
        number: 1,
        branch_id: tx.branches[0].branch_id.to_string(),
        action: Action::Action,
        attempt: 1,
        started_at: tx.created_at,
        duration_ms: 3,
        outcome: "unknown".into(),
        detail: None,
    };
    let saved = store
        .save(Save {
            before: tx,
            after: &after,
            guard: Guard::Version(0),
            lease: None,
            attempts: &[record],
        })
        .await
        .unwrap();
    assert_eq!(saved, Saved::Saved, "{}", tx.gid);
}

/// Rows of `table` whose gid starts with `prefix`.
async fn rows(pool: &AnyPool, table: &str, prefix: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE gid LIKE '{prefix}%'"
    )))
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn counts(pool: &AnyPool, prefix: &str) -> [i64; 3] {
    [
        rows(pool, "idem_global", prefix).await,
        rows(pool, "idem_branch", prefix).await,
        rows(pool, "idem_attempt", prefix).await,
    ]
}

/// The retention counter by table, from this process's metrics.
fn deleted_metric() -> [u64; 3] {
    let text = idem::metrics::render();
    ["global", "branch", "attempt"].map(|table| {
        let series = format!("{ROWS_DELETED}{{table=\"{table}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().unwrap())
    })
}

#[tokio::test]
async fn a_batch_deletes_only_terminal_rows_past_the_cutoff_with_their_children() {
    let dbs = common::stores("retention_batches").await;
    for (db, store) in &dbs {
        let b = db.backend;
        let pool = idem_participant::connect(&db.url, 2).await.unwrap();
        let now = store.db_now().await.unwrap();
        let old = now - 10 * DAY;
        for i in 0..9 {
            let status = [Status::Succeeded, Status::Failed][i % 2];
            seed(
                store.as_ref(),
                &format!("old-{i}"),
                status,
                (old, Some(old + 5)),
                false,
                true,
            )
            .await;
        }
        // Finished, but after the cutoff.
        seed(
            store.as_ref(),
            "young-0",
            Status::Succeeded,
            (old, Some(now)),
            false,
            true,
        )
        .await;
        // Not terminal, however old; `finished_at` set anyway, so only the status keeps
        // them (a delete that checked the age alone would take them).
        for (i, status) in Status::ALL
            .into_iter()
            .filter(|s| !s.is_terminal())
            .enumerate()
        {
            seed(
                store.as_ref(),
                &format!("live-{i}"),
                status,
                (old, Some(old)),
                true,
                true,
            )
            .await;
        }
        let cutoff = now - DAY;
        let mut total = Purged::default();
        let mut batches = 0;
        loop {
            let done = store.purge_finished(cutoff, 4).await.unwrap();
            assert!(done.global <= 4, "{b}: a batch is bounded: {done:?}");
            total.add(done);
            batches += 1;
            if done.global == 0 {
                break;
            }
            assert!(batches < 10, "{b}: retention does not end");
        }
        assert_eq!(batches, 4, "{b}: 9 rows in batches of 4, then an empty one");
        assert_eq!(
            total,
            Purged {
                global: 9,
                branch: 9 * 2 * STEPS as u64,
                attempt: 9
            },
            "{b}"
        );
        assert_eq!(counts(&pool, "old-").await, [0, 0, 0], "{b}");
        let per_tx = 2 * STEPS as i64;
        assert_eq!(counts(&pool, "young-").await, [1, per_tx, 1], "{b}");
        assert_eq!(counts(&pool, "live-").await, [5, 5 * per_tx, 5], "{b}");
        let live = store.load("live-0").await.unwrap().expect("kept");
        assert_eq!(live.tx.branches.len(), 2 * STEPS, "{b}");
        assert_eq!(
            store.attempts("live-0", 0, 1_000).await.unwrap().len(),
            1,
            "{b}"
        );
        // A second pass finds nothing more.
        assert_eq!(
            store.purge_finished(cutoff, 4).await.unwrap(),
            Purged::default()
        );
        pool.close().await;
    }
    common::cleanup(dbs).await;
}

#[tokio::test]
async fn retention_passes_of_two_coordinators_under_load_delete_only_old_finished_rows() {
    let dbs = common::stores("retention_under_load").await;
    let participant = common::recorder::Recorder::start().await;
    for (db, store) in &dbs {
        let b = db.backend;
        let pool = idem_participant::connect(&db.url, 2).await.unwrap();
        let now = store.db_now().await.unwrap();
        let old = now - 30 * DAY;
        const OLD: usize = 40;
        for i in 0..OLD {
            let status = [Status::Succeeded, Status::Failed][i % 2];
            seed(
                store.as_ref(),
                &format!("old-{i}"),
                status,
                (old, Some(old + 1)),
                false,
                true,
            )
            .await;
        }
        for i in 0..3 {
            let at = now - 3_600_000;
            seed(
                store.as_ref(),
                &format!("young-{i}"),
                Status::Failed,
                (at, Some(at)),
                false,
                true,
            )
            .await;
        }
        for (i, status) in [Status::Stalled, Status::Prepared, Status::Committing]
            .into_iter()
            .enumerate()
        {
            seed(
                store.as_ref(),
                &format!("live-{i}"),
                status,
                (old, None),
                true,
                true,
            )
            .await;
        }
        // Old, unfinished and nobody's: a coordinator takes them over and finishes them
        // now, while retention runs, so their status changes under the passes.
        let race: Vec<String> = (0..6).map(|i| format!("race-{i}")).collect();
        for gid in &race {
            store
                .create(&saga(gid, &participant.base, old), "h", None)
                .await
                .unwrap();
        }
        let before = deleted_metric();

        let config = |c: &mut idem::server::ServerConfig| {
            c.retention = RetentionConfig::from_flags(DAY as u64, 30, 7);
        };
        let a = common::coordinator_with(&db.url, config).await;
        let bnode = common::coordinator_with(&db.url, config).await;
        let clients = [
            common::typed::client(&a.url()),
            common::typed::client(&bnode.url()),
        ];
        // More old finished rows arrive while the load and the passes run (as they would
        // from a coordinator still finishing what it drove), so deletes overlap the load.
        const LATE: usize = 30;
        let seeder = {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                for i in 0..LATE {
                    let gid = format!("old-late-{i}");
                    // No attempt row: retention may take the row before one could be added.
                    seed(
                        store.as_ref(),
                        &gid,
                        Status::Succeeded,
                        (old, Some(old)),
                        false,
                        false,
                    )
                    .await;
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        };
        let load: Vec<_> = (0..4)
            .map(|w| {
                let client = clients[w % 2].clone();
                let base = participant.base.clone();
                tokio::spawn(async move {
                    let mut gids = Vec::new();
                    for i in 0..15 {
                        let gid = format!("load-{w}-{i}");
                        let mut saga = client.saga(&gid);
                        for s in 0..STEPS {
                            saga = saga.step(
                                format!("{base}/a{s}"),
                                format!("{base}/c{s}"),
                                serde_json::json!({"s": s}),
                            );
                        }
                        saga.wait_result(true).create().await.expect("created");
                        gids.push(gid);
                    }
                    gids
                })
            })
            .collect();

        seeder.await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while counts(&pool, "old-").await != [0, 0, 0] {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{b}: old finished rows left: {:?}",
                counts(&pool, "old-").await
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut gids: Vec<String> = Vec::new();
        for worker in load {
            gids.extend(worker.await.unwrap());
        }
        gids.extend(race.iter().cloned());
        let done = [ClientStatus::Succeeded];
        common::typed::wait_all(&clients[0], &gids, &done, Duration::from_secs(60)).await;
        // A few more passes over the finished load and the finished race.
        let passes_later = deleted_metric();
        tokio::time::sleep(Duration::from_millis(300)).await;

        let per_tx = 2 * STEPS as i64;
        assert_eq!(counts(&pool, "young-").await, [3, 3 * per_tx, 3], "{b}");
        assert_eq!(counts(&pool, "live-").await, [3, 3 * per_tx, 3], "{b}");
        let loaded = gids.len() as i64 - race.len() as i64;
        assert_eq!(
            counts(&pool, "load-").await[..2],
            [loaded, loaded * per_tx],
            "{b}"
        );
        assert_eq!(counts(&pool, "race-").await[..2], [6, 6 * per_tx], "{b}");
        for gid in ["live-0", "live-1", "live-2"] {
            let kept = store.load(gid).await.unwrap().expect("kept");
            assert!(!kept.tx.status.is_terminal(), "{b}: {gid}");
        }
        let after = deleted_metric();
        let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
        let old = (OLD + LATE) as u64;
        assert_eq!(
            delta,
            [old, old * 2 * STEPS as u64, OLD as u64],
            "{b}: the metric counts each row once"
        );
        assert_eq!(after, passes_later, "{b}: later passes deleted nothing");

        a.stop().await.unwrap();
        bnode.stop().await.unwrap();
        pool.close().await;
    }
    common::cleanup(dbs).await;
}

/// The SDK's settings mirror `idem serve`'s flags: the same defaults, so a participant that
/// derives its barrier retention from `CoordinatorSettings::default()` matches a
/// coordinator run with default flags.
#[test]
fn the_sdk_settings_default_to_the_serve_flags() {
    use clap::Parser;
    let cli = idem::cli::Cli::try_parse_from(["idem", "serve"]).unwrap();
    let idem::cli::Command::Serve(args) = cli.command else {
        panic!("serve parses as serve")
    };
    let sdk = idem_participant::CoordinatorSettings::default();
    assert_eq!(
        sdk,
        idem_participant::CoordinatorSettings {
            prepared_timeout_ms: args.prepared_timeout_ms,
            request_timeout_ms: args.request_timeout_ms,
            retry_interval_ms: args.retry_interval_ms,
            max_retry_interval_ms: args.max_retry_interval_ms,
            max_attempts: args.max_attempts,
            max_in_progress_ms: args.max_in_progress_ms,
            max_branches: args.max_branches,
            lease_ms: args.lease_ms as u64,
            recovery_interval_ms: args.recovery_interval_ms,
            client_retry_period_ms: args.client_retry_period_ms,
        }
    );
    assert_eq!(args.retention_ms, 7 * DAY as u64);
}

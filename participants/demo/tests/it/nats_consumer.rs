//! The JetStream example consumer under a real crash, on every backend: a child consumer
//! process aborts right after committing one event and before acking it; a second child
//! takes over the durable consumer; JetStream redelivers; every event id has exactly one
//! business row. One event is also published twice (a producer retry: same event id, a new
//! stream sequence) and is absorbed the same way.
//!
//! The children are this test binary run again with `IDEM_NATS_CHILD` set (the
//! `nats_consumer::child_consumer` test, a no-op otherwise); they report each delivery on
//! stdout, which is how the parent waits (no sleeps). NATS must be at 127.0.0.1:4222 with
//! JetStream (`IDEM_TEST_NATS_URL` overrides); unreachable is a failure, never a skip.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use idem_demo::events::{self, ConsumerConfig, Event, Hooks, Outcome};
use idem_participant::consumer::ConsumerLog;
use idem_participant::testing;
use sqlx::Row;

const CHILD_ENV: &str = "IDEM_NATS_CHILD";
const MARK: &str = "IDEM-NATS";
const EVENTS: usize = 20;
/// The event whose first application the first child commits and never acks.
const CRASH_EVENT: &str = "evt-7";
/// The event the producer publishes twice.
const RETRIED_EVENT: &str = "evt-5";
const GROUP: &str = "demo-payments";
const ACK_WAIT: Duration = Duration::from_secs(1);
const CONVERGE_WITHIN: Duration = Duration::from_secs(60);

fn nats_url() -> String {
    std::env::var("IDEM_TEST_NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into())
}

async fn nats() -> async_nats::Client {
    let url = nats_url();
    let connect = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(5))
        .connect(url.clone());
    match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("NATS is unreachable at {url}: {e}; start nats-server -js"),
        Err(_) => panic!("NATS is unreachable at {url}: no answer in 10 s; start nats-server -js"),
    }
}

fn config(run: &str) -> ConsumerConfig {
    let mut config = ConsumerConfig::new(
        &format!("IDEM_T_{run}"),
        &format!("idem.t.{run}.order_paid"),
        GROUP,
    );
    config.ack_wait = ACK_WAIT;
    config
}

fn log() -> ConsumerLog {
    ConsumerLog::new(GROUP, "v1").unwrap()
}

/// The child's role: consume until killed, report every delivery, and abort after
/// committing `IDEM_NATS_CRASH_AT` the first time.
#[test]
fn child_consumer() {
    let Ok(run) = std::env::var(CHILD_ENV) else {
        return;
    };
    let database = std::env::var("IDEM_NATS_DATABASE").expect("database URL");
    let crash_at = std::env::var("IDEM_NATS_CRASH_AT").ok();
    let report = |what: &str, event: &Event, outcome: Outcome| {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{MARK} {what} {} {:?} {} {}",
            event.event_id, outcome, event.stream_sequence, event.delivered
        )
        .unwrap();
        out.flush().unwrap();
    };
    let hooks = Hooks {
        after_commit: Some(Arc::new(move |event: &Event, outcome| {
            if outcome == Outcome::Processed && crash_at.as_deref() == Some(&event.event_id) {
                report("CRASH", event, outcome);
                std::process::abort();
            }
        })),
        on_done: Some(Arc::new(move |event: &Event, outcome| {
            report("DONE", event, outcome)
        })),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let pool = idem_demo::connect(&database)
            .await
            .expect("child: database");
        let js = async_nats::jetstream::new(nats().await);
        let consumer = events::open_consumer(&js, &config(&run))
            .await
            .expect("child: consumer");
        println!("{MARK} READY");
        events::run(consumer, pool, log(), events::record_payment, hooks)
            .await
            .expect("child: consumer loop");
    });
}

struct ChildProcess {
    child: Child,
    lines: Receiver<String>,
}

impl Drop for ChildProcess {
    // A consumer never stops by itself: a failing assertion must not leave one running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_child(run: &str, database: &str, crash_at: Option<&str>) -> ChildProcess {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "nats_consumer::child_consumer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, run)
        .env("IDEM_NATS_DATABASE", database)
        .env_remove("IDEM_NATS_CRASH_AT")
        .stdout(Stdio::piped());
    if let Some(event) = crash_at {
        command.env("IDEM_NATS_CRASH_AT", event);
    }
    let mut child = command.spawn().expect("spawn the child consumer");
    let stdout = child.stdout.take().unwrap();
    let (tx, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(at) = line.find(MARK) {
                let _ = tx.send(line[at + MARK.len()..].trim().to_owned());
            }
        }
    });
    ChildProcess { child, lines }
}

/// A delivery a child reported: (event id, outcome, stream sequence, delivered).
type Report = (String, String, u64, i64);

fn parse(line: &str) -> Option<(String, Report)> {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        [what, id, outcome, seq, delivered] => Some((
            (*what).to_owned(),
            (
                (*id).to_owned(),
                (*outcome).to_owned(),
                seq.parse().ok()?,
                delivered.parse().ok()?,
            ),
        )),
        _ => None,
    }
}

fn next_line(child: &ChildProcess, deadline: Instant, seen: &[Report]) -> String {
    let left = deadline.saturating_duration_since(Instant::now());
    child.lines.recv_timeout(left).unwrap_or_else(|e| {
        panic!("no report from the child consumer ({e}); deliveries so far: {seen:?}")
    })
}

#[test]
fn a_consumer_killed_between_commit_and_ack_applies_each_event_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let dbs = rt.block_on(testing::all("nats_consumer_crash"));
    for db in dbs {
        let started = Instant::now();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let config = config(&run);
        let (pool, js) = rt.block_on(async {
            let pool = idem_participant::connect(&db.url, 2)
                .await
                .expect("connect");
            events::create_tables(&pool).await.expect("tables");
            let js = async_nats::jetstream::new(nats().await);
            events::open_consumer(&js, &config)
                .await
                .expect("stream and consumer");
            // The producer: EVENTS events, then a retry of one of them (the same event id
            // and body, a new message in the stream).
            let mut ids: Vec<String> = (0..EVENTS).map(|i| format!("evt-{i}")).collect();
            ids.push(RETRIED_EVENT.to_owned());
            for id in ids {
                let n: i64 = id[4..].parse().unwrap();
                let body = serde_json::json!({
                    "event_id": id, "order_id": format!("order-{n}"), "amount_minor": 100 + n,
                });
                js.publish(config.subject.clone(), body.to_string().into())
                    .await
                    .expect("publish")
                    .await
                    .expect("stream stored it");
            }
            (pool, js)
        });
        let total = EVENTS + 1;
        let deadline = Instant::now() + CONVERGE_WITHIN;
        let mut reports: Vec<Report> = Vec::new();

        // The first child commits CRASH_EVENT and aborts before its ack.
        let mut first = spawn_child(&run, &db.url, Some(CRASH_EVENT));
        let crashed = loop {
            let line = next_line(&first, deadline, &reports);
            match parse(&line) {
                Some((what, report)) if what == "DONE" => reports.push(report),
                Some((what, report)) if what == "CRASH" => break report,
                _ => {}
            }
        };
        let status = first.child.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(6),
            "{}: the first child aborted: {status:?}",
            db.backend
        );
        assert_eq!(crashed.0, CRASH_EVENT);
        let acked_before_crash = reports.len();

        // The second child takes over the durable consumer; JetStream redelivers what the
        // first one never acked (after ACK_WAIT).
        let restarted = Instant::now();
        let second = spawn_child(&run, &db.url, None);
        let mut acked: BTreeSet<u64> = reports.iter().map(|r| r.2).collect();
        while acked.len() < total {
            let line = next_line(&second, deadline, &reports);
            if let Some((what, report)) = parse(&line)
                && what == "DONE"
            {
                acked.insert(report.2);
                reports.push(report);
            }
        }
        let converged = restarted.elapsed();
        drop(second);

        // One business row per event id, and one log row per event id.
        let (rows, distinct, logged) = rt.block_on(async {
            let row =
                sqlx::query("SELECT COUNT(*), COUNT(DISTINCT event_id) FROM demo_payment_received")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let logged: i64 = sqlx::query("SELECT COUNT(*) FROM idem_consumer_log")
                .fetch_one(&pool)
                .await
                .unwrap()
                .get(0);
            (row.get::<i64, _>(0), row.get::<i64, _>(1), logged)
        });
        assert_eq!(
            (rows, distinct, logged),
            (EVENTS as i64, EVENTS as i64, EVENTS as i64),
            "{}",
            db.backend
        );

        // The crashed event came back and was answered as a duplicate.
        let crash_redelivery = reports
            .iter()
            .find(|r| r.0 == CRASH_EVENT)
            .expect("the crashed event was acked by the second child");
        assert_eq!(crash_redelivery.1, "Duplicate", "{}", db.backend);
        assert!(
            crash_redelivery.3 >= 2,
            "{}: redelivered: {crash_redelivery:?}",
            db.backend
        );
        assert_eq!(crash_redelivery.2, crashed.2, "the same stream message");
        // The producer retry: two stream messages for one event id, one applied.
        let retried: BTreeMap<u64, String> = reports
            .iter()
            .filter(|r| r.0 == RETRIED_EVENT)
            .map(|r| (r.2, r.1.clone()))
            .collect();
        assert_eq!(retried.len(), 2, "{}: {retried:?}", db.backend);
        assert_eq!(
            retried.values().filter(|o| *o == "Processed").count(),
            1,
            "{}: {retried:?}",
            db.backend
        );
        let log = log();
        let (crash_record, retried_record, info) = rt.block_on(async {
            let mut consumer = js
                .get_stream(&config.stream)
                .await
                .unwrap()
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(GROUP)
                .await
                .unwrap();
            let info = consumer.info().await.unwrap().clone();
            (
                log.record(&pool, CRASH_EVENT).await.unwrap().unwrap(),
                log.record(&pool, RETRIED_EVENT).await.unwrap().unwrap(),
                info,
            )
        });
        assert_eq!(
            crash_record.broker_message_id,
            Some(format!("{}:{}", config.stream, crashed.2)),
            "the log names the delivery that applied it"
        );
        let retried_applied = retried.iter().find(|(_, o)| *o == "Processed").unwrap().0;
        assert_eq!(
            retried_record.broker_message_id,
            Some(format!("{}:{retried_applied}", config.stream))
        );
        assert_eq!(info.num_ack_pending, 0, "{}: everything acked", db.backend);

        let redeliveries = reports.iter().filter(|r| r.3 > 1).count();
        let duplicates = reports.iter().filter(|r| r.1 == "Duplicate").count();
        println!(
            "FIGURES {}: events={EVENTS} messages={total} acked_before_crash={acked_before_crash} \
             redeliveries_seen={redeliveries} duplicates={duplicates} converge_after_restart_ms={} \
             total_ms={} (ack_wait {} ms)",
            db.backend,
            converged.as_millis(),
            started.elapsed().as_millis(),
            ACK_WAIT.as_millis()
        );
        rt.block_on(async {
            js.delete_stream(&config.stream).await.unwrap();
            pool.close().await;
        });
        rt.block_on(db.drop_database());
    }
}

/// In process, on SQLite: a handler failure is nacked and redelivered (nothing was kept of
/// the failed attempt), an event the handler refuses and a message that is no event are
/// terminated, not redelivered.
#[test]
fn failures_are_redelivered_and_malformed_events_terminated() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = testing::TestDatabase::create(testing::Backend::Sqlite, "nats_failures").await;
        let pool = idem_demo::connect(&db.url).await.unwrap();
        events::create_tables(&pool).await.unwrap();
        let run = uuid::Uuid::new_v4().simple().to_string();
        let config = config(&run);
        let js = async_nats::jetstream::new(nats().await);
        let consumer = events::open_consumer(&js, &config).await.unwrap();
        for body in [
            "not json".to_owned(),
            serde_json::json!({"event_id": "evt-a", "order_id": "o-a", "amount_minor": 1})
                .to_string(),
            serde_json::json!({"event_id": "evt-b", "order_id": "o-b"}).to_string(),
            serde_json::json!({"event_id": "evt-c", "order_id": "o-c", "amount_minor": 3})
                .to_string(),
        ] {
            js.publish(config.subject.clone(), body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let (tx, mut done) = tokio::sync::mpsc::unbounded_channel();
        let hooks = Hooks {
            after_commit: None,
            on_done: Some(Arc::new(move |event: &Event, outcome| {
                let _ = tx.send((event.event_id.clone(), outcome, event.delivered));
            })),
        };
        // evt-a's first attempt writes its row and then fails: the row must not stay.
        let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handler = move |tx: idem_participant::LocalTx<'static, sqlx::Any>, event: Event| {
            let failed_once = failed_once.clone();
            async move {
                let first_try = event.event_id == "evt-a"
                    && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst);
                events::record_payment(tx, event).await?;
                if first_try {
                    return Err(idem_participant::ParticipantError::transient("flaky"));
                }
                Ok(())
            }
        };
        let task = tokio::spawn(events::run(consumer, pool.clone(), log(), handler, hooks));
        let mut seen = Vec::new();
        while seen.len() < 4 {
            let next = tokio::time::timeout(CONVERGE_WITHIN, done.recv()).await;
            seen.push(next.expect("a delivery report").expect("the consumer runs"));
        }
        task.abort();
        let outcome = |id: &str, delivered: i64| {
            seen.iter()
                .find(|(e, _, d)| e == id && *d == delivered)
                .map(|(_, o, _)| *o)
        };
        assert_eq!(outcome("evt-a", 1), Some(Outcome::Retry), "{seen:?}");
        assert_eq!(outcome("evt-a", 2), Some(Outcome::Processed), "{seen:?}");
        assert_eq!(outcome("evt-b", 1), Some(Outcome::Rejected), "{seen:?}");
        assert_eq!(outcome("evt-c", 1), Some(Outcome::Processed), "{seen:?}");
        let rows: Vec<String> =
            sqlx::query("SELECT event_id FROM demo_payment_received ORDER BY event_id")
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
        assert_eq!(rows, ["evt-a", "evt-c"]);
        let info = js
            .get_stream(&config.stream)
            .await
            .unwrap()
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(GROUP)
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .clone();
        // The malformed message and evt-b were terminated: nothing pending, nothing unacked.
        assert_eq!((info.num_pending, info.num_ack_pending), (0, 0), "{info:?}");
        js.delete_stream(&config.stream).await.unwrap();
        pool.close().await;
        db.drop_database().await;
    });
}

//! 200 clients send bodies of about 1 MiB at once to a coordinator that takes 8 requests
//! at a time (`--max-requests-in-flight 8`), on SQLite and PostgreSQL: its peak resident
//! memory (VmHWM of the `serve` child) stays within what 8 requests and 200 connections
//! may hold, every client gets the answer its body earns or `503 overloaded` (never
//! another 5xx, never a dropped connection), and every transaction is stored whole or not
//! at all. The bench's `bodies` workload does the work (docs/operations.md, "Limits"; the figures
//! before and after in docs/performance.md come from it with 200 clients and the
//! defaults).

use std::time::Duration;

use idem_lab::bench::{BenchConfig, Workload, run};

/// Requests in flight the coordinator takes.
const CAP: usize = 8;
const CLIENTS: usize = 200;
/// What one request in flight may hold, in bodies of 1 MiB: the body, its payloads as
/// text, the request's canonical text, the rows written and the answer, which shows every
/// payload of a stored TCC twice (its Confirm and its Cancel).
const PER_REQUEST: f64 = 8.0;
/// What each open connection may hold while a refused body is read and dropped: hyper's
/// read buffer (`http_server::CONNECTION_BUFFER`), twice while a chunk is still out.
const PER_CONNECTION_MB: f64 = 2.0 * 64.0 / 1024.0;
/// Allocator and runtime overhead beside them.
const SLACK_MB: f64 = 16.0;

async fn bodies_at_once(backend: &str) {
    let serve_args = [
        "--max-requests-in-flight",
        &CAP.to_string(),
        // Two hundred megabytes arrive at once on a busy CI machine: a slow read is not
        // what this test is about.
        "--request-read-timeout-ms",
        "60000",
    ];
    let config = BenchConfig {
        workload: Workload::Bodies,
        backend: backend.into(),
        clients: CLIENTS,
        duration: Duration::from_secs(1),
        warmup: Duration::ZERO,
        count: 0,
        idem_bin: env!("CARGO_BIN_EXE_idem-lab").into(),
        serve_args: serve_args.iter().map(|a| a.to_string()).collect(),
        progress: false,
        inflight: 0,
        limit_root: None,
        participant_delay: Duration::ZERO,
        rate: 0.0,
        observe: Duration::ZERO,
        coordinators: 1,
    };
    let result = run(&config).await.expect("the bodies workload runs");
    println!("{}", result.table());
    let bodies = result.bodies.expect("the bodies figures");
    assert_eq!(bodies.requests, CLIENTS);
    assert!(bodies.body_bytes > CLIENTS as u64 * 1_000_000, "{bodies:?}");
    assert_eq!(
        (bodies.unexpected, bodies.half_stored),
        (0, 0),
        "{bodies:?}"
    );
    let answered: usize = bodies.statuses.values().sum();
    assert_eq!(answered, CLIENTS, "{bodies:?}");
    let overloaded = bodies.statuses.get(&503).copied().unwrap_or(0);
    assert!(
        overloaded > 0 && bodies.stored > 0,
        "some are refused at the cap and some stored: {bodies:?}"
    );
    let bound = CAP as f64 * PER_REQUEST + CLIENTS as f64 * PER_CONNECTION_MB + SLACK_MB;
    let growth = bodies.peak_rss_mb - bodies.rss_before_mb;
    assert!(
        growth < bound,
        "the coordinator's peak grew by {growth:.1} MB over {:.1} MB; the bound is {bound:.1} MB",
        bodies.rss_before_mb
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_once_on_sqlite() {
    bodies_at_once("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_at_once_on_postgres() {
    bodies_at_once("postgres").await;
}

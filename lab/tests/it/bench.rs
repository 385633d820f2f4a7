//! The bench's soak workload, run briefly: its load, its outcome accounting and its memory
//! samples work (the figures themselves come from long runs by hand, in
//! docs/performance.md).

use std::time::Duration;

use idem_lab::bench::{BenchConfig, Workload, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_accounts_for_every_saga_and_samples_memory() {
    let config = BenchConfig {
        workload: Workload::Soak,
        backend: "sqlite".into(),
        clients: 1,
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(1),
        count: 0,
        idem_bin: env!("CARGO_BIN_EXE_idem-lab").into(),
        serve_args: Vec::new(),
        progress: false,
        inflight: 0,
        limit_root: None,
        participant_delay: Duration::from_millis(300),
        rate: 40.0,
        observe: Duration::from_secs(1),
        coordinators: 1,
    };
    let result = run(&config).await.expect("soak runs");
    let soak = result.soak.as_ref().expect("soak figures");
    println!("{}", result.table());
    // 40 a second for 5 s, on time whatever the coordinator does.
    assert!(
        (190..=210).contains(&soak.started),
        "started {}",
        soak.started
    );
    assert_eq!(
        result.failures, 0,
        "every saga ended as its participant made it"
    );
    assert_eq!(soak.as_expected, soak.started);
    assert!(soak.slow >= 1 && soak.failing >= 1, "{soak:?}");
    assert_eq!((soak.left_unfinished, soak.stalled), (0, 0));
    assert!(soak.rss_start_mb > 1.0 && soak.rss_end_mb > 1.0, "{soak:?}");
    assert!(
        soak.rss_middle_mb > 1.0 && !soak.rss_curve.is_empty(),
        "{soak:?}"
    );
    assert!(
        result.p50_ms > 0.0 && result.max_ms >= 300.0,
        "the slow ones count"
    );
}

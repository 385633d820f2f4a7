//! A `metrics` recorder installed in this test process, and its counters read back.
//!
//! The recorder is process-global and a snapshot resets the counters it reads, so a test
//! that uses this runs alone in a child process of its own
//! (`idem_participant::testing::in_own_process`).

use std::sync::OnceLock;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A counter seen: name, labels, value.
pub type Counter = (String, Vec<(String, String)>, u64);

/// Installs the recorder on first use (then runs `describe`) and returns its snapshotter.
pub fn snapshotter(describe: fn()) -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        describe();
        snapshotter
    })
}

/// The counters recorded since the last snapshot.
pub fn counters(snapshotter: &Snapshotter) -> Vec<Counter> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            match value {
                DebugValue::Counter(n) => Some((key.name().to_owned(), labels, n)),
                _ => None,
            }
        })
        .collect()
}

/// The sum of counter `name` over series with exactly these labels (0 if none).
pub fn counter_value(counters: &[Counter], name: &str, labels: &[(&str, &str)]) -> u64 {
    counters
        .iter()
        .filter(|(n, l, _)| {
            n == name
                && l.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// The unlabelled gauges set since the last snapshot, by name (takes a snapshot, which
/// resets what it reads: read the counters first, and every gauge from one call).
pub fn gauges(snapshotter: &Snapshotter) -> std::collections::HashMap<String, f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Gauge(v) => Some((key.key().name().to_owned(), v.into_inner())),
            _ => None,
        })
        .collect()
}

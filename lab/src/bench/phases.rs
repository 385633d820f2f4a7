//! Where a global transaction's time goes inside the coordinator: its timing histograms
//! (`/metrics`) read at the start and the end of the measured window, and the difference
//! summarised per phase: how many per transaction, mean, p50 and p99 (interpolated within
//! the buckets, so read them to the bucket's resolution).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The histograms the bench reports, in the order of a transaction's life.
const PHASES: &[&str] = &[
    "idem_http_request_seconds",
    "idem_store_write_seconds",
    "idem_store_queue_seconds",
    "idem_store_batch_seconds",
    "idem_store_batch_writes",
    "idem_round_seconds",
    "idem_branch_call_seconds",
];

/// One histogram series over the measured window.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Phase {
    /// The metric and its labels, as Prometheus prints them.
    pub series: String,
    pub per_transaction: f64,
    /// In the metric's unit: milliseconds for seconds, writes for batch sizes.
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
}

/// A histogram as read from the exposition: cumulative counts by upper bound, and the sum.
#[derive(Clone, Debug, Default)]
struct Histogram {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// The histograms of `PHASES` in a Prometheus text exposition, by series (name and labels
/// without `le`).
fn parse(text: &str) -> BTreeMap<String, Histogram> {
    let mut out: BTreeMap<String, Histogram> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = key.split_once('{').unwrap_or((key, "}"));
        let labels = labels.trim_end_matches('}');
        for phase in PHASES {
            let Some(part) = name.strip_prefix(phase) else {
                continue;
            };
            let mut rest: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
            let le = rest
                .iter()
                .position(|l| l.starts_with("le="))
                .map(|i| rest.remove(i));
            let series = if rest.is_empty() {
                (*phase).to_owned()
            } else {
                format!("{phase}{{{}}}", rest.join(","))
            };
            let h = out.entry(series).or_default();
            match (part, le) {
                ("_bucket", Some(le)) => {
                    let bound = le.trim_start_matches("le=").trim_matches('"');
                    let bound = if bound == "+Inf" {
                        f64::INFINITY
                    } else {
                        bound.parse().unwrap_or(f64::INFINITY)
                    };
                    h.buckets.push((bound, value));
                }
                ("_sum", None) => h.sum = value,
                ("_count", None) => h.count = value,
                _ => {}
            }
        }
    }
    for h in out.values_mut() {
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

impl Histogram {
    fn minus(&self, before: Option<&Histogram>) -> Histogram {
        let Some(before) = before else {
            return self.clone();
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(bound, n)| {
                    let was = before
                        .buckets
                        .iter()
                        .find(|(b, _)| *b == bound)
                        .map_or(0.0, |(_, n)| *n);
                    (bound, n - was)
                })
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// The `q` quantile, linear within its bucket.
    fn quantile(&self, q: f64) -> f64 {
        let target = q * self.count;
        let mut lower = (0.0, 0.0);
        for &(bound, n) in &self.buckets {
            if n >= target {
                if bound.is_infinite() {
                    return lower.0;
                }
                let width = n - lower.1;
                let into = if width > 0.0 {
                    (target - lower.1) / width
                } else {
                    0.0
                };
                return lower.0 + (bound - lower.0) * into;
            }
            lower = (bound, n);
        }
        lower.0
    }
}

/// The phases between two scrapes of one coordinator, for `transactions` transactions.
pub fn between(before: &str, after: &str, transactions: u64) -> Vec<Phase> {
    let before = parse(before);
    let tx = transactions.max(1) as f64;
    parse(after)
        .into_iter()
        .filter_map(|(series, h)| {
            let h = h.minus(before.get(&series));
            if h.count <= 0.0 {
                return None;
            }
            // Seconds are shown in milliseconds; a batch's size as it is.
            let unit = if series.contains("_seconds") {
                1_000.0
            } else {
                1.0
            };
            Some(Phase {
                per_transaction: h.count / tx,
                mean: unit * h.sum / h.count,
                p50: unit * h.quantile(0.5),
                p99: unit * h.quantile(0.99),
                series,
            })
        })
        .collect()
}

/// The phases as a table.
pub fn table(phases: &[Phase]) -> String {
    let mut out =
        String::from("  inside the coordinator (per global transaction; ms, batches in writes):\n");
    for p in phases {
        out.push_str(&format!(
            "    {:<62} {:>6.2} per tx  mean {:>8.3}  p50 {:>8.3}  p99 {:>8.3}\n",
            p.series, p.per_transaction, p.mean, p.p50, p.p99
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE idem_store_batch_seconds histogram
idem_store_batch_seconds_bucket{le=\"0.001\"} 10
idem_store_batch_seconds_bucket{le=\"0.01\"} 10
idem_store_batch_seconds_bucket{le=\"+Inf\"} 10
idem_store_batch_seconds_sum 0.005
idem_store_batch_seconds_count 10
";
    const AFTER: &str = "\
idem_store_batch_seconds_bucket{le=\"0.001\"} 10
idem_store_batch_seconds_bucket{le=\"0.01\"} 110
idem_store_batch_seconds_bucket{le=\"+Inf\"} 110
idem_store_batch_seconds_sum 0.505
idem_store_batch_seconds_count 110
idem_round_seconds_bucket{phase=\"calls\",le=\"0.001\"} 4
idem_round_seconds_bucket{phase=\"calls\",le=\"+Inf\"} 4
idem_round_seconds_sum{phase=\"calls\"} 0.002
idem_round_seconds_count{phase=\"calls\"} 4
";

    #[test]
    fn the_window_is_the_difference_of_two_scrapes() {
        let phases = between(BEFORE, AFTER, 50);
        let batch = phases
            .iter()
            .find(|p| p.series == "idem_store_batch_seconds")
            .expect("the batch histogram");
        // 100 batches in the window, all between 1 and 10 ms, 5 ms on average.
        assert_eq!(batch.per_transaction, 2.0);
        assert!((batch.mean - 5.0).abs() < 1e-9, "{batch:?}");
        assert!((batch.p50 - 5.5).abs() < 1e-9, "{batch:?}");
        let calls = phases
            .iter()
            .find(|p| p.series == "idem_round_seconds{phase=\"calls\"}")
            .expect("a labelled series");
        assert_eq!(calls.per_transaction, 4.0 / 50.0);
        assert!((calls.mean - 0.5).abs() < 1e-9, "{calls:?}");
    }
}

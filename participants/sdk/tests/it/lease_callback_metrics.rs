//! What lease mode and the payment callbacks count, read back from a recorder installed in
//! this test process, on every backend: each outcome under its label, the configured
//! provider as the only other label, never a gid or a transaction id, and the HELP text.
//!
//! The recorder is process-global, so the test runs alone in a child process of its own.

use crate::common;
use crate::kit_support::recorder;

use std::sync::Arc;
use std::time::Duration;

use common::{gid, setup, tcc};
use idem_participant::barrier::{Fact, FactSource, StepRef, lease};
use idem_participant::callback::{self, create_callback_tables};
use idem_participant::{
    CallbackOutcome, ManualClock, Op, OrderTable, PaymentCallbacks, PaymentNotice, testing,
};
use metrics_util::debugging::{DebugValue, Snapshotter};

fn snapshotter() -> &'static Snapshotter {
    recorder::snapshotter(|| {
        lease::describe();
        callback::describe();
    })
}

/// (name, labels, counter value, help).
type Sample = (String, Vec<(String, String)>, u64, Option<String>);

/// Everything recorded since the last snapshot.
fn snapshot() -> Vec<Sample> {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, help, value)| {
            let (_, key) = key.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let value = match value {
                DebugValue::Counter(c) => c,
                other => panic!("{} is not a counter: {other:?}", key.name()),
            };
            (
                key.name().to_owned(),
                labels,
                value,
                help.map(|h| h.to_string()),
            )
        })
        .collect()
}

fn count(seen: &[Sample], name: &str, labels: &[(&str, &str)]) -> u64 {
    seen.iter()
        .filter(|(n, l, _, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, _, v, _)| *v)
        .sum()
}

struct Unknown;

impl FactSource<u32> for Unknown {
    async fn check(&self, _step: &StepRef) -> Fact<u32> {
        Fact::Unknown
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_callback_outcomes_are_counted_without_keys_in_labels() {
    if !testing::in_own_process(
        "lease_callback_metrics::lease_and_callback_outcomes_are_counted_without_keys_in_labels",
    ) {
        return;
    }
    snapshotter();
    for db in testing::all("lease_callback_metrics").await {
        let b = db.backend;
        let pool = setup(&db).await;
        snapshot();

        // Lease: first + executed, a replay; an open claim: in_progress, then unknown.
        let clock = ManualClock::at(1_000);
        let g = gid("mm");
        let step = tcc(&g, Op::Try)
            .with_lease(Duration::from_secs(10))
            .with_clock(Arc::new(clock.clone()));
        step.run(&pool, &Unknown, |_t| async { Ok(7u32) })
            .await
            .unwrap();
        step.run(&pool, &Unknown, |_t| async { Ok(8u32) })
            .await
            .unwrap();
        let open = gid("mo");
        let step = tcc(&open, Op::Try)
            .with_lease(Duration::from_secs(10))
            .with_clock(Arc::new(clock.clone()));
        let Ok(idem_participant::barrier::Claimed::Acquired(_)) =
            step.claim::<_, u32, _>(&pool, &Unknown).await
        else {
            panic!("{b}: claim");
        };
        assert!(step.claim::<_, u32, _>(&pool, &Unknown).await.is_err());
        clock.advance(10_000);
        assert!(step.claim::<_, u32, _>(&pool, &Unknown).await.is_err());

        // Callbacks: credited, duplicate, conflict, bad signature, mismatch.
        create_callback_tables(&pool).await.unwrap();
        sqlx::query(
            "CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(24) NOT NULL, paid_txn VARCHAR(128), \
             amount_minor BIGINT NOT NULL, currency VARCHAR(8) NOT NULL, merchant VARCHAR(64) NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query("INSERT INTO orders (id, status, amount_minor, currency, merchant) VALUES ('o1', 'WAIT_PAY', 500, 'EUR', 'm')")
            .execute(&pool)
            .await
            .unwrap();
        let cb = PaymentCallbacks::<sqlx::Any>::new(
            "acmepay",
            b"k".to_vec(),
            OrderTable::new("orders").unwrap(),
        )
        .unwrap();
        let deliver = |txn: &str, amount: i64| {
            let body = serde_json::to_vec(&PaymentNotice {
                provider_txn_id: txn.into(),
                order_ref: "o1".into(),
                amount_minor: amount,
                currency: "EUR".into(),
                merchant: "m".into(),
            })
            .unwrap();
            let sig = cb.sign(&body);
            let cb = &cb;
            let pool = &pool;
            async move { cb.handle(pool, &body, &sig).await.unwrap() }
        };
        assert_eq!(
            deliver("secret-txn-1", 500).await,
            CallbackOutcome::Credited
        );
        assert_eq!(
            deliver("secret-txn-1", 500).await,
            CallbackOutcome::Duplicate
        );
        assert!(matches!(
            deliver("secret-txn-2", 500).await,
            CallbackOutcome::Conflict(_)
        ));
        assert_eq!(
            deliver("secret-txn-3", 499).await,
            CallbackOutcome::Mismatch("amount")
        );
        assert_eq!(
            cb.handle(&pool, b"{}", "00").await.unwrap(),
            CallbackOutcome::BadSignature
        );

        let seen = snapshot();
        let l = lease::BARRIER_LEASE;
        for (outcome, n) in [
            ("first", 2),
            ("executed", 1),
            ("replay", 1),
            ("in_progress", 1),
            ("unknown", 1),
        ] {
            assert_eq!(
                count(&seen, l, &[("outcome", outcome)]),
                n,
                "{b}: lease {outcome}"
            );
        }
        let c = callback::CALLBACK_TOTAL;
        for outcome in [
            "credited",
            "duplicate",
            "conflict",
            "mismatch",
            "bad_signature",
        ] {
            assert_eq!(
                count(&seen, c, &[("provider", "acmepay"), ("outcome", outcome)]),
                1,
                "{b}: callback {outcome}"
            );
        }
        for (name, labels, _, _) in &seen {
            for (k, v) in labels {
                assert!(
                    !v.contains("secret-txn") && !v.contains(&g) && !v.contains(&open),
                    "{b}: {name} has a key in label {k}={v}"
                );
            }
        }
        for name in [l, c] {
            let help = seen
                .iter()
                .find(|(n, ..)| n == name)
                .and_then(|s| s.3.clone());
            assert!(
                help.is_some_and(|h| h.contains("outcome")),
                "{b}: {name} has its HELP text"
            );
        }
        pool.close().await;
        db.drop_database().await;
    }
}

//! Payloads of every kind are stored as their bytes, on SQLite, PostgreSQL and MariaDB:
//! text in `payload`, anything else (DTM's gRPC clients send protobuf) in `payload_bin`,
//! through every way a branch is written: a create alone, creates batched together, and a
//! TCC registration.

use crate::common;

use std::sync::Arc;

use idem_core::*;
use idem_store::*;

const T0: Millis = 1_700_000_000_000;

/// Text, text beyond ASCII, nothing, and bytes that are not UTF-8 (a NUL, a lone 0xff,
/// a truncated sequence, and 64 KiB of every byte value).
fn payloads() -> Vec<Payload> {
    vec![
        Payload::from("{\"n\":1}"),
        Payload::from("héllo ✓ 🦀"),
        Payload::default(),
        Payload::from(vec![0x0a, 0x00, 0xff, 0x12]),
        Payload::from(vec![0xe2, 0x82]),
        Payload::from((0..65_536).map(|i| (i % 256) as u8).collect::<Vec<u8>>()),
    ]
}

fn saga(gid: &str) -> Transaction {
    let steps = payloads()
        .into_iter()
        .enumerate()
        .map(|(i, payload)| SagaStep {
            action: format!("p:1/s.S/A{i}"),
            compensate: format!("p:1/s.S/C{i}"),
            payload,
        })
        .collect();
    Transaction::saga(gid, steps, TxOptions::default(), T0)
}

fn stored_payloads(tx: &Transaction) -> Vec<Payload> {
    tx.branches
        .iter()
        .filter(|b| b.action == Action::Action)
        .map(|b| b.payload.clone())
        .collect()
}

#[tokio::test]
async fn payloads_of_every_kind_come_back_byte_for_byte() {
    let dbs = common::stores("payloads_every_kind").await;
    for (db, store) in &dbs {
        let b = db.backend;
        // Alone, then twenty at once (the writers batch them), one of them a gid that is
        // taken: a batch that meets it is written again one by one (MariaDB's path).
        let alone = saga("alone");
        assert_eq!(
            store.create(&alone, "h", None).await.unwrap(),
            Created::Inserted
        );
        let creates = (0..20).map(|i| {
            let store = Arc::clone(store);
            async move {
                let gid = match i {
                    7 => "alone".to_owned(),
                    i => format!("batched-{i:02}"),
                };
                let created = store.create(&saga(&gid), "h", None).await.unwrap();
                (gid, created)
            }
        });
        let mut gids = Vec::new();
        for (gid, created) in futures::future::join_all(creates).await {
            match gid.as_str() {
                "alone" => assert!(matches!(created, Created::Exists(_)), "{b}: {created:?}"),
                _ => assert_eq!(created, Created::Inserted, "{b}: {gid}"),
            }
            gids.push(gid);
        }
        for gid in gids {
            let stored = store.load(&gid).await.unwrap().expect("stored");
            assert_eq!(stored_payloads(&stored.tx), payloads(), "{b}: {gid}");
            assert_eq!(stored.tx, saga(&gid), "{b}: {gid} round trip");
        }

        // A TCC registration; the same bytes again are a repeat, one byte more a conflict.
        let tcc = Transaction::prepared("tcc", Kind::Tcc, TxOptions::default(), T0);
        store.create(&tcc, "h", None).await.unwrap();
        let branch = |payload: Payload| {
            vec![Branch::new(
                "b",
                Action::Confirm,
                0,
                "p:1/s.S/Confirm",
                payload,
                T0,
            )]
        };
        let binary = Payload::from(vec![0x08, 0x96, 0x01, 0xff]);
        for _ in 0..2 {
            assert_eq!(
                store
                    .register("tcc", &branch(binary.clone()), T0, Access::Tenant)
                    .await
                    .unwrap(),
                Registered::Stored,
                "{b}"
            );
        }
        let longer = Payload::from(vec![0x08, 0x96, 0x01, 0xff, 0x00]);
        assert!(
            matches!(
                store
                    .register("tcc", &branch(longer), T0, Access::Tenant)
                    .await
                    .unwrap(),
                Registered::Conflict(_)
            ),
            "{b}"
        );
        let stored = store.load("tcc").await.unwrap().expect("stored");
        assert_eq!(stored.tx.branches[0].payload, binary, "{b}");
    }
    common::cleanup(dbs).await;
}

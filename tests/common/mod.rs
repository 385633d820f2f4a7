//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use idem::store::{self, ConnectOptions, Store};
use idem_participant::testing::{self, TestDatabase};

/// A migrated store on a fresh database of each backend (SQLite always; PostgreSQL and
/// MariaDB unless the developer skips them, which is printed).
pub async fn stores(test: &str) -> Vec<(TestDatabase, Arc<dyn Store>)> {
    let mut out = Vec::new();
    for db in testing::all(test).await {
        let store = open(&db.url).await;
        out.push((db, store));
    }
    out
}

pub async fn open(url: &str) -> Arc<dyn Store> {
    let options = ConnectOptions {
        max_connections: 8,
        sqlite_full_sync: false,
    };
    let store = store::connect(url, &options)
        .await
        .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    store.migrate().await.expect("migrations apply");
    store
}

/// Drops the test databases.
pub async fn cleanup(dbs: Vec<(TestDatabase, Arc<dyn Store>)>) {
    for (db, store) in dbs {
        drop(store);
        db.drop_database().await;
    }
}

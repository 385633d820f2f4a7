//! The store's integration tests, as one binary: conditional writes, fencing, claims and
//! batches on SQLite, PostgreSQL and MariaDB (`store`), and PostgreSQL's statistics at
//! start (`pg_statistics`). Each test makes throwaway databases of its own.

mod common {
    use std::sync::Arc;

    use idem_participant::testing::{self, TestDatabase};
    use idem_store::{ConnectOptions, Store, connect};

    /// A migrated store on a fresh database of each backend.
    pub async fn stores(test: &str) -> Vec<(TestDatabase, Arc<dyn Store>)> {
        let options = ConnectOptions {
            max_connections: 8,
            sqlite_full_sync: false,
            ..ConnectOptions::default()
        };
        let mut out = Vec::new();
        for db in testing::all(test).await {
            let store = connect(&db.url, &options).await.expect("the store opens");
            store.migrate().await.expect("migrations apply");
            out.push((db, store));
        }
        out
    }

    /// Closes the stores and drops their databases.
    pub async fn cleanup(dbs: Vec<(TestDatabase, Arc<dyn Store>)>) {
        for (db, store) in dbs {
            drop(store);
            db.drop_database().await;
        }
    }
}

mod payloads;
mod pg_statistics;
mod store;

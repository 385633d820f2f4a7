//! The links between the coordinators and their database, under the runner's control.
//!
//! On PostgreSQL and MariaDB every coordinator process reaches the database through a TCP
//! proxy of its own (`idem_participant::testing::TcpProxy`), started by the runner and kept
//! across the coordinator's restarts; the plan's `db_link` rules freeze it, slow it down
//! or cut its connections as the run reaches their orders. SQLite has no link: a freeze
//! there is another process holding the database's write lock for as long (a backup, an
//! operator's shell), the one stall an embedded database meets; latency and cuts are
//! refused.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::Connection;

use super::{Error, Report, Scenario};
use crate::faults::{DbLinkFault, DbLinkRule};
use idem::core::Millis;
use idem_participant::testing::{Backend, TcpProxy};

/// One rule as it fired.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DbLinkApplied {
    pub at_order: usize,
    pub node: Option<String>,
    pub fault: DbLinkFault,
    /// When it fired (the runner's clock).
    pub at: Millis,
    /// What went wrong applying it, if anything.
    pub error: Option<String>,
}

enum Link {
    /// Coordinator `c{i}`'s proxy.
    Proxies(Vec<Arc<TcpProxy>>),
    /// The SQLite file every coordinator shares.
    Sqlite(String),
}

/// The database links of a run.
pub(super) struct DbLinks {
    link: Link,
    rules: Vec<DbLinkRule>,
    urls: Vec<String>,
    applied: Arc<Mutex<Vec<DbLinkApplied>>>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl DbLinks {
    /// A proxy per coordinator when the plan has database-link rules and the database has
    /// a server; none otherwise (the coordinators connect straight to `url`).
    pub(super) async fn start(
        scenario: &Scenario,
        url: &str,
    ) -> Result<Option<Arc<DbLinks>>, Error> {
        let rules = scenario.plan.db_link.clone();
        if rules.is_empty() {
            return Ok(None);
        }
        let n = scenario.coordinators.max(1);
        let (link, urls) = match Backend::from_url(url) {
            Some(Backend::Sqlite) => {
                if let Some(rule) = rules.iter().find(|r| !r.fault.on_sqlite()) {
                    return Err(format!(
                        "database-link fault `{}` needs a database server (postgres or mysql): SQLite has no connection to slow down or reset",
                        rule.fault.label()
                    )
                    .into());
                }
                (Link::Sqlite(url.to_owned()), vec![url.to_owned(); n])
            }
            Some(_) => {
                let mut proxies = Vec::new();
                let mut urls = Vec::new();
                for _ in 0..n {
                    let (proxy, proxied) = TcpProxy::for_url(url).await?;
                    proxies.push(Arc::new(proxy));
                    urls.push(proxied);
                }
                (Link::Proxies(proxies), urls)
            }
            None => return Err(format!("unsupported database URL {url}").into()),
        };
        for rule in &rules {
            if let Some(node) = &rule.node
                && !(0..n).any(|i| *node == format!("c{i}"))
            {
                return Err(format!(
                    "db_link rule names node {node}, which the run does not have (c0..c{})",
                    n - 1
                )
                .into());
            }
        }
        Ok(Some(Arc::new(DbLinks {
            link,
            rules,
            urls,
            applied: Default::default(),
            tasks: Mutex::new(Vec::new()),
        })))
    }

    /// The database URL coordinator `i` connects to.
    pub(super) fn url(&self, i: usize) -> String {
        self.urls[i % self.urls.len()].clone()
    }

    /// Applies the rules that fire as order `index` starts (those with `after_ms` a little
    /// later, on a task of their own). Returns at once: freezes heal, latencies end and
    /// locks are released on their own.
    pub(super) fn order_started(self: &Arc<Self>, index: usize) {
        for rule in self.rules.iter().filter(|r| r.at_order == index) {
            if rule.after_ms == 0 {
                self.fire(rule);
            } else {
                let (links, rule) = (Arc::clone(self), rule.clone());
                self.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(rule.after_ms)).await;
                    links.fire(&rule);
                });
            }
        }
    }

    fn fire(&self, rule: &DbLinkRule) {
        let slot = {
            let mut applied = self.applied.lock().expect("poisoned");
            applied.push(DbLinkApplied {
                at_order: rule.at_order,
                node: rule.node.clone(),
                fault: rule.fault,
                at: now(),
                error: None,
            });
            applied.len() - 1
        };
        match (&self.link, rule.fault) {
            (Link::Proxies(proxies), fault) => {
                let hit = proxies
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| rule.node.as_ref().is_none_or(|n| *n == format!("c{i}")));
                for (_, proxy) in hit {
                    self.apply(proxy, fault);
                }
            }
            (Link::Sqlite(url), DbLinkFault::Freeze { ms }) => {
                let (url, applied) = (url.clone(), Arc::clone(&self.applied));
                self.spawn(async move {
                    if let Err(e) = hold_write_lock(&url, Duration::from_millis(ms)).await {
                        applied.lock().expect("poisoned")[slot].error =
                            Some(format!("cannot hold the write lock: {e}"));
                    }
                });
            }
            (Link::Sqlite(_), _) => unreachable!("refused by DbLinks::start"),
        }
    }

    fn apply(&self, proxy: &Arc<TcpProxy>, fault: DbLinkFault) {
        match fault {
            DbLinkFault::Freeze { ms } => proxy.freeze(Duration::from_millis(ms)),
            DbLinkFault::Latency {
                to_server_ms,
                to_client_ms,
                for_ms,
            } => {
                proxy.set_latency(
                    Duration::from_millis(to_server_ms),
                    Duration::from_millis(to_client_ms),
                );
                let proxy = Arc::clone(proxy);
                self.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    proxy.set_latency(Duration::ZERO, Duration::ZERO);
                });
            }
            DbLinkFault::Cut => {
                let proxy = Arc::clone(proxy);
                self.spawn(async move { proxy.cut().await });
            }
        }
    }

    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks
            .lock()
            .expect("poisoned")
            .push(tokio::spawn(task));
    }

    /// Waits for the faults still going (a latency to end, a lock to be released) and
    /// records what fired into the report.
    pub(super) async fn finish(&self, report: &mut Report) {
        loop {
            // A delayed rule adds its fault's task when it fires: take until none are left.
            let tasks = std::mem::take(&mut *self.tasks.lock().expect("poisoned"));
            if tasks.is_empty() {
                break;
            }
            for task in tasks {
                let _ = task.await;
            }
        }
        report.db_link = self.applied.lock().expect("poisoned").clone();
    }
}

/// Holds SQLite's write lock for `hold`: what a backup or an operator's open write
/// transaction does to every other writer of the file.
async fn hold_write_lock(url: &str, hold: Duration) -> Result<(), sqlx::Error> {
    let mut conn = sqlx::SqliteConnection::connect(url).await?;
    sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await?;
    tokio::time::sleep(hold).await;
    sqlx::raw_sql("ROLLBACK").execute(&mut conn).await?;
    conn.close().await
}

/// Every rule fired, without error, as many times as planned.
pub(super) fn check(scenario: &Scenario, report: &Report, v: &mut Vec<String>) {
    for rule in &scenario.plan.db_link {
        if rule.at_order >= scenario.orders.len() {
            v.push(format!(
                "db_link rule at order {} never fired: the run has {} orders",
                rule.at_order,
                scenario.orders.len()
            ));
        } else if !report
            .db_link
            .iter()
            .any(|a| a.at_order == rule.at_order && a.fault == rule.fault)
        {
            v.push(format!(
                "db_link {} at order {} did not fire",
                rule.fault.label(),
                rule.at_order
            ));
        }
    }
    for a in &report.db_link {
        if let Some(e) = &a.error {
            v.push(format!(
                "db_link {} at order {} failed: {e}",
                a.fault.label(),
                a.at_order
            ));
        }
    }
}

/// The summary's line.
pub(super) fn describe(applied: &[DbLinkApplied]) -> Option<String> {
    if applied.is_empty() {
        return None;
    }
    let each: Vec<String> = applied
        .iter()
        .map(|a| {
            let whom = a.node.as_deref().unwrap_or("every coordinator");
            format!("{} of {whom} at order {}", a.fault.label(), a.at_order)
        })
        .collect();
    Some(format!(
        "database-link faults: {} ({})",
        applied.len(),
        each.join("; ")
    ))
}

fn now() -> Millis {
    use idem::engine::Clock;
    idem::engine::SystemClock.now()
}

//! Reads the coordinator's transaction and branch rows every few hundred ms while a run
//! goes on, over a read-only connection of its own straight to the database (never through
//! the proxy whose link the run disturbs), and feeds them to a [`RowWatch`].

use std::time::Duration;

use idem_participant::testing::Backend;
use sqlx::Row;
use sqlx::any::AnyPoolOptions;

use super::Error;
use super::rows::{BranchRow, GlobalRow, RowWatch, Sample};

/// The shortest pause between two samples; a slow read stretches it (four times the last
/// read's duration), so sampling never takes more than a fifth of the database's time.
const EVERY: Duration = Duration::from_millis(250);

pub(super) struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<(RowWatch, u32)>,
    pool: sqlx::AnyPool,
}

impl Sampler {
    /// Connects (read-only) and starts sampling.
    pub(super) async fn start(url: &str) -> Result<Sampler, Error> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url).ok_or_else(|| format!("unsupported URL {url}"))?;
        let url = match backend {
            // Read-only at the file: the sampler can never write, even by mistake.
            Backend::Sqlite => url.replace("mode=rwc", "mode=ro"),
            _ => url.to_owned(),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            // A database restart mid-run kills the connection: check before each sample.
            .test_before_acquire(true)
            .acquire_timeout(Duration::from_secs(5))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    let read_only = match backend {
                        Backend::Postgres => "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
                        Backend::Mysql => "SET SESSION TRANSACTION READ ONLY",
                        Backend::Sqlite => return Ok(()),
                    };
                    sqlx::raw_sql(read_only).execute(conn).await.map(|_| ())
                })
            })
            .connect(&url)
            .await
            .map_err(|e| format!("the row sampler cannot connect to {url}: {e}"))?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let reader = pool.clone();
        let task = tokio::spawn(async move {
            let mut watch = RowWatch::default();
            let mut failed = 0u32;
            loop {
                let started = std::time::Instant::now();
                match read(&reader).await {
                    Ok(sample) => watch.observe(sample),
                    // The database restarting, most likely: the next sample will tell.
                    Err(_) => failed += 1,
                }
                let pause = EVERY.max(started.elapsed() * 4);
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stopped.wait_for(|s| *s) => return (watch, failed),
                }
            }
        });
        Ok(Sampler { stop, task, pool })
    }

    /// Stops sampling, reads the final state as one more sample, and returns what was
    /// seen and how many samples could not be read.
    pub(super) async fn finish(self) -> Result<(RowWatch, u32), Error> {
        self.stop.send_replace(true);
        let (mut watch, failed) = self.task.await?;
        let last = read(&self.pool)
            .await
            .map_err(|e| format!("cannot read the coordinator's final rows: {e}"))?;
        watch.observe(last);
        self.pool.close().await;
        Ok((watch, failed))
    }
}

async fn read(pool: &sqlx::AnyPool) -> Result<Sample, sqlx::Error> {
    let started = now();
    let globals = sqlx::query("SELECT gid, kind, status FROM idem_global")
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(|r| {
            Ok(GlobalRow {
                gid: r.try_get(0)?,
                kind: r.try_get(1)?,
                status: r.try_get(2)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    let branches =
        sqlx::query("SELECT gid, branch_id, action, status, attempts, updated_at FROM idem_branch")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|r| {
                Ok(BranchRow {
                    gid: r.try_get(0)?,
                    branch_id: r.try_get(1)?,
                    action: r.try_get(2)?,
                    status: r.try_get(3)?,
                    // i64: the widest integer every driver decodes its INT into.
                    attempts: r.try_get::<i64, _>(4)? as i32,
                    updated_at: r.try_get(5)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Sample {
        started,
        ended: now(),
        globals,
        branches,
    })
}

fn now() -> idem::core::Millis {
    use idem::engine::Clock;
    idem::engine::SystemClock.now()
}

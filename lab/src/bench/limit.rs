//! The limit: the same SQL as one idem global transaction, grouped into the same commits,
//! run by pgbench against a database holding every table (coordinator and participants),
//! with the same number of clients. What idem reaches is compared with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Error, Workload};
use idem_participant::testing::{Backend, TestDatabase};

/// The script for a workload, under `bench/limit/<backend>/`.
pub fn script(root: &Path, backend: &str, workload: Workload) -> PathBuf {
    let name = match workload {
        Workload::Tcc => "tcc",
        Workload::Saga => "saga",
        _ => "empty",
    };
    root.join("bench/limit")
        .join(backend)
        .join(format!("{name}.sql"))
}

/// Runs the PostgreSQL limit script with pgbench (`-M prepared`, through the Unix socket)
/// and returns its transactions per second.
/// Every table in one database: the coordinator's (its migrations) and the participants'
/// (their DDL), seeded as the benchmark seeds them.
async fn create_and_seed(url: &str) -> Result<(), Error> {
    idem::server::open_store(url, &idem::store::ConnectOptions::default()).await?;
    let inventory = idem_demo::inventory::open(url).await?;
    let payment = idem_demo::payment::open(url).await?;
    for i in 0..super::SKUS {
        idem_demo::inventory::seed(&inventory, &format!("sku-{i}"), 1_000_000_000).await?;
    }
    for i in 0..super::ACCOUNTS {
        idem_demo::payment::seed(&payment, &format!("acct-{i}"), 1_000_000_000_000).await?;
    }
    inventory.close().await;
    payment.close().await;
    Ok(())
}

pub async fn postgres(
    root: &Path,
    workload: Workload,
    clients: usize,
    duration: Duration,
) -> Result<f64, Error> {
    let db = TestDatabase::create(Backend::Postgres, "limit").await;
    let socket_url = super::local_socket(&db);
    let result = async {
        create_and_seed(&socket_url).await?;
        let script = script(root, "postgres", workload);
        let out = tokio::process::Command::new("pgbench")
            .args(["-n", "-M", "prepared", "-j", "2"])
            .args([
                "-c",
                &clients.to_string(),
                "-T",
                &duration.as_secs().max(1).to_string(),
            ])
            .args(["-h", "/var/run/postgresql", "-U", "postgres", "-f"])
            .arg(&script)
            .arg(db.name())
            .output()
            .await
            .map_err(|e| format!("cannot run pgbench: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let tps = text
            .lines()
            .find(|l| l.starts_with("tps = "))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| {
                format!(
                    "pgbench gave no rate: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })?;
        Ok::<f64, Error>(tps)
    }
    .await;
    db.drop_database().await;
    result
}

/// One command of a limit script: the subset of pgbench's language the scripts use.
#[derive(Debug, Clone, PartialEq)]
enum Command {
    /// `\set name random(low, high)` or `\set name value`.
    Set { name: String, low: i64, high: i64 },
    /// `BEGIN`, `BEGIN IMMEDIATE`, `COMMIT`: sent as they are.
    Control(String),
    /// A statement with its `:name` variables turned into placeholders, in order.
    Statement { sql: String, params: Vec<String> },
}

/// Parses a limit script (see `bench/limit/README.md`).
fn parse_script(text: &str, numbered: bool) -> Result<Vec<Command>, Error> {
    let mut commands = Vec::new();
    let mut names: Vec<String> = vec!["client_id".into()];
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("--") {
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("\\set ") {
            let (name, value) = rest
                .split_once(' ')
                .ok_or_else(|| format!("bad \\set: {line}"))?;
            let value = value.trim();
            let (low, high) = match value
                .strip_prefix("random(")
                .and_then(|v| v.strip_suffix(')'))
            {
                Some(args) => {
                    let (a, b) = args
                        .split_once(',')
                        .ok_or_else(|| format!("bad random: {line}"))?;
                    (a.trim().parse()?, b.trim().parse()?)
                }
                None => {
                    let v: i64 = value.parse()?;
                    (v, v)
                }
            };
            names.push(name.to_owned());
            commands.push(Command::Set {
                name: name.to_owned(),
                low,
                high,
            });
            continue;
        }
        pending.push_str(line);
        pending.push('\n');
        if trimmed.ends_with(';') {
            let sql = pending.trim().trim_end_matches(';').trim().to_owned();
            pending.clear();
            let upper = sql.to_ascii_uppercase();
            if upper == "BEGIN" || upper == "BEGIN IMMEDIATE" || upper == "COMMIT" {
                commands.push(Command::Control(sql));
                continue;
            }
            let (sql, params) = substitute(&sql, &names, numbered);
            commands.push(Command::Statement { sql, params });
        }
    }
    Ok(commands)
}

/// Replaces `:name` (a known variable) with a placeholder, as pgbench's prepared mode does.
fn substitute(sql: &str, names: &[String], numbered: bool) -> (String, Vec<String>) {
    let mut out = String::with_capacity(sql.len());
    let mut params = Vec::new();
    let bytes = sql.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b':'
            && i + 1 < bytes.len()
            && bytes[i + 1] != b':'
            && (i == 0 || bytes[i - 1] != b':')
        {
            let end = sql[i + 1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(sql.len(), |e| i + 1 + e);
            let name = &sql[i + 1..end];
            if names.iter().any(|n| n == name) {
                params.push(name.to_owned());
                if numbered {
                    out.push_str(&format!("${}", params.len()));
                } else {
                    out.push('?');
                }
                i = end;
                continue;
            }
        }
        out.push(bytes[i] as char);
        i += 1;
    }
    (out, params)
}

/// Runs a limit script with `clients` connections for `duration` through sqlx (MariaDB,
/// SQLite), and returns completed scripts per second.
pub async fn scripted(
    url: &str,
    script_text: &str,
    clients: usize,
    duration: Duration,
) -> Result<f64, Error> {
    use rand::RngExt;
    use sqlx::Connection;
    sqlx::any::install_default_drivers();
    let commands = std::sync::Arc::new(parse_script(script_text, false)?);
    let end = std::time::Instant::now() + duration;
    let mut tasks = Vec::new();
    for client in 0..clients {
        let (url, commands) = (url.to_owned(), std::sync::Arc::clone(&commands));
        tasks.push(tokio::spawn(async move {
            use sqlx::ConnectOptions;
            // SQLite's writers wait for each other here; that is the point, not a warning.
            let options = <sqlx::any::AnyConnectOptions as std::str::FromStr>::from_str(&url)?
                .disable_statement_logging();
            let mut conn = sqlx::AnyConnection::connect_with(&options).await?;
            let mut done = 0u64;
            let mut values = std::collections::HashMap::<String, i64>::new();
            values.insert("client_id".into(), client as i64);
            while std::time::Instant::now() < end {
                let mut failed = false;
                for command in commands.iter() {
                    let result = match command {
                        Command::Set { name, low, high } => {
                            values.insert(name.clone(), rand::rng().random_range(*low..=*high));
                            Ok(())
                        }
                        Command::Control(sql) => sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                            .execute(&mut conn)
                            .await
                            .map(|_| ()),
                        Command::Statement { sql, params } => {
                            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
                            for p in params {
                                query = query.bind(values[p]);
                            }
                            query.fetch_all(&mut conn).await.map(|_| ())
                        }
                    };
                    if result.is_err() {
                        failed = true;
                        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut conn).await;
                        break;
                    }
                }
                if !failed {
                    done += 1;
                }
            }
            Ok::<u64, Error>(done)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / duration.as_secs_f64())
}

/// Sets up one database with every table (MariaDB or SQLite) and runs the workload's
/// limit script on it.
pub async fn other(
    root: &Path,
    backend: &str,
    workload: Workload,
    clients: usize,
    duration: Duration,
) -> Result<f64, Error> {
    let (url, db, dir) = match backend {
        "mysql" => {
            let db = TestDatabase::create(Backend::Mysql, "limit").await;
            (super::local_socket(&db), Some(db), None)
        }
        _ => {
            let dir =
                std::env::temp_dir().join(format!("idem-limit-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir)?;
            (
                format!("sqlite://{}?mode=rwc", dir.join("all.db").display()),
                None,
                Some(dir),
            )
        }
    };
    let result = async {
        create_and_seed(&url).await?;
        let text = std::fs::read_to_string(script(root, backend, workload))?;
        scripted(&url, &text, clients, duration).await
    }
    .await;
    if let Some(db) = db {
        db.drop_database().await;
    }
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_parse_like_pgbench() {
        let script = "-- c\n\\set r random(1, 10)\n\\set k 5\nBEGIN;\nSELECT ':r', :r, :k, x::text,\n  :client_id, '{\"a\": 1}';\nCOMMIT;\n";
        let commands = parse_script(script, false).unwrap();
        assert_eq!(commands.len(), 5);
        assert_eq!(
            commands[0],
            Command::Set {
                name: "r".into(),
                low: 1,
                high: 10
            }
        );
        assert_eq!(
            commands[1],
            Command::Set {
                name: "k".into(),
                low: 5,
                high: 5
            }
        );
        assert_eq!(commands[2], Command::Control("BEGIN".into()));
        match &commands[3] {
            Command::Statement { sql, params } => {
                assert_eq!(sql, "SELECT '?', ?, ?, x::text,\n  ?, '{\"a\": 1}'");
                assert_eq!(params, &["r", "r", "k", "client_id"]);
            }
            other => panic!("{other:?}"),
        }
        let (numbered, _) = substitute("a = :r AND b = :r", &["r".into()], true);
        assert_eq!(numbered, "a = $1 AND b = $2");
    }

    #[test]
    fn every_limit_script_parses() {
        // The scripts are at the checkout's root, where `--limit` runs.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for backend in ["postgres", "mysql", "sqlite"] {
            for workload in [Workload::Tcc, Workload::Saga, Workload::Empty] {
                let path = script(root, backend, workload);
                let text = std::fs::read_to_string(&path).unwrap();
                let commands = parse_script(&text, backend == "postgres").unwrap();
                let statements = commands
                    .iter()
                    .filter(|c| matches!(c, Command::Statement { .. }))
                    .count();
                assert!(statements >= 3, "{}", path.display());
            }
        }
    }
}

//! `idem serve` as a child process, the one way the coordinator's tests and the lab start
//! it: [`IdemServe`] says how (flags with defaults a caller can replace, environment, where
//! the log goes), [`IdemProcess`] is the running process, whose address is the first line
//! it prints.
//!
//! ```no_run
//! # async fn example(bin: &str) -> Result<(), idem_participant::testing::StartError> {
//! use std::time::Duration;
//! use idem_participant::testing::IdemServe;
//!
//! let mut idem = IdemServe::new(bin, "sqlite::memory:")
//!     .quick()
//!     .args(["--node", "a"])
//!     .start(Duration::from_secs(30))
//!     .await?;
//! println!("serving at {}", idem.url());
//! idem.kill();
//! # Ok(()) }
//! ```

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};
use tokio::sync::Notify;

/// Why `idem serve` did not come to serve.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The binary could not be started (or its log file opened).
    #[error("cannot start {bin}: {source}")]
    Spawn {
        /// The binary's path.
        bin: String,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// It did not print its address in time.
    #[error("idem serve did not serve within {within:?}{}", tail(log))]
    Timeout {
        /// How long it was given.
        within: Duration,
        /// Its collected log, if collected.
        log: String,
    },
    /// It ended before printing its address.
    #[error("idem serve exited before serving{}", tail(log))]
    Exited {
        /// Its collected log, if collected.
        log: String,
    },
    /// Its first line holds no URL.
    #[error("unexpected first line from idem serve: {line:?}")]
    Unexpected {
        /// The line.
        line: String,
    },
    /// Its output could not be read.
    #[error("cannot read idem serve's output: {0}")]
    Read(#[from] std::io::Error),
}

fn tail(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("; its log:\n{log}")
    }
}

/// Where the child's stderr (its log) goes.
enum LogTo {
    Inherit,
    File { path: PathBuf, append: bool },
    Collect,
}

/// How to start `idem serve`.
pub struct IdemServe {
    bin: PathBuf,
    /// Flags given unless the explicit arguments name them (clap refuses a flag twice).
    defaults: Vec<(String, String)>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    clear_inherited: bool,
    log: LogTo,
}

impl IdemServe {
    /// `idem serve --database-url <database_url> --listen 127.0.0.1:0` from the binary at
    /// `bin` (a test's `env!("CARGO_BIN_EXE_idem")`), logging warnings to this stderr.
    pub fn new(bin: impl Into<PathBuf>, database_url: &str) -> IdemServe {
        IdemServe {
            bin: bin.into(),
            defaults: vec![
                ("--database-url".into(), database_url.into()),
                ("--listen".into(), "127.0.0.1:0".into()),
            ],
            args: Vec::new(),
            env: vec![("RUST_LOG".into(), "warn".into())],
            clear_inherited: false,
            log: LogTo::Inherit,
        }
    }

    /// `flag value`, unless the explicit [`args`](IdemServe::args) give `flag`.
    pub fn default_flag(mut self, flag: &str, value: impl ToString) -> IdemServe {
        self.defaults.retain(|(f, _)| f != flag);
        self.defaults.push((flag.into(), value.to_string()));
        self
    }

    /// Short leases and retry delays, no fsync on SQLite: what the tests that kill and
    /// restart coordinators run with, so that recoveries take a second, not a minute.
    pub fn quick(self) -> IdemServe {
        self.default_flag("--lease-ms", 1_500)
            .default_flag("--recovery-interval-ms", 100)
            .default_flag("--retry-interval-ms", 50)
            .default_flag("--max-retry-interval-ms", 200)
            .default_flag("--sqlite-full-sync", false)
    }

    /// More arguments; a flag named here replaces its default.
    pub fn args<I, S>(mut self, args: I) -> IdemServe
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable (replacing an earlier value of it, `RUST_LOG`'s `warn`
    /// included).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> IdemServe {
        let key = key.as_ref().to_owned();
        self.env.retain(|(k, _)| *k != key);
        self.env.push((key, value.as_ref().to_owned()));
        self
    }

    /// Leaves out what this process's environment would pass on to idem (`IDEM_…`,
    /// `RUST_LOG`, `NO_COLOR`) and the default `RUST_LOG`: idem as an operator starts it,
    /// configured only by [`args`](IdemServe::args) and [`env`](IdemServe::env).
    pub fn without_inherited_env(mut self) -> IdemServe {
        self.clear_inherited = true;
        self.env.retain(|(k, _)| k != "RUST_LOG");
        self
    }

    /// The log (stderr) to `path`, created or truncated, or appended to (a supervisor's
    /// restarts write one file).
    pub fn log_to(mut self, path: impl Into<PathBuf>, append: bool) -> IdemServe {
        self.log = LogTo::File {
            path: path.into(),
            append,
        };
        self
    }

    /// The log kept in memory, line by line, for [`IdemProcess::log`] and
    /// [`IdemProcess::wait_log`].
    pub fn collect_log(mut self) -> IdemServe {
        self.log = LogTo::Collect;
        self
    }

    /// `idem serve`'s whole argument list.
    pub fn arg_list(&self) -> Vec<OsString> {
        let mut list: Vec<OsString> = vec!["serve".into()];
        for (flag, value) in &self.defaults {
            if !self.args.iter().any(|a| a == flag.as_str()) {
                list.extend([flag.into(), value.into()]);
            }
        }
        list.extend(self.args.iter().cloned());
        list
    }

    /// Starts the process without waiting for it to serve (its start may wait for a
    /// database): [`IdemProcess::listening`] waits.
    pub fn spawn(self) -> Result<IdemProcess, StartError> {
        let mut command = tokio::process::Command::new(&self.bin);
        if self.clear_inherited {
            for (name, _) in std::env::vars_os() {
                let text = name.to_string_lossy();
                if text.starts_with("IDEM_") || text == "RUST_LOG" || text == "NO_COLOR" {
                    command.env_remove(&name);
                }
            }
        }
        let stderr = match &self.log {
            LogTo::Inherit => Stdio::inherit(),
            LogTo::Collect => Stdio::piped(),
            LogTo::File { path, append } => open_log(path, *append)
                .map_err(|source| self.spawn_error(source))?
                .into(),
        };
        let mut child = command
            .args(self.arg_list())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| self.spawn_error(source))?;
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take().map(|s| BufReader::new(s).lines());
        let log = match child.stderr.take() {
            Some(stderr) => {
                let log = Arc::new(Log::default());
                let sink = Arc::clone(&log);
                let mut lines = BufReader::new(stderr).lines();
                tokio::spawn(async move {
                    while let Ok(Some(line)) = lines.next_line().await {
                        sink.lines.lock().unwrap().push(line);
                        sink.changed.notify_waiters();
                    }
                });
                Some(log)
            }
            None => None,
        };
        Ok(IdemProcess {
            child,
            pid,
            stdout,
            url: String::new(),
            grpc_addr: None,
            log,
        })
    }

    /// Starts the process and waits up to `within` until it serves.
    pub async fn start(self, within: Duration) -> Result<IdemProcess, StartError> {
        let mut process = self.spawn()?;
        process.listening(within).await?;
        Ok(process)
    }

    fn spawn_error(&self, source: std::io::Error) -> StartError {
        StartError::Spawn {
            bin: self.bin.display().to_string(),
            source,
        }
    }
}

fn open_log(path: &Path, append: bool) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(path)
}

/// A collected log and a signal for each line that arrives.
#[derive(Default)]
struct Log {
    lines: Mutex<Vec<String>>,
    changed: Notify,
}

/// A running `idem serve`, killed when dropped.
pub struct IdemProcess {
    child: Child,
    pid: u32,
    /// Until the address has been read; then drained on a task of its own, so that the
    /// child never writes into a closed pipe.
    stdout: Option<Lines<BufReader<ChildStdout>>>,
    url: String,
    /// The gRPC listener's `host:port`, with `--grpc-listen`.
    grpc_addr: Option<String>,
    log: Option<Arc<Log>>,
}

impl IdemProcess {
    /// Waits up to `within` for the line idem prints once it serves, and returns its base
    /// URL (`http://…` or `https://…`). Later calls return it at once.
    pub async fn listening(&mut self, within: Duration) -> Result<String, StartError> {
        let Some(mut stdout) = self.stdout.take() else {
            return Ok(self.url.clone());
        };
        let deadline = tokio::time::Instant::now() + within;
        // `--grpc-listen` adds a line before the HTTP one, with the gRPC address.
        let (line, url) = loop {
            let line = match tokio::time::timeout_at(deadline, stdout.next_line()).await {
                Err(_) => {
                    return Err(StartError::Timeout {
                        within,
                        log: self.log(),
                    });
                }
                Ok(line) => line?,
            };
            let Some(line) = line else {
                return Err(StartError::Exited { log: self.log() });
            };
            if line.starts_with("idem gRPC") {
                self.grpc_addr = line.split_whitespace().last().map(str::to_owned);
                continue;
            }
            let url = line
                .split_whitespace()
                .find(|w| w.starts_with("http://") || w.starts_with("https://"))
                .map(str::to_owned);
            break (line, url);
        };
        let url = url.ok_or_else(|| StartError::Unexpected { line: line.clone() })?;
        self.url = url;
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        Ok(self.url.clone())
    }

    /// The gRPC listener's `host:port` (`--grpc-listen`), once
    /// [`listening`](IdemProcess::listening) has read it.
    pub fn grpc_addr(&self) -> Option<&str> {
        self.grpc_addr.as_deref()
    }

    /// The base URL; empty until [`listening`](IdemProcess::listening) has read it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The process id (that of a process that has ended, once it has).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `HUP`).
    pub fn signal(&self, name: &str) -> std::io::Result<()> {
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), self.pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{name} {} failed: {status}",
                self.pid
            )))
        }
    }

    /// SIGKILL: no shutdown, no lease handed back; returns once the process is gone.
    pub fn kill(&mut self) {
        if self.child.start_kill().is_err() {
            return; // already reaped
        }
        // A killed process ends at once; reap it so that the next step sees it gone.
        while let Ok(None) = self.child.try_wait() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// SIGTERM, then waits up to `within` for the process to exit; how long it took.
    pub async fn terminate(&mut self, within: Duration) -> std::io::Result<Duration> {
        let started = Instant::now();
        self.signal("TERM")?;
        match self.wait_exit(within).await? {
            Some(_) => Ok(started.elapsed()),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("idem serve did not exit within {within:?} of SIGTERM"),
            )),
        }
    }

    /// Waits for the process to exit, however long that takes (a supervisor's wait).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    /// Waits up to `within` for the process to exit; `None` if it still runs.
    pub async fn wait_exit(&mut self, within: Duration) -> std::io::Result<Option<ExitStatus>> {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => status.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The collected log so far (see [`IdemServe::collect_log`]); empty otherwise.
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .map(|log| log.lines.lock().unwrap().join("\n"))
            .unwrap_or_default()
    }

    /// Lines of the collected log containing `text`.
    pub fn count(&self, text: &str) -> usize {
        self.log.as_ref().map_or(0, |log| {
            log.lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(text))
                .count()
        })
    }

    /// Waits until `done(the collected log's lines)` holds; `false` after `within`.
    pub async fn wait_log(&self, within: Duration, done: impl Fn(&[String]) -> bool) -> bool {
        let Some(log) = &self.log else { return false };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let changed = log.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if done(&log.lines.lock().unwrap()) {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return false;
            }
        }
    }

    /// `VmRSS` and `VmHWM` (the peak), in KiB, from `/proc`.
    pub fn memory_kib(&self) -> std::io::Result<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .ok_or_else(|| std::io::Error::other(format!("no {name} in /proc status")))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// CPU time used so far (user and system), in seconds, from `/proc`.
    pub fn cpu_seconds(&self) -> std::io::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid))?;
        // The fields after the command name, which may hold spaces, in parentheses.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
            .sum();
        Ok(ticks / 100.0)
    }
}

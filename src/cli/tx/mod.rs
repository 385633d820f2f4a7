//! `idem tx`: the operator's commands.
//!
//! They talk to a running coordinator through its HTTP API — `--server URL`, else
//! `IDEM_SERVER`, else the address `idem serve` listens on by default — so they see what
//! the coordinator sees and never touch a database by accident. `--database-url`, given
//! on the command line, works on that database directly instead (when no coordinator
//! runs); it is never read from `IDEM_DATABASE_URL`, which is the server's setting, and
//! never combined with `--server`. Whichever way, a command prints the same: a table with
//! RFC 3339 times, or with `--json` the transaction view exactly as the API gives it.

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::Value;

use super::BoxError;
use crate::core::{Kind, Status};

mod bulk;
mod direct;
mod remote;
mod render;

pub use bulk::SelectArgs;

/// The address `idem serve` listens on unless told otherwise.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8686";

/// Which coordinator (or database) a command works on.
#[derive(Debug, Args, Clone)]
pub struct TargetArgs {
    /// The coordinator's HTTP API [env: IDEM_SERVER] [default: http://127.0.0.1:8686].
    // The environment is read by hand, not by clap: an explicit --database-url must beat
    // IDEM_SERVER (with a note) but clash with an explicit --server, and clap does not tell
    // a flag from an environment variable.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Work on this database directly instead of through a coordinator (sqlite:PATH,
    /// postgres://..., mysql://...). Never creates or migrates it. Not read from
    /// IDEM_DATABASE_URL.
    #[arg(long, value_name = "URL", conflicts_with = "server")]
    pub database_url: Option<String>,
    /// The API token to present to a coordinator that requires tokens (`idem token
    /// issue`); commands act in its tenant with its role.
    #[arg(
        long,
        env = "IDEM_TOKEN",
        hide_env_values = true,
        conflicts_with = "database_url"
    )]
    pub token: Option<String>,
    /// Trust the CA certificates of this PEM bundle, besides the system's roots, for a
    /// coordinator served over HTTPS with a private CA.
    #[arg(
        long,
        env = "IDEM_CA_FILE",
        value_name = "PATH",
        conflicts_with = "database_url"
    )]
    pub ca_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TxCommand {
    /// List transactions, newest first.
    List {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(long)]
        status: Option<Status>,
        #[arg(long)]
        kind: Option<Kind>,
        /// At most this many (1-1000).
        #[arg(long, default_value_t = crate::api::validate::DEFAULT_LIST_LIMIT)]
        limit: u32,
        /// Continue a listing where the last page ended (the `next_cursor` it printed).
        #[arg(long)]
        cursor: Option<String>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one transaction with its branches and retry history.
    Show {
        #[command(flatten)]
        target: TargetArgs,
        gid: String,
        /// Print the API's JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Resume a stalled transaction (or make a backing-off one due now); with --status
    /// instead of a gid, every one the filter selects.
    Retry {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(required_unless_present = "status")]
        gid: Option<String>,
        #[command(flatten)]
        select: SelectArgs,
        #[arg(long)]
        json: bool,
    },
    /// Mark a transaction failed and call nothing more for it; with --status instead of a
    /// gid, every one the filter selects.
    ForceStop {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(required_unless_present = "status")]
        gid: Option<String>,
        #[command(flatten)]
        select: SelectArgs,
        #[arg(long, default_value = "force-stopped by an operator")]
        reason: String,
        #[arg(long)]
        json: bool,
    },
    /// Roll back a prepared TCC (its Cancels are called) or msg transaction; with --status
    /// instead of a gid, every one the filter selects.
    Abort {
        #[command(flatten)]
        target: TargetArgs,
        #[arg(required_unless_present = "status")]
        gid: Option<String>,
        #[command(flatten)]
        select: SelectArgs,
        #[arg(long, default_value = "aborted by an operator")]
        reason: String,
        #[arg(long)]
        json: bool,
    },
}

/// What `tx list` asks for.
#[derive(Clone, Debug, Default)]
pub(crate) struct ListQuery {
    pub status: Option<Status>,
    pub kind: Option<Kind>,
    pub limit: u32,
    pub cursor: Option<String>,
}

/// The operations that change a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Operation {
    Retry,
    ForceStop,
    Abort,
}

impl Operation {
    /// The API path's last segment.
    fn path(self) -> &'static str {
        match self {
            Operation::Retry => "retry",
            Operation::ForceStop => "force-stop",
            Operation::Abort => "abort",
        }
    }
}

/// Where the commands go, once the flags and the environment are weighed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    Server(String),
    Database(String),
}

impl TargetArgs {
    /// `--database-url` → that database; else `--server`, `IDEM_SERVER`, the default
    /// address. `env_server` is `IDEM_SERVER`'s value. Returns a note for the operator when
    /// an explicit `--database-url` overrides `IDEM_SERVER`, so neither is ignored
    /// silently.
    pub(crate) fn destination(&self, env_server: Option<String>) -> (Destination, Option<String>) {
        let env_server = env_server.filter(|s| !s.is_empty());
        if let Some(url) = &self.database_url {
            let note = env_server.map(|s| {
                format!("--database-url given: working on the database directly, not through IDEM_SERVER={s}")
            });
            return (Destination::Database(url.clone()), note);
        }
        let server = self
            .server
            .clone()
            .or(env_server)
            .unwrap_or_else(|| DEFAULT_SERVER.to_owned());
        (Destination::Server(server), None)
    }
}

/// A coordinator's API or a database, behind one interface. Every answer is JSON shaped as
/// the API's.
enum Target {
    // Boxed: the client with its URLs is much larger than the database handle.
    Server(Box<remote::Remote>),
    Database(direct::Direct),
}

impl Target {
    async fn open(args: &TargetArgs) -> Result<Target, BoxError> {
        let (destination, note) = args.destination(std::env::var("IDEM_SERVER").ok());
        if let Some(note) = note {
            // stderr may be closed too; a note is not worth failing for.
            let _ = writeln!(std::io::stderr(), "idem: note: {note}");
        }
        Ok(match destination {
            Destination::Server(url) => Target::Server(Box::new(remote::Remote::new(
                &url,
                args.token.as_deref(),
                args.ca_file.as_deref(),
            )?)),
            Destination::Database(url) => Target::Database(direct::Direct::open(&url).await?),
        })
    }

    async fn list(&self, query: &ListQuery) -> Result<Value, BoxError> {
        match self {
            Target::Server(r) => r.list(query).await,
            Target::Database(d) => d.list(query).await,
        }
    }

    async fn show(&self, gid: &str) -> Result<Value, BoxError> {
        match self {
            Target::Server(r) => r.show(gid).await,
            Target::Database(d) => d.show(gid).await,
        }
    }

    async fn operate(&self, gid: &str, op: Operation, reason: &str) -> Result<Value, BoxError> {
        match self {
            Target::Server(r) => r.operate(gid, op, reason).await,
            Target::Database(d) => d.operate(gid, op, reason).await,
        }
    }
}

pub(super) async fn run(cmd: TxCommand) -> Result<(), BoxError> {
    let text = match cmd {
        TxCommand::List {
            target,
            status,
            kind,
            limit,
            cursor,
            json,
        } => {
            let query = ListQuery {
                status,
                kind,
                limit,
                cursor,
            };
            let page = Target::open(&target).await?.list(&query).await?;
            if json {
                render::json(&page)?
            } else {
                render::list(&page)?
            }
        }
        TxCommand::Show { target, gid, json } => {
            let tx = Target::open(&target).await?.show(&gid).await?;
            if json {
                render::json(&tx)?
            } else {
                render::show(&tx)?
            }
        }
        TxCommand::Retry {
            target,
            gid,
            select,
            json,
        } => match gid {
            Some(gid) => operate(&target, &gid, Operation::Retry, "", json).await?,
            None => bulk::run(&target, &select, Operation::Retry, None, json).await?,
        },
        TxCommand::ForceStop {
            target,
            gid,
            select,
            reason,
            json,
        } => match gid {
            Some(gid) => operate(&target, &gid, Operation::ForceStop, &reason, json).await?,
            None => bulk::run(&target, &select, Operation::ForceStop, Some(&reason), json).await?,
        },
        TxCommand::Abort {
            target,
            gid,
            select,
            reason,
            json,
        } => match gid {
            Some(gid) => operate(&target, &gid, Operation::Abort, &reason, json).await?,
            None => bulk::run(&target, &select, Operation::Abort, Some(&reason), json).await?,
        },
    };
    emit(&text)
}

async fn operate(
    args: &TargetArgs,
    gid: &str,
    op: Operation,
    reason: &str,
    json: bool,
) -> Result<String, BoxError> {
    let target = Target::open(args).await?;
    let tx = target.operate(gid, op, reason).await?;
    if json {
        return render::json(&tx);
    }
    let mut line = render::outcome(&tx)?;
    if matches!(target, Target::Database(_)) && op != Operation::ForceStop {
        // Without a coordinator in this process, the row was released for one to pick up.
        line.push_str(" (a running idem serve on this database continues it)");
    }
    line.push('\n');
    Ok(line)
}

/// Writes the output. A reader that stops early (`| head`) closes the pipe: that ends the
/// command quietly with status 0 — what was wanted was read — rather than a panic or an
/// error message.
fn emit(text: &str) -> Result<(), BoxError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn target(args: &[&str]) -> TargetArgs {
        let mut argv = vec!["idem", "tx", "list"];
        argv.extend(args);
        match Cli::parse_from(argv).command {
            Command::Tx(TxCommand::List { target, .. }) => target,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_destination_follows_the_documented_precedence() {
        let server = |s: &str| (Destination::Server(s.into()), None);
        assert_eq!(target(&[]).destination(None), server(DEFAULT_SERVER));
        assert_eq!(
            target(&[]).destination(Some("http://env:1".into())),
            server("http://env:1")
        );
        // An empty variable counts as unset, as shells often leave one.
        assert_eq!(
            target(&[]).destination(Some(String::new())),
            server(DEFAULT_SERVER)
        );
        assert_eq!(
            target(&["--server", "http://flag:2"]).destination(Some("http://env:1".into())),
            server("http://flag:2")
        );
        let (dest, note) = target(&["--database-url", "sqlite:x.db"]).destination(None);
        assert_eq!(
            (dest, note),
            (Destination::Database("sqlite:x.db".into()), None)
        );
        let (dest, note) =
            target(&["--database-url", "sqlite:x.db"]).destination(Some("http://env:1".into()));
        assert_eq!(dest, Destination::Database("sqlite:x.db".into()));
        assert!(note.unwrap().contains("IDEM_SERVER=http://env:1"));
    }

    #[test]
    fn server_and_database_url_together_are_refused() {
        let both = Cli::try_parse_from([
            "idem",
            "tx",
            "show",
            "g",
            "--server",
            "http://x",
            "--database-url",
            "sqlite:x.db",
        ]);
        assert!(both.is_err());
    }
}

//! Where a command's settings come from: its flag, then its `IDEM_…` environment
//! variable, then the TOML file named by `--config`, then the built-in default.
//!
//! clap already orders flag > env > default. The file slots in between by becoming the
//! defaults of the subcommand it configures, so every argument of that subcommand (one
//! added later too) can be set in the file with no code of its own. The file's keys are
//! the arguments' ids: the long flags' names in snake_case (`lease_ms` for `--lease-ms`).
//! A key that is no argument, or a value of the wrong type, is an error naming the key
//! and the file.

use std::any::TypeId;
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::ContextKind;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory, FromArgMatches};

/// The id of the argument that names the file, in any subcommand that takes one.
pub const CONFIG_ARG: &str = "config";

/// A parsed command line, and what it takes to say where each value came from.
pub struct Loaded<C> {
    pub cli: C,
    /// The matches of the whole command line, with the file's values as defaults.
    pub matches: ArgMatches,
    /// The file that was read, if any.
    pub file: Option<FileLayer>,
}

/// A configuration file that was read.
#[derive(Debug, Clone)]
pub struct FileLayer {
    pub path: PathBuf,
    /// The argument ids it set.
    pub keys: BTreeSet<String>,
}

/// Why a command line could not be loaded.
#[derive(Debug)]
pub enum LoadError {
    /// clap's own: a bad flag, or `--help` and `--version`.
    Usage(clap::Error),
    /// The configuration file cannot be read, is not TOML, or has a bad key or value.
    File(String),
    /// Settings that are each valid but contradict each other (the message names them).
    Settings(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Usage(e) => write!(f, "{e}"),
            LoadError::File(e) | LoadError::Settings(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    /// Prints the error and exits: clap's errors as clap prints them (help and version
    /// with status 0), a file's and contradicting settings as `bin: message` with status
    /// 2, that of a usage error.
    pub fn exit(self, bin: &str) -> ! {
        match self {
            LoadError::Usage(e) => e.exit(),
            LoadError::File(e) | LoadError::Settings(e) => {
                eprintln!("{bin}: {e}");
                std::process::exit(2)
            }
        }
    }
}

/// Parses `argv` as `C`, with the values of the file that the subcommand's `--config`
/// names (flag or env) as that subcommand's defaults.
pub fn load<C>(argv: impl IntoIterator<Item = impl Into<OsString>>) -> Result<Loaded<C>, LoadError>
where
    C: CommandFactory + FromArgMatches,
{
    let argv: Vec<OsString> = argv.into_iter().map(Into::into).collect();
    let cmd = C::command();
    let first = cmd
        .clone()
        .try_get_matches_from(&argv)
        .map_err(LoadError::Usage)?;
    let (cmd, file) = with_file_defaults(cmd, &first)?;
    let matches = cmd.try_get_matches_from(&argv).map_err(LoadError::Usage)?;
    let cli = C::from_arg_matches(&matches).map_err(LoadError::Usage)?;
    Ok(Loaded { cli, matches, file })
}

fn with_file_defaults(
    cmd: Command,
    first: &ArgMatches,
) -> Result<(Command, Option<FileLayer>), LoadError> {
    let Some((name, sub)) = first.subcommand() else {
        return Ok((cmd, None));
    };
    let Ok(Some(path)) = sub.try_get_one::<PathBuf>(CONFIG_ARG) else {
        return Ok((cmd, None));
    };
    let path = path.clone();
    let values = read_file(&cmd, &path)?;
    let sub_cmd = cmd
        .find_subcommand(name)
        .expect("the matched subcommand exists");
    // One file serves every subcommand that reads one (`serve`, `config`, `migrate`):
    // each takes the keys it has.
    let values: Vec<_> = values
        .into_iter()
        .filter(|(id, _)| configurable(sub_cmd).any(|a| a.get_id() == id.as_str()))
        .collect();
    let keys = values.iter().map(|(id, _)| id.clone()).collect();
    let cmd = cmd.mut_subcommand(name, |mut sub_cmd| {
        for (id, vals) in values {
            sub_cmd = sub_cmd.mut_arg(id, |arg| arg.default_values(vals));
        }
        sub_cmd
    });
    Ok((cmd, Some(FileLayer { path, keys })))
}

/// The subcommands that read a file, and each one's configurable arguments.
fn file_readers(cmd: &Command) -> impl Iterator<Item = (&Command, &Arg)> {
    cmd.get_subcommands()
        .filter(|sub| sub.get_arguments().any(|a| a.get_id() == CONFIG_ARG))
        .flat_map(|sub| configurable(sub).map(move |arg| (sub, arg)))
}

/// The file's values as the strings clap would have read on a command line, each
/// checked with its argument's own parser. A key must be an option of some subcommand
/// that reads the file.
fn read_file(cmd: &Command, path: &Path) -> Result<Vec<(String, Vec<String>)>, LoadError> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError::File(format!("cannot read {shown}: {e}")))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| LoadError::File(format!("{shown} is not valid TOML: {e}")))?;
    let mut out = Vec::new();
    for (key, value) in &table {
        let Some((owner, arg)) = file_readers(cmd).find(|(_, a)| a.get_id() == key.as_str()) else {
            return Err(LoadError::File(unknown_key(cmd, key, path)));
        };
        let bad = |why: String| LoadError::File(format!("`{key}` in {shown}: {why}"));
        let kind = Kind::of(arg);
        let vals = match value {
            toml::Value::Array(items) if takes_many(arg) => items
                .iter()
                .map(|v| kind.text(v).ok_or_else(|| bad(kind.expected(v))))
                .collect::<Result<Vec<_>, _>>()?,
            v => vec![kind.text(v).ok_or_else(|| bad(kind.expected(v)))?],
        };
        check(owner, arg, &vals).map_err(bad)?;
        out.push((key.clone(), vals));
    }
    Ok(out)
}

fn unknown_key(cmd: &Command, key: &str, path: &Path) -> String {
    let snake = key.replace('-', "_");
    let hint = if file_readers(cmd).any(|(_, a)| a.get_id() == snake.as_str()) {
        format!("; keys are snake_case: `{snake}`")
    } else {
        "; the keys are the long flags in snake_case, as `idem config` prints them".to_owned()
    };
    format!("unknown key `{key}` in {}{hint}", path.display())
}

/// The arguments a file may set: the subcommand's options, not `--config` itself, help
/// or version.
pub fn configurable(cmd: &Command) -> impl Iterator<Item = &Arg> {
    cmd.get_arguments().filter(|a| {
        a.get_id() != CONFIG_ARG
            && a.get_long().is_some()
            && !matches!(
                a.get_action(),
                ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
            )
    })
}

fn takes_many(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Append)
        || arg.get_num_args().is_some_and(|n| n.max_values() > 1)
}

/// Runs the subcommand's own parser over the values, as if they were flags, so that a
/// range or a choice is enforced exactly as on the command line.
fn check(cmd: &Command, arg: &Arg, values: &[String]) -> Result<(), String> {
    if !arg.get_action().takes_values() {
        // A switch (`SetTrue`): the value was a TOML boolean, which is all it takes.
        return Ok(());
    }
    let long = arg
        .get_long()
        .expect("configurable arguments are long flags");
    let argv = values.iter().map(|v| format!("--{long}={v}"));
    match cmd.clone().no_binary_name(true).try_get_matches_from(argv) {
        Ok(_) => Ok(()),
        Err(e) => Err(reason(&e)),
    }
}

/// clap's reason without its usage lines: the parser's own error when there is one.
fn reason(e: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(e) {
        return source.to_string();
    }
    let rendered = e.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    let mut why = first.trim_start_matches("error: ").to_owned();
    if let Some(valid) = e.get(ContextKind::ValidValue) {
        why.push_str(&format!(" (possible values: {valid})"));
    }
    why
}

/// The TOML type an argument takes, from the type its value parser produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Integer,
    Float,
    Bool,
    Text,
}

impl Kind {
    fn of(arg: &Arg) -> Kind {
        if !arg.get_action().takes_values() {
            return Kind::Bool;
        }
        let produced = arg.get_value_parser().type_id();
        let is = |types: &[TypeId]| types.iter().any(|t| produced == *t);
        if is(&[
            TypeId::of::<i8>(),
            TypeId::of::<i16>(),
            TypeId::of::<i32>(),
            TypeId::of::<i64>(),
            TypeId::of::<isize>(),
            TypeId::of::<u8>(),
            TypeId::of::<u16>(),
            TypeId::of::<u32>(),
            TypeId::of::<u64>(),
            TypeId::of::<usize>(),
        ]) {
            Kind::Integer
        } else if is(&[TypeId::of::<f32>(), TypeId::of::<f64>()]) {
            Kind::Float
        } else if is(&[TypeId::of::<bool>()]) {
            Kind::Bool
        } else {
            Kind::Text
        }
    }

    /// The value as command-line text, if it has this kind's TOML type.
    fn text(self, value: &toml::Value) -> Option<String> {
        use toml::Value as V;
        match (self, value) {
            (Kind::Integer, V::Integer(i)) => Some(i.to_string()),
            (Kind::Float, V::Float(f)) => Some(f.to_string()),
            (Kind::Float, V::Integer(i)) => Some(i.to_string()),
            (Kind::Bool, V::Boolean(b)) => Some(b.to_string()),
            (Kind::Text, V::String(s)) => Some(s.clone()),
            _ => None,
        }
    }

    fn expected(self, found: &toml::Value) -> String {
        let wanted = match self {
            Kind::Integer => "an integer",
            Kind::Float => "a number",
            Kind::Bool => "true or false",
            Kind::Text => "a string",
        };
        format!("expected {wanted}, found {}", found.type_str())
    }

    /// A command-line value as a TOML value, for `idem config`.
    fn toml(self, raw: &str) -> String {
        match self {
            Kind::Integer | Kind::Float | Kind::Bool => raw.to_owned(),
            Kind::Text => toml::Value::String(raw.to_owned()).to_string(),
        }
    }
}

/// Words in an argument's id that mark its value as a secret, which `idem config`
/// never prints.
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "credential",
    "api_key",
    "auth",
    "header",
];

/// Settings whose names hold one of those words but whose values are not secret: the
/// authentication mode, how often tokens are reread, and where no token is needed.
const NOT_SECRET: &[&str] = &["auth", "token_refresh_ms", "dtm_tokenless_from"];

/// Whether an argument's value is a secret by its name.
pub fn is_secret(id: &str) -> bool {
    let id = id.to_ascii_lowercase();
    !NOT_SECRET.contains(&id.as_str()) && SECRET_WORDS.iter().any(|w| id.contains(w))
}

/// The effective configuration of the matched subcommand as TOML that `--config` reads
/// back: each key with its value and, as a comment, where the value came from. Secrets
/// are replaced by `***`, and so are passwords in URLs.
pub fn render<C: CommandFactory>(loaded: &Loaded<C>) -> String {
    let cmd = C::command();
    let Some((name, sub)) = loaded.matches.subcommand() else {
        return String::new();
    };
    let sub_cmd = cmd
        .find_subcommand(name)
        .expect("the matched subcommand exists");
    let mut out = String::from(
        "# The effective configuration (flag > env > file > default), as `--config` reads it;\n\
         # secrets are shown as \"***\".\n",
    );
    match &loaded.file {
        Some(file) => out.push_str(&format!(
            "# config file: {} ({})\n",
            file.path.display(),
            source_name(sub.value_source(CONFIG_ARG))
        )),
        None => out.push_str("# config file: none\n"),
    }
    for arg in configurable(sub_cmd) {
        let id = arg.get_id().as_str();
        let source = match sub.value_source(id) {
            Some(ValueSource::CommandLine) => format!("flag --{}", arg.get_long().unwrap_or(id)),
            Some(ValueSource::EnvVariable) => format!(
                "env {}",
                arg.get_env()
                    .map(|e| e.to_string_lossy())
                    .unwrap_or_default()
            ),
            _ if loaded.file.as_ref().is_some_and(|f| f.keys.contains(id)) => "file".to_owned(),
            _ => "default".to_owned(),
        };
        if arg.is_hide_set() && source == "default" {
            continue;
        }
        let raw: Vec<String> = sub
            .get_raw(id)
            .map(|vals| vals.map(|v| v.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let kind = Kind::of(arg);
        let shown: Vec<String> = raw
            .iter()
            .map(|v| match kind {
                _ if is_secret(id) => Kind::Text.toml("***"),
                Kind::Text => kind.toml(&super::redact(v)),
                _ => kind.toml(v),
            })
            .collect();
        let line = match shown.as_slice() {
            [] => format!("# {id} is not set"),
            [one] if !takes_many(arg) => format!("{id} = {one}"),
            many => format!("{id} = [{}]", many.join(", ")),
        };
        out.push_str(&format!("{line}  # {source}\n"));
    }
    out
}

fn source_name(source: Option<ValueSource>) -> &'static str {
    match source {
        Some(ValueSource::CommandLine) => "flag",
        Some(ValueSource::EnvVariable) => "env",
        _ => "default",
    }
}

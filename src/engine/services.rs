//! What nodes reach beyond the state: the node kinds of the run, model providers and, per
//! kind, the clients and stores the run was given, and the environment variables they may
//! read. The engine looks inside a `Services` only for its node kinds; it hands the rest to
//! them.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::cassette::Cassette;
use crate::net::Web;
use crate::providers::Providers;
use crate::rag::DataStore;

use super::Kinds;

/// The outside world of a run, shared by every task (cheap to clone: handles only).
///
/// `Services::default()` (and `From<Providers>`) come with the built-in node kinds: they are
/// written where those kinds are registered (`nodes/`), which the engine does not import.
#[derive(Clone, Debug)]
pub struct Services {
    /// The node kinds a plan's nodes are run by.
    pub kinds: Kinds,
    /// Model providers by profile name.
    pub providers: Providers,
    /// The cassette of `--record` / `--replay` (the providers and `web` were built with it: a
    /// web request is recorded by `web` itself).
    pub cassette: Option<Arc<Cassette>>,
    /// Search indexes and long-term memory (index, retrieve, store). Opened on first use; an
    /// in-memory store unless the run was given a file.
    pub data: DataStore,
    /// The web client of every request a node makes besides model calls: http, search,
    /// scrape, load from a URL, the HTTP reranker (a default one allows only public addresses
    /// and has no cassette).
    pub web: Arc<Web>,
    /// Directories nodes may read files from besides the workflow's own directory tree
    /// (`--allow-read`, `RUNNER_ALLOW_READ`).
    pub read_roots: ReadRoots,
    /// The variables nodes read: `${env:NAME}` in a workflow's own text, a search engine's
    /// key, an MCP server's `env` and `headers`. The run builder gives the run's environment
    /// (the process's, filled in by a project's `.env` and `runner.toml`); nothing below it
    /// reads the process's own.
    pub env: Arc<Env>,
}

impl Services {
    /// Services of the node kinds `kinds` and nothing else: no model provider, an in-memory
    /// data store, a web client that allows only public addresses.
    pub fn with_kinds(kinds: Kinds) -> Services {
        Services {
            kinds,
            providers: Providers::default(),
            cassette: None,
            data: DataStore::default(),
            web: Arc::default(),
            read_roots: ReadRoots::default(),
            env: Arc::default(),
        }
    }
}

/// Where an environment variable's value came from, so that an error about the value can
/// say where to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The process's environment (or a map a caller gave).
    Process,
    /// A line of a `.env` file.
    EnvFile(Arc<Path>),
    /// A key of a project file: `runner.toml`'s `db` sets `RUNNER_DB`.
    Project { file: Arc<Path>, key: &'static str },
}

/// Environment variables by name, each with its [`Origin`]: the process's, and those a
/// project's `.env` and `runner.toml` add where the process leaves them unset. A run's
/// settings are resolved against it, and its nodes read it (through [`Services::env`]); a
/// test or a library caller passes a map of its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, (OsString, Origin)>,
}

impl Env {
    /// The variables of this process (those whose names are text).
    pub fn process() -> Env {
        Env {
            vars: std::env::vars_os()
                .filter_map(|(name, value)| Some((name.into_string().ok()?, (value, Origin::Process))))
                .collect(),
        }
    }

    /// These variables and no others, as if the process had them.
    pub fn from_pairs<K: Into<String>, V: Into<OsString>>(pairs: impl IntoIterator<Item = (K, V)>) -> Env {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), (v.into(), Origin::Process)))
                .collect(),
        }
    }

    /// The value of `name` as it is (a path need not be text).
    pub fn get_os(&self, name: &str) -> Option<&OsStr> {
        self.vars.get(name).map(|(v, _)| v.as_os_str())
    }

    /// The value of `name` when it is set and is text.
    pub fn get(&self, name: &str) -> Option<String> {
        self.get_os(name)?.to_str().map(str::to_string)
    }

    /// Where the value of `name` came from, when it is set.
    pub fn origin(&self, name: &str) -> Option<&Origin> {
        self.vars.get(name).map(|(_, origin)| origin)
    }

    /// Sets `name` to `value` from `origin`, unless it is set already.
    pub fn set_default(&mut self, name: &str, value: OsString, origin: Origin) {
        self.vars.entry(name.to_string()).or_insert((value, origin));
    }

    /// This environment without `name`.
    pub fn without(mut self, name: &str) -> Env {
        self.vars.remove(name);
        self
    }

    /// The values of the variables whose names say they hold secrets.
    pub fn credentials(&self) -> Vec<String> {
        self.vars
            .iter()
            .filter(|(name, _)| crate::secrets::is_secret_name(name))
            .filter_map(|(_, (value, _))| value.to_str().map(str::to_string))
            .collect()
    }

    /// The variable `name` as an error about its value names it: `NAME` when the process set
    /// it (or nobody did), `NAME (from /project/.env)`, or `` `key` in /project/runner.toml ``.
    pub fn describe(&self, name: &str) -> String {
        self.origin(name).unwrap_or(&Origin::Process).describe(name)
    }

    /// The variables the `${env:…}` of `text` read and found set, each as [`Env::describe`]
    /// says it, joined for an error: "API_URL (from /project/.env), API_KEY". Empty when the
    /// text read none.
    pub fn describe_refs(&self, text: &str) -> String {
        let refs = crate::spec::interp::env_refs(text).unwrap_or_default();
        let mut named: Vec<String> = Vec::new();
        for r in refs {
            let described = self.describe(r.name);
            if self.get(r.name).is_some_and(|v| !v.is_empty()) && !named.contains(&described) {
                named.push(described);
            }
        }
        named.join(", ")
    }

    /// `${env:NAME}` (and `${env:NAME:-default}`) in `text` expanded from these variables.
    pub fn expand(&self, text: &str) -> Result<String, String> {
        crate::spec::interp::expand_env(text, |name| self.get(name))
    }
}

impl Origin {
    /// The variable `name` set here, as [`Env::describe`] says it.
    pub fn describe(&self, name: &str) -> String {
        match self {
            Origin::Process => name.to_string(),
            Origin::EnvFile(file) => format!("{name} (from {})", file.display()),
            Origin::Project { file, key } => format!("`{key}` in {}", file.display()),
        }
    }
}

/// Where nodes may read files whose paths can come from data (load, index): the tree of the
/// workflow's own directory and the roots a run allows. Anything else (`/etc/passwd`,
/// `/proc/self/environ`, `../../secrets`, a symlink leading out) is refused, naming the path
/// and the flag.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct ReadRoots {
    roots: Vec<PathBuf>,
}

impl ReadRoots {
    /// The roots `dirs`, each resolved (symlinks followed): a root that does not exist is an
    /// error.
    pub fn new<P: AsRef<Path>>(dirs: impl IntoIterator<Item = P>) -> Result<ReadRoots, String> {
        let mut roots = Vec::new();
        for d in dirs {
            let d = d.as_ref();
            let real = std::fs::canonicalize(d).map_err(|e| format!("{}: {e}", d.display()))?;
            if !roots.contains(&real) {
                roots.push(real);
            }
        }
        Ok(ReadRoots { roots })
    }

    /// `path` (relative to the current directory) resolved, when it lies inside
    /// `workflow_dir` or one of the roots; else a refusal naming it. Callers read the path
    /// returned, the one that was checked.
    pub fn check(&self, workflow_dir: &Path, path: &Path) -> Result<PathBuf, String> {
        let base = if workflow_dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            workflow_dir
        };
        let mut allowed: Vec<PathBuf> = std::fs::canonicalize(base).into_iter().collect();
        allowed.extend(self.roots.iter().cloned());
        // A path that exists is judged where it really is (symlinks followed); one that does
        // not, by its spelling (its read then fails as a missing file would).
        let real = std::fs::canonicalize(path)
            .or_else(|_| absolute(path))
            .map_err(|e| e.to_string())?;
        if allowed.iter().any(|root| real.starts_with(root)) {
            return Ok(real);
        }
        Err(format!(
            "refused to read {}: it is outside the workflow's directory ({}){}; allow its directory with --allow-read DIR (or RUNNER_ALLOW_READ)",
            path.display(),
            allowed
                .first()
                .map_or_else(|| base.display().to_string(), |p| p.display().to_string()),
            if self.roots.is_empty() {
                String::new()
            } else {
                " and the directories --allow-read allows".to_string()
            }
        ))
    }
}

/// `path` made absolute against the current directory, `.` and `..` resolved by spelling.
fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    let joined = std::env::current_dir()?.join(path);
    let mut out = PathBuf::new();
    for c in joined.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

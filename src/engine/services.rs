//! What nodes reach beyond the state: the node kinds of the run, model providers and, per
//! kind, the clients and stores the run was given. The engine looks inside a `Services` only
//! for its node kinds; it hands the rest to them.

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

//! The checkpointer a run (or a look at threads) is given.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::RunError;
use super::settings::{Setting, Source};
use crate::checkpoint::memory::MemoryCheckpointer;
use crate::checkpoint::postgres::PostgresCheckpointer;
use crate::checkpoint::sqlite::SqliteCheckpointer;
use crate::checkpoint::{Checkpointer, Durability};
use crate::rag::Location;

/// The forms a database argument takes, for messages.
const FORMS: &str = "a file path, `sqlite://PATH`, `postgres://…` or `:memory:`";

/// A database argument, read.
enum Parsed {
    Sqlite(PathBuf),
    Postgres(String),
    Memory,
}

/// Reads the argument naming the `what` database (for messages: `checkpoint`, `data`).
fn parse_location(arg: &Path, what: &str) -> Result<Parsed, String> {
    let Some(text) = arg.to_str() else {
        return Ok(Parsed::Sqlite(arg.to_path_buf()));
    };
    if text == ":memory:" {
        return Ok(Parsed::Memory);
    }
    if let Some(rest) = text.strip_prefix("sqlite://") {
        return match rest {
            "" => Err(format!("`sqlite://` names no file; the {what} database is {FORMS}")),
            ":memory:" => Ok(Parsed::Memory),
            path => Ok(Parsed::Sqlite(PathBuf::from(path))),
        };
    }
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        return Ok(Parsed::Postgres(text.to_owned()));
    }
    if let Some((scheme, _)) = text.split_once("://")
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return Err(format!(
            "`{scheme}://` databases are not supported: the {what} database is {FORMS}"
        ));
    }
    Ok(Parsed::Sqlite(arg.to_path_buf()))
}

/// Reads the data database's argument, as [`Checkpoints::parse`] reads the checkpoint
/// database's: a path, `sqlite://PATH`, `postgres://…` or `:memory:`.
pub(super) fn data_location(arg: &Path) -> Result<Location, String> {
    Ok(match parse_location(arg, "data")? {
        Parsed::Sqlite(path) => Location::Sqlite(path),
        Parsed::Postgres(url) => Location::Postgres(url),
        Parsed::Memory => Location::Sqlite(PathBuf::from(":memory:")),
    })
}

/// Where checkpoints are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checkpoints {
    /// A SQLite file, created if missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its URL (`postgres://` or `postgresql://`): its schema
    /// created or migrated when opened to run.
    Postgres(String),
    /// `:memory:`: nothing outlives the process, so only each thread's latest checkpoint is
    /// kept.
    Memory,
    /// In memory with every checkpoint kept (history read back in the same process).
    Scratch,
}

impl std::fmt::Display for Checkpoints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Checkpoints::Sqlite(path) => write!(f, "{}", path.display()),
            Checkpoints::Postgres(url) => f.write_str(&redacted(url)),
            Checkpoints::Memory => f.write_str(":memory:"),
            Checkpoints::Scratch => f.write_str("memory"),
        }
    }
}

impl Checkpoints {
    /// Reads a database argument: a path, `sqlite://PATH`, `postgres://…` or `:memory:`. Any
    /// other URL is refused rather than taken for a relative path (`mysql://h/db` would
    /// otherwise become a SQLite file under `./mysql:/h/`). Only the scheme is named in the
    /// error: the rest of a URL may hold a password.
    pub fn parse(arg: &Path) -> Result<Checkpoints, String> {
        Ok(match parse_location(arg, "checkpoint")? {
            Parsed::Sqlite(path) => Checkpoints::Sqlite(path),
            Parsed::Postgres(url) => Checkpoints::Postgres(url),
            Parsed::Memory => Checkpoints::Memory,
        })
    }

    /// Whether many processes may share it (PostgreSQL).
    pub fn is_shared(&self) -> bool {
        matches!(self, Checkpoints::Postgres(_))
    }

    /// The store for a run: created if missing.
    pub fn open(&self, durability: Durability) -> Result<Arc<dyn Checkpointer>, RunError> {
        match self {
            Checkpoints::Memory => Ok(Arc::new(MemoryCheckpointer::ephemeral())),
            Checkpoints::Scratch => Ok(Arc::new(MemoryCheckpointer::new())),
            Checkpoints::Sqlite(path) => {
                let store = SqliteCheckpointer::open(path, durability).map_err(|e| RunError::Store {
                    path: path.clone(),
                    source_of: Box::new(Source::Default),
                    error: e,
                })?;
                Ok(Arc::new(store))
            }
            Checkpoints::Postgres(url) => {
                let store = PostgresCheckpointer::open(url, durability).map_err(|e| RunError::Store {
                    path: PathBuf::from(redacted(url)),
                    source_of: Box::new(Source::Default),
                    error: e,
                })?;
                Ok(Arc::new(store))
            }
        }
    }

    /// The store for looking only (threads, history, state): opened read-only, so a database
    /// the user may not write (a read-only file or folder, a copy from elsewhere) can be
    /// inspected, and looking never creates or changes anything. A missing file holds no
    /// threads.
    pub fn open_read_only(&self) -> Result<Arc<dyn Checkpointer>, RunError> {
        match self {
            Checkpoints::Memory | Checkpoints::Scratch => Ok(Arc::new(MemoryCheckpointer::new())),
            Checkpoints::Sqlite(path) if !path.exists() => Ok(Arc::new(MemoryCheckpointer::new())),
            Checkpoints::Sqlite(path) => {
                let store = SqliteCheckpointer::open_read_only(path).map_err(|e| RunError::Store {
                    path: path.clone(),
                    source_of: Box::new(Source::Default),
                    error: e,
                })?;
                Ok(Arc::new(store))
            }
            // A database without runner's schema holds no threads.
            Checkpoints::Postgres(url) => match PostgresCheckpointer::open_existing(url) {
                Ok(Some(store)) => Ok(Arc::new(store)),
                Ok(None) => Ok(Arc::new(MemoryCheckpointer::new())),
                Err(e) => Err(RunError::Store {
                    path: PathBuf::from(redacted(url)),
                    source_of: Box::new(Source::Default),
                    error: e,
                }),
            },
        }
    }
}

impl Setting<Checkpoints> {
    /// [`Checkpoints::open`], an error naming where the database was set.
    pub fn open(&self, durability: Durability) -> Result<Arc<dyn Checkpointer>, RunError> {
        self.value.open(durability).map_err(|e| self.named(e))
    }

    /// [`Checkpoints::open_read_only`], an error naming where the database was set.
    pub fn open_read_only(&self) -> Result<Arc<dyn Checkpointer>, RunError> {
        self.value.open_read_only().map_err(|e| self.named(e))
    }

    fn named(&self, e: RunError) -> RunError {
        match e {
            RunError::Store { path, error, .. } => RunError::Store {
                path,
                source_of: Box::new(self.source.clone()),
                error,
            },
            other => other,
        }
    }
}

/// A database URL without its password, for messages.
pub(super) fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => "a PostgreSQL URL that does not parse".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_arguments() {
        let loc = |s: &str| Checkpoints::parse(Path::new(s));
        assert_eq!(loc(":memory:"), Ok(Checkpoints::Memory));
        assert_eq!(loc("runs.db"), Ok(Checkpoints::Sqlite("runs.db".into())));
        assert_eq!(loc("dir/a:b.db"), Ok(Checkpoints::Sqlite("dir/a:b.db".into())));
        assert_eq!(loc("sqlite://runs.db"), Ok(Checkpoints::Sqlite("runs.db".into())));
        assert_eq!(
            loc("sqlite:///tmp/runs.db"),
            Ok(Checkpoints::Sqlite("/tmp/runs.db".into()))
        );
        assert_eq!(loc("sqlite://:memory:"), Ok(Checkpoints::Memory));
        assert!(loc("sqlite://").is_err());
        assert_eq!(
            loc("postgres://user@host:5432/db"),
            Ok(Checkpoints::Postgres("postgres://user@host:5432/db".into()))
        );
        assert!(loc("postgresql://h/db").is_ok_and(|c| c.is_shared()));
        assert_eq!(
            Checkpoints::Postgres("postgres://me:secret@h/db".into()).to_string(),
            "postgres://me:***@h/db"
        );
        for url in ["mysql://h/db", "HTTP://h/x", "postgresql+tls://u:secret@h/db"] {
            let e = loc(url).unwrap_err();
            assert!(e.contains("are not supported") && e.contains("postgres://"), "{e}");
            assert!(!e.contains("secret") && !e.contains("host"), "{e}");
        }
    }

    #[test]
    fn data_arguments() {
        let loc = |s: &str| data_location(Path::new(s));
        assert_eq!(loc("data.db"), Ok(Location::Sqlite("data.db".into())));
        assert_eq!(loc("sqlite://d/data.db"), Ok(Location::Sqlite("d/data.db".into())));
        assert_eq!(loc(":memory:"), Ok(Location::Sqlite(":memory:".into())));
        assert_eq!(
            loc("postgresql://u:pw@h/db"),
            Ok(Location::Postgres("postgresql://u:pw@h/db".into()))
        );
        let e = loc("mysql://u:secret@h/db").unwrap_err();
        assert!(e.contains("the data database is") && !e.contains("secret"), "{e}");
    }
}

//! Opening the checkpoint store the CLI was pointed at.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::checkpoint::memory::MemoryCheckpointer;
use crate::checkpoint::sqlite::SqliteCheckpointer;
use crate::checkpoint::{Checkpointer, Durability};

/// SQLite durability, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Survives a killed process (WAL, synchronous=NORMAL).
    #[default]
    CrashSafe,
    /// Survives power loss (synchronous=FULL).
    PowerSafe,
}

/// The forms `--db` takes, for messages.
const FORMS: &str = "a file path, `sqlite://PATH` or `:memory:`";

/// `--db`, else `$RUNNER_DB`, else `.runner/runner.db`.
pub fn db_path(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os("RUNNER_DB").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".runner/runner.db"))
}

/// `--data-db`, else `$RUNNER_DATA_DB`, else `.runner/data.db`.
pub fn data_db_path(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .or_else(|| std::env::var_os("RUNNER_DATA_DB").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(".runner/data.db"))
}

/// Where a `--db` argument points.
#[derive(Debug, PartialEq, Eq)]
enum Location {
    /// `:memory:`: nothing outlives the process.
    Memory,
    /// A SQLite file.
    File(PathBuf),
}

/// Reads a `--db` argument: a path, `sqlite://PATH` or `:memory:`. Any other URL is refused
/// rather than taken for a relative path (`postgres://h/db` would otherwise become a SQLite
/// file under `./postgres:/h/`). Only the scheme is named in the error: the rest of a URL may
/// hold a password.
fn location(arg: &Path) -> anyhow::Result<Location> {
    let Some(text) = arg.to_str() else {
        return Ok(Location::File(arg.to_path_buf()));
    };
    if text == ":memory:" {
        return Ok(Location::Memory);
    }
    if let Some(rest) = text.strip_prefix("sqlite://") {
        return match rest {
            "" => bail!("`sqlite://` names no file; the checkpoint database is {FORMS}"),
            ":memory:" => Ok(Location::Memory),
            path => Ok(Location::File(PathBuf::from(path))),
        };
    }
    if let Some((scheme, _)) = text.split_once("://")
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        bail!("`{scheme}://` databases are not supported: the checkpoint database is {FORMS}");
    }
    Ok(Location::File(arg.to_path_buf()))
}

/// The store at `path` for a run: created if missing.
pub fn open(path: &Path, durability: DurabilityArg) -> anyhow::Result<Arc<dyn Checkpointer>> {
    let path = match location(path)? {
        // Nothing outlives the process, so no history is kept either.
        Location::Memory => return Ok(Arc::new(MemoryCheckpointer::ephemeral())),
        Location::File(path) => path,
    };
    let d = match durability {
        DurabilityArg::CrashSafe => Durability::CrashSafe,
        DurabilityArg::PowerSafe => Durability::PowerSafe,
    };
    let store = SqliteCheckpointer::open(&path, d)
        .with_context(|| format!("cannot open the checkpoint database {}", path.display()))?;
    Ok(Arc::new(store))
}

/// The store at `path` for looking only (`threads`, `history`, `state`): opened read-only, so
/// a database the user may not write (a read-only file or folder, a copy from elsewhere) can
/// be inspected, and looking never creates or changes anything. A missing file holds no
/// threads.
pub fn open_read_only(path: &Path) -> anyhow::Result<Arc<dyn Checkpointer>> {
    let path = match location(path)? {
        Location::Memory => return Ok(Arc::new(MemoryCheckpointer::new())),
        Location::File(path) => path,
    };
    if !path.exists() {
        return Ok(Arc::new(MemoryCheckpointer::new()));
    }
    let store = SqliteCheckpointer::open_read_only(&path)
        .with_context(|| format!("cannot open the checkpoint database {}", path.display()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_arguments() {
        let loc = |s: &str| location(Path::new(s)).map_err(|e| e.to_string());
        assert_eq!(loc(":memory:"), Ok(Location::Memory));
        assert_eq!(loc("runs.db"), Ok(Location::File("runs.db".into())));
        assert_eq!(loc("dir/a:b.db"), Ok(Location::File("dir/a:b.db".into())));
        assert_eq!(loc("sqlite://runs.db"), Ok(Location::File("runs.db".into())));
        assert_eq!(loc("sqlite:///tmp/runs.db"), Ok(Location::File("/tmp/runs.db".into())));
        assert_eq!(loc("sqlite://:memory:"), Ok(Location::Memory));
        assert!(loc("sqlite://").is_err());
        for url in [
            "postgres://user@host:5432/db",
            "mysql://h/db",
            "HTTP://h/x",
            "postgresql+tls://u:secret@h/db",
        ] {
            let e = loc(url).unwrap_err();
            assert!(e.contains("are not supported") && e.contains("sqlite://PATH"), "{e}");
            assert!(!e.contains("secret") && !e.contains("host"), "{e}");
        }
    }
}

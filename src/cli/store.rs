//! Opening the checkpoint store the CLI was pointed at.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

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

pub fn open(path: &Path, durability: DurabilityArg) -> anyhow::Result<Arc<dyn Checkpointer>> {
    if path.as_os_str() == ":memory:" {
        // Nothing outlives the process, so no history is kept either.
        return Ok(Arc::new(MemoryCheckpointer::ephemeral()));
    }
    let d = match durability {
        DurabilityArg::CrashSafe => Durability::CrashSafe,
        DurabilityArg::PowerSafe => Durability::PowerSafe,
    };
    let store = SqliteCheckpointer::open(path, d)
        .with_context(|| format!("cannot open the checkpoint database {}", path.display()))?;
    Ok(Arc::new(store))
}

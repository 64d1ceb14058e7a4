//! Opening the checkpoint store the CLI was pointed at (`--db`, else `RUNNER_DB`, else the
//! default; see `run::db_path`).

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::{Checkpointer, Durability};
use crate::run::{Checkpoints, Setting};

/// SQLite durability, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DurabilityArg {
    /// Survives a killed process (WAL, synchronous=NORMAL).
    #[default]
    CrashSafe,
    /// Survives power loss (synchronous=FULL).
    PowerSafe,
}

impl From<DurabilityArg> for Durability {
    fn from(arg: DurabilityArg) -> Self {
        match arg {
            DurabilityArg::CrashSafe => Durability::CrashSafe,
            DurabilityArg::PowerSafe => Durability::PowerSafe,
        }
    }
}

/// The database `--db` names, else `RUNNER_DB` (the process's, `.env`'s or `runner.toml`'s),
/// else the default, with where it was set.
pub(super) fn checkpoints(flag: Option<&Path>) -> anyhow::Result<Setting<Checkpoints>> {
    let at = crate::run::db_path(flag.map(Path::to_path_buf), &super::project_env()?.0);
    let value = Checkpoints::parse(&at.value).map_err(|m| anyhow::anyhow!("{}: {m}", at.source))?;
    Ok(Setting {
        value,
        source: at.source,
    })
}

/// The store `--db` names, created if missing.
pub(super) fn open(flag: Option<&Path>) -> anyhow::Result<Arc<dyn Checkpointer>> {
    Ok(checkpoints(flag)?.open(Durability::default())?)
}

/// The store `--db` names, for looking only: opened read-only, never created.
pub(super) fn open_read_only(flag: Option<&Path>) -> anyhow::Result<Arc<dyn Checkpointer>> {
    Ok(checkpoints(flag)?.open_read_only()?)
}

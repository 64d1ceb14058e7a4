//! The run builder: the one place where a run's settings are decided and its checkpointer and
//! services assembled, for `runner run`, `runner resume`, `runner test` and any other caller of
//! the engine. Three stages, each built only by the one before:
//!
//! - [`RunOptions`]: what the caller says (flags, a test case), every field optional;
//! - [`RunSettings`]: the options over the environment ([`Env`], a map, so tests and a server
//!   pass their own) over the defaults, every value decided and, where it matters for an
//!   error, with its [`Source`];
//! - [`Run`]: the checkpointer, the [`Services`](crate::nodes::Services) and the engine
//!   [`Overrides`], from [`RunSettings::build`].
//!
//! It may import every module but `cli`; only `cli` and `server` import it. No clap
//! type lives here.

mod build;
pub mod env;
mod options;
mod project;
mod settings;
mod store;

use std::path::PathBuf;

pub use build::{Run, Start, config_has};
pub use env::Env;
pub use options::{CassetteOption, DbOption, MockOption, RunOptions};
pub use project::{AuthFile, OneOrMany, Project, ProjectError, QuotaFile, ServeFile, WindowText};
pub use settings::{
    DEFAULT_DATA_DB, DEFAULT_DB, OFFLINE_EMBEDDER, Overrides, RunSettings, Setting, Source, StoreIndex, cache_dir,
    data_location, data_location_from_env, db_path,
};
pub use store::Checkpoints;

/// Why a run's settings or services could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A value that does not fit, named by where it came from.
    #[error("{source_of}: {message}")]
    Invalid { source_of: Source, message: String },
    /// Options that exclude each other.
    #[error("{0}")]
    Conflict(&'static str),
    /// The checkpoint database at `path` (set by `source_of`) cannot be opened.
    #[error("cannot open the checkpoint database {}{}", path.display(), from(source_of))]
    Store {
        path: PathBuf,
        source_of: Box<Source>,
        #[source]
        error: crate::checkpoint::CheckpointError,
    },
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A mock script that cannot be read.
    #[error("mock script{}: {message}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Mock { path: Option<PathBuf>, message: String },
    /// `PROFILE=SPEC` that does not name a profile or a model.
    #[error("--model: {0}")]
    Model(String),
    #[error(transparent)]
    Cassette(#[from] crate::cassette::CassetteError),
    #[error(transparent)]
    Providers(#[from] crate::providers::SetupError),
}

/// " (from RUNNER_DB)": where a value was set, unless nobody did.
fn from(source: &Source) -> String {
    match source {
        Source::Default => String::new(),
        source => format!(" (from {source})"),
    }
}

#[cfg(test)]
mod tests;

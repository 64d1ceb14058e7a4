//! What the caller says about a run, every field optional: the flags of `runner run` and
//! `runner resume`, a test case's `models` and `recursion_limit`, later a server request.
//! Nothing here is checked or read from the environment yet: [`RunOptions::resolve`] does both.

use std::path::PathBuf;

use serde_json::Value;

use crate::checkpoint::Durability;
use crate::engine::Kinds;
use crate::engine::Persist;

/// Where checkpoints go, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbOption {
    /// A file path, `sqlite://PATH` or `:memory:` (which keeps only each thread's latest
    /// checkpoint), as `--db` and `RUNNER_DB` spell it.
    At(PathBuf),
    /// In memory with every checkpoint kept, for runs whose history is read back in the same
    /// process (a test case).
    Scratch,
}

/// Where a scripted mock's replies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum MockOption {
    /// A script file (`--mock FILE`, a case's `models: {mock_file: …}`).
    File(PathBuf),
    /// A script given inline (a case's `models: {mock: …}`).
    Script(Value),
    /// No replies: a call fails as a mock with nothing left would.
    Empty,
}

/// A cassette: every model call and web request recorded to it, or served from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CassetteOption {
    Record(PathBuf),
    Replay(PathBuf),
}

/// A run as its caller describes it. `None` (or empty) means "not said": the environment or
/// the default decides.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOptions {
    /// The checkpoint database; else `RUNNER_DB`; else `.runner/runner.db`.
    pub db: Option<DbOption>,
    /// How hard SQLite works to keep a commit; else crash-safe.
    pub durability: Option<Durability>,
    /// The data database; else `RUNNER_DATA_DB`; else `.runner/data.db`.
    pub data_db: Option<PathBuf>,
    /// Long-term memory's semantic index: the embedder, `offline` or
    /// `PROVIDER:MODEL[@URL]`; else `RUNNER_STORE_INDEX`; else none (a store query is keyword
    /// search).
    pub store_index: Option<String>,
    /// The fields of a stored value the index embeds; else `RUNNER_STORE_INDEX_FIELDS`; else
    /// `$`, the whole value.
    pub store_index_fields: Vec<String>,
    /// Serve every model profile from this mock.
    pub mock: Option<MockOption>,
    /// Record to or replay from a cassette (a replay cannot be combined with a mock).
    pub cassette: Option<CassetteOption>,
    /// `PROFILE=PROVIDER:MODEL[@URL]`: serve a profile from another model.
    pub models: Vec<String>,
    /// `PROFILE=PROVIDER:MODEL[@URL]` defaults of a project (`runner.toml`): applied before
    /// `models`, and only to the workflows that have the profile.
    pub project_models: Vec<String>,
    /// `PROFILE=IN,OUT`: a profile's price per million prompt and completion tokens.
    pub prices: Vec<String>,
    /// `PROFILE=TOKENS`: a profile's context window.
    pub contexts: Vec<String>,
    /// Added to `RUNNER_ALLOW_NET`'s entries.
    pub allow_net: Vec<String>,
    /// Added to `RUNNER_ALLOW_READ`'s directories.
    pub allow_read: Vec<PathBuf>,
    /// The lease's time to live in seconds; else `RUNNER_LEASE_TTL`; else the engine's default.
    pub lease_ttl: Option<f64>,
    /// Wait for a thread another process runs instead of failing at once.
    pub wait: Option<bool>,
    /// The most supersteps; else the workflow's `limits`.
    pub recursion_limit: Option<u32>,
    /// When checkpoints are committed; else after every step.
    pub persist: Option<Persist>,
    /// Continue a thread whose workflow changed incompatibly.
    pub force: Option<bool>,
    /// `path=value` overrides of the config of every run made with these options (a server's
    /// `--set`), under each run's own; a path applies to the workflows whose config has it.
    pub config: Vec<(String, Value)>,
    /// The node kinds the run knows (default: the built-in ones). A library caller adds its
    /// own kinds here.
    pub kinds: Option<Kinds>,
}

//! The environment a run's settings are resolved against, and its nodes read: the process's
//! variables filled in by a project's files in the CLI, a map in tests. [`Env`] itself lives
//! with the run's services, which carry it to the nodes; the `RUNNER_*` names are here.

pub use crate::engine::{Env, Origin};

/// The checkpoint database (`--db`).
pub const DB: &str = "RUNNER_DB";
/// The data database: search indexes and long-term memory (`--data-db`).
pub const DATA_DB: &str = "RUNNER_DATA_DB";
/// Hosts, addresses and CIDRs the web kinds may reach although private (`--allow-net`),
/// comma-separated.
pub const ALLOW_NET: &str = "RUNNER_ALLOW_NET";
/// Directories load and index may read besides the workflow's tree (`--allow-read`),
/// separated as in `PATH`.
pub const ALLOW_READ: &str = "RUNNER_ALLOW_READ";
/// The lease's time to live in seconds (`--lease-ttl`).
pub const LEASE_TTL: &str = "RUNNER_LEASE_TTL";
/// Long-term memory's semantic index: `offline` or `PROVIDER:MODEL[@URL]`, the embedder
/// (`--store-index`).
pub const STORE_INDEX: &str = "RUNNER_STORE_INDEX";
/// The fields of a stored value that index embeds, comma-separated (`--store-index-field`).
pub const STORE_INDEX_FIELDS: &str = "RUNNER_STORE_INDEX_FIELDS";
/// Where clean schema verdicts are remembered (default: the user's cache directory).
pub const CACHE_DIR: &str = "RUNNER_CACHE_DIR";
/// Set (to anything but `0` or `false`): nothing is remembered between processes.
pub const NO_CACHE: &str = "RUNNER_NO_CACHE";

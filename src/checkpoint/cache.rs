//! Cached task results, beside the checkpoints (LangGraph's node cache): an entry is a
//! finished task's result, opaque JSON here, stored under its workflow, its node and a key,
//! with an optional expiry. Entries outlive the threads that made them: any thread of the
//! workflow may reuse one.
//!
//! A [`CacheStore`] is part of every [`super::Checkpointer`]. This module is the format, shared
//! by every backend: the trait, its types, how a value is stored (`value_text`,
//! `value_from_text`) and when an entry is live (`live`). The backends' code is theirs
//! (`sqlite/cache.rs`, `memory/cache.rs`); nothing here names a backend.
//!
//! Expiry is the caller's clock in milliseconds since the epoch (`now_ms`), so a test can
//! move it. An expired entry is never returned; writes and clears delete the expired ones.
//!
//! Architecture Invariant: like the rest of checkpoint/, this knows nothing of plans or the
//! engine: what a key hashes and what a value holds are the engine's.

use serde_json::Value;

use super::{CheckpointError, Result};

/// One cached result.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheEntry {
    /// The workflow's name.
    pub workflow: String,
    pub node: String,
    /// What identifies the result among the node's (a hash, for the engine).
    pub key: String,
    pub value: Value,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// Milliseconds since the Unix epoch; `None`: until the cache is cleared.
    pub expires_at_ms: Option<i64>,
}

/// An entry as listed: everything but its value, and the value's size.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheHead {
    pub workflow: String,
    pub node: String,
    pub key: String,
    pub created_at: String,
    pub expires_at_ms: Option<i64>,
    /// The value's size as stored JSON, in bytes.
    pub bytes: u64,
}

/// Cached task results. Every method is durable when it returns, but for
/// [`CacheStore::cache_put`] with power-safe durability (see there).
pub trait CacheStore: Send + Sync {
    /// The value of the entry `(workflow, node, key)`, unless it has expired at `now_ms`.
    fn cache_get(&self, workflow: &str, node: &str, key: &str, now_ms: i64) -> Result<Option<Value>>;

    /// Stores an entry (replacing one with the same workflow, node and key), and deletes every
    /// entry expired at `now_ms`. The entry survives a crash of the process, but a backend may
    /// leave it to its next synced commit to survive power loss: an entry lost costs its node
    /// one run, and a fan-out of cached nodes would otherwise wait for the disk once per task.
    fn cache_put(&self, entry: &CacheEntry, now_ms: i64) -> Result<()>;

    /// Deletes the entries of `workflow` (every workflow's when `None`) and of `node` (every
    /// node's when `None`), and every expired one; how many of the first kind there were.
    fn cache_clear(&self, workflow: Option<&str>, node: Option<&str>, now_ms: i64) -> Result<u64>;

    /// The entries not expired at `now_ms`, by workflow, node and key.
    fn cache_list(&self, now_ms: i64) -> Result<Vec<CacheHead>>;
}

/// A cached value as stored: JSON text.
pub(crate) fn value_text(v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

/// A stored value read back.
pub(crate) fn value_from_text(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt(format!("node_cache.value: {e}")))
}

/// Whether an entry that expires at `expires_at_ms` is still returned at `now_ms`.
pub(crate) fn live(expires_at_ms: Option<i64>, now_ms: i64) -> bool {
    expires_at_ms.is_none_or(|at| at > now_ms)
}

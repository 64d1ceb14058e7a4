//! Cached task results, beside the checkpoints (LangGraph's node cache): an entry is a
//! finished task's result, opaque JSON here, stored under its workflow, its node and a key,
//! with an optional expiry. Entries outlive the threads that made them: any thread of the
//! workflow may reuse one.
//!
//! A [`CacheStore`] is part of every [`super::Checkpointer`]. The SQLite table is additive
//! (`CREATE TABLE IF NOT EXISTS` on every open, as `leases` and `runs`): a file written by an
//! earlier build gains it without a schema version change, so that build can still open the
//! file (it ignores the table), which a version bump would forbid.
//!
//! Expiry is the caller's clock in milliseconds since the epoch (`now_ms`), so a test can
//! move it. An expired entry is never returned; writes and clears delete the expired ones.
//!
//! Architecture Invariant: like the rest of checkpoint/, this knows nothing of plans or the
//! engine: what a key hashes and what a value holds are the engine's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::memory::MemoryCheckpointer;
use super::sqlite::SqliteCheckpointer;
use super::{CheckpointError, Result};

/// Applied on every open of a SQLite store (see the module doc), with [`INDEX`].
pub(super) const TABLE: &str = "
CREATE TABLE IF NOT EXISTS node_cache (
    workflow TEXT NOT NULL,
    node TEXT NOT NULL,
    key TEXT NOT NULL,
    -- The task's result, JSON.
    value TEXT NOT NULL,
    created_at TEXT NOT NULL,
    -- Milliseconds since the Unix epoch; NULL: until cleared.
    expires_at INTEGER,
    PRIMARY KEY (workflow, node, key)
) STRICT;
";

/// What the sweep of expired entries reads.
pub(super) const INDEX: &str =
    "CREATE INDEX IF NOT EXISTS node_cache_by_expiry ON node_cache (expires_at) WHERE expires_at IS NOT NULL;";

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

fn json_text(v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

/// Deletes the entries expired at `now`.
fn sweep(conn: &Connection, now: i64) -> rusqlite::Result<usize> {
    conn.prepare_cached("DELETE FROM node_cache WHERE expires_at IS NOT NULL AND expires_at <= ?1")?
        .execute([now])
}

impl CacheStore for SqliteCheckpointer {
    fn cache_get(&self, workflow: &str, node: &str, key: &str, now_ms: i64) -> Result<Option<Value>> {
        let text: Option<String> = self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT value FROM node_cache WHERE workflow = ?1 AND node = ?2 AND key = ?3 \
                     AND (expires_at IS NULL OR expires_at > ?4)",
                )?
                .query_row(params![workflow, node, key, now_ms], |r| r.get(0))
                .optional()?)
        })?;
        text.map(|t| serde_json::from_str(&t).map_err(|e| CheckpointError::Corrupt(format!("node_cache.value: {e}"))))
            .transpose()
    }

    fn cache_put(&self, entry: &CacheEntry, now_ms: i64) -> Result<()> {
        let row = (
            entry.workflow.clone(),
            entry.node.clone(),
            entry.key.clone(),
            json_text(&entry.value)?,
            entry.created_at.clone(),
            entry.expires_at_ms,
        );
        self.exec_unsynced(Box::new(move |conn: &Connection| {
            sweep(conn, now_ms)?;
            let r = &row;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO node_cache (workflow, node, key, value, created_at, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![r.0, r.1, r.2, r.3, r.4, r.5])?;
            Ok(())
        }))
    }

    fn cache_clear(&self, workflow: Option<&str>, node: Option<&str>, now_ms: i64) -> Result<u64> {
        let (workflow, node) = (workflow.map(str::to_owned), node.map(str::to_owned));
        // The writer runs the statement; the count comes back through this.
        let deleted = Arc::new(AtomicU64::new(0));
        let count = deleted.clone();
        self.exec(Box::new(move |conn: &Connection| {
            sweep(conn, now_ms)?;
            let n = conn
                .prepare_cached(
                    "DELETE FROM node_cache WHERE (?1 IS NULL OR workflow = ?1) AND (?2 IS NULL OR node = ?2)",
                )?
                .execute(params![workflow, node])?;
            count.store(n as u64, Ordering::SeqCst);
            Ok(())
        }))?;
        Ok(deleted.load(Ordering::SeqCst))
    }

    fn cache_list(&self, now_ms: i64) -> Result<Vec<CacheHead>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT workflow, node, key, created_at, expires_at, length(CAST(value AS BLOB)) FROM node_cache \
                 WHERE expires_at IS NULL OR expires_at > ?1 ORDER BY workflow, node, key",
            )?;
            let rows = stmt.query_map([now_ms], |r| {
                Ok(CacheHead {
                    workflow: r.get(0)?,
                    node: r.get(1)?,
                    key: r.get(2)?,
                    created_at: r.get(3)?,
                    expires_at_ms: r.get(4)?,
                    bytes: r.get::<_, i64>(5).map(|b| u64::try_from(b).unwrap_or(0))?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }
}

/// The in-memory store's entries, by workflow, node and key.
pub(super) type Memory = BTreeMap<(String, String, String), CacheEntry>;

fn live(e: &CacheEntry, now_ms: i64) -> bool {
    e.expires_at_ms.is_none_or(|at| at > now_ms)
}

impl CacheStore for MemoryCheckpointer {
    fn cache_get(&self, workflow: &str, node: &str, key: &str, now_ms: i64) -> Result<Option<Value>> {
        let entries = self.lock_cache()?;
        let found = entries.get(&(workflow.to_owned(), node.to_owned(), key.to_owned()));
        Ok(found.filter(|e| live(e, now_ms)).map(|e| e.value.clone()))
    }

    fn cache_put(&self, entry: &CacheEntry, now_ms: i64) -> Result<()> {
        let mut entries = self.lock_cache()?;
        entries.retain(|_, e| live(e, now_ms));
        entries.insert(
            (entry.workflow.clone(), entry.node.clone(), entry.key.clone()),
            entry.clone(),
        );
        Ok(())
    }

    fn cache_clear(&self, workflow: Option<&str>, node: Option<&str>, now_ms: i64) -> Result<u64> {
        let mut entries = self.lock_cache()?;
        entries.retain(|_, e| live(e, now_ms));
        let before = entries.len();
        entries.retain(|(w, n, _), _| !(workflow.is_none_or(|x| x == w) && node.is_none_or(|x| x == n)));
        Ok((before - entries.len()) as u64)
    }

    fn cache_list(&self, now_ms: i64) -> Result<Vec<CacheHead>> {
        let entries = self.lock_cache()?;
        Ok(entries
            .values()
            .filter(|e| live(e, now_ms))
            .map(|e| CacheHead {
                workflow: e.workflow.clone(),
                node: e.node.clone(),
                key: e.key.clone(),
                created_at: e.created_at.clone(),
                expires_at_ms: e.expires_at_ms,
                bytes: e.value.to_string().len() as u64,
            })
            .collect())
    }
}

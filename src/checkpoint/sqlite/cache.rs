//! The SQLite [`CacheStore`]: the `node_cache` table and its SQL. The table is additive
//! (`CREATE TABLE IF NOT EXISTS` on every open, as `leases` and `runs`): a file written by an
//! earlier build gains it without a schema version change, so that build can still open the
//! file (it ignores the table), which a version bump would forbid.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use super::SqliteCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::cache::{CacheEntry, CacheHead, CacheStore, value_from_text, value_text};

/// Applied on every open (see the module doc), with [`INDEX`].
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
        text.as_deref().map(value_from_text).transpose()
    }

    fn cache_put(&self, entry: &CacheEntry, now_ms: i64) -> Result<()> {
        let row = (
            entry.workflow.clone(),
            entry.node.clone(),
            entry.key.clone(),
            value_text(&entry.value)?,
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

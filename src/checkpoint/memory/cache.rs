//! The in-memory [`CacheStore`]: entries in a map under one lock.

use std::collections::BTreeMap;

use serde_json::Value;

use super::MemoryCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::cache::{CacheEntry, CacheHead, CacheStore};

/// The in-memory store's entries, by workflow, node and key.
pub(super) type Memory = BTreeMap<(String, String, String), CacheEntry>;

fn live(e: &CacheEntry, now_ms: i64) -> bool {
    crate::checkpoint::cache::live(e.expires_at_ms, now_ms)
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

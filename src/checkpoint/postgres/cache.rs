//! The PostgreSQL [`CacheStore`]: the `node_cache` table and its SQL.

use serde_json::Value;

use super::PostgresCheckpointer;
use super::runs::Param;
use crate::checkpoint::Result;
use crate::checkpoint::cache::{CacheEntry, CacheHead, CacheStore, value_from_text, value_text};

impl CacheStore for PostgresCheckpointer {
    fn cache_get(&self, workflow: &str, node: &str, key: &str, now_ms: i64) -> Result<Option<Value>> {
        let rows = self.query(
            "SELECT value FROM node_cache WHERE workflow = $1 AND node = $2 AND key = $3 \
             AND (expires_at IS NULL OR expires_at > $4)"
                .into(),
            vec![
                Param::Text(workflow.into()),
                Param::Text(node.into()),
                Param::Text(key.into()),
                Param::Int(now_ms),
            ],
        )?;
        rows.first()
            .map(|r| value_from_text(&r.try_get::<_, String>(0)?))
            .transpose()
    }

    fn cache_put(&self, entry: &CacheEntry, now_ms: i64) -> Result<()> {
        let pool = self.pool.clone();
        let e = entry.clone();
        let value = value_text(&entry.value)?;
        self.block(async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            // A cache entry is worth less than a checkpoint: never waited for on the disk.
            tx.batch_execute("SET LOCAL synchronous_commit = off").await?;
            tx.execute(
                "DELETE FROM node_cache WHERE expires_at IS NOT NULL AND expires_at <= $1",
                &[&now_ms],
            )
            .await?;
            tx.execute(
                "INSERT INTO node_cache (workflow, node, key, value, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (workflow, node, key) DO UPDATE \
                 SET value = excluded.value, created_at = excluded.created_at, expires_at = excluded.expires_at",
                &[
                    &e.workflow as &(dyn tokio_postgres::types::ToSql + Sync),
                    &e.node,
                    &e.key,
                    &value,
                    &e.created_at,
                    &e.expires_at_ms,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn cache_clear(&self, workflow: Option<&str>, node: Option<&str>, now_ms: i64) -> Result<u64> {
        let pool = self.pool.clone();
        let (workflow, node) = (workflow.map(str::to_owned), node.map(str::to_owned));
        self.block(async move {
            let mut client = pool.get().await?;
            let tx = client.transaction().await?;
            tx.execute(
                "DELETE FROM node_cache WHERE expires_at IS NOT NULL AND expires_at <= $1",
                &[&now_ms],
            )
            .await?;
            // Each filter a statement of its own: a plan made once serves it with the key.
            type P<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
            let (sql, params): (&str, Vec<P<'_>>) = match (&workflow, &node) {
                (Some(w), Some(n)) => ("DELETE FROM node_cache WHERE workflow = $1 AND node = $2", vec![w, n]),
                (Some(w), None) => ("DELETE FROM node_cache WHERE workflow = $1", vec![w]),
                (None, Some(n)) => ("DELETE FROM node_cache WHERE node = $1", vec![n]),
                (None, None) => ("DELETE FROM node_cache", vec![]),
            };
            let n = tx.execute(sql, &params).await?;
            tx.commit().await?;
            Ok(n)
        })
    }

    fn cache_list(&self, now_ms: i64) -> Result<Vec<CacheHead>> {
        let rows = self.query(
            "SELECT workflow, node, key, created_at, expires_at, octet_length(value)::bigint FROM node_cache \
             WHERE expires_at IS NULL OR expires_at > $1 ORDER BY workflow, node, key"
                .into(),
            vec![Param::Int(now_ms)],
        )?;
        rows.iter()
            .map(|r| {
                Ok(CacheHead {
                    workflow: r.try_get(0)?,
                    node: r.try_get(1)?,
                    key: r.try_get(2)?,
                    created_at: r.try_get(3)?,
                    expires_at_ms: r.try_get(4)?,
                    bytes: u64::try_from(r.try_get::<_, i64>(5)?).unwrap_or(0),
                })
            })
            .collect()
    }
}

//! Long-term memory on PostgreSQL: items with their keyword vector in one row, their embeddings
//! in `memory_vectors` (removed with the item by a cascading key).
//!
//! A namespace prefix is matched as a range of the primary key (`prefix <= namespace <
//! bound`, byte order), never by a pattern, so labels holding `%` or `_` need no escaping and
//! the index serves the search.

use std::collections::HashMap;

use futures::{TryStreamExt, pin_mut};
use tokio_postgres::types::ToSql;

use super::{Db, Done, Vectors, any_of, no_nul, prefix_bound, storable};
use crate::rag::backend::{FieldVector, MemoryPut, MemoryRow, MemoryRows};
use crate::rag::embed::dot;

/// [`MemoryRows`], owned, to travel to the store's runtime.
pub(super) enum Rows {
    Namespace(String),
    Recent {
        prefix: String,
        limit: usize,
    },
    InOrder {
        prefix: String,
    },
    Matching {
        prefix: String,
        query: String,
        limit: Option<usize>,
    },
}

impl From<MemoryRows<'_>> for Rows {
    fn from(which: MemoryRows<'_>) -> Rows {
        match which {
            MemoryRows::Namespace(ns) => Rows::Namespace(ns.to_owned()),
            MemoryRows::Recent { prefix, limit } => Rows::Recent {
                prefix: prefix.to_owned(),
                limit,
            },
            MemoryRows::InOrder { prefix } => Rows::InOrder {
                prefix: prefix.to_owned(),
            },
            MemoryRows::Matching { prefix, words, limit } => Rows::Matching {
                prefix: prefix.to_owned(),
                query: any_of(words),
                limit,
            },
        }
    }
}

/// [`MemoryPut`], owned.
pub(super) struct Put {
    namespace: String,
    key: String,
    value: String,
    text: String,
    at: String,
    ttl: Option<f64>,
    expires_at: Option<String>,
    vectors: Option<(String, Vec<FieldVector>)>,
}

impl From<&MemoryPut<'_>> for Put {
    fn from(p: &MemoryPut<'_>) -> Put {
        Put {
            namespace: p.namespace.to_owned(),
            key: p.key.to_owned(),
            value: p.value.to_owned(),
            text: p.text.to_owned(),
            at: p.at.to_owned(),
            ttl: p.ttl,
            expires_at: p.expires_at.map(str::to_owned),
            vectors: p.vectors.map(|(e, v)| (e.to_owned(), v.to_vec())),
        }
    }
}

const COLS: &str = "namespace, key, value, updated_at, created_at, ttl, expires_at";

fn row(r: &tokio_postgres::Row) -> Done<MemoryRow> {
    Ok(MemoryRow {
        namespace: r.try_get(0)?,
        key: r.try_get(1)?,
        value: r.try_get(2)?,
        updated_at: r.try_get(3)?,
        created_at: r.try_get(4)?,
        ttl: r.try_get(5)?,
        expires_at: r.try_get(6)?,
        score: None,
    })
}

/// The condition "namespace `$n` is under the prefix `$n`, bounded by `$n+1`".
fn under(n: usize) -> String {
    format!(
        "namespace >= ${n} AND (${m}::text IS NULL OR namespace < ${m}::text)",
        m = n + 1
    )
}

pub(super) async fn sweep(db: &Db, now: &str) -> Done<usize> {
    let client = db.pool.get().await?;
    let stmt = client
        .prepare_cached("DELETE FROM memory WHERE expires_at IS NOT NULL AND expires_at <= $1")
        .await?;
    Ok(client.execute(&stmt, &[&now]).await? as usize)
}

pub(super) async fn item(db: &Db, namespace: &str, key: &str) -> Done<Option<MemoryRow>> {
    let client = db.pool.get().await?;
    let stmt = client
        .prepare_cached(&format!("SELECT {COLS} FROM memory WHERE namespace = $1 AND key = $2"))
        .await?;
    client
        .query_opt(&stmt, &[&namespace, &key])
        .await?
        .as_ref()
        .map(row)
        .transpose()
}

pub(super) async fn rows(db: &Db, which: Rows) -> Done<Vec<MemoryRow>> {
    let client = db.pool.get().await?;
    let rows = match &which {
        Rows::Namespace(ns) => {
            let stmt = client
                .prepare_cached(&format!("SELECT {COLS} FROM memory WHERE namespace = $1 ORDER BY key"))
                .await?;
            client.query(&stmt, &[ns]).await?
        }
        Rows::Recent { prefix, limit } => {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {COLS} FROM memory WHERE {} ORDER BY updated_at DESC, key LIMIT $3",
                    under(1)
                ))
                .await?;
            client
                .query(&stmt, &[prefix, &prefix_bound(prefix), &(*limit as i64)])
                .await?
        }
        Rows::InOrder { prefix } => {
            // Oldest first (an item from before `created_at` was kept first, as SQLite orders
            // it), then in the order rows were first put.
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {COLS} FROM memory WHERE {} ORDER BY created_at NULLS FIRST, id",
                    under(1)
                ))
                .await?;
            client.query(&stmt, &[prefix, &prefix_bound(prefix)]).await?
        }
        Rows::Matching { prefix, query, limit } => {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {COLS}, ts_rank(tsv, q)::float8 FROM memory, websearch_to_tsquery('english', $3) q
                     WHERE tsv @@ q AND {} ORDER BY 8 DESC, key LIMIT $4",
                    under(1)
                ))
                .await?;
            let limit = limit.map(|l| l as i64);
            client
                .query(&stmt, &[prefix, &prefix_bound(prefix), query, &limit])
                .await?
        }
    };
    let scored = matches!(which, Rows::Matching { .. });
    rows.iter()
        .map(|r| {
            let mut out = row(r)?;
            if scored {
                out.score = Some(r.try_get(7)?);
            }
            Ok(out)
        })
        .collect()
}

/// Stores an item, its keyword vector and its embeddings in one transaction.
pub(super) async fn put(db: &Db, p: Put) -> Done<()> {
    no_nul("a namespace", &p.namespace)?;
    no_nul("a key", &p.key)?;
    let mut client = db.pool.get().await?;
    let tx = client.transaction().await?;
    let upsert = tx
        .prepare_cached(
            "INSERT INTO memory (namespace, key, value, updated_at, created_at, ttl, expires_at, tsv)
             VALUES ($1, $2, $3, $4, $4, $5, $6, to_tsvector('english', $7))
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
               updated_at = excluded.updated_at, ttl = excluded.ttl, expires_at = excluded.expires_at,
               tsv = excluded.tsv",
        )
        .await?;
    let text = keyword_text(&p.text);
    tx.execute(
        &upsert,
        &[&p.namespace, &p.key, &p.value, &p.at, &p.ttl, &p.expires_at, &text],
    )
    .await?;
    tx.execute(
        "DELETE FROM memory_vectors WHERE namespace = $1 AND key = $2",
        &[&p.namespace, &p.key],
    )
    .await?;
    if let Some((embedder, vectors)) = &p.vectors {
        let insert = tx
            .prepare(&format!(
                "INSERT INTO memory_vectors (namespace, key, path, embedder, vector) VALUES ($1, $2, $3, $4, {})
                 ON CONFLICT (namespace, key, path) DO UPDATE SET embedder = excluded.embedder,
                   vector = excluded.vector",
                db.vectors.param(5)
            ))
            .await?;
        for (path, v) in vectors {
            let path = storable(path).into_owned();
            tx.execute(&insert, &[&p.namespace, &p.key, &path, embedder, v]).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// The text an item's keyword vector is made of, within what a `tsvector` holds (1 MiB of
/// lexemes and positions): a value's first 256 KiB of words are searchable.
fn keyword_text(text: &str) -> String {
    const MAX: usize = 256 * 1024;
    let mut end = text.len().min(MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    storable(&text[..end]).into_owned()
}

pub(super) async fn delete(db: &Db, namespace: &str, key: &str) -> Done<bool> {
    let client = db.pool.get().await?;
    let n = client
        .execute(
            "DELETE FROM memory WHERE namespace = $1 AND key = $2",
            &[&namespace, &key],
        )
        .await?;
    Ok(n > 0)
}

pub(super) async fn set_expiry(db: &Db, namespace: &str, key: &str, expires_at: &str) -> Done<()> {
    let client = db.pool.get().await?;
    client
        .execute(
            "UPDATE memory SET expires_at = $3 WHERE namespace = $1 AND key = $2",
            &[&namespace, &key, &expires_at],
        )
        .await?;
    Ok(())
}

/// Each item's best similarity to `query`: computed by the server with pgvector, else from
/// every vector under the prefix, streamed.
pub(super) async fn scores(
    db: &Db,
    prefix: &str,
    embedder: &str,
    query: &[f32],
) -> Done<HashMap<(String, String), f32>> {
    let client = db.pool.get().await?;
    let bound = prefix_bound(prefix);
    let mut best: HashMap<(String, String), f32> = HashMap::new();
    match &db.vectors {
        Vectors::Pgvector(at) => {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT namespace, key, max(-(vector OPERATOR({at}.<#>) {}))::float4 FROM memory_vectors
                     WHERE embedder = $3 AND {} GROUP BY namespace, key",
                    db.vectors.param(4),
                    under(1)
                ))
                .await?;
            let query = query.to_vec();
            for r in client.query(&stmt, &[&prefix, &bound, &embedder, &query]).await? {
                best.insert((r.try_get(0)?, r.try_get(1)?), r.try_get(2)?);
            }
        }
        Vectors::Arrays => {
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT namespace, key, vector FROM memory_vectors WHERE embedder = $3 AND {}",
                    under(1)
                ))
                .await?;
            let params: [&(dyn ToSql + Sync); 3] = [&prefix, &bound, &embedder];
            let rows = client.query_raw(&stmt, params).await?;
            pin_mut!(rows);
            while let Some(r) = rows.try_next().await? {
                let v: Vec<f32> = r.try_get(2)?;
                let score = dot(query, &v);
                let slot = best.entry((r.try_get(0)?, r.try_get(1)?)).or_insert(f32::NEG_INFINITY);
                *slot = slot.max(score);
            }
        }
    }
    Ok(best)
}

pub(super) async fn namespaces(db: &Db, prefix: &str) -> Done<Vec<String>> {
    let client = db.pool.get().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT DISTINCT namespace FROM memory WHERE {} ORDER BY namespace",
            under(1)
        ))
        .await?;
    let rows = client.query(&stmt, &[&prefix, &prefix_bound(prefix)]).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

//! Indexes on PostgreSQL: documents, chunks with their keyword vectors and embeddings, the
//! searches over them, calibrations and the query-embedding cache.

use std::collections::HashMap;

use futures::{TryStreamExt, pin_mut};
use tokio_postgres::types::ToSql;

use super::{Db, Done, Vectors, storable};
use crate::rag::backend::{Nearest, StoredCalibration};
use crate::rag::chunk::Chunk;
use crate::rag::embed::dot;
use crate::rag::index::Document;
use crate::rag::search::ChunkRow;

/// FTS5's weights: a heading (A) twice the text (B); `ts_rank` takes them as `{D, C, B, A}`.
const WEIGHTS: &str = "'{0.1, 0.2, 0.5, 1.0}'";
/// A restriction to the documents `$n` (an empty list: none).
fn restrict(n: usize) -> String {
    format!("(cardinality(${n}::bigint[]) = 0 OR c.doc_id = ANY(${n}::bigint[]))")
}

pub(super) async fn embedder(db: &Db, index: &str) -> Done<Option<String>> {
    let client = db.pool.get().await?;
    let row = client
        .query_opt("SELECT embedder FROM indexes WHERE name = $1", &[&index])
        .await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

pub(super) async fn create(db: &Db, index: &str, embedder: &str, dims: usize, at: &str) -> Done<()> {
    let client = db.pool.get().await?;
    client
        .execute(
            "INSERT INTO indexes (name, embedder, dims, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO NOTHING",
            &[&index, &embedder, &(dims as i64), &at],
        )
        .await?;
    Ok(())
}

/// Drops an index: its documents, chunks and calibration go with it (cascading keys).
pub(super) async fn drop(db: &Db, index: &str) -> Done<()> {
    let client = db.pool.get().await?;
    client.execute("DELETE FROM indexes WHERE name = $1", &[&index]).await?;
    Ok(())
}

pub(super) async fn document_hash(db: &Db, index: &str, key: &str) -> Done<Option<String>> {
    let client = db.pool.get().await?;
    let row = client
        .query_opt(
            "SELECT hash FROM documents WHERE index_name = $1 AND path = $2",
            &[&index, &key],
        )
        .await?;
    Ok(row.map(|r| r.try_get(0)).transpose()?)
}

/// Replaces a document in one transaction, under a lock on its index and key: two processes
/// indexing the same document at once take turns, the later one's version kept.
pub(super) async fn replace_document(
    db: &Db,
    index: &str,
    doc: &Document,
    hash: &str,
    at: &str,
    chunks: &[Chunk],
    vectors: &[Vec<f32>],
) -> Done<()> {
    super::no_nul("a document key", &doc.key)?;
    let mut client = db.pool.get().await?;
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('runner.documents'), hashtext($1 || E'\\n' || $2))",
        &[&index, &doc.key],
    )
    .await?;
    tx.execute(
        "DELETE FROM documents WHERE index_name = $1 AND path = $2",
        &[&index, &doc.key],
    )
    .await?;
    let name = storable(&doc.name).into_owned();
    let title = doc.title.as_deref().map(|t| storable(t).into_owned());
    let row = tx
        .query_one(
            "INSERT INTO documents (index_name, path, name, title, format, hash, metadata, indexed_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) RETURNING id",
            &[
                &index,
                &doc.key,
                &name,
                &title,
                &doc.format.name(),
                &hash,
                &doc.metadata.to_string(),
                &at,
            ],
        )
        .await?;
    let doc_id: i64 = row.try_get(0)?;
    let insert = tx
        .prepare(&format!(
            "INSERT INTO chunks (doc_id, position, heading, page, start_char, end_char, text, vector, tsv)
             VALUES ($1, $2, $3, $4, $5, $6, $7, {},
               setweight(to_tsvector('english', coalesce($3, '')), 'A') || setweight(to_tsvector('english', $7), 'B'))",
            db.vectors.param(8)
        ))
        .await?;
    // Sent together: the client pipelines them, one round trip for the lot.
    let rows = chunks.iter().zip(vectors).map(|(ch, v)| {
        let insert = &insert;
        let tx = &tx;
        async move {
            let heading = ch.heading.as_deref().map(|h| storable(h).into_owned());
            let text = storable(&ch.text).into_owned();
            let page = ch.page.map(i64::from);
            let params: [&(dyn ToSql + Sync); 8] = [
                &doc_id,
                &(ch.position as i64),
                &heading,
                &page,
                &(ch.start as i64),
                &(ch.end as i64),
                &text,
                v,
            ];
            tx.execute(insert, &params).await
        }
    });
    futures::future::try_join_all(rows).await?;
    tx.commit().await?;
    Ok(())
}

pub(super) async fn documents(db: &Db, index: &str) -> Done<Vec<(i64, String, String)>> {
    let client = db.pool.get().await?;
    let rows = client
        .query(
            "SELECT id, name, path FROM documents WHERE index_name = $1 ORDER BY id",
            &[&index],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect()
}

/// Each query's nearest chunks: found by the server with pgvector (one ordered scan per query);
/// without it, every vector of the index streamed once for all the queries and scored here.
pub(super) async fn nearest(
    db: &Db,
    index: &str,
    docs: &[i64],
    queries: &[Vec<f32>],
    depth: usize,
) -> Done<Vec<Vec<(i64, f64)>>> {
    let client = db.pool.get().await?;
    match &db.vectors {
        Vectors::Pgvector(at) => {
            let stmt = client
                .prepare(&format!(
                    "SELECT c.id, c.vector OPERATOR({at}.<#>) {} FROM chunks c JOIN documents d ON d.id = c.doc_id
                     WHERE d.index_name = $1 AND {} ORDER BY 2, c.id LIMIT $3",
                    db.vectors.param(2),
                    restrict(4)
                ))
                .await?;
            let mut out = Vec::with_capacity(queries.len());
            for q in queries {
                let rows = client.query(&stmt, &[&index, q, &(depth as i64), &docs]).await?;
                let list = rows
                    .iter()
                    .map(|r| Ok((r.try_get::<_, i64>(0)?, -r.try_get::<_, f64>(1)?)))
                    .collect::<Done<Vec<_>>>()?;
                out.push(list);
            }
            Ok(out)
        }
        Vectors::Arrays => {
            let mut nearest = Nearest::new(queries.len(), depth);
            if queries.is_empty() {
                return Ok(nearest.finish());
            }
            let stmt = client
                .prepare(&format!(
                    "SELECT c.id, c.vector FROM chunks c JOIN documents d ON d.id = c.doc_id
                     WHERE d.index_name = $1 AND {}",
                    restrict(2)
                ))
                .await?;
            let params: [&(dyn ToSql + Sync); 2] = [&index, &docs];
            let rows = client.query_raw(&stmt, params).await?;
            pin_mut!(rows);
            while let Some(r) = rows.try_next().await? {
                let id: i64 = r.try_get(0)?;
                let v: Vec<f32> = r.try_get(1)?;
                for (qi, q) in queries.iter().enumerate() {
                    nearest.offer(qi, id, f64::from(dot(q, &v)));
                }
            }
            Ok(nearest.finish())
        }
    }
}

pub(super) async fn keyword(db: &Db, index: &str, docs: &[i64], query: &str, depth: usize) -> Done<Vec<i64>> {
    let client = db.pool.get().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id, websearch_to_tsquery('english', $2) q
             WHERE c.tsv @@ q AND d.index_name = $1 AND {}
             ORDER BY ts_rank({WEIGHTS}, c.tsv, q, 1) DESC, c.id LIMIT $3",
            restrict(4)
        ))
        .await?;
    let rows = client.query(&stmt, &[&index, &query, &(depth as i64), &docs]).await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

pub(super) async fn chunk_vectors(db: &Db, ids: &[i64]) -> Done<HashMap<i64, Vec<f32>>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let client = db.pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT id, {} FROM chunks WHERE id = ANY($1)",
                db.vectors.read("vector")
            ),
            &[&ids],
        )
        .await?;
    rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
}

const CHUNK_COLS: &str = "c.id, c.doc_id, d.name, c.position, c.heading, c.text, c.page";

fn chunk_row(r: &tokio_postgres::Row) -> Done<ChunkRow> {
    Ok(ChunkRow {
        id: r.try_get(0)?,
        doc_id: r.try_get(1)?,
        document: r.try_get(2)?,
        position: r.try_get(3)?,
        heading: r.try_get(4)?,
        text: r.try_get(5)?,
        page: r.try_get(6)?,
    })
}

pub(super) async fn chunks(db: &Db, ids: &[i64]) -> Done<HashMap<i64, ChunkRow>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let client = db.pool.get().await?;
    let rows = client
        .query(
            &format!("SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id = ANY($1)"),
            &[&ids],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let row = chunk_row(r)?;
            Ok((row.id, row))
        })
        .collect()
}

pub(super) async fn window(db: &Db, doc: i64, from: i64, to: i64) -> Done<Vec<ChunkRow>> {
    let client = db.pool.get().await?;
    let stmt = client
        .prepare_cached(&format!(
            "SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE c.doc_id = $1 AND c.position BETWEEN $2 AND $3 ORDER BY c.position"
        ))
        .await?;
    let rows = client.query(&stmt, &[&doc, &from, &to]).await?;
    rows.iter().map(chunk_row).collect()
}

pub(super) async fn chunk_count(db: &Db, index: &str) -> Done<(i64, Option<i64>)> {
    let client = db.pool.get().await?;
    let row = client
        .query_one(
            "SELECT count(*), max(c.id) FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE d.index_name = $1",
            &[&index],
        )
        .await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

pub(super) async fn chunk_texts(db: &Db, index: &str) -> Done<Vec<(i64, i64, i64, String)>> {
    let client = db.pool.get().await?;
    let rows = client
        .query(
            "SELECT c.id, c.doc_id, c.position, c.text FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE d.index_name = $1 ORDER BY c.id",
            &[&index],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
        .collect()
}

/// Every chunk of the index with its vector (for calibration, which runs when the index
/// changed).
pub(super) async fn chunk_vectors_of(db: &Db, index: &str) -> Done<Vec<(i64, i64, i64, Vec<f32>)>> {
    let client = db.pool.get().await?;
    let rows = client
        .query(
            &format!(
                "SELECT c.id, c.doc_id, c.position, {} FROM chunks c JOIN documents d ON d.id = c.doc_id
                 WHERE d.index_name = $1",
                db.vectors.read("c.vector")
            ),
            &[&index],
        )
        .await?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
        .collect()
}

pub(super) async fn calibration(db: &Db, index: &str) -> Done<Option<StoredCalibration>> {
    let client = db.pool.get().await?;
    let row = client
        .query_opt(
            "SELECT fingerprint, matching, unrelated, samples FROM calibrations WHERE index_name = $1",
            &[&index],
        )
        .await?;
    row.map(|r| {
        Ok(StoredCalibration {
            fingerprint: r.try_get(0)?,
            matching: r.try_get(1)?,
            unrelated: r.try_get(2)?,
            samples: r.try_get(3)?,
        })
    })
    .transpose()
}

pub(super) async fn put_calibration(db: &Db, index: &str, k: &StoredCalibration, at: &str) -> Done<()> {
    let client = db.pool.get().await?;
    client
        .execute(
            "INSERT INTO calibrations (index_name, fingerprint, matching, unrelated, samples, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (index_name) DO UPDATE SET fingerprint = excluded.fingerprint,
               matching = excluded.matching, unrelated = excluded.unrelated, samples = excluded.samples,
               created_at = excluded.created_at",
            &[&index, &k.fingerprint, &k.matching, &k.unrelated, &k.samples, &at],
        )
        .await?;
    Ok(())
}

pub(super) async fn cached_vectors(db: &Db, embedder: &str, keys: &[String]) -> Done<Vec<Option<Vec<f32>>>> {
    let client = db.pool.get().await?;
    let rows = client
        .query(
            "SELECT hash, vector FROM query_embeddings WHERE embedder = $1 AND hash = ANY($2)",
            &[&embedder, &keys],
        )
        .await?;
    let mut found: HashMap<String, Vec<f32>> = HashMap::with_capacity(rows.len());
    for r in rows {
        found.insert(r.try_get(0)?, r.try_get(1)?);
    }
    Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
}

pub(super) async fn cache_vectors(
    db: &Db,
    embedder: &str,
    fresh: &[(String, Vec<f32>)],
    at: &str,
    keep: i64,
) -> Done<()> {
    let mut client = db.pool.get().await?;
    let tx = client.transaction().await?;
    let insert = tx
        .prepare(
            "INSERT INTO query_embeddings (embedder, hash, vector, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (embedder, hash) DO UPDATE SET vector = excluded.vector, created_at = excluded.created_at",
        )
        .await?;
    for (k, v) in fresh {
        tx.execute(&insert, &[&embedder, k, v, &at]).await?;
    }
    tx.execute(
        "DELETE FROM query_embeddings WHERE embedder = $1 AND id NOT IN
         (SELECT id FROM query_embeddings WHERE embedder = $1 ORDER BY created_at DESC, id DESC LIMIT $2)",
        &[&embedder, &keep],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

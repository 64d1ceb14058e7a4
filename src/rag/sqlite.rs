//! The data store on SQLite: one file (or `:memory:`), FTS5 for keywords (BM25, Porter
//! stemming), vectors as little-endian f32 blobs scored in-process by brute force.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::DataError;
use super::backend::{Backend, MemoryPut, MemoryRow, MemoryRows, Nearest, Result, ScannedChunk, StoredCalibration};
use super::chunk::Chunk;
use super::embed::{dot_blob, from_blob, to_blob};
use super::index::Document;
use super::search::ChunkRow;

/// The schema this build writes, kept in `PRAGMA user_version`.
pub const SCHEMA_VERSION: i64 = 4;
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS indexes (
    name TEXT PRIMARY KEY NOT NULL,
    embedder TEXT NOT NULL,
    dims INTEGER NOT NULL,
    created_at TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS documents (
    id INTEGER PRIMARY KEY,
    index_name TEXT NOT NULL REFERENCES indexes (name) ON DELETE CASCADE,
    path TEXT NOT NULL,
    name TEXT NOT NULL,
    title TEXT,
    format TEXT NOT NULL,
    hash TEXT NOT NULL,
    metadata TEXT NOT NULL,
    indexed_at TEXT NOT NULL,
    UNIQUE (index_name, path)
) STRICT;
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY,
    doc_id INTEGER NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    heading TEXT,
    page INTEGER,
    start_char INTEGER NOT NULL,
    end_char INTEGER NOT NULL,
    text TEXT NOT NULL,
    vector BLOB NOT NULL,
    UNIQUE (doc_id, position)
) STRICT;
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5 (heading, text, tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS memory (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    created_at TEXT,
    ttl REAL,
    expires_at TEXT,
    PRIMARY KEY (namespace, key)
) STRICT;
CREATE TABLE IF NOT EXISTS query_embeddings (
    embedder TEXT NOT NULL,
    hash TEXT NOT NULL,
    vector BLOB NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (embedder, hash)
) STRICT;
CREATE TABLE IF NOT EXISTS calibrations (
    index_name TEXT PRIMARY KEY NOT NULL REFERENCES indexes (name) ON DELETE CASCADE,
    fingerprint TEXT NOT NULL,
    matching REAL,
    unrelated REAL,
    samples INTEGER NOT NULL,
    created_at TEXT NOT NULL
) STRICT;
CREATE VIRTUAL TABLE IF NOT EXISTS memory_fts USING fts5 (namespace UNINDEXED, key UNINDEXED, text, tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS memory_vectors (
    namespace TEXT NOT NULL,
    key TEXT NOT NULL,
    path TEXT NOT NULL,
    embedder TEXT NOT NULL,
    vector BLOB NOT NULL,
    PRIMARY KEY (namespace, key, path)
) STRICT;
";

/// Opens (creating or upgrading) the data database at `path`; `:memory:` keeps nothing past
/// the process.
pub(super) fn open(path: &Path) -> Result<Connection> {
    let shown = path.display().to_string();
    let wrap = |source| DataError::Open {
        path: shown.clone(),
        source,
    };
    let conn = if path.as_os_str() == ":memory:" {
        Connection::open_in_memory().map_err(wrap)?
    } else {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| DataError::Invalid(format!("cannot create {}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path).map_err(wrap)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        let _: String = conn.pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0))?;
        conn.pragma_update(None, "synchronous", "normal")?;
        conn
    };
    conn.pragma_update(None, "foreign_keys", true)?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(DataError::NewerSchema(shown, version));
    }
    conn.execute_batch(SCHEMA)?;
    // Version 2: memory items remember when they were first stored (older items: unknown).
    let has_created: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('memory') WHERE name = 'created_at'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_created {
        conn.execute_batch("ALTER TABLE memory ADD COLUMN created_at TEXT")?;
    }
    // Version 3: an item may have a time to live (minutes) and the time it expires.
    let has_ttl: bool = conn.query_row(
        "SELECT count(*) FROM pragma_table_info('memory') WHERE name = 'expires_at'",
        [],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !has_ttl {
        conn.execute_batch(
            "ALTER TABLE memory ADD COLUMN ttl REAL;
             ALTER TABLE memory ADD COLUMN expires_at TEXT;",
        )?;
    }
    conn.execute_batch("CREATE INDEX IF NOT EXISTS memory_expiry ON memory (expires_at) WHERE expires_at IS NOT NULL")?;
    // Version 4: long-term memory's vectors for semantic search (`memory_vectors`, made by
    // the schema above).
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(conn)
}

/// Words as an FTS5 query: each quoted, any of them matching.
fn fts_query(words: &[String]) -> String {
    words
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// ` AND c.doc_id IN (…)` for a restriction to `docs`, nothing for none.
fn restrict(docs: &[i64]) -> String {
    if docs.is_empty() {
        String::new()
    } else {
        format!(
            " AND c.doc_id IN ({})",
            docs.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
        )
    }
}

const CHUNK_COLS: &str = "c.id, c.doc_id, d.name, c.position, c.heading, c.text, c.page";

fn chunk_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ChunkRow> {
    Ok(ChunkRow {
        id: r.get(0)?,
        doc_id: r.get(1)?,
        document: r.get(2)?,
        position: r.get(3)?,
        heading: r.get(4)?,
        text: r.get(5)?,
        page: r.get(6)?,
    })
}

const MEMORY_COLS: &str = "m.namespace, m.key, m.value, m.updated_at, m.created_at, m.ttl, m.expires_at";

fn memory_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MemoryRow> {
    Ok(MemoryRow {
        namespace: r.get(0)?,
        key: r.get(1)?,
        value: r.get(2)?,
        updated_at: r.get(3)?,
        created_at: r.get(4)?,
        ttl: r.get(5)?,
        expires_at: r.get(6)?,
        score: None,
    })
}

fn delete_document(c: &Connection, index: &str, key: &str) -> Result<()> {
    c.execute(
        "DELETE FROM chunks_fts WHERE rowid IN (SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id
         WHERE d.index_name = ?1 AND d.path = ?2)",
        params![index, key],
    )?;
    c.execute(
        "DELETE FROM documents WHERE index_name = ?1 AND path = ?2",
        params![index, key],
    )?;
    Ok(())
}

impl Backend for Connection {
    fn index_embedder(&self, index: &str) -> Result<Option<String>> {
        Ok(self
            .query_row("SELECT embedder FROM indexes WHERE name = ?1", [index], |r| r.get(0))
            .optional()?)
    }

    fn create_index(&self, index: &str, embedder: &str, dims: usize, at: &str) -> Result<()> {
        self.execute(
            "INSERT OR IGNORE INTO indexes (name, embedder, dims, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![index, embedder, dims as i64, at],
        )?;
        Ok(())
    }

    fn drop_index(&self, index: &str) -> Result<()> {
        let tx = self.unchecked_transaction()?;
        tx.execute(
            "DELETE FROM chunks_fts WHERE rowid IN (SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE d.index_name = ?1)",
            [index],
        )?;
        tx.execute("DELETE FROM indexes WHERE name = ?1", [index])?;
        tx.commit()?;
        Ok(())
    }

    fn document_hash(&self, index: &str, key: &str) -> Result<Option<String>> {
        Ok(self
            .query_row(
                "SELECT hash FROM documents WHERE index_name = ?1 AND path = ?2",
                params![index, key],
                |r| r.get(0),
            )
            .optional()?)
    }

    fn replace_document(
        &self,
        index: &str,
        doc: &Document,
        hash: &str,
        at: &str,
        chunks: &[Chunk],
        vectors: &[Vec<f32>],
    ) -> Result<()> {
        let tx = self.unchecked_transaction()?;
        delete_document(&tx, index, &doc.key)?;
        tx.execute(
            "INSERT INTO documents (index_name, path, name, title, format, hash, metadata, indexed_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                index,
                doc.key,
                doc.name,
                doc.title,
                doc.format.name(),
                hash,
                doc.metadata.to_string(),
                at
            ],
        )?;
        let doc_id = tx.last_insert_rowid();
        {
            let mut chunk_row = tx.prepare(
                "INSERT INTO chunks (doc_id, position, heading, page, start_char, end_char, text, vector)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            let mut fts_row = tx.prepare("INSERT INTO chunks_fts (rowid, heading, text) VALUES (?1, ?2, ?3)")?;
            for (ch, v) in chunks.iter().zip(vectors) {
                chunk_row.execute(params![
                    doc_id,
                    ch.position as i64,
                    ch.heading,
                    ch.page,
                    ch.start as i64,
                    ch.end as i64,
                    ch.text,
                    to_blob(v)
                ])?;
                let id = tx.last_insert_rowid();
                fts_row.execute(params![id, ch.heading.as_deref().unwrap_or(""), ch.text])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn documents(&self, index: &str) -> Result<Vec<(i64, String, String)>> {
        let mut stmt = self.prepare_cached("SELECT id, name, path FROM documents WHERE index_name = ?1 ORDER BY id")?;
        let rows = stmt.query_map([index], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn nearest(&self, index: &str, docs: &[i64], queries: &[Vec<f32>], depth: usize) -> Result<Vec<Vec<(i64, f64)>>> {
        let mut nearest = Nearest::new(queries.len(), depth);
        if queries.is_empty() {
            return Ok(nearest.finish());
        }
        let mut stmt = self.prepare(&format!(
            "SELECT c.id, c.vector FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE d.index_name = ?1{}",
            restrict(docs)
        ))?;
        let mut rows = stmt.query([index])?;
        while let Some(r) = rows.next()? {
            let id: i64 = r.get(0)?;
            // Read in place: no copy of the vector per row.
            let blob = r.get_ref(1)?.as_blob().map_err(rusqlite::Error::from)?;
            for (qi, q) in queries.iter().enumerate() {
                nearest.offer(qi, id, f64::from(dot_blob(q, blob)));
            }
        }
        Ok(nearest.finish())
    }

    fn keyword(&self, index: &str, docs: &[i64], words: &[String], depth: usize) -> Result<Vec<i64>> {
        if words.is_empty() {
            return Ok(Vec::new());
        }
        let mut stmt = self.prepare_cached(&format!(
            "SELECT c.id FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid JOIN documents d ON d.id = c.doc_id
             WHERE chunks_fts MATCH ?1 AND d.index_name = ?2{}
             ORDER BY bm25(chunks_fts, 2.0, 1.0), c.id LIMIT ?3",
            restrict(docs)
        ))?;
        let ids = stmt
            .query_map(params![fts_query(words), index, depth as i64], |r| r.get::<_, i64>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(ids)
    }

    fn chunk_vectors(&self, ids: &[i64]) -> Result<HashMap<i64, Vec<f32>>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let marks = vec!["?"; ids.len()].join(",");
        let mut stmt = self.prepare(&format!("SELECT id, vector FROM chunks WHERE id IN ({marks})"))?;
        let rows = stmt.query_map(params_from_iter(ids), |r| {
            Ok((r.get::<_, i64>(0)?, from_blob(&r.get::<_, Vec<u8>>(1)?)))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn chunks(&self, ids: &[i64]) -> Result<HashMap<i64, ChunkRow>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let marks = vec!["?"; ids.len()].join(",");
        let mut stmt = self.prepare(&format!(
            "SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id IN ({marks})"
        ))?;
        let rows = stmt.query_map(params_from_iter(ids), chunk_row)?;
        let mut out = HashMap::new();
        for r in rows {
            let r = r?;
            out.insert(r.id, r);
        }
        Ok(out)
    }

    fn window(&self, doc: i64, from: i64, to: i64) -> Result<Vec<ChunkRow>> {
        let mut stmt = self.prepare_cached(&format!(
            "SELECT {CHUNK_COLS} FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE c.doc_id = ?1 AND c.position BETWEEN ?2 AND ?3 ORDER BY c.position"
        ))?;
        let rows = stmt.query_map(params![doc, from, to], chunk_row)?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn chunk_count(&self, index: &str) -> Result<(i64, Option<i64>)> {
        Ok(self.query_row(
            "SELECT count(*), max(c.id) FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE d.index_name = ?1",
            [index],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }

    fn chunk_texts(&self, index: &str) -> Result<Vec<(i64, i64, i64, String)>> {
        let mut stmt = self.prepare(
            "SELECT c.id, c.doc_id, c.position, c.text FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE d.index_name = ?1 ORDER BY c.id",
        )?;
        let rows = stmt.query_map([index], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    fn scan_vectors(&self, index: &str, f: &mut dyn FnMut(ScannedChunk<'_>)) -> Result<()> {
        let mut stmt = self.prepare(
            "SELECT c.id, c.doc_id, c.position, c.vector FROM chunks c JOIN documents d ON d.id = c.doc_id
             WHERE d.index_name = ?1",
        )?;
        let mut rows = stmt.query([index])?;
        while let Some(r) = rows.next()? {
            let blob = r.get_ref(3)?.as_blob().map_err(rusqlite::Error::from)?;
            let vector = from_blob(blob);
            f(ScannedChunk {
                id: r.get(0)?,
                doc: r.get(1)?,
                position: r.get(2)?,
                vector: &vector,
            });
        }
        Ok(())
    }

    fn calibration(&self, index: &str) -> Result<Option<StoredCalibration>> {
        Ok(self
            .query_row(
                "SELECT fingerprint, matching, unrelated, samples FROM calibrations WHERE index_name = ?1",
                [index],
                |r| {
                    Ok(StoredCalibration {
                        fingerprint: r.get(0)?,
                        matching: r.get(1)?,
                        unrelated: r.get(2)?,
                        samples: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }

    fn put_calibration(&self, index: &str, k: &StoredCalibration, at: &str) -> Result<()> {
        self.execute(
            "INSERT OR REPLACE INTO calibrations (index_name, fingerprint, matching, unrelated, samples, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![index, k.fingerprint, k.matching, k.unrelated, k.samples, at],
        )?;
        Ok(())
    }

    fn cached_vectors(&self, embedder: &str, keys: &[String]) -> Result<Vec<Option<Vec<f32>>>> {
        let mut stmt = self.prepare_cached("SELECT vector FROM query_embeddings WHERE embedder = ?1 AND hash = ?2")?;
        let mut out = Vec::with_capacity(keys.len());
        for k in keys {
            let v: Option<Vec<u8>> = stmt.query_row(params![embedder, k], |r| r.get(0)).optional()?;
            out.push(v.map(|b| from_blob(&b)));
        }
        Ok(out)
    }

    fn cache_vectors(&self, embedder: &str, fresh: &[(String, Vec<f32>)], at: &str, keep: i64) -> Result<()> {
        let tx = self.unchecked_transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO query_embeddings (embedder, hash, vector, created_at) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (k, v) in fresh {
                stmt.execute(params![embedder, k, to_blob(v), at])?;
            }
        }
        tx.execute(
            "DELETE FROM query_embeddings WHERE embedder = ?1 AND rowid NOT IN
             (SELECT rowid FROM query_embeddings WHERE embedder = ?1 ORDER BY created_at DESC, rowid DESC LIMIT ?2)",
            params![embedder, keep],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn sweep(&self, now: &str) -> Result<usize> {
        let expired: Vec<(String, String)> = self
            .prepare_cached("SELECT namespace, key FROM memory WHERE expires_at IS NOT NULL AND expires_at <= ?1")?
            .query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        for (ns, key) in &expired {
            self.memory_delete(ns, key)?;
        }
        Ok(expired.len())
    }

    fn memory_item(&self, namespace: &str, key: &str) -> Result<Option<MemoryRow>> {
        Ok(self
            .query_row(
                &format!("SELECT {MEMORY_COLS} FROM memory m WHERE m.namespace = ?1 AND m.key = ?2"),
                params![namespace, key],
                memory_row,
            )
            .optional()?)
    }

    fn memory_rows(&self, which: MemoryRows<'_>) -> Result<Vec<MemoryRow>> {
        let rows = match which {
            MemoryRows::Namespace(ns) => self
                .prepare_cached(&format!(
                    "SELECT {MEMORY_COLS} FROM memory m WHERE m.namespace = ?1 ORDER BY m.key"
                ))?
                .query_map([ns], memory_row)?
                .collect::<rusqlite::Result<_>>()?,
            MemoryRows::Recent { prefix, limit } => self
                .prepare_cached(&format!(
                    "SELECT {MEMORY_COLS} FROM memory m WHERE substr(m.namespace, 1, length(?1)) = ?1
                     ORDER BY m.updated_at DESC, m.key LIMIT ?2"
                ))?
                .query_map(params![prefix, limit as i64], memory_row)?
                .collect::<rusqlite::Result<_>>()?,
            MemoryRows::InOrder { prefix } => self
                .prepare_cached(&format!(
                    // Oldest first, and the row's id (kept by an update) between items put in
                    // the same millisecond.
                    "SELECT {MEMORY_COLS} FROM memory m WHERE substr(m.namespace, 1, length(?1)) = ?1
                     ORDER BY m.created_at, m.rowid"
                ))?
                .query_map([prefix], memory_row)?
                .collect::<rusqlite::Result<_>>()?,
            MemoryRows::Matching { prefix, words, limit } => {
                if words.is_empty() {
                    return Ok(Vec::new());
                }
                let limit = limit.map_or(-1, |l| l as i64);
                self.prepare_cached(&format!(
                    "SELECT {MEMORY_COLS}, bm25(memory_fts) FROM memory_fts
                     JOIN memory m ON m.namespace = memory_fts.namespace AND m.key = memory_fts.key
                     WHERE memory_fts MATCH ?1 AND substr(memory_fts.namespace, 1, length(?2)) = ?2
                     ORDER BY bm25(memory_fts), m.key LIMIT ?3"
                ))?
                .query_map(params![fts_query(words), prefix, limit], |r| {
                    let mut row = memory_row(r)?;
                    // BM25 is lower for better matches: negated, higher is better.
                    row.score = Some(-r.get::<_, f64>(7)?);
                    Ok(row)
                })?
                .collect::<rusqlite::Result<_>>()?
            }
        };
        Ok(rows)
    }

    fn memory_put(&self, put: &MemoryPut<'_>) -> Result<()> {
        let (ns, key) = (put.namespace, put.key);
        let tx = self.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO memory (namespace, key, value, updated_at, created_at, ttl, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?4, ?5, ?6)
             ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value,
               updated_at = excluded.updated_at, ttl = excluded.ttl, expires_at = excluded.expires_at",
            params![ns, key, put.value, put.at, put.ttl, put.expires_at],
        )?;
        tx.execute(
            "DELETE FROM memory_fts WHERE namespace = ?1 AND key = ?2",
            params![ns, key],
        )?;
        tx.execute(
            "INSERT INTO memory_fts (namespace, key, text) VALUES (?1, ?2, ?3)",
            params![ns, key, put.text],
        )?;
        tx.execute(
            "DELETE FROM memory_vectors WHERE namespace = ?1 AND key = ?2",
            params![ns, key],
        )?;
        if let Some((embedder, vectors)) = put.vectors {
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO memory_vectors (namespace, key, path, embedder, vector) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for (path, v) in vectors {
                insert.execute(params![ns, key, path, embedder, to_blob(v)])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn memory_delete(&self, namespace: &str, key: &str) -> Result<bool> {
        let tx = self.unchecked_transaction()?;
        let n = tx.execute(
            "DELETE FROM memory WHERE namespace = ?1 AND key = ?2",
            params![namespace, key],
        )?;
        tx.execute(
            "DELETE FROM memory_fts WHERE namespace = ?1 AND key = ?2",
            params![namespace, key],
        )?;
        tx.execute(
            "DELETE FROM memory_vectors WHERE namespace = ?1 AND key = ?2",
            params![namespace, key],
        )?;
        tx.commit()?;
        Ok(n > 0)
    }

    fn set_expiry(&self, namespace: &str, key: &str, expires_at: &str) -> Result<()> {
        self.execute(
            "UPDATE memory SET expires_at = ?3 WHERE namespace = ?1 AND key = ?2",
            params![namespace, key, expires_at],
        )?;
        Ok(())
    }

    fn memory_scores(&self, prefix: &str, embedder: &str, query: &[f32]) -> Result<HashMap<(String, String), f32>> {
        let mut best: HashMap<(String, String), f32> = HashMap::new();
        let mut stmt = self.prepare_cached(
            "SELECT namespace, key, vector FROM memory_vectors
             WHERE embedder = ?1 AND substr(namespace, 1, length(?2)) = ?2",
        )?;
        let mut rows = stmt.query(params![embedder, prefix])?;
        while let Some(r) = rows.next()? {
            let blob = r.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
            let score = dot_blob(query, blob);
            let slot = best.entry((r.get(0)?, r.get(1)?)).or_insert(f32::NEG_INFINITY);
            *slot = slot.max(score);
        }
        Ok(best)
    }

    fn memory_namespaces(&self, prefix: &str) -> Result<Vec<String>> {
        let mut stmt = self.prepare_cached(
            "SELECT DISTINCT namespace FROM memory WHERE substr(namespace, 1, length(?1)) = ?1 ORDER BY namespace",
        )?;
        let rows = stmt.query_map([prefix], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }
}

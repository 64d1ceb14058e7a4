//! The storage seam of the data store: what the shared code (indexing, hybrid search,
//! calibration, the query-embedding cache, long-term memory's rules) asks of a database, as
//! one trait with a SQLite implementation (`sqlite.rs`) and a PostgreSQL one (`postgres/`).
//!
//! A backend stores and finds; it decides nothing a user could see differ between backends
//! beyond what its engine ranks: keyword ranking (FTS5's BM25 or PostgreSQL's `ts_rank`) and,
//! with pgvector, which chunks are nearest (computed by the server). Everything else —
//! chunking, embedding, fusion by reciprocal rank, cosine scores, calibration, filters,
//! paging, time-to-live rules, namespace matching — is the shared code's, computed in-process
//! the same way whichever backend holds the rows.
//!
//! Calls block: the store runs them on tokio's blocking pool ([`super::DataStore::with`]).
//! Each call that writes is one transaction.

use std::collections::HashMap;

use super::DataError;
use super::chunk::Chunk;
use super::index::Document;
use super::search::ChunkRow;

pub type Result<T> = std::result::Result<T, DataError>;

/// A chunk's vector as a calibration scan reads it.
pub struct ScannedChunk<'a> {
    pub id: i64,
    pub doc: i64,
    pub position: i64,
    pub vector: &'a [f32],
}

/// A stored calibration: the fingerprint of the chunks it was computed on, its medians (none:
/// the index was too small to calibrate) and the samples they came from.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredCalibration {
    pub fingerprint: String,
    pub matching: Option<f64>,
    pub unrelated: Option<f64>,
    pub samples: i64,
}

/// A long-term memory item as stored: its namespace as stored (parts joined, see
/// `memory::ns_key`), its value as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryRow {
    pub namespace: String,
    pub key: String,
    pub value: String,
    pub updated_at: String,
    /// Unknown for items stored before the store kept it.
    pub created_at: Option<String>,
    /// Minutes, for an item with a time to live.
    pub ttl: Option<f64>,
    pub expires_at: Option<String>,
    /// The keyword match's score (higher is better), for [`MemoryRows::Matching`].
    pub score: Option<f64>,
}

/// Which items [`Backend::memory_rows`] reads. A prefix is a namespace as stored: an item is
/// under it when its namespace starts with it (empty: every item).
#[derive(Debug, Clone, Copy)]
pub enum MemoryRows<'a> {
    /// One namespace's items, in key order.
    Namespace(&'a str),
    /// Items under a prefix, the most recently updated first (then by key), at most `limit`.
    Recent { prefix: &'a str, limit: usize },
    /// Items under a prefix in the order they were first put.
    InOrder { prefix: &'a str },
    /// Items under a prefix whose keyword text holds any of `words`, best match first (then by
    /// key), at most `limit` if given.
    Matching {
        prefix: &'a str,
        words: &'a [String],
        limit: Option<usize>,
    },
}

/// A field path of a value and its text's unit vector.
pub type FieldVector = (String, Vec<f32>);
/// An item's vectors: a unit vector per field path embedded.
pub type FieldVectors = [FieldVector];

/// An item to store, replacing the one under its namespace and key (its first-stored time
/// kept).
#[derive(Debug, Clone)]
pub struct MemoryPut<'a> {
    pub namespace: &'a str,
    pub key: &'a str,
    /// The value as JSON text.
    pub value: &'a str,
    /// The words keyword search finds it by.
    pub text: &'a str,
    /// Now, as stored.
    pub at: &'a str,
    pub ttl: Option<f64>,
    pub expires_at: Option<&'a str>,
    /// The embedder's id and a unit vector per field path; none: the item has no vectors.
    pub vectors: Option<(&'a str, &'a FieldVectors)>,
}

/// What the data store asks of a database.
pub trait Backend {
    // ── indexes ────────────────────────────────────────────────────────────────────────────

    /// The embedder `index` was built with; none when the index does not exist.
    fn index_embedder(&self, index: &str) -> Result<Option<String>>;
    /// Records `index` as built by `embedder`, unless it exists.
    fn create_index(&self, index: &str, embedder: &str, dims: usize, at: &str) -> Result<()>;
    /// Drops `index` with its documents, chunks and calibration.
    fn drop_index(&self, index: &str) -> Result<()>;
    /// The content hash of the document `key` of `index`, if it is indexed.
    fn document_hash(&self, index: &str, key: &str) -> Result<Option<String>>;
    /// Replaces document `doc` of `index` (its chunks, their keyword entries and vectors) in
    /// one transaction.
    fn replace_document(
        &self,
        index: &str,
        doc: &Document,
        hash: &str,
        at: &str,
        chunks: &[Chunk],
        vectors: &[Vec<f32>],
    ) -> Result<()>;

    // ── search ─────────────────────────────────────────────────────────────────────────────

    /// Every document of `index`: id, name and key (path), in id order.
    fn documents(&self, index: &str) -> Result<Vec<(i64, String, String)>>;
    /// For each query (a unit vector), the ids of the `depth` chunks of `index` (of `docs`
    /// only, unless empty) nearest to it, nearest first, ties by id, each with its similarity.
    fn nearest(&self, index: &str, docs: &[i64], queries: &[Vec<f32>], depth: usize) -> Result<Vec<Vec<(i64, f64)>>>;
    /// The ids of the `depth` chunks of `index` (of `docs` only, unless empty) whose heading
    /// or text holds any of `words`, best keyword match first (headings weigh twice the
    /// text), ties by id.
    fn keyword(&self, index: &str, docs: &[i64], words: &[String], depth: usize) -> Result<Vec<i64>>;
    /// The vectors of the chunks `ids`.
    fn chunk_vectors(&self, ids: &[i64]) -> Result<HashMap<i64, Vec<f32>>>;
    /// The chunks `ids`.
    fn chunks(&self, ids: &[i64]) -> Result<HashMap<i64, ChunkRow>>;
    /// The chunks of document `doc` at positions `from..=to`, in order.
    fn window(&self, doc: i64, from: i64, to: i64) -> Result<Vec<ChunkRow>>;

    // ── calibration ────────────────────────────────────────────────────────────────────────

    /// How many chunks `index` has, and its largest chunk id.
    fn chunk_count(&self, index: &str) -> Result<(i64, Option<i64>)>;
    /// Every chunk of `index` with its text (id, document, position, text), in id order.
    fn chunk_texts(&self, index: &str) -> Result<Vec<(i64, i64, i64, String)>>;
    /// Calls `f` with every chunk of `index` and its vector.
    fn scan_vectors(&self, index: &str, f: &mut dyn FnMut(ScannedChunk<'_>)) -> Result<()>;
    fn calibration(&self, index: &str) -> Result<Option<StoredCalibration>>;
    fn put_calibration(&self, index: &str, calibration: &StoredCalibration, at: &str) -> Result<()>;

    // ── the query-embedding cache ──────────────────────────────────────────────────────────

    /// The cached vector of each key (the SHA-256 of a text) by `embedder`, in order.
    fn cached_vectors(&self, embedder: &str, keys: &[String]) -> Result<Vec<Option<Vec<f32>>>>;
    /// Caches `fresh` vectors by `embedder`, keeping its newest `keep`.
    fn cache_vectors(&self, embedder: &str, fresh: &[(String, Vec<f32>)], at: &str, keep: i64) -> Result<()>;

    // ── long-term memory ───────────────────────────────────────────────────────────────────

    /// Removes the items that expired at `now` or before, with their keyword entries and
    /// vectors; how many.
    fn sweep(&self, now: &str) -> Result<usize>;
    fn memory_item(&self, namespace: &str, key: &str) -> Result<Option<MemoryRow>>;
    fn memory_rows(&self, which: MemoryRows<'_>) -> Result<Vec<MemoryRow>>;
    /// Stores an item, its keyword entry and its vectors in one transaction.
    fn memory_put(&self, put: &MemoryPut<'_>) -> Result<()>;
    /// Deletes an item with its keyword entry and vectors; whether it existed.
    fn memory_delete(&self, namespace: &str, key: &str) -> Result<bool>;
    /// Sets when an item expires.
    fn set_expiry(&self, namespace: &str, key: &str, expires_at: &str) -> Result<()>;
    /// The best similarity of each item under `prefix` with vectors by `embedder` to `query` (a
    /// unit vector), by namespace and key.
    fn memory_scores(&self, prefix: &str, embedder: &str, query: &[f32]) -> Result<HashMap<(String, String), f32>>;
    /// The namespaces under `prefix` that hold items, distinct, in byte order.
    fn memory_namespaces(&self, prefix: &str) -> Result<Vec<String>>;
}

/// Keeps, for each query, the `depth` nearest chunks of those offered: what a backend that
/// scores vectors in-process ranks with (brute force: every chunk of the index is offered).
pub struct Nearest {
    lists: Vec<Vec<(i64, f64)>>,
    depth: usize,
}

impl Nearest {
    pub fn new(queries: usize, depth: usize) -> Nearest {
        Nearest {
            lists: vec![Vec::new(); queries],
            depth,
        }
    }

    /// Offers chunk `id` with its similarity to query `query`.
    pub fn offer(&mut self, query: usize, id: i64, similarity: f64) {
        self.lists[query].push((id, similarity));
    }

    /// Each query's nearest, nearest first, ties by id.
    pub fn finish(mut self) -> Vec<Vec<(i64, f64)>> {
        for list in &mut self.lists {
            list.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            list.truncate(self.depth);
        }
        self.lists
    }
}

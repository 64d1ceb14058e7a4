//! The data store on PostgreSQL: one database shared by many runner processes, so a value one
//! process stores is what every other reads, and an index built once serves them all.
//!
//! Connections as the checkpointer makes them ([`crate::pg`]: the URL, TLS, a pool, runner's
//! schema as search_path), and the same design: [`Backend`] is synchronous, so the store owns a
//! small tokio runtime on which every query runs, and a call is a spawn onto it and a wait for
//! the answer (on tokio's blocking pool: see [`super::DataStore::with`]).
//!
//! Keywords: a `tsvector` per chunk (heading weighted above text) and per memory item, with a
//! GIN index, matched by `websearch_to_tsquery` over the query's words joined by `or` (any of
//! them, as on SQLite) with the `english` configuration (Snowball stemming, stop words
//! dropped), ranked by `ts_rank` — frequency and weights, with no inverse document frequency,
//! where FTS5's BM25 has it. Vectors: with pgvector, the nearest chunks of a query (negative
//! inner product, exact: no approximate index) and memory items' best similarities are
//! computed by the server; without it, vectors are `real[]` rows scored in-process as on
//! SQLite. Either way the cosines a result reports are computed in-process.

mod index;
mod memory;
mod schema;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use deadpool_postgres::Pool;

use super::DataError;
use super::backend::{Backend, MemoryPut, MemoryRow, MemoryRows, Result, ScannedChunk, StoredCalibration};
use super::chunk::Chunk;
use super::index::Document;
use super::search::ChunkRow;
use crate::pg;

pub use schema::SCHEMA_VERSION;

/// Where vectors live.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Vectors {
    /// pgvector's `vector` type, its objects in this schema.
    Pgvector(String),
    /// `real[]`, scored in-process.
    Arrays,
}

impl Vectors {
    fn column_type(&self) -> String {
        match self {
            Vectors::Pgvector(at) => format!("{at}.vector"),
            Vectors::Arrays => "real[]".into(),
        }
    }

    /// A `real[]` parameter as the column takes it.
    fn param(&self, n: usize) -> String {
        match self {
            Vectors::Pgvector(at) => format!("${n}::real[]::{at}.vector"),
            Vectors::Arrays => format!("${n}::real[]"),
        }
    }

    /// A vector column read as `real[]`.
    fn read(&self, column: &str) -> String {
        match self {
            Vectors::Pgvector(_) => format!("{column}::real[]"),
            Vectors::Arrays => column.to_string(),
        }
    }
}

/// A failure inside a query's future, named once it is back ([`Db::failed`]).
enum Failure {
    Db(tokio_postgres::Error),
    Pool(deadpool_postgres::PoolError),
    Message(String),
    Data(DataError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Db(e)
    }
}

impl From<deadpool_postgres::PoolError> for Failure {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Failure::Pool(e)
    }
}

impl From<DataError> for Failure {
    fn from(e: DataError) -> Self {
        Failure::Data(e)
    }
}

type Done<T> = std::result::Result<T, Failure>;

/// What every query needs: the pool and where vectors live.
struct Db {
    pool: Pool,
    vectors: Vectors,
}

/// The data store on a PostgreSQL database.
pub(super) struct PostgresData {
    db: Arc<Db>,
    /// `None` only while dropping.
    runtime: Option<tokio::runtime::Runtime>,
    /// The host, port, database and schema, for messages (no password).
    display: String,
    /// The schema version the database had when it was opened (0: none) and has now.
    migrated: (i64, i64),
}

impl PostgresData {
    /// What the store is: where, at which schema version (and which it had), and where its
    /// vectors live.
    pub(super) fn describe(&self) -> super::Described {
        super::Described {
            at: self.display.clone(),
            migrated: self.migrated,
            vectors: match &self.db.vectors {
                Vectors::Pgvector(_) => "pgvector",
                Vectors::Arrays => "real[] scored in-process",
            },
        }
    }

    /// Connects to the database at `url`, creating the schema's data tables or migrating them
    /// (and moving vectors to pgvector when the server has it and the URL allows it). Fails
    /// when the URL does not parse or the server does not answer, naming the database.
    pub(super) fn open(url: &str) -> Result<PostgresData> {
        let target = pg::parse_url(url).map_err(DataError::Invalid)?;
        let at = target.display.clone();
        let failed = |message: String| DataError::Postgres {
            at: at.clone(),
            message,
        };
        let runtime = pg::runtime("runner-data").map_err(failed)?;
        let pool = pg::pool(&target, pg::tls().map_err(failed)?).map_err(failed)?;
        let (schema, pgvector) = (target.schema.clone(), target.pgvector);
        let migrating = pool.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let work = async {
                let mut client = migrating.get().await?;
                let tx = client.transaction().await?;
                let migrated = schema::migrate(&tx, &schema, pgvector).await?;
                tx.commit().await?;
                Ok::<_, Failure>(migrated)
            };
            let _ = tx.send(work.await);
        });
        let (vectors, migrated) = rx
            .recv()
            .map_err(|_| failed("the PostgreSQL client has stopped".into()))?
            .map_err(|e| describe(&target.display, e))?;
        Ok(PostgresData {
            db: Arc::new(Db { pool, vectors }),
            runtime: Some(runtime),
            display: target.display,
            migrated,
        })
    }

    /// Runs the future `work` makes on the store's runtime and waits for its answer.
    fn block<T, F, W>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        F: Future<Output = Done<T>> + Send + 'static,
        W: FnOnce(Arc<Db>) -> F,
    {
        let stopped = || DataError::Postgres {
            at: self.display.clone(),
            message: "the PostgreSQL client has stopped".into(),
        };
        let runtime = self.runtime.as_ref().ok_or_else(stopped)?;
        let future = work(Arc::clone(&self.db));
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(future.await);
        });
        crate::blocking::wait(&rx)
            .map_err(|_| stopped())?
            .map_err(|e| describe(&self.display, e))
    }
}

/// A failure as the store reports it: the database named, never the password.
fn describe(at: &str, failure: Failure) -> DataError {
    let message = match failure {
        Failure::Db(e) => pg::describe(&e),
        Failure::Pool(e) => pg::describe_pool(&e),
        Failure::Message(m) => m,
        Failure::Data(e) => return e,
    };
    DataError::Postgres {
        at: at.to_string(),
        message,
    }
}

impl Drop for PostgresData {
    /// Every call has its answer when it returns: nothing is pending. The runtime is let go
    /// without waiting (a drop may happen on another runtime's thread, where blocking is not
    /// allowed); its connections close with it.
    fn drop(&mut self) {
        self.db.pool.close();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// PostgreSQL text holds no NUL: an identifier with one is refused (it could not be read back
/// as it was given).
fn no_nul(what: &str, text: &str) -> Done<()> {
    if text.contains('\0') {
        return Err(Failure::Data(DataError::Invalid(format!(
            "{what} {text:?} holds a NUL character, which PostgreSQL cannot store"
        ))));
    }
    Ok(())
}

/// Text as PostgreSQL can store it: a NUL character becomes U+FFFD.
fn storable(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\u{fffd}").into()
    } else {
        text.into()
    }
}

/// The query `websearch_to_tsquery` reads for any of `words`.
fn any_of(words: &[String]) -> String {
    words.join(" or ")
}

/// The least text greater than every text that starts with `prefix` (byte order: what
/// `COLLATE "C"` compares), so `prefix <= t < bound` finds them through a btree index; none for
/// the empty prefix (everything).
fn prefix_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

impl Backend for PostgresData {
    fn index_embedder(&self, index: &str) -> Result<Option<String>> {
        let index = index.to_owned();
        self.block(|db| async move { index::embedder(&db, &index).await })
    }

    fn create_index(&self, index: &str, embedder: &str, dims: usize, at: &str) -> Result<()> {
        let (index, embedder, at) = (index.to_owned(), embedder.to_owned(), at.to_owned());
        self.block(|db| async move { index::create(&db, &index, &embedder, dims, &at).await })
    }

    fn drop_index(&self, index: &str) -> Result<()> {
        let index = index.to_owned();
        self.block(|db| async move { index::drop(&db, &index).await })
    }

    fn document_hash(&self, index: &str, key: &str) -> Result<Option<String>> {
        let (index, key) = (index.to_owned(), key.to_owned());
        self.block(|db| async move { index::document_hash(&db, &index, &key).await })
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
        let (index, doc, hash, at) = (index.to_owned(), doc.clone(), hash.to_owned(), at.to_owned());
        let (chunks, vectors) = (chunks.to_vec(), vectors.to_vec());
        self.block(|db| async move { index::replace_document(&db, &index, &doc, &hash, &at, &chunks, &vectors).await })
    }

    fn documents(&self, index: &str) -> Result<Vec<(i64, String, String)>> {
        let index = index.to_owned();
        self.block(|db| async move { index::documents(&db, &index).await })
    }

    fn nearest(&self, index: &str, docs: &[i64], queries: &[Vec<f32>], depth: usize) -> Result<Vec<Vec<(i64, f64)>>> {
        let (index, docs, queries) = (index.to_owned(), docs.to_vec(), queries.to_vec());
        self.block(|db| async move { index::nearest(&db, &index, &docs, &queries, depth).await })
    }

    fn keyword(&self, index: &str, docs: &[i64], words: &[String], depth: usize) -> Result<Vec<i64>> {
        let (index, docs, query) = (index.to_owned(), docs.to_vec(), any_of(words));
        self.block(|db| async move { index::keyword(&db, &index, &docs, &query, depth).await })
    }

    fn chunk_vectors(&self, ids: &[i64]) -> Result<HashMap<i64, Vec<f32>>> {
        let ids = ids.to_vec();
        self.block(|db| async move { index::chunk_vectors(&db, &ids).await })
    }

    fn chunks(&self, ids: &[i64]) -> Result<HashMap<i64, ChunkRow>> {
        let ids = ids.to_vec();
        self.block(|db| async move { index::chunks(&db, &ids).await })
    }

    fn window(&self, doc: i64, from: i64, to: i64) -> Result<Vec<ChunkRow>> {
        self.block(|db| async move { index::window(&db, doc, from, to).await })
    }

    fn chunk_count(&self, index: &str) -> Result<(i64, Option<i64>)> {
        let index = index.to_owned();
        self.block(|db| async move { index::chunk_count(&db, &index).await })
    }

    fn chunk_texts(&self, index: &str) -> Result<Vec<(i64, i64, i64, String)>> {
        let index = index.to_owned();
        self.block(|db| async move { index::chunk_texts(&db, &index).await })
    }

    fn scan_vectors(&self, index: &str, f: &mut dyn FnMut(ScannedChunk<'_>)) -> Result<()> {
        let index = index.to_owned();
        let rows = self.block(|db| async move { index::chunk_vectors_of(&db, &index).await })?;
        for (id, doc, position, vector) in rows {
            f(ScannedChunk {
                id,
                doc,
                position,
                vector: &vector,
            });
        }
        Ok(())
    }

    fn calibration(&self, index: &str) -> Result<Option<StoredCalibration>> {
        let index = index.to_owned();
        self.block(|db| async move { index::calibration(&db, &index).await })
    }

    fn put_calibration(&self, index: &str, calibration: &StoredCalibration, at: &str) -> Result<()> {
        let (index, calibration, at) = (index.to_owned(), calibration.clone(), at.to_owned());
        self.block(|db| async move { index::put_calibration(&db, &index, &calibration, &at).await })
    }

    fn cached_vectors(&self, embedder: &str, keys: &[String]) -> Result<Vec<Option<Vec<f32>>>> {
        let (embedder, keys) = (embedder.to_owned(), keys.to_vec());
        self.block(|db| async move { index::cached_vectors(&db, &embedder, &keys).await })
    }

    fn cache_vectors(&self, embedder: &str, fresh: &[(String, Vec<f32>)], at: &str, keep: i64) -> Result<()> {
        let (embedder, fresh, at) = (embedder.to_owned(), fresh.to_vec(), at.to_owned());
        self.block(|db| async move { index::cache_vectors(&db, &embedder, &fresh, &at, keep).await })
    }

    fn sweep(&self, now: &str) -> Result<usize> {
        let now = now.to_owned();
        self.block(|db| async move { memory::sweep(&db, &now).await })
    }

    fn memory_item(&self, namespace: &str, key: &str) -> Result<Option<MemoryRow>> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.block(|db| async move { memory::item(&db, &namespace, &key).await })
    }

    fn memory_rows(&self, which: MemoryRows<'_>) -> Result<Vec<MemoryRow>> {
        let which = memory::Rows::from(which);
        self.block(|db| async move { memory::rows(&db, which).await })
    }

    fn memory_put(&self, put: &MemoryPut<'_>) -> Result<()> {
        let put = memory::Put::from(put);
        self.block(|db| async move { memory::put(&db, put).await })
    }

    fn memory_delete(&self, namespace: &str, key: &str) -> Result<bool> {
        let (namespace, key) = (namespace.to_owned(), key.to_owned());
        self.block(|db| async move { memory::delete(&db, &namespace, &key).await })
    }

    fn set_expiry(&self, namespace: &str, key: &str, expires_at: &str) -> Result<()> {
        let (namespace, key, expires_at) = (namespace.to_owned(), key.to_owned(), expires_at.to_owned());
        self.block(|db| async move { memory::set_expiry(&db, &namespace, &key, &expires_at).await })
    }

    fn memory_scores(&self, prefix: &str, embedder: &str, query: &[f32]) -> Result<HashMap<(String, String), f32>> {
        let (prefix, embedder, query) = (prefix.to_owned(), embedder.to_owned(), query.to_vec());
        self.block(|db| async move { memory::scores(&db, &prefix, &embedder, &query).await })
    }

    fn memory_namespaces(&self, prefix: &str) -> Result<Vec<String>> {
        let prefix = prefix.to_owned();
        self.block(|db| async move { memory::namespaces(&db, &prefix).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_bound_is_the_least_text_past_every_text_under_it() {
        assert_eq!(prefix_bound(""), None);
        assert_eq!(prefix_bound("a\u{1f}").as_deref(), Some("a\u{20}"));
        assert_eq!(prefix_bound("ab").as_deref(), Some("ac"));
        // Past the surrogates, and past the last character.
        assert_eq!(prefix_bound("\u{d7ff}").as_deref(), Some("\u{e000}"));
        assert_eq!(prefix_bound("a\u{10ffff}").as_deref(), Some("b"));
        let mut sorted = ["a\u{1f}", "a\u{1f}b\u{1f}", "a\u{1f}\u{10ffff}", "a\u{20}", "a"];
        sorted.sort();
        let under: Vec<&str> = sorted
            .iter()
            .copied()
            .filter(|t| *t >= "a\u{1f}" && *t < prefix_bound("a\u{1f}").unwrap().as_str())
            .collect();
        assert_eq!(under, ["a\u{1f}", "a\u{1f}b\u{1f}", "a\u{1f}\u{10ffff}"]);
    }
}

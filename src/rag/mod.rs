//! The data store: one SQLite file holding search indexes (chunks, an FTS5 keyword index,
//! vectors) and long-term memory (JSON values by namespace and key), and what fills and reads
//! it: text extraction, chunking, the offline embedder, the query-embedding cache, relevance
//! calibration, hybrid search.
//!
//! The file is opened on first use, so runs that never index, retrieve or store never touch
//! it. SQLite calls block: nodes run them through [`DataStore::with`], on tokio's blocking pool.
//!
//! Depends on rusqlite, serde_json and `providers` (the `Embedder` trait) only.

pub mod cache;
pub mod calibrate;
pub mod chunk;
pub mod embed;
pub mod extract;
pub mod index;
pub mod memory;
pub mod pptx;
pub mod search;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rusqlite::Connection;

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

/// Why the data store failed.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot open the data database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("the data database {0} was written by a newer runner (schema {1})")]
    NewerSchema(String, i64),
    #[error("data database: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("index `{0}` does not exist; build it with `runner index DIR --index {0}` (or an `index` node)")]
    NoIndex(String),
    #[error(
        "index `{index}` was built with embedder `{built}` and cannot be searched or extended with `{given}`; \
         use the same `embeddings` profile, or rebuild it with `runner index --reset`"
    )]
    EmbedderMismatch {
        index: String,
        built: String,
        given: String,
    },
    #[error("{0}")]
    Invalid(String),
    /// The store's semantic index could not embed a value or a query.
    #[error("the store's embedder failed: {0}")]
    Embed(String),
    #[error("the data store's worker stopped: {0}")]
    Worker(String),
}

/// A handle on the data database: cheap to clone, opened on first use.
#[derive(Clone)]
pub struct DataStore {
    path: PathBuf,
    conn: Arc<OnceLock<Result<Mutex<Connection>, String>>>,
    /// Long-term memory's semantic index, when the store has one.
    index: Option<Arc<memory::MemoryIndex>>,
}

impl std::fmt::Debug for DataStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataStore")
            .field("path", &self.path)
            .field("index", &self.index.as_ref().map(|i| i.embedder.id().to_string()))
            .finish()
    }
}

impl Default for DataStore {
    /// An in-memory store: what a run gets when it was given no file.
    fn default() -> DataStore {
        DataStore::at(":memory:")
    }
}

impl DataStore {
    /// A store at `path` (`:memory:` keeps nothing past the process), opened on first use.
    pub fn at(path: impl Into<PathBuf>) -> DataStore {
        DataStore {
            path: path.into(),
            conn: Arc::new(OnceLock::new()),
            index: None,
        }
    }

    /// This store with long-term memory indexed for semantic search by `index`: values put
    /// are embedded at its fields, and a search with a query ranks items by similarity.
    pub fn with_memory_index(mut self, index: memory::MemoryIndex) -> DataStore {
        self.index = Some(Arc::new(index));
        self
    }

    /// Long-term memory's semantic index, if the store has one.
    pub fn memory_index(&self) -> Option<&memory::MemoryIndex> {
        self.index.as_deref()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the database was opened (a run that used none of the data kinds never opens it).
    pub fn is_open(&self) -> bool {
        self.conn.get().is_some()
    }

    /// Runs `f` on the connection, opening it first if needed (blocking).
    pub fn with_blocking<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, DataError>) -> Result<T, DataError> {
        let slot = self
            .conn
            .get_or_init(|| open(&self.path).map(Mutex::new).map_err(|e| e.to_string()));
        let lock = slot.as_ref().map_err(|e| DataError::Invalid(e.clone()))?;
        // A panic while holding the lock leaves the connection usable: SQLite rolls back an
        // unfinished transaction when the next one begins.
        let mut conn = lock.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn)
    }

    /// Runs `f` on the connection on tokio's blocking pool.
    pub async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, DataError> + Send + 'static,
    ) -> Result<T, DataError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.with_blocking(f))
            .await
            .map_err(|e| DataError::Worker(e.to_string()))?
    }
}

fn open(path: &Path) -> Result<Connection, DataError> {
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

/// Turns free text into an FTS5 query: its words, each quoted, any of them matching.
pub(crate) fn fts_query(text: &str) -> Option<String> {
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(64)
        .map(|w| format!("\"{}\"", w.to_lowercase()))
        .collect();
    (!words.is_empty()).then(|| words.join(" OR "))
}

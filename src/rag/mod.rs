//! The data store: search indexes (chunks, a keyword index, vectors) and long-term memory
//! (JSON values by namespace and key) in one database — a SQLite file, or a PostgreSQL database
//! that many runner processes share — and what fills and reads it: text extraction, chunking,
//! the offline embedder, the query-embedding cache, relevance calibration, hybrid search.
//!
//! What is stored and by which rules is shared by both databases; each is a [`Backend`]
//! (`backend.rs`), the SQL and nothing else: `sqlite.rs`, `postgres/`.
//!
//! The database is opened on first use, so runs that never index, retrieve or store never
//! touch it. Backend calls block: nodes run them through [`DataStore::with`], on tokio's
//! blocking pool.
//!
//! Depends on rusqlite, tokio-postgres, serde_json, `pg` (PostgreSQL connections) and
//! `providers` (the `Embedder` trait) only.

pub mod backend;
pub mod cache;
pub mod calibrate;
pub mod chunk;
pub mod embed;
pub mod extract;
pub mod index;
pub mod memory;
mod postgres;
pub mod pptx;
mod scope;
pub mod search;
mod sqlite;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

pub use backend::Backend;
pub use postgres::SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION;
pub use scope::NamespaceScope;
pub use sqlite::SCHEMA_VERSION;

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
    /// A PostgreSQL failure, naming the database (never the password).
    #[error("data database {at}: {message}")]
    Postgres { at: String, message: String },
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

/// Where the data store is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A SQLite file, created if missing; `:memory:` keeps nothing past the process.
    Sqlite(PathBuf),
    /// A PostgreSQL database, by its URL (see [`crate::pg`]): its schema created or migrated
    /// when first used.
    Postgres(String),
}

impl std::fmt::Display for Location {
    /// The path, or the URL's host, port, database and schema (never its password).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "{}", path.display()),
            Location::Postgres(url) => match crate::pg::parse_url(url) {
                Ok(target) => f.write_str(&target.display),
                Err(_) => f.write_str("a PostgreSQL URL that does not parse"),
            },
        }
    }
}

/// An open database.
enum Opened {
    /// One connection: SQLite serialises writers anyway, and a process's calls are short.
    Sqlite(Mutex<Connection>),
    Postgres(postgres::PostgresData),
}

/// A handle on the data database: cheap to clone, opened on first use.
#[derive(Clone)]
pub struct DataStore {
    location: Location,
    /// The open database; none until first used, or while opening it fails (a PostgreSQL
    /// server that did not answer is asked again on the next use).
    opened: Arc<Mutex<Option<Arc<Opened>>>>,
    /// Long-term memory's semantic index, when the store has one.
    index: Option<Arc<memory::MemoryIndex>>,
    /// Whose long-term memory this handle is for (none: every namespace as stored).
    scope: Option<NamespaceScope>,
}

impl std::fmt::Debug for DataStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataStore")
            .field("location", &self.location.to_string())
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
    /// A SQLite store at `path` (`:memory:` keeps nothing past the process), opened on first
    /// use.
    pub fn at(path: impl Into<PathBuf>) -> DataStore {
        DataStore::new(Location::Sqlite(path.into()))
    }

    /// A store at `location`, opened on first use.
    pub fn new(location: Location) -> DataStore {
        DataStore {
            location,
            opened: Arc::new(Mutex::new(None)),
            index: None,
            scope: None,
        }
    }

    /// The same store, its long-term memory seen as `scope`'s owner sees it: a `store` node
    /// given this handle reads and writes that user's namespaces (and the shared ones).
    pub fn scoped(&self, scope: Option<NamespaceScope>) -> DataStore {
        DataStore { scope, ..self.clone() }
    }

    /// Whose long-term memory this handle is for, if one user's.
    pub fn scope(&self) -> Option<&NamespaceScope> {
        self.scope.as_ref()
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

    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Whether the database was opened (a run that used none of the data kinds never opens it).
    pub fn is_open(&self) -> bool {
        self.opened.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The open database, opening it first if needed (blocking).
    fn open(&self) -> Result<Arc<Opened>, DataError> {
        // Held while opening: concurrent first uses open once.
        let mut slot = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(opened) = &*slot {
            return Ok(Arc::clone(opened));
        }
        let opened = Arc::new(match &self.location {
            Location::Sqlite(path) => Opened::Sqlite(Mutex::new(sqlite::open(path)?)),
            Location::Postgres(url) => Opened::Postgres(postgres::PostgresData::open(url)?),
        });
        *slot = Some(Arc::clone(&opened));
        Ok(opened)
    }

    /// Opens the database now (creating or migrating its tables) and says what it is.
    pub fn open_now(&self) -> Result<Described, DataError> {
        Ok(match &*self.open()? {
            Opened::Sqlite(_) => Described {
                at: self.location.to_string(),
                migrated: (SCHEMA_VERSION, SCHEMA_VERSION),
                vectors: "blobs scored in-process",
            },
            Opened::Postgres(pg) => pg.describe(),
        })
    }

    /// Runs `f` on the database, opening it first if needed (blocking).
    pub fn with_blocking<T>(&self, f: impl FnOnce(&dyn Backend) -> Result<T, DataError>) -> Result<T, DataError> {
        match &*self.open()? {
            Opened::Sqlite(conn) => {
                // A panic while holding the lock leaves the connection usable: SQLite rolls
                // back an unfinished transaction when the next one begins.
                let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
                f(&*conn)
            }
            // A pool: calls from many tasks run at once.
            Opened::Postgres(pg) => f(pg),
        }
    }

    /// Runs `f` on the database on tokio's blocking pool.
    pub async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Backend) -> Result<T, DataError> + Send + 'static,
    ) -> Result<T, DataError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.with_blocking(f))
            .await
            .map_err(|e| DataError::Worker(e.to_string()))?
    }
}

/// What an open store is, for `runner db migrate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// The file, or the PostgreSQL database and schema (no password).
    pub at: String,
    /// The schema version the database had when it was opened (0: none) and has now.
    pub migrated: (i64, i64),
    /// Where its vectors live.
    pub vectors: &'static str,
}

/// The words of free text a keyword search looks for: lowercased, at most 64, any of them
/// matching (each backend turns them into its own query).
pub(crate) fn keywords(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(64)
        .map(str::to_lowercase)
        .collect()
}

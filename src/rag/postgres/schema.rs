//! The data store's tables on PostgreSQL, in runner's schema (beside the checkpointer's when
//! both share a database), with their version in `data_schema_version`. Created or migrated
//! when the store is first used, under the advisory lock every migration of runner's schema
//! takes, so processes starting at once migrate once.
//!
//! SQLite's tables with PostgreSQL's types: identifiers and times as `text COLLATE "C"`, so
//! they order byte by byte as SQLite orders them; JSON as `text` (never re-encoded); the
//! keyword index a `tsvector` column with a GIN index in place of FTS5's tables; vectors in a
//! pgvector `vector` column when the server has the extension, else as `real[]`.

use deadpool_postgres::Transaction;

use super::{Failure, Vectors};
use crate::pg::{MIGRATION_LOCK, Pgvector};

/// The schema this build writes. A database with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 1;

/// Version 1; `{vector}` is the vector columns' type.
const V1: &str = r#"
CREATE TABLE indexes (
    name text COLLATE "C" PRIMARY KEY,
    embedder text NOT NULL,
    dims bigint NOT NULL,
    created_at text NOT NULL
);
CREATE TABLE documents (
    id bigserial PRIMARY KEY,
    index_name text COLLATE "C" NOT NULL REFERENCES indexes (name) ON DELETE CASCADE,
    path text COLLATE "C" NOT NULL,
    name text NOT NULL,
    title text,
    format text NOT NULL,
    hash text NOT NULL,
    metadata text NOT NULL,
    indexed_at text NOT NULL,
    UNIQUE (index_name, path)
);
CREATE TABLE chunks (
    id bigserial PRIMARY KEY,
    doc_id bigint NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
    position bigint NOT NULL,
    heading text,
    page bigint,
    start_char bigint NOT NULL,
    end_char bigint NOT NULL,
    text text NOT NULL,
    vector {vector} NOT NULL,
    -- The heading weighs A, the text B (FTS5's bm25 weights, 2 and 1).
    tsv tsvector NOT NULL,
    UNIQUE (doc_id, position)
);
CREATE INDEX chunks_keywords ON chunks USING gin (tsv);
CREATE TABLE calibrations (
    index_name text COLLATE "C" PRIMARY KEY REFERENCES indexes (name) ON DELETE CASCADE,
    fingerprint text NOT NULL,
    matching double precision,
    unrelated double precision,
    samples bigint NOT NULL,
    created_at text NOT NULL
);
CREATE TABLE query_embeddings (
    id bigserial,
    embedder text COLLATE "C" NOT NULL,
    hash text COLLATE "C" NOT NULL,
    vector real[] NOT NULL,
    created_at text COLLATE "C" NOT NULL,
    PRIMARY KEY (embedder, hash)
);
CREATE TABLE memory (
    -- The order items were first put in (kept by an update).
    id bigserial,
    namespace text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    value text NOT NULL,
    updated_at text COLLATE "C" NOT NULL,
    created_at text COLLATE "C",
    ttl double precision,
    expires_at text COLLATE "C",
    tsv tsvector NOT NULL,
    PRIMARY KEY (namespace, key)
);
CREATE INDEX memory_keywords ON memory USING gin (tsv);
CREATE INDEX memory_expiry ON memory (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE memory_vectors (
    namespace text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    path text COLLATE "C" NOT NULL,
    embedder text COLLATE "C" NOT NULL,
    vector {vector} NOT NULL,
    PRIMARY KEY (namespace, key, path),
    FOREIGN KEY (namespace, key) REFERENCES memory (namespace, key) ON DELETE CASCADE
);
"#;

/// Creates `schema` and the data store's tables, or migrates them, in one transaction under
/// the migration lock; a newer schema is refused. Decides where vectors live: pgvector when
/// `pgvector` allows it and the server has the extension (created, in `public`, if it is only
/// available), else `real[]`; a store made without it moves its vectors to it once it can.
/// Returns where vectors live, and the version found (0: none) and the version now.
pub(super) async fn migrate(
    tx: &Transaction<'_>,
    schema: &str,
    pgvector: Pgvector,
) -> Result<(Vectors, (i64, i64)), Failure> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    // `schema` was checked to be a plain lowercase name: no quoting is needed.
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {schema}; \
         CREATE TABLE IF NOT EXISTS {schema}.data_schema_version (version bigint NOT NULL); \
         SET LOCAL search_path = {schema}"
    ))
    .await?;
    let version: i64 = match tx.query_opt("SELECT version FROM data_schema_version", &[]).await? {
        Some(row) => row.try_get(0)?,
        None => {
            tx.execute("INSERT INTO data_schema_version VALUES (0)", &[]).await?;
            0
        }
    };
    if version > SCHEMA_VERSION {
        return Err(Failure::Message(format!(
            "the database has data schema version {version}, newer than the {SCHEMA_VERSION} this runner \
             understands; upgrade runner to open it"
        )));
    }
    let extension = match pgvector {
        Pgvector::Off => None,
        Pgvector::Auto | Pgvector::On => match extension(tx, schema).await? {
            Ok(at) => Some(at),
            Err(why) if pgvector == Pgvector::On => {
                return Err(Failure::Message(format!("`pgvector=on`, but {why}")));
            }
            Err(why) => {
                tracing::info!(target: "runner", %why, "data store: vectors scored in-process, without pgvector");
                None
            }
        },
    };
    let vectors = if version == 0 {
        let vectors = match extension {
            Some(at) => Vectors::Pgvector(at),
            None => Vectors::Arrays,
        };
        tx.batch_execute(&V1.replace("{vector}", &vectors.column_type()))
            .await?;
        vectors
    } else {
        match (stored(tx).await?, extension) {
            (Vectors::Arrays, Some(at)) => {
                let to = Vectors::Pgvector(at);
                let ty = to.column_type();
                tx.batch_execute(&format!(
                    "ALTER TABLE chunks ALTER COLUMN vector TYPE {ty} USING vector::{ty}; \
                     ALTER TABLE memory_vectors ALTER COLUMN vector TYPE {ty} USING vector::{ty}"
                ))
                .await?;
                to
            }
            (stored, _) => stored,
        }
    };
    if version < SCHEMA_VERSION {
        tx.execute("UPDATE data_schema_version SET version = $1", &[&SCHEMA_VERSION])
            .await?;
    }
    Ok((vectors, (version, SCHEMA_VERSION)))
}

/// The schema pgvector's objects live in, the extension created first if the server only has
/// it available; or why it cannot be used.
async fn extension(tx: &Transaction<'_>, schema: &str) -> Result<Result<String, String>, Failure> {
    let installed = "SELECT n.nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
                     WHERE e.extname = 'vector'";
    if let Some(row) = tx.query_opt(installed, &[]).await? {
        return Ok(Ok(row.try_get(0)?));
    }
    let available = tx
        .query_opt("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'", &[])
        .await?
        .is_some();
    if !available {
        return Ok(Err("the server has no pgvector extension".into()));
    }
    // In `public` where there is one, so that dropping runner's schema never takes the
    // extension, and other schemas' vector columns, with it.
    let public = tx
        .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = 'public'", &[])
        .await?
        .is_some();
    let at = if public { "public" } else { schema };
    tx.batch_execute("SAVEPOINT pgvector").await?;
    match tx
        .batch_execute(&format!("CREATE EXTENSION IF NOT EXISTS vector SCHEMA {at}"))
        .await
    {
        Ok(()) => {
            tx.batch_execute("RELEASE SAVEPOINT pgvector").await?;
            let row = tx.query_one(installed, &[]).await?;
            Ok(Ok(row.try_get(0)?))
        }
        Err(e) => {
            tx.batch_execute("ROLLBACK TO SAVEPOINT pgvector").await?;
            Ok(Err(format!(
                "the pgvector extension could not be created ({})",
                crate::pg::describe(&e)
            )))
        }
    }
}

/// Where the store's vectors are now.
async fn stored(tx: &Transaction<'_>) -> Result<Vectors, Failure> {
    let row = tx
        .query_one(
            "SELECT t.typname::text, n.nspname::text FROM pg_attribute a
             JOIN pg_type t ON t.oid = a.atttypid JOIN pg_namespace n ON n.oid = t.typnamespace
             WHERE a.attrelid = 'chunks'::regclass AND a.attname = 'vector'",
            &[],
        )
        .await?;
    let (ty, at): (String, String) = (row.try_get(0)?, row.try_get(1)?);
    Ok(if ty == "vector" {
        Vectors::Pgvector(at)
    } else {
        Vectors::Arrays
    })
}

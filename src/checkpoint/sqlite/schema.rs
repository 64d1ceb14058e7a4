//! The SQLite schema: the tables of a new file, the migrations of older ones, and the
//! additive tables every open applies. Version in `PRAGMA user_version`.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

use super::{BUSY_TIMEOUT, SCHEMA_VERSION, cache, crons, runs, users};
use crate::checkpoint::{CheckpointError, Result};

/// A new file's schema, with [`TABLES_2`]: what a version 1 file becomes with [`MIGRATE_2`],
/// written directly (the migration's `ALTER TABLE … DROP COLUMN`s rewrite the table and reread
/// the schema each: most of creating a file). A test holds the two to the same tables, columns
/// and indexes.
pub(super) const SCHEMA: &str = "
CREATE TABLE threads (
    thread_id TEXT PRIMARY KEY NOT NULL,
    workflow TEXT NOT NULL,
    plan_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    touched INTEGER NOT NULL,
    forked_from_thread TEXT,
    forked_from_checkpoint TEXT
) STRICT;
CREATE INDEX threads_by_touched ON threads (touched);
CREATE TABLE checkpoints (
    thread_id TEXT NOT NULL REFERENCES threads (thread_id),
    checkpoint_id TEXT NOT NULL,
    parent_id TEXT,
    step INTEGER NOT NULL,
    versions TEXT NOT NULL,
    ran TEXT NOT NULL,
    changed TEXT NOT NULL,
    next TEXT NOT NULL,
    meta TEXT NOT NULL,
    -- NULL when it is the thread's (nearly always): a 64-character hash per step adds up.
    plan_hash TEXT,
    created_at TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id)
) STRICT, WITHOUT ROWID;
CREATE INDEX checkpoints_by_step ON checkpoints (thread_id, step, checkpoint_id);
CREATE TABLE state_values (
    thread_id TEXT NOT NULL REFERENCES threads (thread_id),
    key TEXT NOT NULL,
    version INTEGER NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (thread_id, key, version)
) STRICT;
CREATE TABLE writes (
    thread_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    channel TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_id, task_id, idx),
    FOREIGN KEY (thread_id, checkpoint_id) REFERENCES checkpoints (thread_id, checkpoint_id)
) STRICT;
";

/// The tables version 2 added: a new file and a migrated one create them from this one text.
pub(super) const TABLES_2: &str = "
CREATE TABLE thread_inputs (
    thread_id TEXT PRIMARY KEY NOT NULL REFERENCES threads (thread_id),
    input TEXT NOT NULL,
    context TEXT NOT NULL,
    config TEXT NOT NULL
) STRICT;
CREATE TABLE blobs (hash TEXT PRIMARY KEY NOT NULL, text TEXT NOT NULL) STRICT;
CREATE TABLE blob_refs (
    thread_id TEXT NOT NULL,
    hash TEXT NOT NULL,
    PRIMARY KEY (thread_id, hash)
) STRICT, WITHOUT ROWID;
CREATE INDEX blob_refs_by_hash ON blob_refs (hash);
";

/// Version 2: a thread's input, context and config move out of its (often updated) row (after
/// [`TABLES_2`]).
pub(super) const MIGRATE_2: &str = "
INSERT INTO thread_inputs (thread_id, input, context, config) SELECT thread_id, input, context, config FROM threads;
ALTER TABLE threads DROP COLUMN input;
ALTER TABLE threads DROP COLUMN context;
ALTER TABLE threads DROP COLUMN config;
";

/// Version 3: who owns a thread, indexed (kept from its metadata's `owner`), and the tables
/// of users' API keys and quota windows. Applied after the additive tables, which it alters.
pub(super) const MIGRATE_3: &str = "
ALTER TABLE thread_meta ADD COLUMN owner TEXT;
UPDATE thread_meta SET owner = json_extract(metadata, '$.owner')
    WHERE json_type(metadata, '$.owner') = 'text';
CREATE INDEX thread_meta_by_owner ON thread_meta (owner) WHERE owner IS NOT NULL;
";

/// Applied on every open: the lease table is additive, so it needs no schema version.
pub(super) const LEASES: &str = "
CREATE TABLE IF NOT EXISTS leases (
    thread_id TEXT PRIMARY KEY NOT NULL,
    owner TEXT NOT NULL,
    generation INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    acquired_at TEXT NOT NULL,
    -- Milliseconds since the Unix epoch.
    expires_at INTEGER NOT NULL
) STRICT;
";

pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<()> {
    // IMMEDIATE: two processes opening a new file at once must not both create the schema.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(newer_schema(path, version));
    }
    // A new file gets the current schema; an older one every step up, one at a time, inside
    // this transaction.
    if version == 0 {
        tx.execute_batch(SCHEMA)?;
        tx.execute_batch(TABLES_2)?;
    } else if version < 2 {
        tx.execute_batch(TABLES_2)?;
        tx.execute_batch(MIGRATE_2)?;
    }
    if version < SCHEMA_VERSION {
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.execute_batch(LEASES)?;
    tx.execute_batch(runs::SCHEMA)?;
    runs::migrate_meta(&tx)?;
    tx.execute_batch(cache::TABLE)?;
    tx.execute_batch(cache::INDEX)?;
    tx.execute_batch(crons::SCHEMA)?;
    if version < 3 {
        tx.execute_batch(MIGRATE_3)?;
        tx.execute_batch(users::TABLES)?;
    }
    tx.commit()?;
    Ok(())
}

/// Runs `f` again while the database is busy or locked, for up to [`BUSY_TIMEOUT`].
pub(super) fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        match f() {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if matches!(
                    e.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

pub(super) fn newer_schema(path: &Path, version: i64) -> CheckpointError {
    CheckpointError::Backend(format!(
        "`{}` has checkpoint schema version {version}, newer than the {SCHEMA_VERSION} this runner \
         understands; upgrade runner to open it",
        path.display()
    ))
}

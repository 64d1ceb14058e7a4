//! SQLite checkpointer: the embedded default store, one file per deployment.
//!
//! One writer: a dedicated OS thread owns the only write connection and takes commands over a
//! channel. It drains every command queued when it wakes and commits them in one transaction
//! (group commit), each inside its own savepoint so one failing command does not undo the
//! others; then it answers each. So the writes of every task finishing in a superstep cost one
//! commit (one fsync in power-safe mode). Reads go through a small pool of read connections and
//! never wait for the writer (WAL).
//!
//! Tables (schema version 2, kept in `PRAGMA user_version`):
//! - `threads`: one row per thread; `touched` is a store-wide counter bumped by every update,
//!   which orders [`Checkpointer::list_threads`] even within one millisecond.
//! - `thread_inputs`: a thread's input, context and config, written once. They live apart
//!   from `threads` because SQLite rewrites a whole row on every update: a status change
//!   would otherwise copy a large input again.
//! - `blobs`: strings of 64 KiB or more, once per store by SHA-256; inputs, state values,
//!   writes and checkpoint meta hold a reference instead ([`super::blobs`]). `blob_refs`
//!   records which threads use which, so deleting the last user deletes the text.
//! - `checkpoints`: one row per checkpoint; JSON columns are TEXT.
//! - `state_values`: `(thread_id, key, version) → value`, written once per version and never
//!   again, so an unchanged key costs nothing per step.
//! - `writes`: pending writes, `(thread_id, checkpoint_id, task_id, idx)`; re-putting replaces.
//! - `leases`: one row per leased thread id (no reference to `threads`: the lease is taken
//!   before the thread exists). Created with `IF NOT EXISTS` on open, so files written by
//!   earlier builds gain it without a schema version change; they ignore it.
//! - `runs`, `thread_meta`: the server's runs and API thread metadata, added the same way
//!   (`runs.rs`; the format is [`super::runs`]).
//! - `node_cache`: cached task results by workflow, node and key, with their expiry, added the
//!   same way (`cache.rs`; the format is [`super::cache`]).
//!
//! Depends on rusqlite and serde_json only (Architecture Invariant of [`super`]).

mod cache;
mod runs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior, params};
use serde_json::{Map, Value};

use super::format::{self, CheckpointRow, Done, Op, ThreadRow};
use super::{
    Checkpoint, CheckpointError, Checkpointer, Durability, Fence, Lease, LeaseClaim, PendingWrite, Result, Thread,
    ThreadStatus,
};

/// The schema this build writes. Opening a file with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 2;
/// How long a connection waits for a lock (another process's writer, a WAL checkpoint).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most commands one group commit takes, so one transaction stays bounded.
const MAX_BATCH: usize = 1024;
/// Read connections kept open between reads; more are opened under load and closed after.
const MAX_IDLE_READERS: usize = 8;

/// A new file's schema, with [`TABLES_2`]: what a version 1 file becomes with [`MIGRATE_2`],
/// written directly (the migration's `ALTER TABLE … DROP COLUMN`s rewrite the table and reread
/// the schema each: most of creating a file). A test holds the two to the same tables, columns
/// and indexes.
const SCHEMA: &str = "
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
const TABLES_2: &str = "
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
const MIGRATE_2: &str = "
INSERT INTO thread_inputs (thread_id, input, context, config) SELECT thread_id, input, context, config FROM threads;
ALTER TABLE threads DROP COLUMN input;
ALTER TABLE threads DROP COLUMN context;
ALTER TABLE threads DROP COLUMN config;
";

/// The columns of a thread as read, from `threads t JOIN thread_inputs i`.
const THREAD_COLS: &str = "t.thread_id, t.workflow, t.plan_hash, i.input, i.context, i.config, t.status, t.created_at, \
                           t.updated_at, t.forked_from_thread, t.forked_from_checkpoint";
const THREAD_FROM: &str = "threads t JOIN thread_inputs i ON i.thread_id = t.thread_id";

/// Applied on every open: the lease table is additive, so it needs no schema version.
const LEASES: &str = "
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

const LEASE_COLS: &str = "thread_id, owner, generation, pid, host, acquired_at, expires_at";
const CHECKPOINT_COLS: &str =
    "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, plan_hash, created_at";
/// The checkpoint columns as read: a NULL plan hash is the thread's.
const CHECKPOINT_READ: &str = "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, \
     coalesce(plan_hash, (SELECT t.plan_hash FROM threads t WHERE t.thread_id = checkpoints.thread_id)), created_at";

impl From<rusqlite::Error> for CheckpointError {
    fn from(e: rusqlite::Error) -> Self {
        CheckpointError::Backend(format!("sqlite: {e}"))
    }
}

/// A [`Checkpointer`] on one SQLite file.
pub struct SqliteCheckpointer {
    path: PathBuf,
    /// `None` only while dropping.
    writer: Option<mpsc::Sender<Command>>,
    writer_thread: Option<JoinHandle<()>>,
    readers: Mutex<Vec<Connection>>,
    counters: Arc<Counters>,
    synchronous: &'static str,
    journal_mode: String,
    /// How read connections open the file.
    access: Access,
}

/// How a read connection opens the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// Read-write, `query_only` (the store's own readers, beside its writer).
    ReadWrite,
    /// SQLITE_OPEN_READ_ONLY: nothing is written; WAL's `-shm` is used if it can be.
    ReadOnly,
    /// Read-only and `immutable=1`: for a file with no WAL (see
    /// [`SqliteCheckpointer::open_read_only`]).
    Immutable,
}

/// What a store holds and what its writer did, for tests, benchmarks and `runner` diagnostics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub threads: u64,
    pub checkpoints: u64,
    pub value_rows: u64,
    pub write_rows: u64,
    /// Transactions the writer committed since this checkpointer was opened.
    pub commits: u64,
    /// Write commands it applied in them (each trait call that writes is one).
    pub write_ops: u64,
    /// Those of the commits that waited for the disk (an fsync each, at `synchronous` FULL or
    /// EXTRA); commits of [`Checkpointer::put_batch_unsynced`] alone do not.
    pub synced_commits: u64,
    /// The database's logical size (`page_count × page_size`, including pages still in the WAL).
    pub db_bytes: u64,
    /// The main file plus its `-wal` file on disk.
    pub file_bytes: u64,
    /// The writer connection's `PRAGMA synchronous`: `off`, `normal`, `full` or `extra`.
    pub synchronous: &'static str,
    /// The writer connection's `PRAGMA journal_mode` (`wal`).
    pub journal_mode: String,
}

#[derive(Default)]
struct Counters {
    commits: AtomicU64,
    synced: AtomicU64,
    ops: AtomicU64,
}

impl SqliteCheckpointer {
    /// Opens (creating it and its parent folders if missing) the store at `path`.
    pub fn open(path: &Path, durability: Durability) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| CheckpointError::Backend(format!("cannot create `{}`: {e}", dir.display())))?;
        }
        // Whether the file holds nothing yet (missing, or created empty by another process).
        let fresh = std::fs::metadata(path).map_or(true, |m| m.len() == 0);
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // A new file's switch to WAL is a rollback-journal transaction that writes the header: at
        // the default `synchronous` that is four fsyncs (journal, folder, journal, file) to
        // protect a file with nothing in it yet from power loss. Crash-safe promises survival
        // of a process crash only, which the OS's cache gives without them; power-safe keeps
        // them.
        if fresh && durability == Durability::CrashSafe {
            conn.pragma_update(None, "synchronous", "OFF")?;
        }
        // Switching a new file to WAL takes a lock that SQLite's busy handler does not wait for:
        // two processes creating the file at once would otherwise fail with "locked".
        let journal_mode: String =
            retry_busy(|| conn.pragma_update_and_check(None, "journal_mode", "wal", |r| r.get(0)))?;
        if !journal_mode.eq_ignore_ascii_case("wal") {
            return Err(CheckpointError::Backend(format!(
                "`{}` cannot use WAL journaling (got `{journal_mode}`)",
                path.display()
            )));
        }
        let synchronous = match durability {
            Durability::CrashSafe => "NORMAL",
            Durability::PowerSafe => "FULL",
        };
        // Likewise a new crash-safe file's schema is written unsynced: its first WAL commit
        // would sync the WAL's header and its folder for tables with nothing in them yet.
        let unsynced_schema = fresh && durability == Durability::CrashSafe;
        if !unsynced_schema {
            conn.pragma_update(None, "synchronous", synchronous)?;
        }
        // The schema's REFERENCES are not enforced by SQLite: every op checks what it refers
        // to itself (`require_thread`, `checkpoint_exists`, `thread_exists`) and deletes a
        // thread's rows children first. Enforced, each row of `writes` would look up its
        // checkpoint, and a fan-out's checkpoint (its `next` lists every task) overflows its
        // page: SQLite reads the whole row for each comparison, for each task's writes.
        conn.pragma_update(None, "foreign_keys", false)?;
        // The writer appends rows and touches few old pages (the right edges of the b-trees and
        // their roots): a 256 KiB page cache is plenty, and larger ones only add to the RSS.
        conn.pragma_update(None, "cache_size", -256)?;
        keep_wal_on_close(&conn)?;
        migrate(&mut conn, path)?;
        if unsynced_schema {
            conn.pragma_update(None, "synchronous", synchronous)?;
        }
        let synchronous = match conn.pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))? {
            0 => "off",
            1 => "normal",
            2 => "full",
            _ => "extra",
        };

        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let writer_counters = Arc::clone(&counters);
        let wal = wal_path(path);
        let writer_thread = std::thread::Builder::new()
            .name("checkpoint-writer".into())
            .spawn(move || run_writer(conn, rx, &writer_counters, synchronous, &wal))
            .map_err(|e| CheckpointError::Backend(format!("cannot start the checkpoint writer: {e}")))?;
        Ok(SqliteCheckpointer {
            path: path.to_path_buf(),
            writer: Some(tx),
            writer_thread: Some(writer_thread),
            readers: Mutex::new(Vec::new()),
            counters,
            synchronous,
            journal_mode: journal_mode.to_ascii_lowercase(),
            access: Access::ReadWrite,
        })
    }

    /// Opens the existing store at `path` for reading only (SQLITE_OPEN_READ_ONLY): nothing
    /// is written, so a file or folder without write permission can be read. Every write
    /// fails.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(CheckpointError::Backend(format!("`{}` does not exist", path.display())));
        }
        // Without a `-wal` file no connection is open and everything is in the main file:
        // read it as immutable, which takes no lock and creates no `-shm` file (a WAL-mode
        // reader needs one, and a read-only folder cannot hold it). A writer that starts
        // meanwhile appends to a new WAL, unseen: the reader sees the file as it was opened.
        // With a WAL, a writer is (or was) on it: read through it.
        let access = if wal_path(path).exists() {
            Access::ReadOnly
        } else {
            Access::Immutable
        };
        let conn = open_reader(path, access)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > SCHEMA_VERSION {
            return Err(newer_schema(path, version));
        }
        if version == 0 {
            return Err(CheckpointError::Backend(format!(
                "`{}` is not a checkpoint database",
                path.display()
            )));
        }
        let journal_mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0))?;
        let synchronous = match conn.pragma_query_value(None, "synchronous", |r| r.get::<_, i64>(0))? {
            0 => "off",
            1 => "normal",
            2 => "full",
            _ => "extra",
        };
        Ok(SqliteCheckpointer {
            path: path.to_path_buf(),
            writer: None,
            writer_thread: None,
            readers: Mutex::new(vec![conn]),
            counters: Arc::new(Counters::default()),
            synchronous,
            journal_mode: journal_mode.to_ascii_lowercase(),
            access,
        })
    }

    /// Row counts, commit counters and sizes.
    pub fn stats(&self) -> Result<Stats> {
        let (threads, checkpoints, value_rows, write_rows, db_bytes) = self.read(|tx| {
            let count = |table: &str| -> Result<u64> {
                let n: i64 = tx.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))?;
                Ok(n as u64)
            };
            let pages: i64 = tx.pragma_query_value(None, "page_count", |r| r.get(0))?;
            let page_size: i64 = tx.pragma_query_value(None, "page_size", |r| r.get(0))?;
            Ok((
                count("threads")?,
                count("checkpoints")?,
                count("state_values")?,
                count("writes")?,
                (pages * page_size) as u64,
            ))
        })?;
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        Ok(Stats {
            threads,
            checkpoints,
            value_rows,
            write_rows,
            commits: self.counters.commits.load(Ordering::Relaxed),
            write_ops: self.counters.ops.load(Ordering::Relaxed),
            synced_commits: self.counters.synced.load(Ordering::Relaxed),
            db_bytes,
            file_bytes: size(&self.path) + size(Path::new(&wal)),
            synchronous: self.synchronous,
            journal_mode: self.journal_mode.clone(),
        })
    }

    /// Sends a command to the writer and waits until it is committed (or failed).
    fn write(&self, op: Op) -> Result<Done> {
        self.send(Job::Op(op), true)
    }

    /// `synced: false`: the command may be committed without an fsync (see
    /// [`Checkpointer::put_batch_unsynced`]).
    fn send(&self, job: Job, synced: bool) -> Result<Done> {
        let stopped = || {
            CheckpointError::Backend(if self.access != Access::ReadWrite {
                format!("`{}` was opened read-only", self.path.display())
            } else {
                "the checkpoint writer has stopped".into()
            })
        };
        let (reply, answer) = mpsc::channel();
        self.writer
            .as_ref()
            .ok_or_else(stopped)?
            .send(Command { job, synced, reply })
            .map_err(|_| stopped())?;
        answer.recv().map_err(|_| stopped())?
    }

    fn write_unit(&self, op: Op) -> Result<()> {
        self.write(op).map(|_| ())
    }

    /// Runs `f` on the write connection, committed with the writer's next group.
    fn exec(&self, f: Exec) -> Result<()> {
        self.send(Job::Exec(f), true).map(|_| ())
    }

    /// [`SqliteCheckpointer::exec`] without waiting for the disk (power-safe: no fsync of its
    /// own; the next synced commit covers it). It survives a crash of the process at once.
    fn exec_unsynced(&self, f: Exec) -> Result<()> {
        self.send(Job::Exec(f), false).map(|_| ())
    }

    /// Runs `f` in a read transaction (one snapshot) on a pooled read connection.
    fn read<T>(&self, f: impl FnOnce(&Transaction<'_>) -> Result<T>) -> Result<T> {
        let pooled = self.lock_readers()?.pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => open_reader(&self.path, self.access)?,
        };
        let out = conn.transaction().map_err(CheckpointError::from).and_then(|tx| f(&tx));
        let mut readers = self.lock_readers()?;
        if readers.len() < MAX_IDLE_READERS {
            readers.push(conn);
        }
        out
    }

    fn lock_readers(&self) -> Result<std::sync::MutexGuard<'_, Vec<Connection>>> {
        self.readers
            .lock()
            .map_err(|_| CheckpointError::Backend("the read connection pool is poisoned".into()))
    }
}

impl Drop for SqliteCheckpointer {
    /// Closing the channel lets the writer commit everything queued, then stop; joining it
    /// means every acknowledged write is on disk and the file closed when drop returns.
    ///
    /// The pooled readers close first, so that the writer's connection is this process's last
    /// and its close may fold the WAL into the file (see `fold_wal_on_close`).
    fn drop(&mut self) {
        if let Ok(mut readers) = self.readers.lock() {
            readers.clear();
        }
        drop(self.writer.take());
        if let Some(handle) = self.writer_thread.take() {
            let _ = handle.join();
        }
    }
}

impl Checkpointer for SqliteCheckpointer {
    fn create_thread(&self, thread: &Thread) -> Result<()> {
        self.write_unit(format::create_thread_op(thread)?)
    }

    fn set_status(&self, thread_id: &str, status: ThreadStatus) -> Result<()> {
        self.write_unit(format::status_op(thread_id.to_owned(), status))
    }

    fn get_thread(&self, thread_id: &str) -> Result<Option<Thread>> {
        self.read(|tx| {
            load_thread(tx, thread_id)?
                .map(|t| t.into_thread(&mut blob_reader(tx)))
                .transpose()
        })
    }

    fn list_threads(&self) -> Result<Vec<Thread>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {THREAD_COLS} FROM {THREAD_FROM} ORDER BY t.touched DESC"
            ))?;
            let rows = stmt.query_map([], ThreadRow::from_row)?;
            rows.map(|row| row?.into_thread(&mut blob_reader(tx))).collect()
        })
    }

    fn list_thread_heads(&self) -> Result<Vec<super::ThreadHead>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT thread_id, workflow, status, created_at, updated_at FROM threads ORDER BY touched DESC",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                ))
            })?;
            rows.map(|row| {
                let (thread_id, workflow, status, created_at, updated_at) = row?;
                Ok(super::ThreadHead {
                    thread_id,
                    workflow,
                    status: format::parse_status(&status)?,
                    created_at,
                    updated_at,
                })
            })
            .collect()
        })
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint, values: &[(String, u64, Value)]) -> Result<()> {
        self.write_unit(format::checkpoint_op(checkpoint, values)?)
    }

    fn put_batch_unsynced(&self, puts: Vec<super::Put>) -> Result<bool> {
        let op = format::batch_op(puts)?;
        self.send(Job::Op(op), false)?;
        // Only a FULL connection syncs its commits; below that nothing was skipped.
        Ok(self.synchronous != "full" && self.synchronous != "extra")
    }

    fn put_batch(&self, puts: Vec<super::Put>) -> Result<()> {
        self.write_unit(format::batch_op(puts)?)
    }

    fn get_checkpoint(&self, thread_id: &str, checkpoint_id: Option<&str>) -> Result<Option<Checkpoint>> {
        // A missing thread has no checkpoint: `None`, not an error (the engine probes
        // subgraph threads that may not exist yet).
        self.read(|tx| {
            let row = match checkpoint_id {
                Some(id) => load_checkpoint(tx, thread_id, id)?,
                None => tx
                    .prepare_cached(&latest_checkpoint_sql())?
                    .query_row([thread_id], CheckpointRow::from_row)
                    .optional()?,
            };
            row.map(|c| c.into_checkpoint(&mut blob_reader(tx))).transpose()
        })
    }

    fn history(&self, thread_id: &str) -> Result<Vec<Checkpoint>> {
        self.read(|tx| {
            require_thread(tx, thread_id)?;
            let mut stmt = tx.prepare_cached(&history_sql())?;
            let rows = stmt.query_map([thread_id], CheckpointRow::from_row)?;
            rows.map(|row| row?.into_checkpoint(&mut blob_reader(tx))).collect()
        })
    }

    fn state(&self, thread_id: &str, versions: &BTreeMap<String, u64>) -> Result<Map<String, Value>> {
        self.read(|tx| {
            require_thread(tx, thread_id)?;
            let mut stmt =
                tx.prepare_cached("SELECT value FROM state_values WHERE thread_id = ?1 AND key = ?2 AND version = ?3")?;
            let mut state = Map::new();
            for (key, &version) in versions {
                let value = super::resolve(key, version, |v| {
                    let text: Option<String> = stmt
                        .query_row(params![thread_id, key, format::version_to_stored(v)?], |r| r.get(0))
                        .optional()?;
                    let text = text.ok_or_else(|| format::missing_value(thread_id, key, v))?;
                    format::decode("a state value", &text, &mut blob_reader(tx))
                })?;
                state.insert(key.clone(), value);
            }
            Ok(state)
        })
    }

    fn put_writes(&self, thread_id: &str, checkpoint_id: &str, writes: &[PendingWrite]) -> Result<()> {
        self.write_unit(format::writes_op(
            thread_id.to_owned(),
            checkpoint_id.to_owned(),
            writes,
        )?)
    }

    fn get_writes(&self, thread_id: &str, checkpoint_id: &str) -> Result<Vec<PendingWrite>> {
        self.read(|tx| {
            require_thread(tx, thread_id)?;
            if !checkpoint_exists(tx, thread_id, checkpoint_id)? {
                return Err(CheckpointError::NoCheckpoint(thread_id.into(), checkpoint_id.into()));
            }
            let mut stmt = tx.prepare_cached(
                "SELECT task_id, idx, channel, value FROM writes WHERE thread_id = ?1 AND checkpoint_id = ?2 \
                 ORDER BY task_id, idx",
            )?;
            let rows = stmt.query_map([thread_id, checkpoint_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })?;
            rows.map(|row| {
                let (task_id, idx, channel, value) = row?;
                Ok(PendingWrite {
                    task_id,
                    idx: u32::try_from(idx).map_err(|_| CheckpointError::Corrupt(format!("write index {idx}")))?,
                    channel,
                    value: format::decode("a pending write", &value, &mut blob_reader(tx))?,
                })
            })
            .collect()
        })
    }

    fn delete_thread(&self, thread_id: &str) -> Result<()> {
        self.write_unit(Op::DeleteThread(thread_id.to_owned()))
    }

    fn acquire_lease(&self, claim: &LeaseClaim) -> Result<Lease> {
        let now = crate::clock::now_ms();
        self.write(Op::AcquireLease {
            claim: claim.clone(),
            now,
            expires: super::expiry_ms(now, claim.ttl),
            at: crate::clock::now(),
        })?
        .into_lease()
    }

    fn renew_lease(&self, fence: &Fence, ttl: Duration) -> Result<Lease> {
        self.write(Op::RenewLease {
            fence: fence.clone(),
            expires: super::expiry_ms(crate::clock::now_ms(), ttl),
        })?
        .into_lease()
    }

    fn release_lease(&self, fence: &Fence) -> Result<()> {
        self.write_unit(Op::ReleaseLease(fence.clone()))
    }

    fn lease(&self, thread_id: &str) -> Result<Option<Lease>> {
        self.read(|tx| load_lease(tx, thread_id))
    }

    fn fork(&self, from: &str, checkpoint_id: &str, new: &str) -> Result<Checkpoint> {
        let op = Op::Fork {
            from: from.to_owned(),
            checkpoint_id: checkpoint_id.to_owned(),
            new: new.to_owned(),
            new_checkpoint_id: super::new_id(),
            at: crate::clock::now(),
        };
        self.write(op)?.into_forked()
    }
}

/// Deletes the checkpoints of `thread_id` newer than `to` with the values they introduced, and
/// the writes stored against `to` and them.
fn truncate(conn: &Connection, thread_id: &str, to: &str) -> Result<()> {
    let row = load_checkpoint(conn, thread_id, to)?
        .ok_or_else(|| CheckpointError::NoCheckpoint(thread_id.into(), to.into()))?;
    let versions = row.versions()?;
    // Checkpoint ids are UUIDv7 within a thread: newer is greater.
    conn.prepare_cached("DELETE FROM writes WHERE thread_id = ?1 AND checkpoint_id >= ?2")?
        .execute(params![thread_id, to])?;
    conn.prepare_cached("DELETE FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id > ?2")?
        .execute(params![thread_id, to])?;
    let mut keep =
        conn.prepare_cached("DELETE FROM state_values WHERE thread_id = ?1 AND key = ?2 AND version > ?3")?;
    for (key, version) in &versions {
        keep.execute(params![thread_id, key, format::version_to_stored(*version)?])?;
    }
    let all: Vec<String> = conn
        .prepare_cached("SELECT DISTINCT key FROM state_values WHERE thread_id = ?1")?
        .query_map([thread_id], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for key in all.iter().filter(|k| !versions.contains_key(k.as_str())) {
        conn.prepare_cached("DELETE FROM state_values WHERE thread_id = ?1 AND key = ?2")?
            .execute(params![thread_id, key])?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The writer thread.

/// What the writer applies: an op of the format, or SQL of another module of this backend
/// (`runs.rs`, `cache.rs`).
enum Job {
    Op(Op),
    Exec(Exec),
}

/// What [`Job::Exec`] runs on the write connection.
type Exec = Box<dyn Fn(&Connection) -> Result<()> + Send>;

struct Command {
    job: Job,
    /// Whether its commit must reach the disk before it is answered (at `synchronous=FULL`).
    synced: bool,
    reply: mpsc::Sender<Result<Done>>,
}

/// Writes a consistent copy of the store at `path` to `dest`, a new file, while other
/// processes may be reading and writing it: SQLite's `VACUUM INTO`, in one read transaction
/// (a snapshot that never waits for or holds up a writer), the WAL's commits included,
/// compacted and without a WAL of its own. The copy is written beside `dest`, synced and then
/// renamed, so `dest` is either absent or whole; an existing `dest` is refused.
pub fn backup(path: &Path, dest: &Path) -> Result<()> {
    if !path.is_file() {
        return Err(CheckpointError::Backend(format!("`{}` does not exist", path.display())));
    }
    if dest.exists() {
        return Err(CheckpointError::Backend(format!(
            "`{}` exists: a backup never replaces a file",
            dest.display()
        )));
    }
    // Not read-only: `VACUUM INTO` opens its output with the connection's flags. Nothing is
    // written to `path` (a read transaction, and no checkpoint at close).
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    keep_wal_on_close(&conn)?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version == 0 {
        return Err(CheckpointError::Backend(format!(
            "`{}` is not a checkpoint database",
            path.display()
        )));
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let io = |what: &str, p: &Path, e: std::io::Error| {
        CheckpointError::Backend(format!("cannot {what} `{}`: {e}", p.display()))
    };
    let text = partial
        .to_str()
        .ok_or_else(|| CheckpointError::Backend(format!("`{}` is not a UTF-8 path", dest.display())))?;
    let written = conn
        .execute("VACUUM INTO ?1", [text])
        .map_err(CheckpointError::from)
        .and_then(|_| {
            std::fs::File::open(&partial)
                .and_then(|f| f.sync_all())
                .map_err(|e| io("sync", &partial, e))
        })
        .and_then(|()| {
            // A link, unlike a rename, never replaces a file made meanwhile; a file system
            // without links gets the rename.
            match std::fs::hard_link(&partial, dest) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(CheckpointError::Backend(format!(
                    "`{}` exists: a backup never replaces a file",
                    dest.display()
                ))),
                Err(_) => std::fs::rename(&partial, dest).map_err(|e| io("write", dest, e)),
            }
        });
    let _ = std::fs::remove_file(&partial);
    written?;
    // The rename is durable once the folder is synced (where the platform can sync one).
    if let Some(dir) = dest.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// `synchronous`: the connection's level (`full` and `extra` sync every commit).
fn run_writer(
    mut conn: Connection,
    commands: mpsc::Receiver<Command>,
    counters: &Counters,
    synchronous: &str,
    wal: &Path,
) {
    let syncs = matches!(synchronous, "full" | "extra");
    // Whether the last commit skipped its fsync. Closing does not checkpoint the WAL (see
    // `keep_wal_on_close`), so nothing after it would sync those frames: the writer does.
    let mut unsynced_tail = false;
    // Ends when every sender is gone (the checkpointer dropped) and the queue is drained.
    while let Ok(first) = commands.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match commands.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        // A commit none of whose commands needs the disk skips the fsync (the WAL's NORMAL
        // level); the next synced commit's fsync makes it durable too, as WAL frames reach the
        // disk in order.
        let lazy = syncs && batch.iter().all(|c| !c.synced);
        let results = if lazy {
            match conn.pragma_update(None, "synchronous", "NORMAL") {
                Ok(()) => {
                    let results = commit_batch(&mut conn, &batch, counters);
                    unsynced_tail |= results.iter().any(Result::is_ok);
                    match conn.pragma_update(None, "synchronous", synchronous) {
                        Ok(()) => results,
                        Err(e) => {
                            // Later commits would not be synced as promised: stop the writer
                            // (every caller then gets "the checkpoint writer has stopped").
                            for command in batch {
                                let _ = command
                                    .reply
                                    .send(Err(CheckpointError::Backend(format!("sqlite: {e}"))));
                            }
                            return;
                        }
                    }
                }
                Err(_) => commit_batch(&mut conn, &batch, counters),
            }
        } else {
            let results = commit_batch(&mut conn, &batch, counters);
            if syncs && results.iter().any(Result::is_ok) {
                counters.synced.fetch_add(1, Ordering::Relaxed);
                unsynced_tail = false;
            }
            results
        };
        for (command, result) in batch.into_iter().zip(results) {
            // The caller waits on its reply channel; if it has gone there is no one to tell.
            let _ = command.reply.send(result);
        }
    }
    if unsynced_tail {
        // The frames SQLite's own FULL commit would have synced: the same fsync of the WAL.
        // Nobody is left to tell of a failure; those commands were answered as not waiting
        // for the disk.
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(wal) {
            let _ = file.sync_data();
        }
    }
    fold_wal_on_close(conn);
}

/// Closes the writer's connection, folding the WAL into the main file and removing it when no
/// other connection (of any process) has the file open: after a command that wrote, the file
/// alone holds everything, so copying `runner.db` copies the data.
///
/// SQLite's close does it when it is the last connection: it takes the file's exclusive lock
/// without waiting (a reader or writer elsewhere holds a shared one, and then the WAL is left
/// for them, as before), checkpoints every frame (fsyncs of the WAL and of the file: power
/// loss can neither lose nor corrupt what was committed) and deletes `-wal` and `-shm`.
/// Another process's reader is never waited for or cut off. Only the writer's connection does
/// it, at the end of a clean close: a process killed outright leaves the WAL, which the next
/// opener reads.
fn fold_wal_on_close(conn: Connection) {
    if conn
        .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
        .is_err()
    {
        return;
    }
    // A close that fails leaves the WAL beside the file, which every opener reads: nothing is
    // lost, and nobody is left to tell.
    let _ = conn.close();
}

/// Applies a batch in one transaction, each command in its own savepoint.
fn commit_batch(conn: &mut Connection, batch: &[Command], counters: &Counters) -> Vec<Result<Done>> {
    let fail_all = |e: rusqlite::Error| {
        let msg = format!("sqlite: {e}");
        batch
            .iter()
            .map(|_| Err(CheckpointError::Backend(msg.clone())))
            .collect()
    };
    let mut tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => return fail_all(e),
    };
    let results: Vec<_> = batch
        .iter()
        .map(|command| apply_in_savepoint(&mut tx, &command.job))
        .collect();
    match tx.commit() {
        Ok(()) => {
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.ops.fetch_add(batch.len() as u64, Ordering::Relaxed);
            results
        }
        Err(e) => fail_all(e),
    }
}

fn apply_in_savepoint(tx: &mut Transaction<'_>, job: &Job) -> Result<Done> {
    // Dropping the savepoint on an error rolls back to it.
    let savepoint = tx.savepoint()?;
    let done = match job {
        Job::Op(op) => apply(&savepoint, op)?,
        Job::Exec(f) => {
            f(&savepoint)?;
            Done::Unit
        }
    };
    savepoint.commit()?;
    Ok(done)
}

fn apply(conn: &Connection, op: &Op) -> Result<Done> {
    match op {
        Op::Batch(ops) => {
            for op in ops {
                apply(conn, op)?;
            }
        }
        Op::CreateThread(row) => {
            if thread_exists(conn, &row.thread_id)? {
                return Err(CheckpointError::ThreadExists(row.thread_id.clone()));
            }
            row.insert(conn)?;
        }
        Op::Blobs { thread_id, blobs } => store_blobs(conn, thread_id, blobs)?,
        Op::SetStatus { thread_id, status, at } => {
            let n = conn
                .prepare_cached(
                    "UPDATE threads SET status = ?2, updated_at = ?3, \
                     touched = (SELECT coalesce(max(touched), 0) + 1 FROM threads) WHERE thread_id = ?1",
                )?
                .execute(params![thread_id, status.as_str(), at])?;
            if n == 0 {
                return Err(CheckpointError::NoThread(thread_id.clone()));
            }
        }
        Op::PutCheckpoint { row, values } => {
            require_thread(conn, &row.thread_id)?;
            if checkpoint_exists(conn, &row.thread_id, &row.checkpoint_id)? {
                return Err(format::duplicate_checkpoint(&row.thread_id, &row.checkpoint_id));
            }
            row.insert(conn)?;
            let mut stmt = conn.prepare_cached(
                "INSERT OR IGNORE INTO state_values (thread_id, key, version, value) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (key, version, value) in values {
                stmt.execute(params![row.thread_id, key, version, value])?;
            }
        }
        Op::PutWrites {
            thread_id,
            checkpoint_id,
            writes,
        } => {
            require_thread(conn, thread_id)?;
            if !checkpoint_exists(conn, thread_id, checkpoint_id)? {
                return Err(CheckpointError::NoCheckpoint(thread_id.clone(), checkpoint_id.clone()));
            }
            let mut stmt = conn.prepare_cached(
                "INSERT OR REPLACE INTO writes (thread_id, checkpoint_id, task_id, idx, channel, value) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (task_id, idx, channel, value) in writes {
                stmt.execute(params![thread_id, checkpoint_id, task_id, idx, channel, value])?;
            }
        }
        Op::DeleteThread(thread_id) => {
            require_thread(conn, thread_id)?;
            for table in [
                "writes",
                "state_values",
                "checkpoints",
                "thread_inputs",
                "threads",
                "blob_refs",
            ] {
                conn.prepare_cached(&format!("DELETE FROM {table} WHERE thread_id = ?1"))?
                    .execute([thread_id])?;
            }
            conn.prepare_cached("DELETE FROM blobs WHERE hash NOT IN (SELECT hash FROM blob_refs)")?
                .execute([])?;
        }
        Op::Truncate { thread_id, to } => truncate(conn, thread_id, to)?,
        Op::Fence(fence) => super::check_fence(load_lease(conn, &fence.thread_id)?.as_ref(), fence)?,
        Op::AcquireLease {
            claim,
            now,
            expires,
            at,
        } => {
            // One statement: insert, or take over a lease that expired, is already ours, or
            // belongs to the owner the claim replaces. (PostgreSQL: the same INSERT … ON
            // CONFLICT … DO UPDATE … WHERE … RETURNING.)
            let granted = conn
                .prepare_cached(&format!(
                    "INSERT INTO leases ({LEASE_COLS}) VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6) \
                     ON CONFLICT (thread_id) DO UPDATE SET \
                       generation = CASE WHEN leases.owner = excluded.owner THEN leases.generation \
                                    ELSE leases.generation + 1 END, \
                       acquired_at = CASE WHEN leases.owner = excluded.owner THEN leases.acquired_at \
                                     ELSE excluded.acquired_at END, \
                       owner = excluded.owner, pid = excluded.pid, host = excluded.host, \
                       expires_at = excluded.expires_at \
                     WHERE leases.expires_at <= ?7 OR leases.owner = excluded.owner OR leases.owner = ?8 \
                     RETURNING {LEASE_COLS}"
                ))?
                .query_row(
                    params![
                        claim.thread_id,
                        claim.owner,
                        claim.pid,
                        claim.host,
                        at,
                        expires,
                        now,
                        claim.replace
                    ],
                    lease_from_row,
                )
                .optional()?;
            return match granted {
                Some(lease) => Ok(Done::Lease(Box::new(lease?))),
                None => match load_lease(conn, &claim.thread_id)? {
                    Some(holder) => Err(CheckpointError::Leased(Box::new(holder))),
                    None => Err(CheckpointError::Backend("a lease was neither granted nor held".into())),
                },
            };
        }
        Op::RenewLease { fence, expires } => {
            let renewed = conn
                .prepare_cached(&format!(
                    "UPDATE leases SET expires_at = ?4 WHERE thread_id = ?1 AND owner = ?2 AND generation = ?3 \
                     RETURNING {LEASE_COLS}"
                ))?
                .query_row(
                    params![
                        fence.thread_id,
                        fence.owner,
                        format::generation_to_stored(fence.generation)?,
                        expires
                    ],
                    lease_from_row,
                )
                .optional()?;
            return match renewed {
                Some(lease) => Ok(Done::Lease(Box::new(lease?))),
                None => Err(CheckpointError::LeaseLost(fence.thread_id.clone())),
            };
        }
        Op::ReleaseLease(fence) => {
            conn.prepare_cached("DELETE FROM leases WHERE thread_id = ?1 AND owner = ?2 AND generation = ?3")?
                .execute(params![
                    fence.thread_id,
                    fence.owner,
                    format::generation_to_stored(fence.generation)?
                ])?;
        }
        Op::Fork {
            from,
            checkpoint_id,
            new,
            new_checkpoint_id,
            at,
        } => return fork(conn, from, checkpoint_id, new, new_checkpoint_id, at).map(|c| Done::Forked(Box::new(c))),
    }
    Ok(Done::Unit)
}

/// Stores long strings `(hash, text)` that `thread_id` refers to; a text already stored (the
/// same hash) is not written again.
fn store_blobs(conn: &Connection, thread_id: &str, blobs: &[(String, String)]) -> Result<()> {
    let mut known = conn.prepare_cached("SELECT 1 FROM blobs WHERE hash = ?1")?;
    let mut text = conn.prepare_cached("INSERT INTO blobs (hash, text) VALUES (?1, ?2)")?;
    let mut uses = conn.prepare_cached("INSERT OR IGNORE INTO blob_refs (thread_id, hash) VALUES (?1, ?2)")?;
    for (hash, blob) in blobs {
        if !known.exists([hash])? {
            text.execute(params![hash, blob])?;
        }
        uses.execute(params![thread_id, hash])?;
    }
    Ok(())
}

fn fork(conn: &Connection, from: &str, checkpoint_id: &str, new: &str, new_id: &str, at: &str) -> Result<Checkpoint> {
    let mut thread = load_thread(conn, from)?.ok_or_else(|| CheckpointError::NoThread(from.into()))?;
    let mut row = load_checkpoint(conn, from, checkpoint_id)?
        .ok_or_else(|| CheckpointError::NoCheckpoint(from.into(), checkpoint_id.into()))?;
    if thread_exists(conn, new)? {
        return Err(CheckpointError::ThreadExists(new.into()));
    }
    thread.thread_id = new.into();
    thread.status = ThreadStatus::Running.as_str().into();
    thread.created_at = at.into();
    thread.updated_at = at.into();
    thread.forked_from = Some((from.into(), checkpoint_id.into()));
    thread.insert(conn)?;
    // The copies refer to the same long strings.
    conn.prepare_cached(
        "INSERT OR IGNORE INTO blob_refs (thread_id, hash) SELECT ?1, hash FROM blob_refs WHERE thread_id = ?2",
    )?
    .execute([new, from])?;

    row.thread_id = new.into();
    row.checkpoint_id = new_id.into();
    row.parent_id = None;
    row.created_at = at.into();
    row.insert(conn)?;
    let checkpoint = row.into_checkpoint(&mut blob_reader(conn))?;
    // Values are copied resolved, so no extension in the new thread refers to the old one.
    let mut read =
        conn.prepare_cached("SELECT value FROM state_values WHERE thread_id = ?1 AND key = ?2 AND version = ?3")?;
    let mut write =
        conn.prepare_cached("INSERT INTO state_values (thread_id, key, version, value) VALUES (?1, ?2, ?3, ?4)")?;
    for (key, &version) in &checkpoint.versions {
        let value = super::resolve(key, version, |v| {
            let text: Option<String> = read
                .query_row(params![from, key, format::version_to_stored(v)?], |r| r.get(0))
                .optional()?;
            let text = text.ok_or_else(|| format::missing_value(from, key, v))?;
            format::decode("a state value", &text, &mut blob_reader(conn))
        })?;
        let mut blobs = Vec::new();
        write.execute(params![
            new,
            key,
            format::version_to_stored(version)?,
            format::encode(&value, &mut blobs)?
        ])?;
        store_blobs(conn, new, &blobs)?;
    }
    Ok(checkpoint)
}

// ---------------------------------------------------------------------------------------------
// Opening and migrating.

fn migrate(conn: &mut Connection, path: &Path) -> Result<()> {
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
    tx.execute_batch(cache::TABLE)?;
    tx.execute_batch(cache::INDEX)?;
    tx.commit()?;
    Ok(())
}

/// Runs `f` again while the database is busy or locked, for up to [`BUSY_TIMEOUT`].
fn retry_busy<T>(mut f: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
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

fn newer_schema(path: &Path, version: i64) -> CheckpointError {
    CheckpointError::Backend(format!(
        "`{}` has checkpoint schema version {version}, newer than the {SCHEMA_VERSION} this runner \
         understands; upgrade runner to open it",
        path.display()
    ))
}

/// `file:` URI of `path` with `immutable=1` (every byte but unreserved ones and `/`
/// percent-encoded, so `?`, `#` and `%` in a name stay part of it).
fn immutable_uri(path: &Path) -> Result<String> {
    let absolute = std::path::absolute(path)
        .map_err(|e| CheckpointError::Backend(format!("cannot resolve `{}`: {e}", path.display())))?;
    let text = absolute
        .to_str()
        .ok_or_else(|| CheckpointError::Backend(format!("`{}` is not a UTF-8 path", path.display())))?;
    let mut uri = String::from("file:");
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    Ok(uri)
}

fn wal_path(path: &Path) -> PathBuf {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    PathBuf::from(wal)
}

/// A read connection, and the writer's until it closes cleanly (`fold_wal_on_close`), closes
/// without checkpointing the WAL into the main file: a reader that happened to close last
/// would otherwise pay the checkpoint's fsyncs, and a writer that failed to open leaves the
/// file as it found it. The WAL stays bounded by SQLite's automatic checkpoint every 1,000
/// pages while writing; a read-only open finds the `-shm` file beside it and reads through it.
fn keep_wal_on_close(conn: &Connection) -> Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
    Ok(())
}

/// A read connection.
fn open_reader(path: &Path, access: Access) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match access {
        Access::ReadWrite => Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_READ_WRITE)?,
        Access::ReadOnly => Connection::open_with_flags(path, flags | OpenFlags::SQLITE_OPEN_READ_ONLY)?,
        Access::Immutable => Connection::open_with_flags(
            immutable_uri(path)?,
            flags | OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
        )?,
    };
    conn.busy_timeout(BUSY_TIMEOUT)?;
    keep_wal_on_close(&conn)?;
    if access != Access::ReadWrite {
        // A file of version 1 is read as it is (looking never migrates): a temporary view
        // gives its thread rows the shape of version 2.
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version == 1 {
            conn.execute_batch(
                "CREATE TEMP VIEW thread_inputs AS SELECT thread_id, input, context, config FROM main.threads",
            )?;
        }
        // A file no build with leases has written to has no lease table: an empty temporary
        // one answers that no run holds any thread.
        let has_leases: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'leases')",
            [],
            |r| r.get(0),
        )?;
        if !has_leases {
            conn.execute_batch(&LEASES.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))?;
        }
        // Nor, from a build before the node cache, a cache table: an empty one holds nothing.
        let has_cache: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = 'node_cache')",
            [],
            |r| r.get(0),
        )?;
        if !has_cache {
            conn.execute_batch(&cache::TABLE.replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))?;
        }
    }
    conn.pragma_update(None, "query_only", true)?;
    // Readers look up a checkpoint or a few values at a time: a small page cache will do.
    conn.pragma_update(None, "cache_size", -256)?;
    Ok(conn)
}

// ---------------------------------------------------------------------------------------------
// Rows.

impl ThreadRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        let forked_thread: Option<String> = r.get(9)?;
        let forked_checkpoint: Option<String> = r.get(10)?;
        Ok(ThreadRow {
            thread_id: r.get(0)?,
            workflow: r.get(1)?,
            plan_hash: r.get(2)?,
            input: r.get(3)?,
            context: r.get(4)?,
            config: r.get(5)?,
            status: r.get(6)?,
            created_at: r.get(7)?,
            updated_at: r.get(8)?,
            forked_from: forked_thread.zip(forked_checkpoint),
        })
    }

    fn insert(&self, conn: &Connection) -> Result<()> {
        let (forked_thread, forked_checkpoint) = self.forked_from.clone().unzip();
        conn.prepare_cached(
            "INSERT INTO threads (thread_id, workflow, plan_hash, status, created_at, updated_at, forked_from_thread, \
             forked_from_checkpoint, touched) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, \
             (SELECT coalesce(max(touched), 0) + 1 FROM threads))",
        )?
        .execute(params![
            self.thread_id,
            self.workflow,
            self.plan_hash,
            self.status,
            self.created_at,
            self.updated_at,
            forked_thread,
            forked_checkpoint,
        ])?;
        conn.prepare_cached("INSERT INTO thread_inputs (thread_id, input, context, config) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![self.thread_id, self.input, self.context, self.config])?;
        Ok(())
    }
}

impl CheckpointRow {
    fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(CheckpointRow {
            thread_id: r.get(0)?,
            checkpoint_id: r.get(1)?,
            parent_id: r.get(2)?,
            step: r.get(3)?,
            versions: r.get(4)?,
            ran: r.get(5)?,
            changed: r.get(6)?,
            next: r.get(7)?,
            meta: r.get(8)?,
            plan_hash: r.get(9)?,
            created_at: r.get(10)?,
        })
    }

    fn insert(&self, conn: &Connection) -> Result<()> {
        conn.prepare_cached(&format!(
            "INSERT INTO checkpoints ({CHECKPOINT_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, \
             nullif(?10, (SELECT plan_hash FROM threads WHERE thread_id = ?1)), ?11)"
        ))?
        .execute(params![
            self.thread_id,
            self.checkpoint_id,
            self.parent_id,
            self.step,
            self.versions,
            self.ran,
            self.changed,
            self.next,
            self.meta,
            self.plan_hash,
            self.created_at,
        ])?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Small queries and conversions shared by the reader and the writer.

// The reads every run makes compare the thread id with `+?1`, not `?1`. Given `?1`, SQLite
// carries the parameter over an equality with another column (the join of `threads` and
// `thread_inputs`, the plan hash's subquery: its constant propagation) and marks the statement
// to be compiled again whenever a new value is bound: once per thread read, a fifth of a
// served run's instructions. The unary plus leaves the plans as they were (each table searched by its
// key) and the statements compiled once per connection.

/// Reads a long string by hash, for [`format::decode`].
fn blob_reader(conn: &Connection) -> impl FnMut(&str) -> Result<Option<String>> + '_ {
    move |hash: &str| {
        Ok(conn
            .prepare_cached("SELECT text FROM blobs WHERE hash = ?1")?
            .query_row([hash], |r| r.get::<_, String>(0))
            .optional()?)
    }
}

fn thread_sql() -> String {
    format!("SELECT {THREAD_COLS} FROM {THREAD_FROM} WHERE t.thread_id = +?1")
}

fn latest_checkpoint_sql() -> String {
    format!("SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = +?1 ORDER BY checkpoint_id DESC LIMIT 1")
}

fn history_sql() -> String {
    format!("SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = +?1 ORDER BY checkpoint_id DESC")
}

fn load_thread(conn: &Connection, thread_id: &str) -> Result<Option<ThreadRow>> {
    Ok(conn
        .prepare_cached(&thread_sql())?
        .query_row([thread_id], ThreadRow::from_row)
        .optional()?)
}

fn load_checkpoint(conn: &Connection, thread_id: &str, checkpoint_id: &str) -> Result<Option<CheckpointRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2"
        ))?
        .query_row([thread_id, checkpoint_id], CheckpointRow::from_row)
        .optional()?)
}

/// A `leases` row; the inner result is a conversion error of a column.
fn lease_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Lease>> {
    let generation: i64 = r.get(2)?;
    let pid: i64 = r.get(3)?;
    Ok(Ok(Lease {
        thread_id: r.get(0)?,
        owner: r.get(1)?,
        generation: match u64::try_from(generation) {
            Ok(g) => g,
            Err(_) => return Ok(Err(CheckpointError::Corrupt(format!("lease generation {generation}")))),
        },
        pid: match u32::try_from(pid) {
            Ok(p) => p,
            Err(_) => return Ok(Err(CheckpointError::Corrupt(format!("lease pid {pid}")))),
        },
        host: r.get(4)?,
        acquired_at: r.get(5)?,
        expires_at_ms: r.get(6)?,
    }))
}

fn load_lease(conn: &Connection, thread_id: &str) -> Result<Option<Lease>> {
    conn.prepare_cached(&format!("SELECT {LEASE_COLS} FROM leases WHERE thread_id = ?1"))?
        .query_row([thread_id], lease_from_row)
        .optional()?
        .transpose()
}

fn thread_exists(conn: &Connection, thread_id: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM threads WHERE thread_id = ?1")?
        .exists([thread_id])?)
}

fn require_thread(conn: &Connection, thread_id: &str) -> Result<()> {
    if thread_exists(conn, thread_id)? {
        Ok(())
    } else {
        Err(CheckpointError::NoThread(thread_id.into()))
    }
}

fn checkpoint_exists(conn: &Connection, thread_id: &str, checkpoint_id: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2")?
        .exists([thread_id, checkpoint_id])?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{Checkpointer, fixtures};

    #[test]
    fn the_reads_every_run_makes_are_compiled_once_not_once_per_thread() {
        let dir = tempfile::tempdir().unwrap();
        let cp = SqliteCheckpointer::open(&dir.path().join("r.db"), Durability::CrashSafe).unwrap();
        let ids: Vec<String> = (0..4).map(|i| format!("t{i}")).collect();
        let at = "2020-01-01T00:00:00.000Z";
        for id in &ids {
            cp.create_thread(&fixtures::thread(id, "p", at)).unwrap();
            let checkpoint = fixtures::first_checkpoint(id, &crate::checkpoint::new_id(), "p", at);
            cp.put_checkpoint(&checkpoint, &[]).unwrap();
        }
        for id in &ids {
            assert!(cp.get_thread(id).unwrap().is_some());
            assert!(cp.get_checkpoint(id, None).unwrap().is_some());
            assert_eq!(cp.history(id).unwrap().len(), 1);
        }
        // The reads ran one after another, on the one pooled read connection.
        let conn = cp.lock_readers().unwrap().pop().unwrap();
        for sql in [thread_sql(), latest_checkpoint_sql(), history_sql()] {
            let stmt = conn.prepare_cached(&sql).unwrap();
            assert_eq!(stmt.get_status(rusqlite::StatementStatus::RePrepare), 0, "{sql}");
        }
    }
}

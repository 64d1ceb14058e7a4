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
//! - `crons`, `webhook_deliveries`: schedules and the webhook calls of ended runs, added the
//!   same way (`crons.rs`; the format is [`super::crons`]).
//!
//! Depends on rusqlite and serde_json only (Architecture Invariant of [`super`]).

mod backup;
mod cache;
mod crons;
mod rows;
mod runs;
mod schema;
mod users;
mod writer;

pub use backup::backup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction, params};
use serde_json::{Map, Value};

use super::format::{self, CheckpointRow, Done, Op, ThreadRow};
use super::{
    Checkpoint, CheckpointError, Checkpointer, Durability, Fence, Lease, LeaseClaim, PendingWrite, Result, Thread,
    ThreadStatus,
};
use rows::*;
use schema::{LEASES, migrate, newer_schema, retry_busy};
use writer::{Command, Exec, Job, run_writer};

/// The schema this build writes. Opening a file with a newer one is refused.
pub const SCHEMA_VERSION: i64 = 3;
/// How long a connection waits for a lock (another process's writer, a WAL checkpoint).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// The most commands one group commit takes, so one transaction stays bounded.
const MAX_BATCH: usize = 1024;
/// Read connections kept open between reads; more are opened under load and closed after.
const MAX_IDLE_READERS: usize = 8;

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
        // A commit waits for the disk, or for another process's write: off the caller's
        // runtime when it is slow.
        crate::blocking::wait(&answer).map_err(|_| stopped())?
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
            ttl,
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

//! The writer thread: the only write connection, fed commands over a channel. It drains every
//! command queued when it wakes and commits them in one transaction (group commit), each in
//! its own savepoint so one failing command does not undo the others; then it answers each.
//! It applies the format's [`Op`]s with SQL, by the rules written in [`crate::checkpoint::format`].

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use super::rows::*;
use super::{Counters, MAX_BATCH};
use crate::checkpoint::format::{self, Done, Op};
use crate::checkpoint::{Checkpoint, CheckpointError, Result, ThreadStatus};

/// What the writer applies: an op of the format, or SQL of another module of this backend
/// (`runs.rs`, `cache.rs`).
// Moved once, through the channel: boxing the op would cost an allocation per write.
#[allow(clippy::large_enum_variant)]
pub(super) enum Job {
    Op(Op),
    Exec(Exec),
}

/// What [`Job::Exec`] runs on the write connection.
pub(super) type Exec = Box<dyn Fn(&Connection) -> Result<()> + Send>;

pub(super) struct Command {
    pub(super) job: Job,
    /// Whether its commit must reach the disk before it is answered (at `synchronous=FULL`).
    pub(super) synced: bool,
    pub(super) reply: mpsc::Sender<Result<Done>>,
}

/// `synchronous`: the connection's level (`full` and `extra` sync every commit).
pub(super) fn run_writer(
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
pub(super) fn fold_wal_on_close(conn: Connection) {
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
pub(super) fn commit_batch(conn: &mut Connection, batch: &[Command], counters: &Counters) -> Vec<Result<Done>> {
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

pub(super) fn apply_in_savepoint(tx: &mut Transaction<'_>, job: &Job) -> Result<Done> {
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

pub(super) fn apply(conn: &Connection, op: &Op) -> Result<Done> {
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
        Op::Fence(fence) => crate::checkpoint::check_fence(load_lease(conn, &fence.thread_id)?.as_ref(), fence)?,
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
        Op::RenewLease { fence, expires, .. } => {
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
pub(super) fn store_blobs(conn: &Connection, thread_id: &str, blobs: &[(String, String)]) -> Result<()> {
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

pub(super) fn fork(
    conn: &Connection,
    from: &str,
    checkpoint_id: &str,
    new: &str,
    new_id: &str,
    at: &str,
) -> Result<Checkpoint> {
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
        let value = crate::checkpoint::resolve(key, version, |v| {
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

/// Deletes the checkpoints of `thread_id` newer than `to` with the values they introduced, and
/// the writes stored against `to` and them.
pub(super) fn truncate(conn: &Connection, thread_id: &str, to: &str) -> Result<()> {
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

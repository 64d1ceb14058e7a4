//! Rows as SQLite reads and writes them: the format's rows ([`ThreadRow`], [`CheckpointRow`])
//! from and into statements, and the small queries the reader and the writer share.

use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::checkpoint::format::{CheckpointRow, ThreadRow};
use crate::checkpoint::{CheckpointError, Lease, Result};

/// The columns of a thread as read, from `threads t JOIN thread_inputs i`.
pub(super) const THREAD_COLS: &str = "t.thread_id, t.workflow, t.plan_hash, i.input, i.context, i.config, t.status, t.created_at, \
                           t.updated_at, t.forked_from_thread, t.forked_from_checkpoint";
pub(super) const THREAD_FROM: &str = "threads t JOIN thread_inputs i ON i.thread_id = t.thread_id";

pub(super) const LEASE_COLS: &str = "thread_id, owner, generation, pid, host, acquired_at, expires_at";
pub(super) const CHECKPOINT_COLS: &str =
    "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, plan_hash, created_at";
/// The checkpoint columns as read: a NULL plan hash is the thread's.
pub(super) const CHECKPOINT_READ: &str = "thread_id, checkpoint_id, parent_id, step, versions, ran, changed, next, meta, \
     coalesce(plan_hash, (SELECT t.plan_hash FROM threads t WHERE t.thread_id = checkpoints.thread_id)), created_at";

impl ThreadRow {
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
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

    pub(super) fn insert(&self, conn: &Connection) -> Result<()> {
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
    pub(super) fn from_row(r: &Row<'_>) -> rusqlite::Result<Self> {
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

    pub(super) fn insert(&self, conn: &Connection) -> Result<()> {
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
pub(super) fn blob_reader(conn: &Connection) -> impl FnMut(&str) -> Result<Option<String>> + '_ {
    move |hash: &str| {
        Ok(conn
            .prepare_cached("SELECT text FROM blobs WHERE hash = ?1")?
            .query_row([hash], |r| r.get::<_, String>(0))
            .optional()?)
    }
}

pub(super) fn thread_sql() -> String {
    format!("SELECT {THREAD_COLS} FROM {THREAD_FROM} WHERE t.thread_id = +?1")
}

pub(super) fn latest_checkpoint_sql() -> String {
    format!("SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = +?1 ORDER BY checkpoint_id DESC LIMIT 1")
}

pub(super) fn history_sql() -> String {
    format!("SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = +?1 ORDER BY checkpoint_id DESC")
}

pub(super) fn load_thread(conn: &Connection, thread_id: &str) -> Result<Option<ThreadRow>> {
    Ok(conn
        .prepare_cached(&thread_sql())?
        .query_row([thread_id], ThreadRow::from_row)
        .optional()?)
}

pub(super) fn load_checkpoint(
    conn: &Connection,
    thread_id: &str,
    checkpoint_id: &str,
) -> Result<Option<CheckpointRow>> {
    Ok(conn
        .prepare_cached(&format!(
            "SELECT {CHECKPOINT_READ} FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2"
        ))?
        .query_row([thread_id, checkpoint_id], CheckpointRow::from_row)
        .optional()?)
}

/// A `leases` row; the inner result is a conversion error of a column.
pub(super) fn lease_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Lease>> {
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

pub(super) fn load_lease(conn: &Connection, thread_id: &str) -> Result<Option<Lease>> {
    conn.prepare_cached(&format!("SELECT {LEASE_COLS} FROM leases WHERE thread_id = ?1"))?
        .query_row([thread_id], lease_from_row)
        .optional()?
        .transpose()
}

pub(super) fn thread_exists(conn: &Connection, thread_id: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM threads WHERE thread_id = ?1")?
        .exists([thread_id])?)
}

pub(super) fn require_thread(conn: &Connection, thread_id: &str) -> Result<()> {
    if thread_exists(conn, thread_id)? {
        Ok(())
    } else {
        Err(CheckpointError::NoThread(thread_id.into()))
    }
}

pub(super) fn checkpoint_exists(conn: &Connection, thread_id: &str, checkpoint_id: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM checkpoints WHERE thread_id = ?1 AND checkpoint_id = ?2")?
        .exists([thread_id, checkpoint_id])?)
}

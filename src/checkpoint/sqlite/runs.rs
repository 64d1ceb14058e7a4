//! The SQLite [`RunStore`]: the `runs`, `run_traces` and `thread_meta` tables and their SQL.
//! The rows' shape is the format's ([`RunText`], [`TraceText`], [`ThreadMetaText`]). The
//! tables are additive (`CREATE TABLE IF NOT EXISTS` on every open, as `leases`): files written
//! by earlier builds gain them without a schema version change, and those builds ignore them
//! (a version change would make every older build refuse the file for a table it never reads).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::SqliteCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::runs::{
    RunRow, RunStatus, RunStore, RunText, ThreadMeta, ThreadMetaText, TraceRow, TraceText, json_text,
};

/// Applied on every open (see the module doc).
pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY NOT NULL,
    thread_id TEXT NOT NULL,
    assistant_id TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    -- The run's request, JSON.
    kwargs TEXT NOT NULL,
    multitask_strategy TEXT NOT NULL,
    -- JSON objects.
    metadata TEXT NOT NULL,
    error TEXT,
    event_ids INTEGER NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS runs_by_thread ON runs (thread_id, run_id);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs (status, run_id);
CREATE TABLE IF NOT EXISTS thread_meta (
    thread_id TEXT PRIMARY KEY NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    metadata TEXT NOT NULL,
    -- The thread's time to live, JSON `{strategy, ttl}`, and when it runs out (milliseconds
    -- since the epoch).
    ttl TEXT,
    expires_at INTEGER
) STRICT;
CREATE TABLE IF NOT EXISTS run_traces (
    run_id TEXT PRIMARY KEY NOT NULL,
    thread_id TEXT NOT NULL,
    -- JSON: the trace, and what the run spent.
    trace TEXT NOT NULL,
    usage TEXT NOT NULL,
    updated_at TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS run_traces_by_thread ON run_traces (thread_id, run_id);
";

/// The columns `thread_meta` gained after it was first made: added to a file that lacks them
/// on open (its other builds ignore them).
pub(super) const META_COLUMNS: &[(&str, &str)] = &[("ttl", "TEXT"), ("expires_at", "INTEGER")];

/// Adds to `thread_meta` the columns of [`META_COLUMNS`] it lacks, and the index the sweeper
/// reads.
pub(super) fn migrate_meta(conn: &Connection) -> rusqlite::Result<()> {
    let have: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('thread_meta')")?
        .query_map([], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    for (name, kind) in META_COLUMNS {
        if !have.iter().any(|h| h == name) {
            conn.execute_batch(&format!("ALTER TABLE thread_meta ADD COLUMN {name} {kind}"))?;
        }
    }
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS thread_meta_by_expiry ON thread_meta (expires_at) WHERE expires_at IS NOT NULL",
    )
}

const META_COLS: &str = "thread_id, created_at, updated_at, metadata, ttl, expires_at";

const RUN_COLS: &str = "run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs, \
                        multitask_strategy, metadata, error, event_ids";

fn run_from_row(r: &Row<'_>) -> rusqlite::Result<RunText> {
    Ok(RunText {
        run_id: r.get(0)?,
        thread_id: r.get(1)?,
        assistant_id: r.get(2)?,
        status: r.get(3)?,
        created_at: r.get(4)?,
        updated_at: r.get(5)?,
        kwargs: r.get(6)?,
        multitask_strategy: r.get(7)?,
        metadata: r.get(8)?,
        error: r.get(9)?,
        event_ids: r.get(10)?,
    })
}

fn meta_from_row(r: &Row<'_>) -> rusqlite::Result<ThreadMetaText> {
    Ok(ThreadMetaText {
        thread_id: r.get(0)?,
        created_at: r.get(1)?,
        updated_at: r.get(2)?,
        metadata: r.get(3)?,
        ttl: r.get(4)?,
        expires_at: r.get(5)?,
        owner: None,
    })
}

impl RunStore for SqliteCheckpointer {
    fn put_run(&self, run: &RunRow) -> Result<()> {
        let v = RunText::from_run(run)?;
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(&format!(
                "INSERT OR REPLACE INTO runs ({RUN_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))?
            .execute(params![
                v.run_id,
                v.thread_id,
                v.assistant_id,
                v.status,
                v.created_at,
                v.updated_at,
                v.kwargs,
                v.multitask_strategy,
                v.metadata,
                v.error,
                v.event_ids
            ])?;
            Ok(())
        }))
    }

    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()> {
        let (run_id, at) = (run_id.to_owned(), at.to_owned());
        let error = error.map(json_text).transpose()?;
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(
                "UPDATE runs SET status = ?2, error = ?3, updated_at = ?4 \
                 WHERE run_id = ?1 AND (?2 <> 'running' OR status = 'pending')",
            )?
            .execute(params![run_id, status.as_str(), error, at])?;
            Ok(())
        }))
    }

    fn reserve_event_ids(&self, run_id: &str, upto: u64) -> Result<()> {
        let run_id = run_id.to_owned();
        let upto = crate::checkpoint::runs::event_ids_to_stored(upto);
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached("UPDATE runs SET event_ids = max(event_ids, ?2) WHERE run_id = ?1")?
                .execute(params![run_id, upto])?;
            Ok(())
        }))
    }

    fn get_run(&self, run_id: &str) -> Result<Option<RunRow>> {
        let raw = self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!("SELECT {RUN_COLS} FROM runs WHERE run_id = ?1"))?
                .query_row([run_id], run_from_row)
                .optional()?)
        })?;
        raw.map(RunText::into_run).transpose()
    }

    fn list_runs(&self, thread_id: Option<&str>, statuses: &[RunStatus]) -> Result<Vec<RunRow>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {RUN_COLS} FROM runs WHERE (?1 IS NULL OR thread_id = ?1) ORDER BY run_id"
            ))?;
            let rows = stmt.query_map([thread_id], run_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let mut out = Vec::new();
        for raw in raws {
            let run = raw.into_run()?;
            if statuses.is_empty() || statuses.contains(&run.status) {
                out.push(run);
            }
        }
        Ok(out)
    }

    fn delete_run(&self, run_id: &str) -> Result<bool> {
        let existed = self.get_run(run_id)?.is_some();
        let run_id = run_id.to_owned();
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached("DELETE FROM runs WHERE run_id = ?1")?
                .execute([&run_id])?;
            conn.prepare_cached("DELETE FROM run_traces WHERE run_id = ?1")?
                .execute([&run_id])?;
            Ok(())
        }))?;
        Ok(existed)
    }

    fn put_thread_meta(&self, meta: &ThreadMeta) -> Result<()> {
        let v = ThreadMetaText::from_meta(meta)?;
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO thread_meta (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                v.thread_id,
                v.created_at,
                v.updated_at,
                v.metadata,
                v.ttl,
                v.expires_at,
                v.owner
            ])?;
            Ok(())
        }))
    }

    fn create_thread_meta(&self, meta: &ThreadMeta) -> Result<bool> {
        let v = ThreadMetaText::from_meta(meta)?;
        let created = Arc::new(AtomicBool::new(false));
        let told = created.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO thread_meta (thread_id, created_at, updated_at, metadata, ttl, expires_at, owner) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (thread_id) DO NOTHING",
                )?
                .execute(params![
                    v.thread_id,
                    v.created_at,
                    v.updated_at,
                    v.metadata,
                    v.ttl,
                    v.expires_at,
                    v.owner
                ])?;
            told.store(inserted == 1, Ordering::SeqCst);
            Ok(())
        }))?;
        Ok(created.load(Ordering::SeqCst))
    }

    fn get_thread_meta(&self, thread_id: &str) -> Result<Option<ThreadMeta>> {
        let raw = self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!("SELECT {META_COLS} FROM thread_meta WHERE thread_id = ?1"))?
                .query_row([thread_id], meta_from_row)
                .optional()?)
        })?;
        raw.map(ThreadMetaText::into_meta).transpose()
    }

    fn list_thread_meta(&self) -> Result<Vec<ThreadMeta>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!("SELECT {META_COLS} FROM thread_meta"))?;
            let rows = stmt.query_map([], meta_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(ThreadMetaText::into_meta).collect()
    }

    fn expired_threads(&self, now_ms: i64, limit: usize) -> Result<Vec<String>> {
        self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT thread_id FROM thread_meta WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![now_ms, i64::try_from(limit).unwrap_or(i64::MAX)], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<String>>>()?)
        })
    }

    fn list_thread_meta_of(&self, owner: &str) -> Result<Vec<ThreadMeta>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(
                "SELECT thread_id, created_at, updated_at, metadata, ttl, expires_at FROM thread_meta WHERE owner = ?1",
            )?;
            let rows = stmt.query_map([owner], meta_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(ThreadMetaText::into_meta).collect()
    }

    fn delete_thread_meta(&self, thread_id: &str) -> Result<()> {
        let thread_id = thread_id.to_owned();
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached("DELETE FROM runs WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            conn.prepare_cached("DELETE FROM run_traces WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            conn.prepare_cached("DELETE FROM thread_meta WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            conn.prepare_cached("DELETE FROM crons WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            Ok(())
        }))
    }

    /// One machine's store: no claim to check.
    fn put_trace(&self, trace: &TraceRow, _claim: Option<&str>) -> Result<()> {
        let v = TraceText::from_trace(trace)?;
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached(
                "INSERT OR REPLACE INTO run_traces (run_id, thread_id, trace, usage, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![v.run_id, v.thread_id, v.trace, v.usage, v.updated_at])?;
            Ok(())
        }))
    }

    fn get_trace(&self, run_id: &str) -> Result<Option<TraceRow>> {
        let raw = self.read(|tx| {
            Ok(tx
                .prepare_cached(&format!("SELECT {TRACE_COLS} FROM run_traces WHERE run_id = ?1"))?
                .query_row([run_id], trace_from_row)
                .optional()?)
        })?;
        raw.map(TraceText::into_trace).transpose()
    }

    fn list_traces(&self, thread_id: &str) -> Result<Vec<TraceRow>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {TRACE_COLS} FROM run_traces WHERE thread_id = ?1 ORDER BY run_id"
            ))?;
            let rows = stmt.query_map([thread_id], trace_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(TraceText::into_trace).collect()
    }
}

const TRACE_COLS: &str = "run_id, thread_id, trace, usage, updated_at";

fn trace_from_row(r: &Row<'_>) -> rusqlite::Result<TraceText> {
    Ok(TraceText {
        run_id: r.get(0)?,
        thread_id: r.get(1)?,
        trace: r.get(2)?,
        usage: r.get(3)?,
        updated_at: r.get(4)?,
    })
}

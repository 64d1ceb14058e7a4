//! Runs and API thread metadata, beside the checkpoints: a run started through the server is a
//! row (pending → running → success / error / interrupted / timeout) in the same database as
//! its thread's checkpoints, so a server that stops (or is killed) finds on start the runs it
//! left unfinished and resumes them; the metadata a client sets on a thread survives too.
//!
//! A [`RunStore`] is part of every [`super::Checkpointer`]. The SQLite tables are additive
//! (`CREATE TABLE IF NOT EXISTS` on every open, as `leases`): files written by earlier builds
//! gain them without a schema version change, and those builds ignore them.
//!
//! Architecture Invariant: like the rest of checkpoint/, this knows nothing of the server or
//! the engine: a run's request is opaque JSON here.

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::memory::MemoryCheckpointer;
use super::sqlite::SqliteCheckpointer;
use super::{CheckpointError, Result};

/// Applied on every open of a SQLite store (see the module doc).
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
    metadata TEXT NOT NULL
) STRICT;
";

/// Where a run stands, as the LangGraph API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Created, not yet holding its thread (waiting for its turn, or not started).
    Pending,
    Running,
    Success,
    Error,
    /// Cancelled (by a client or a newer run) before its end.
    Interrupted,
    Timeout,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Error => "error",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Timeout => "timeout",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "pending" => RunStatus::Pending,
            "running" => RunStatus::Running,
            "success" => RunStatus::Success,
            "error" => RunStatus::Error,
            "interrupted" => RunStatus::Interrupted,
            "timeout" => RunStatus::Timeout,
            _ => return None,
        })
    }

    /// Not ended yet: a server that stops leaves such runs to be resumed.
    pub fn is_active(self) -> bool {
        matches!(self, RunStatus::Pending | RunStatus::Running)
    }
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    /// A UUIDv7: ordering by id is ordering by creation.
    pub run_id: String,
    pub thread_id: String,
    pub assistant_id: String,
    pub status: RunStatus,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub updated_at: String,
    /// The request the run was created with, as the client sent it: what a resumed run is
    /// started from again.
    pub kwargs: Value,
    pub multitask_strategy: String,
    pub metadata: Value,
    /// Why it failed: `{error, message}`.
    pub error: Option<Value>,
    /// Event ids the run's stream reserved: a resumed run numbers its events after them, so a
    /// client's `Last-Event-ID` from before the restart never names a new event.
    pub event_ids: u64,
}

/// The API's own record of a thread: its metadata, and when the API created and last changed
/// it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadMeta {
    pub thread_id: String,
    pub created_at: String,
    pub updated_at: String,
    /// A JSON object.
    pub metadata: Value,
}

/// Runs and thread metadata. Every method is durable when it returns.
pub trait RunStore: Send + Sync {
    /// Creates or replaces a run.
    fn put_run(&self, run: &RunRow) -> Result<()>;

    /// Sets a run's status (and error) and `updated_at`; a run that does not exist (deleted
    /// meanwhile) is left so.
    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()>;

    /// Raises the run's reserved event ids to `upto` (never lowers them).
    fn reserve_event_ids(&self, run_id: &str, upto: u64) -> Result<()>;

    fn get_run(&self, run_id: &str) -> Result<Option<RunRow>>;

    /// The runs of `thread_id` (every thread's when `None`) whose status is one of `statuses`
    /// (any when empty), oldest first.
    fn list_runs(&self, thread_id: Option<&str>, statuses: &[RunStatus]) -> Result<Vec<RunRow>>;

    /// Deletes a run; whether it existed.
    fn delete_run(&self, run_id: &str) -> Result<bool>;

    /// Creates or replaces a thread's metadata.
    fn put_thread_meta(&self, meta: &ThreadMeta) -> Result<()>;

    /// Creates a thread's metadata unless the thread has some already: whether it did. One
    /// atomic step, so that of two creations of one thread exactly one succeeds.
    fn create_thread_meta(&self, meta: &ThreadMeta) -> Result<bool>;

    fn get_thread_meta(&self, thread_id: &str) -> Result<Option<ThreadMeta>>;

    /// Every thread that has metadata.
    fn list_thread_meta(&self) -> Result<Vec<ThreadMeta>>;

    /// Deletes a thread's metadata and its runs.
    fn delete_thread_meta(&self, thread_id: &str) -> Result<()>;
}

// ---------------------------------------------------------------------------------------------
// SQLite.

const RUN_COLS: &str = "run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs, \
                        multitask_strategy, metadata, error, event_ids";

fn json_text(v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

fn parse_json(column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt(format!("runs.{column}: {e}")))
}

/// A `runs` row, JSON columns as text.
type RawRun = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
);

fn raw_run(r: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
    ))
}

fn run_from_raw(raw: RawRun) -> Result<RunRow> {
    let (run_id, thread_id, assistant_id, status, created_at, updated_at, kwargs, strategy, metadata, error, ids) = raw;
    Ok(RunRow {
        status: RunStatus::parse(&status)
            .ok_or_else(|| CheckpointError::Corrupt(format!("run {run_id} has status `{status}`")))?,
        kwargs: parse_json("kwargs", &kwargs)?,
        metadata: parse_json("metadata", &metadata)?,
        error: error.as_deref().map(|e| parse_json("error", e)).transpose()?,
        event_ids: u64::try_from(ids).unwrap_or(0),
        run_id,
        thread_id,
        assistant_id,
        created_at,
        updated_at,
        multitask_strategy: strategy,
    })
}

fn meta_from_row(r: &Row<'_>) -> rusqlite::Result<(String, String, String, String)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn meta_from_raw(
    (thread_id, created_at, updated_at, metadata): (String, String, String, String),
) -> Result<ThreadMeta> {
    Ok(ThreadMeta {
        metadata: parse_json("metadata", &metadata)?,
        thread_id,
        created_at,
        updated_at,
    })
}

impl RunStore for SqliteCheckpointer {
    fn put_run(&self, run: &RunRow) -> Result<()> {
        let values = (
            run.run_id.clone(),
            run.thread_id.clone(),
            run.assistant_id.clone(),
            run.status.as_str(),
            run.created_at.clone(),
            run.updated_at.clone(),
            json_text(&run.kwargs)?,
            run.multitask_strategy.clone(),
            json_text(&run.metadata)?,
            run.error.as_ref().map(json_text).transpose()?,
            i64::try_from(run.event_ids).unwrap_or(i64::MAX),
        );
        self.exec(Box::new(move |conn: &Connection| {
            let v = &values;
            conn.prepare_cached(&format!(
                "INSERT OR REPLACE INTO runs ({RUN_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
            ))?
            .execute(params![v.0, v.1, v.2, v.3, v.4, v.5, v.6, v.7, v.8, v.9, v.10])?;
            Ok(())
        }))
    }

    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()> {
        let (run_id, at) = (run_id.to_owned(), at.to_owned());
        let error = error.map(json_text).transpose()?;
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached("UPDATE runs SET status = ?2, error = ?3, updated_at = ?4 WHERE run_id = ?1")?
                .execute(params![run_id, status.as_str(), error, at])?;
            Ok(())
        }))
    }

    fn reserve_event_ids(&self, run_id: &str, upto: u64) -> Result<()> {
        let run_id = run_id.to_owned();
        let upto = i64::try_from(upto).unwrap_or(i64::MAX);
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
                .query_row([run_id], raw_run)
                .optional()?)
        })?;
        raw.map(run_from_raw).transpose()
    }

    fn list_runs(&self, thread_id: Option<&str>, statuses: &[RunStatus]) -> Result<Vec<RunRow>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "SELECT {RUN_COLS} FROM runs WHERE (?1 IS NULL OR thread_id = ?1) ORDER BY run_id"
            ))?;
            let rows = stmt.query_map([thread_id], raw_run)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        let mut out = Vec::new();
        for raw in raws {
            let run = run_from_raw(raw)?;
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
            Ok(())
        }))?;
        Ok(existed)
    }

    fn put_thread_meta(&self, meta: &ThreadMeta) -> Result<()> {
        let values = (
            meta.thread_id.clone(),
            meta.created_at.clone(),
            meta.updated_at.clone(),
            json_text(&meta.metadata)?,
        );
        self.exec(Box::new(move |conn: &Connection| {
            let v = &values;
            conn.prepare_cached(
                "INSERT OR REPLACE INTO thread_meta (thread_id, created_at, updated_at, metadata) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![v.0, v.1, v.2, v.3])?;
            Ok(())
        }))
    }

    fn create_thread_meta(&self, meta: &ThreadMeta) -> Result<bool> {
        let values = (
            meta.thread_id.clone(),
            meta.created_at.clone(),
            meta.updated_at.clone(),
            json_text(&meta.metadata)?,
        );
        let created = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let told = created.clone();
        self.exec(Box::new(move |conn: &Connection| {
            let v = &values;
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO thread_meta (thread_id, created_at, updated_at, metadata) VALUES (?1, ?2, ?3, ?4) ON CONFLICT (thread_id) DO NOTHING",
                )?
                .execute(params![v.0, v.1, v.2, v.3])?;
            told.store(inserted == 1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }))?;
        Ok(created.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn get_thread_meta(&self, thread_id: &str) -> Result<Option<ThreadMeta>> {
        let raw = self.read(|tx| {
            Ok(tx
                .prepare_cached(
                    "SELECT thread_id, created_at, updated_at, metadata FROM thread_meta WHERE thread_id = ?1",
                )?
                .query_row([thread_id], meta_from_row)
                .optional()?)
        })?;
        raw.map(meta_from_raw).transpose()
    }

    fn list_thread_meta(&self) -> Result<Vec<ThreadMeta>> {
        let raws = self.read(|tx| {
            let mut stmt = tx.prepare_cached("SELECT thread_id, created_at, updated_at, metadata FROM thread_meta")?;
            let rows = stmt.query_map([], meta_from_row)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })?;
        raws.into_iter().map(meta_from_raw).collect()
    }

    fn delete_thread_meta(&self, thread_id: &str) -> Result<()> {
        let thread_id = thread_id.to_owned();
        self.exec(Box::new(move |conn: &Connection| {
            conn.prepare_cached("DELETE FROM runs WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            conn.prepare_cached("DELETE FROM thread_meta WHERE thread_id = ?1")?
                .execute([&thread_id])?;
            Ok(())
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// In memory.

/// The in-memory store's runs and thread metadata.
#[derive(Debug, Default)]
pub(super) struct Memory {
    runs: std::collections::BTreeMap<String, RunRow>,
    threads: std::collections::HashMap<String, ThreadMeta>,
}

impl RunStore for MemoryCheckpointer {
    fn put_run(&self, run: &RunRow) -> Result<()> {
        self.lock_runs()?.runs.insert(run.run_id.clone(), run.clone());
        Ok(())
    }

    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()> {
        if let Some(run) = self.lock_runs()?.runs.get_mut(run_id) {
            run.status = status;
            run.error = error.cloned();
            run.updated_at = at.to_owned();
        }
        Ok(())
    }

    fn reserve_event_ids(&self, run_id: &str, upto: u64) -> Result<()> {
        if let Some(run) = self.lock_runs()?.runs.get_mut(run_id) {
            run.event_ids = run.event_ids.max(upto);
        }
        Ok(())
    }

    fn get_run(&self, run_id: &str) -> Result<Option<RunRow>> {
        Ok(self.lock_runs()?.runs.get(run_id).cloned())
    }

    fn list_runs(&self, thread_id: Option<&str>, statuses: &[RunStatus]) -> Result<Vec<RunRow>> {
        Ok(self
            .lock_runs()?
            .runs
            .values()
            .filter(|r| thread_id.is_none_or(|t| r.thread_id == t))
            .filter(|r| statuses.is_empty() || statuses.contains(&r.status))
            .cloned()
            .collect())
    }

    fn delete_run(&self, run_id: &str) -> Result<bool> {
        Ok(self.lock_runs()?.runs.remove(run_id).is_some())
    }

    fn put_thread_meta(&self, meta: &ThreadMeta) -> Result<()> {
        self.lock_runs()?.threads.insert(meta.thread_id.clone(), meta.clone());
        Ok(())
    }

    fn create_thread_meta(&self, meta: &ThreadMeta) -> Result<bool> {
        let mut m = self.lock_runs()?;
        if m.threads.contains_key(&meta.thread_id) {
            return Ok(false);
        }
        m.threads.insert(meta.thread_id.clone(), meta.clone());
        Ok(true)
    }

    fn get_thread_meta(&self, thread_id: &str) -> Result<Option<ThreadMeta>> {
        Ok(self.lock_runs()?.threads.get(thread_id).cloned())
    }

    fn list_thread_meta(&self) -> Result<Vec<ThreadMeta>> {
        Ok(self.lock_runs()?.threads.values().cloned().collect())
    }

    fn delete_thread_meta(&self, thread_id: &str) -> Result<()> {
        let mut m = self.lock_runs()?;
        m.runs.retain(|_, r| r.thread_id != thread_id);
        m.threads.remove(thread_id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::checkpoint::Durability;

    fn run(id: &str, thread: &str, status: RunStatus) -> RunRow {
        RunRow {
            run_id: id.into(),
            thread_id: thread.into(),
            assistant_id: "a".into(),
            status,
            created_at: "c".into(),
            updated_at: "u".into(),
            kwargs: json!({"input": {"x": 1}}),
            multitask_strategy: "reject".into(),
            metadata: json!({"who": "me"}),
            error: None,
            event_ids: 0,
        }
    }

    /// What both stores are given; [`verify`] reads it back (the SQLite one reopened on the same
    /// file, so that what is checked is what was stored).
    fn fill(store: &dyn RunStore) {
        store.put_run(&run("r1", "t1", RunStatus::Running)).unwrap();
        store.put_run(&run("r2", "t1", RunStatus::Pending)).unwrap();
        store.put_run(&run("r3", "t2", RunStatus::Success)).unwrap();
        store
            .set_run_status("r2", RunStatus::Error, Some(&json!({"message": "boom"})), "later")
            .unwrap();
        store.reserve_event_ids("r1", 1000).unwrap();
        store.reserve_event_ids("r1", 10).unwrap();
        store.set_run_status("gone", RunStatus::Success, None, "x").unwrap();
        store
            .put_thread_meta(&ThreadMeta {
                thread_id: "t1".into(),
                created_at: "c".into(),
                updated_at: "u".into(),
                metadata: json!({"graph_id": "g"}),
            })
            .unwrap();
    }

    fn verify(store: &dyn RunStore) {
        let r1 = store.get_run("r1").unwrap().unwrap();
        assert_eq!(
            (r1.status, r1.event_ids, &r1.kwargs),
            (RunStatus::Running, 1000, &json!({"input": {"x": 1}}))
        );
        let r2 = store.get_run("r2").unwrap().unwrap();
        assert_eq!(
            (r2.status, r2.error, r2.updated_at.as_str()),
            (RunStatus::Error, Some(json!({"message": "boom"})), "later")
        );
        assert_eq!(store.get_run("gone").unwrap(), None);
        let ids = |runs: Vec<RunRow>| runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
        assert_eq!(ids(store.list_runs(Some("t1"), &[]).unwrap()), ["r1", "r2"]);
        assert_eq!(
            ids(store
                .list_runs(None, &[RunStatus::Running, RunStatus::Success])
                .unwrap()),
            ["r1", "r3"]
        );
        assert_eq!(
            store.get_thread_meta("t1").unwrap().unwrap().metadata,
            json!({"graph_id": "g"})
        );
        assert!(store.delete_run("r3").unwrap());
        assert!(!store.delete_run("r3").unwrap());
        store.delete_thread_meta("t1").unwrap();
        assert_eq!(store.list_runs(None, &[]).unwrap(), Vec::new());
        assert_eq!(store.list_thread_meta().unwrap(), Vec::new());
    }

    #[test]
    fn runs_and_thread_metadata_are_stored_by_both_backends() {
        let memory = MemoryCheckpointer::new();
        fill(&memory);
        verify(&memory);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        fill(&SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap());
        verify(&SqliteCheckpointer::open(&path, Durability::CrashSafe).unwrap());
    }
}

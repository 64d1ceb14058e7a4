//! Runs and API thread metadata, beside the checkpoints: a run started through the server is a
//! row (pending → running → success / error / interrupted / timeout) in the same database as
//! its thread's checkpoints, so a server that stops (or is killed) finds on start the runs it
//! left unfinished and resumes them; the metadata a client sets on a thread survives too.
//!
//! A [`RunStore`] is part of every [`super::Checkpointer`]. This module is the format, shared
//! by every backend: the trait, its types, and their stored shape (`RunText`,
//! `ThreadMetaText`: JSON columns as text). The backends' code is theirs
//! (`sqlite/runs.rs`, `memory/runs.rs`); nothing here names a backend.
//!
//! Architecture Invariant: like the rest of checkpoint/, this knows nothing of the server or
//! the engine: a run's request is opaque JSON here.

use serde_json::Value;

use super::{CheckpointError, Result};

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
    /// When the thread is swept, if it has a time to live.
    pub ttl: Option<ThreadTtl>,
}

/// A thread's time to live (LangGraph's `ttl: {ttl, strategy}`): once it has been idle that
/// long, the server's sweeper deletes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadTtl {
    /// What is done then: `delete`, the only strategy runner has.
    pub strategy: String,
    pub minutes: f64,
    /// When it runs out unless the thread is used again (milliseconds since the epoch): set
    /// when the API last touched the thread.
    pub expires_at_ms: i64,
}

impl ThreadTtl {
    /// A time to live of `minutes` from `now_ms`.
    pub fn starting(strategy: &str, minutes: f64, now_ms: i64) -> ThreadTtl {
        ThreadTtl {
            strategy: strategy.to_string(),
            minutes,
            expires_at_ms: now_ms.saturating_add(Self::millis(minutes)),
        }
    }

    /// The same time to live, started again at `now_ms`.
    pub fn restarted(&self, now_ms: i64) -> ThreadTtl {
        Self::starting(&self.strategy, self.minutes, now_ms)
    }

    /// `minutes` in milliseconds, saturating.
    pub fn millis(minutes: f64) -> i64 {
        let ms = minutes * 60_000.0;
        if ms >= i64::MAX as f64 {
            i64::MAX
        } else {
            ms.max(0.0) as i64
        }
    }
}

/// Runs and thread metadata. Every method is durable when it returns.
pub trait RunStore: Send + Sync {
    /// Creates or replaces a run.
    fn put_run(&self, run: &RunRow) -> Result<()>;

    /// Sets a run's status (and error) and `updated_at`; a run that does not exist (deleted
    /// meanwhile) is left so. A run's end is final: `running` is set only on a run still
    /// pending, so a start told after the end (two writers, unordered) cannot revive it.
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

    /// The threads whose time to live ran out by `now_ms` (milliseconds since the epoch), at
    /// most `limit`, those that ran out first first: what the TTL sweeper looks at.
    fn expired_threads(&self, now_ms: i64, limit: usize) -> Result<Vec<String>> {
        let mut expired: Vec<(i64, String)> = self
            .list_thread_meta()?
            .into_iter()
            .filter_map(|m| {
                m.ttl
                    .filter(|t| t.expires_at_ms <= now_ms)
                    .map(|t| (t.expires_at_ms, m.thread_id))
            })
            .collect();
        expired.sort();
        Ok(expired.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    /// The time by which threads' expiry is judged (milliseconds since the epoch), given the
    /// process's clock `process_ms`: a store that many processes share and that has a clock of
    /// its own answers by it (PostgreSQL's), so that processes whose clocks disagree sweep a
    /// thread at the same time; any other answers `process_ms`.
    fn expiry_clock_ms(&self, process_ms: i64) -> Result<i64> {
        Ok(process_ms)
    }

    /// The threads whose metadata names `owner` as theirs (`metadata.owner`, as LangGraph's
    /// servers stamp it). The databases answer from an indexed column kept from it.
    fn list_thread_meta_of(&self, owner: &str) -> Result<Vec<ThreadMeta>> {
        Ok(self
            .list_thread_meta()?
            .into_iter()
            .filter(|m| owner_of(&m.metadata) == Some(owner))
            .collect())
    }

    /// Deletes the API's records of a thread: its metadata, its runs (their traces too) and
    /// the crons that run on it, together.
    fn delete_thread_meta(&self, thread_id: &str) -> Result<()>;

    /// Creates or replaces a run's trace. `claim`: a worker's claim on the run (a database many
    /// processes share): the trace is stored only while the run is still that claim's, so a
    /// worker taken for dead does not overwrite the trace of the one that resumed its run.
    fn put_trace(&self, trace: &TraceRow, claim: Option<&str>) -> Result<()>;

    fn get_trace(&self, run_id: &str) -> Result<Option<TraceRow>>;

    /// The traces of `thread_id`'s runs, oldest run first.
    fn list_traces(&self, thread_id: &str) -> Result<Vec<TraceRow>>;
}

/// A run's trace: what the server shows of it (`GET …/runs/{run_id}/trace`), built from its
/// events as it goes, and what it spent, apart so a thread's sums read no spans. Both are
/// opaque JSON here; deleting a run (or its thread's runs) deletes its trace.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceRow {
    pub run_id: String,
    pub thread_id: String,
    pub trace: Value,
    pub usage: Value,
    /// RFC 3339 UTC.
    pub updated_at: String,
}

/// A [`TraceRow`] as a backend stores it: its JSON columns as text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TraceText {
    pub(crate) run_id: String,
    pub(crate) thread_id: String,
    pub(crate) trace: String,
    pub(crate) usage: String,
    pub(crate) updated_at: String,
}

impl TraceText {
    pub(crate) fn from_trace(t: &TraceRow) -> Result<Self> {
        Ok(TraceText {
            run_id: t.run_id.clone(),
            thread_id: t.thread_id.clone(),
            trace: json_text(&t.trace)?,
            usage: json_text(&t.usage)?,
            updated_at: t.updated_at.clone(),
        })
    }

    pub(crate) fn into_trace(self) -> Result<TraceRow> {
        Ok(TraceRow {
            trace: parse_json("trace", &self.trace)?,
            usage: parse_json("usage", &self.usage)?,
            run_id: self.run_id,
            thread_id: self.thread_id,
            updated_at: self.updated_at,
        })
    }
}

/// A [`RunRow`] as a backend stores it: the status as its name, JSON columns as text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RunText {
    pub(crate) run_id: String,
    pub(crate) thread_id: String,
    pub(crate) assistant_id: String,
    pub(crate) status: String,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    pub(crate) kwargs: String,
    pub(crate) multitask_strategy: String,
    pub(crate) metadata: String,
    pub(crate) error: Option<String>,
    pub(crate) event_ids: i64,
}

impl RunText {
    pub(crate) fn from_run(run: &RunRow) -> Result<Self> {
        Ok(RunText {
            run_id: run.run_id.clone(),
            thread_id: run.thread_id.clone(),
            assistant_id: run.assistant_id.clone(),
            status: run.status.as_str().into(),
            created_at: run.created_at.clone(),
            updated_at: run.updated_at.clone(),
            kwargs: json_text(&run.kwargs)?,
            multitask_strategy: run.multitask_strategy.clone(),
            metadata: json_text(&run.metadata)?,
            error: run.error.as_ref().map(json_text).transpose()?,
            event_ids: event_ids_to_stored(run.event_ids),
        })
    }

    pub(crate) fn into_run(self) -> Result<RunRow> {
        Ok(RunRow {
            status: RunStatus::parse(&self.status)
                .ok_or_else(|| CheckpointError::Corrupt(format!("run {} has status `{}`", self.run_id, self.status)))?,
            kwargs: parse_json("kwargs", &self.kwargs)?,
            metadata: parse_json("metadata", &self.metadata)?,
            error: self.error.as_deref().map(|e| parse_json("error", e)).transpose()?,
            event_ids: u64::try_from(self.event_ids).unwrap_or(0),
            run_id: self.run_id,
            thread_id: self.thread_id,
            assistant_id: self.assistant_id,
            created_at: self.created_at,
            updated_at: self.updated_at,
            multitask_strategy: self.multitask_strategy,
        })
    }
}

/// A [`ThreadMeta`] as a backend stores it: its metadata as JSON text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ThreadMetaText {
    pub(crate) thread_id: String,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    pub(crate) metadata: String,
    /// `{"strategy", "ttl"}` (minutes), JSON.
    pub(crate) ttl: Option<String>,
    /// Milliseconds since the epoch.
    pub(crate) expires_at: Option<i64>,
    /// `metadata.owner`, kept in a column of its own for an index (never read back: the
    /// metadata is what is shown).
    pub(crate) owner: Option<String>,
}

impl ThreadMetaText {
    pub(crate) fn from_meta(meta: &ThreadMeta) -> Result<Self> {
        Ok(ThreadMetaText {
            thread_id: meta.thread_id.clone(),
            created_at: meta.created_at.clone(),
            updated_at: meta.updated_at.clone(),
            metadata: json_text(&meta.metadata)?,
            ttl: meta
                .ttl
                .as_ref()
                .map(|t| json_text(&serde_json::json!({"strategy": t.strategy, "ttl": t.minutes})))
                .transpose()?,
            expires_at: meta.ttl.as_ref().map(|t| t.expires_at_ms),
            owner: owner_of(&meta.metadata).map(str::to_string),
        })
    }

    pub(crate) fn into_meta(self) -> Result<ThreadMeta> {
        let ttl = match (self.ttl.as_deref(), self.expires_at) {
            (Some(text), Some(expires_at_ms)) => {
                let v = parse_json("ttl", text)?;
                Some(ThreadTtl {
                    strategy: v
                        .get("strategy")
                        .and_then(Value::as_str)
                        .unwrap_or("delete")
                        .to_string(),
                    minutes: v.get("ttl").and_then(Value::as_f64).unwrap_or_default(),
                    expires_at_ms,
                })
            }
            _ => None,
        };
        Ok(ThreadMeta {
            metadata: parse_json("metadata", &self.metadata)?,
            thread_id: self.thread_id,
            created_at: self.created_at,
            updated_at: self.updated_at,
            ttl,
        })
    }
}

/// Whose a thread or a run is: its metadata's `owner`, if it names one.
pub fn owner_of(metadata: &Value) -> Option<&str> {
    metadata.get("owner").and_then(Value::as_str)
}

/// Event ids as stored (a signed 64-bit column), saturating.
pub(crate) fn event_ids_to_stored(ids: u64) -> i64 {
    i64::try_from(ids).unwrap_or(i64::MAX)
}

/// JSON text of an error, as `set_run_status` stores it.
pub(crate) fn json_text(v: &Value) -> Result<String> {
    serde_json::to_string(v).map_err(|e| CheckpointError::Corrupt(e.to_string()))
}

fn parse_json(column: &str, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt(format!("runs.{column}: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::checkpoint::Durability;
    use crate::checkpoint::memory::MemoryCheckpointer;
    use crate::checkpoint::sqlite::SqliteCheckpointer;

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
                ttl: Some(ThreadTtl::starting("delete", 1.5, 1_000)),
            })
            .unwrap();
        for (run, thread, calls) in [("r1", "t1", 1), ("r2", "t1", 2), ("r3", "t2", 3), ("r1", "t1", 4)] {
            store
                .put_trace(
                    &TraceRow {
                        run_id: run.into(),
                        thread_id: thread.into(),
                        trace: json!({"spans": [{"id": "s1", "kind": "run"}]}),
                        usage: json!({"total": {"calls": calls}}),
                        updated_at: "u".into(),
                    },
                    None,
                )
                .unwrap();
        }
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
        let meta = store.get_thread_meta("t1").unwrap().unwrap();
        assert_eq!(meta.metadata, json!({"graph_id": "g"}));
        assert_eq!(meta.ttl, Some(ThreadTtl::starting("delete", 1.5, 1_000)));
        assert_eq!(meta.ttl.unwrap().expires_at_ms, 91_000);
        // A trace put again replaces the earlier one; a thread's traces come oldest run first.
        let usage = |rows: Vec<TraceRow>| rows.into_iter().map(|t| (t.run_id, t.usage)).collect::<Vec<_>>();
        assert_eq!(
            usage(store.list_traces("t1").unwrap()),
            [
                ("r1".to_string(), json!({"total": {"calls": 4}})),
                ("r2".to_string(), json!({"total": {"calls": 2}}))
            ]
        );
        assert_eq!(
            store.get_trace("r3").unwrap().unwrap().trace,
            json!({"spans": [{"id": "s1", "kind": "run"}]})
        );
        assert!(store.delete_run("r3").unwrap());
        assert!(!store.delete_run("r3").unwrap());
        assert_eq!(
            store.get_trace("r3").unwrap(),
            None,
            "a deleted run's trace goes with it"
        );
        store.delete_thread_meta("t1").unwrap();
        assert_eq!(store.list_runs(None, &[]).unwrap(), Vec::new());
        assert_eq!(store.list_thread_meta().unwrap(), Vec::new());
        assert_eq!(store.list_traces("t1").unwrap(), Vec::new());
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

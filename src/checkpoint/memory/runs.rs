//! The in-memory [`RunStore`]: runs, their traces and thread metadata in maps under one lock.

use serde_json::Value;

use super::MemoryCheckpointer;
use crate::checkpoint::Result;
use crate::checkpoint::runs::{RunRow, RunStatus, RunStore, ThreadMeta, TraceRow};

/// The in-memory store's runs and thread metadata.
#[derive(Debug, Default)]
pub(super) struct Memory {
    runs: std::collections::BTreeMap<String, RunRow>,
    threads: std::collections::HashMap<String, ThreadMeta>,
    traces: std::collections::BTreeMap<String, TraceRow>,
    /// Per-user API keys with their hashes, and quota windows (`users.rs`).
    pub(super) users: super::users::Users,
}

impl Memory {
    /// Whether run `run_id` exists and is pending or running.
    pub(super) fn is_active(&self, run_id: &str) -> bool {
        self.runs.get(run_id).is_some_and(|r| r.status.is_active())
    }
}

impl RunStore for MemoryCheckpointer {
    fn put_run(&self, run: &RunRow) -> Result<()> {
        self.lock_runs()?.runs.insert(run.run_id.clone(), run.clone());
        Ok(())
    }

    fn set_run_status(&self, run_id: &str, status: RunStatus, error: Option<&Value>, at: &str) -> Result<()> {
        if let Some(run) = self.lock_runs()?.runs.get_mut(run_id)
            && (status != RunStatus::Running || run.status == RunStatus::Pending)
        {
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
        let mut m = self.lock_runs()?;
        m.traces.remove(run_id);
        Ok(m.runs.remove(run_id).is_some())
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
        m.traces.retain(|_, t| t.thread_id != thread_id);
        m.threads.remove(thread_id);
        self.lock_crons()?.delete_for_thread(thread_id);
        Ok(())
    }

    /// One process's store: no claim to check.
    fn put_trace(&self, trace: &TraceRow, _claim: Option<&str>) -> Result<()> {
        self.lock_runs()?.traces.insert(trace.run_id.clone(), trace.clone());
        Ok(())
    }

    fn get_trace(&self, run_id: &str) -> Result<Option<TraceRow>> {
        Ok(self.lock_runs()?.traces.get(run_id).cloned())
    }

    fn list_traces(&self, thread_id: &str) -> Result<Vec<TraceRow>> {
        Ok(self
            .lock_runs()?
            .traces
            .values()
            .filter(|t| t.thread_id == thread_id)
            .cloned()
            .collect())
    }
}

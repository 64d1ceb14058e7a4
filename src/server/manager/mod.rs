//! The run manager: what a request asks of runs — create one (admitted to its thread by its
//! multitask strategy), enqueue it for a worker, claim a worker and the thread for it, cancel it,
//! roll it back, join it, list and delete runs — below HTTP, with typed requests
//! ([`CreateRun`]) and one error type ([`RunsError`]). The server's handlers parse, call it and
//! map its error to a response in one place (`server/http.rs`); a worker process would call the
//! same.
//!
//! It may use the run builder, the engine and the checkpoint and run stores, and the served
//! graphs' data type; never axum or an HTTP type. The live runs of this process (their stoppers,
//! their ends, what readers join) are its registry, locked nowhere else. What is shown of a run
//! is its row in the store, so runs outlive the process that started them.
//!
//! - `request.rs`: [`CreateRun`], read from the request a run's row keeps;
//! - `start.rs`: admission, the run's row, its place in line, its worker and its engine;
//! - `control.rs`: cancel, rollback (through the engine, under the thread's lease), join;
//! - `workers.rs`: how many runs execute at once, and the line of pending runs;
//! - `trace.rs`: a run's trace and usage, built from its events where it executes;
//! - `shared.rs`: a database many processes share: the API's side and the workers'.

mod control;
mod journal;
mod request;
mod shared;
mod start;
mod trace;
mod workers;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) use control::Cancel;
pub(crate) use request::{CreateRun, RunCreate};
pub(crate) use shared::{Role, Worker};
pub(crate) use start::{Queued, Stopper, checkpoint_metadata, failure};
pub(crate) use trace::UsageSums;

use crate::checkpoint::{CheckpointError, Checkpointer, PendingWrite, RunRow, RunStatus};
use crate::engine::EngineError;
use crate::run::{RunError, RunSettings};

/// Why the run manager refused or failed a request. One type for every operation; the server
/// maps it to a status in one place.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RunsError {
    /// The request is malformed or does not fit its graph or thread (HTTP 422).
    #[error("{0}")]
    Invalid(String),
    /// No such run, thread or assistant (HTTP 404).
    #[error("{0}")]
    NotFound(String),
    /// The thread or the run is not in a state that allows it (HTTP 409).
    #[error("{0}")]
    Conflict(String),
    /// The engine refused to start or continue the run.
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Store(#[from] CheckpointError),
    /// The run's services could not be built.
    #[error(transparent)]
    Build(#[from] RunError),
}

/// What a stream or a wait for a run answers when the thread already has a run and the request
/// said `multitask_strategy: reject` (or the engine found the thread's lease taken).
pub(crate) const BUSY: &str =
    "Thread is already running a task. Wait for it to finish or choose a different multitask strategy.";

fn no_run(run_id: &str) -> RunsError {
    RunsError::NotFound(format!("Run {run_id} not found"))
}

fn no_thread(thread_id: &str) -> RunsError {
    RunsError::NotFound(format!("Thread with ID {thread_id} not found"))
}

/// A run this process started: what only a live run has (what is shown of a run is its row).
/// `S` is what readers of the run join (the server's frames of its stream).
pub(crate) struct Live<S> {
    pub run_id: String,
    pub thread_id: String,
    /// As stored; kept here too so that a thread's busy status reads no store.
    pub status: RunStatus,
    /// The thread's latest checkpoint when the run was created, with the writes it had then:
    /// what a rollback goes back to (none: the thread had no checkpoint, and a rollback deletes
    /// them all).
    rollback_to: Option<(String, Vec<PendingWrite>)>,
    stopper: Stopper,
    /// Becomes true once the run's end is recorded.
    pub ended: tokio::sync::watch::Receiver<bool>,
    /// What readers join, while they may.
    pub stream: Option<Arc<S>>,
    /// Its trace as it is built, for a run executing here.
    trace: Option<Arc<Mutex<trace::Recorder>>>,
    /// It had a worker: it may have touched its thread (one cancelled in line never did).
    had_worker: bool,
    /// Where it executes: here, or on a worker of a shared database (this is its reader's
    /// record), or here for such a worker (its claim).
    place: Place,
}

/// Where a live run executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// In this process, for this process's clients.
    Here,
    /// On whichever worker claims it from a shared database: this process reads its events.
    Remote,
    /// In this process, claimed from a shared database's queue by this process's worker.
    Claimed,
}

impl<S> Clone for Live<S> {
    fn clone(&self) -> Self {
        Live {
            run_id: self.run_id.clone(),
            thread_id: self.thread_id.clone(),
            status: self.status,
            rollback_to: self.rollback_to.clone(),
            stopper: self.stopper.clone(),
            ended: self.ended.clone(),
            stream: self.stream.clone(),
            trace: self.trace.clone(),
            had_worker: self.had_worker,
            place: self.place,
        }
    }
}

impl<S> Live<S> {
    pub(crate) fn is_active(&self) -> bool {
        self.status.is_active()
    }

    /// Waits until the run's end is recorded (at once if its task is gone).
    pub(crate) async fn wait_end(&self) {
        let mut ended = self.ended.clone();
        // A closed channel means the run's task is gone, after recording its end.
        let _ = ended.wait_for(|e| *e).await;
    }
}

/// The run manager of one process.
pub(crate) struct RunManager<S> {
    settings: RunSettings,
    /// Checkpoints, and the runs and thread metadata of the API.
    store: Arc<dyn Checkpointer>,
    /// The data store every run's data kinds share.
    data: crate::rag::DataStore,
    /// How many runs execute at once; the others wait `pending`, in the order they came.
    workers: workers::Workers,
    /// The live runs, by run id.
    runs: Mutex<HashMap<String, Live<S>>>,
    /// Threads being deleted. Held while a run is admitted to a thread (until it is among
    /// `runs`): admissions are decided one at a time, and none to a thread being deleted.
    deleting: Mutex<HashSet<String>>,
    /// The process is shutting down: the runs it stops stay unfinished in the store, for the
    /// next process to continue.
    stopping: AtomicBool,
    /// Runs ended since the process started, by final status.
    ended: Mutex<BTreeMap<&'static str, u64>>,
    /// What this manager is to the store: the one process of an embedded store, or, on a
    /// database many processes share, the API's side (its runs execute on workers) or a
    /// worker's.
    role: Role,
    /// The time to live of a thread a run creates, in minutes (`--thread-ttl`).
    thread_ttl: Option<f64>,
    /// Per-user quotas: a user's run spends at most what the window leaves, and what it spent
    /// is counted when it ends (by the process that ran it).
    quotas: Option<crate::server::auth::Quotas>,
}

/// A lock may be held across a store call (a run's log, an admission), which a database out of
/// reach makes long: one taken is waited for off the runtime's thread.
pub(crate) use crate::blocking::lock;

impl<S: Send + Sync + 'static> RunManager<S> {
    /// A manager of runs built from `settings` on `store`, at most `workers` of them executing
    /// at once.
    pub(crate) fn new(
        settings: RunSettings,
        store: Arc<dyn Checkpointer>,
        data: crate::rag::DataStore,
        workers: usize,
        role: Role,
    ) -> RunManager<S> {
        RunManager {
            quotas: None,
            role,
            settings,
            store,
            data,
            workers: workers::Workers::new(workers),
            runs: Mutex::new(HashMap::new()),
            deleting: Mutex::new(HashSet::new()),
            stopping: AtomicBool::new(false),
            ended: Mutex::new(BTreeMap::new()),
            thread_ttl: None,
        }
    }

    /// The same manager, giving a thread its runs create a time to live of `minutes`.
    pub(crate) fn with_thread_ttl(self, minutes: Option<f64>) -> RunManager<S> {
        RunManager {
            thread_ttl: minutes,
            ..self
        }
    }

    /// The time to live of a thread a run creates, in minutes.
    pub(crate) fn thread_ttl(&self) -> Option<f64> {
        self.thread_ttl
    }

    /// This manager with per-user quotas.
    pub(crate) fn with_quotas(mut self, quotas: Option<crate::server::auth::Quotas>) -> RunManager<S> {
        self.quotas = quotas;
        self
    }

    /// Whether its runs go through the queue of a database many processes share.
    pub(crate) fn is_shared(&self) -> bool {
        self.role != Role::Local
    }

    /// How many runs may execute at once.
    pub(crate) fn workers(&self) -> usize {
        self.workers.size()
    }

    /// The stored run `run_id` of `thread_id`.
    pub(crate) fn get(&self, thread_id: &str, run_id: &str) -> Result<RunRow, RunsError> {
        self.store
            .get_run(run_id)?
            .filter(|r| r.thread_id == thread_id)
            .ok_or_else(|| no_run(run_id))
    }

    /// The runs of `thread_id`, newest first, with `status` if given: `limit` of them after the
    /// first `offset`.
    pub(crate) fn list(
        &self,
        thread_id: &str,
        status: Option<&str>,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<RunRow>, RunsError> {
        if !self.thread_exists(thread_id)? {
            return Err(no_thread(thread_id));
        }
        let runs = self.store.list_runs(Some(thread_id), &[])?;
        // Oldest first from the store (run ids are UUIDv7: their order is their creation's).
        Ok(runs
            .into_iter()
            .rev()
            .filter(|r| status.is_none_or(|s| r.status.as_str() == s))
            .skip(offset)
            .take(limit)
            .collect())
    }

    /// The runs some process left pending or running: what a process starting on the store
    /// resumes.
    pub(crate) fn unfinished(&self) -> Result<Vec<RunRow>, RunsError> {
        Ok(self.store.list_runs(None, &[RunStatus::Pending, RunStatus::Running])?)
    }

    /// Whether the API knows the thread (its metadata) or the store has it.
    pub(crate) fn thread_exists(&self, thread_id: &str) -> Result<bool, RunsError> {
        if self.store.get_thread_meta(thread_id)?.is_some() {
            return Ok(true);
        }
        Ok(self.store.get_thread(thread_id)?.is_some())
    }

    /// Whether a run of this process, running or waiting for a worker, holds the thread.
    pub(crate) fn busy(&self, thread_id: &str) -> bool {
        let active: Vec<String> = lock(&self.runs)
            .iter()
            .filter(|(_, r)| r.thread_id == thread_id && r.is_active())
            .map(|(id, _)| id.clone())
            .collect();
        if !self.is_api() {
            return !active.is_empty();
        }
        // A run executing elsewhere: its row says whether it goes on. The local record of it
        // follows the run's log, a moment behind a cancel that waited for the row.
        active.iter().any(|id| {
            self.store
                .get_run(id)
                .ok()
                .flatten()
                .is_some_and(|r| r.status.is_active())
        })
    }

    /// How many live runs are in each active status.
    pub(crate) fn active(&self) -> BTreeMap<&'static str, u64> {
        let mut active: BTreeMap<&'static str, u64> = [("pending", 0), ("running", 0)].into();
        for r in lock(&self.runs).values().filter(|r| r.is_active()) {
            *active.entry(r.status.as_str()).or_default() += 1;
        }
        active
    }

    /// How many runs ended since the process started, by final status.
    pub(crate) fn ended(&self) -> BTreeMap<&'static str, u64> {
        lock(&self.ended).clone()
    }

    /// The live run `run_id` of `thread_id`, if this process runs (or ran) it.
    pub(crate) fn live(&self, thread_id: &str, run_id: &str) -> Option<Live<S>> {
        lock(&self.runs)
            .get(run_id)
            .filter(|r| r.thread_id == thread_id)
            .cloned()
    }

    /// Run `run_id`'s trace and what it spent so far, when it executes (or executed) here.
    pub(crate) fn live_trace(&self, run_id: &str) -> Option<(serde_json::Value, UsageSums)> {
        let recorder = lock(&self.runs).get(run_id)?.trace.clone()?;
        let t = lock(&recorder);
        Some((t.json(), t.usage().clone()))
    }

    /// Offers `stream` to the run's joining readers.
    pub(crate) fn attach(&self, run_id: &str, stream: Arc<S>) {
        if let Some(r) = lock(&self.runs).get_mut(run_id) {
            r.stream = Some(stream);
        }
    }

    /// Withdraws what readers join (its readers keep what they hold).
    pub(crate) fn detach(&self, run_id: &str) {
        if let Some(r) = lock(&self.runs).get_mut(run_id) {
            r.stream = None;
        }
    }

    /// What readers of run `run_id` of `thread_id` join, once it has started: a run whose row
    /// is active but that is not live here yet (it is being resumed, or is queued) is waited
    /// for. `None` when the run ended without offering anything to join.
    pub(crate) async fn joinable(&self, thread_id: &str, run_id: &str) -> Result<Option<Live<S>>, RunsError> {
        loop {
            if let Some(run) = self.live(thread_id, run_id)
                && (run.stream.is_some() || !run.is_active())
            {
                return Ok(Some(run));
            }
            if !self.get(thread_id, run_id)?.status.is_active() {
                return Ok(self.live(thread_id, run_id));
            }
            tokio::time::sleep(STARTING).await;
        }
    }

    /// Deletes a run that has ended (a running one is a conflict: cancel it first).
    pub(crate) fn delete(&self, thread_id: &str, run_id: &str) -> Result<(), RunsError> {
        let run = self.get(thread_id, run_id)?;
        if run.status.is_active() {
            return Err(RunsError::Conflict(format!(
                "run {run_id} is {}: cancel it before deleting it",
                run.status.as_str()
            )));
        }
        self.store.delete_run(run_id)?;
        lock(&self.runs).remove(run_id);
        Ok(())
    }

    /// Deletes a thread with its checkpoints and runs, as the reference deletes them. A run in
    /// progress or queued on it is cancelled first, and no run is admitted to the thread
    /// meanwhile, so none brings it back.
    pub(crate) async fn delete_thread(&self, thread_id: &str) -> Result<(), RunsError> {
        {
            let mut deleting = lock(&self.deleting);
            if deleting.contains(thread_id) || !self.thread_exists(thread_id)? {
                return Err(no_thread(thread_id));
            }
            deleting.insert(thread_id.to_string());
        }
        let deleted = async {
            self.stop_thread_runs(thread_id, false).await?;
            // Under the thread's lease, taken in the removal's transaction: a run another
            // process started on it meanwhile (or a CLI run) keeps it, and the delete is refused.
            let claim = crate::engine::own_claim(self.settings.lease_ttl.value);
            let removed = self
                .store
                .remove_thread(thread_id, &crate::checkpoint::Removal::default(), &claim)?;
            if let crate::checkpoint::Removed::Busy(why) = removed {
                return Err(RunsError::Conflict(format!(
                    "Thread {thread_id} is busy ({why}): it cannot be deleted while a run holds it"
                )));
            }
            lock(&self.runs).retain(|_, r| r.thread_id != thread_id);
            Ok::<_, RunsError>(())
        }
        .await;
        lock(&self.deleting).remove(thread_id);
        deleted
    }

    /// Removes the thread of a stateless run once its reader is done, under its lease as any
    /// removal; a thread something else holds now stays (garbage nobody can name).
    pub(crate) fn remove_temporary(&self, thread_id: &str) {
        let claim = crate::engine::own_claim(self.settings.lease_ttl.value);
        match self
            .store
            .remove_thread(thread_id, &crate::checkpoint::Removal::default(), &claim)
        {
            Ok(crate::checkpoint::Removed::Busy(why)) => {
                tracing::warn!(thread_id, why, "a stateless run's thread is held: kept");
            }
            Err(e) => tracing::warn!(thread_id, error = %e, "a stateless run's thread could not be deleted"),
            Ok(_) => {}
        }
    }

    /// Stops every live run at its next step boundary and waits until each has ended: its step
    /// checkpointed, its lease released. From here on a run that stops stays unfinished in the
    /// store, for the next process. A run started meanwhile is stopped in turn.
    pub(crate) async fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        // Each run is waited for once: one whose task died without recording its end still
        // looks active, and looking again would spin.
        let mut waited = HashSet::new();
        loop {
            // A run executing on a worker elsewhere goes on without this process.
            let active: Vec<Live<S>> = lock(&self.runs)
                .values()
                .filter(|r| r.is_active() && r.place != Place::Remote && !waited.contains(&r.run_id))
                .cloned()
                .collect();
            if active.is_empty() {
                return;
            }
            for run in &active {
                run.stopper.stop();
            }
            for run in active {
                run.wait_end().await;
                waited.insert(run.run_id);
            }
        }
    }

    /// How many live runs have not ended.
    pub(crate) fn running(&self) -> usize {
        lock(&self.runs).values().filter(|r| r.is_active()).count()
    }
}

/// How often a reader of a run that has not started yet looks again.
const STARTING: std::time::Duration = std::time::Duration::from_millis(50);

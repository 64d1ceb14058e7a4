//! A run after it started: cancelled (interrupted where it is, or rolled back to where its
//! thread was before it), joined.

use super::{Live, RunManager, RunsError, lock, no_run};
use crate::engine::{Engine, EngineError, LeasePolicy, RollbackTo};

/// What a cancel does to the run's thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancel {
    /// The thread stays at the checkpoint the cancelled step started from, waiting for the
    /// tasks the cancel dropped.
    Interrupt,
    /// The thread goes back to where it was before the run, and the run is deleted.
    Rollback,
}

impl<S: Send + Sync + 'static> RunManager<S> {
    /// Cancels run `run_id` of `thread_id` at once, as LangGraph's server does: its running
    /// tasks are dropped where they are (a model call's request with them) and their writes
    /// are not kept. A rollback waits for the run to stop, then takes the thread back; with
    /// `wait`, an interrupt answers once the run has stopped too.
    pub(crate) async fn cancel(
        &self,
        thread_id: &str,
        run_id: &str,
        action: Cancel,
        wait: bool,
    ) -> Result<(), RunsError> {
        // Only a run that has not ended can be cancelled: the reference answers 404 for one
        // that has (it is no longer among the runs that can be).
        if !self.get(thread_id, run_id)?.status.is_active() {
            return Err(no_run(run_id));
        }
        if self.is_api() {
            let action = match action {
                Cancel::Interrupt => "interrupt",
                Cancel::Rollback => "rollback",
            };
            return self.cancel_remote(run_id, action, wait).await;
        }
        let Some(run) = self.live(thread_id, run_id) else {
            // A run of no process now: it has ended (or waits for a process to resume it).
            if action == Cancel::Rollback {
                return Err(RunsError::Conflict(format!(
                    "run {run_id} is not running here: only a running run can be rolled back"
                )));
            }
            return Ok(());
        };
        if action == Cancel::Rollback {
            return self.stop(run, true).await;
        }
        run.stopper.cancel();
        if wait {
            run.wait_end().await;
        }
        Ok(())
    }

    /// Waits until run `run_id` of `thread_id` has ended (at once if it is not live here and
    /// not active in the store), and returns its row.
    pub(crate) async fn join(&self, thread_id: &str, run_id: &str) -> Result<crate::checkpoint::RunRow, RunsError> {
        if let Some(run) = self.joinable(thread_id, run_id).await? {
            run.wait_end().await;
        }
        self.get(thread_id, run_id)
    }

    /// Stops every active run of `thread_id` and waits for their ends (a newer run's
    /// `multitask_strategy` `interrupt` or `rollback`, a thread's deletion); with `rollback`,
    /// each is rolled back.
    pub(crate) async fn stop_thread_runs(&self, thread_id: &str, rollback: bool) -> Result<(), RunsError> {
        if self.is_api() {
            return self.stop_thread_runs_remote(thread_id, rollback).await;
        }
        let mut active: Vec<Live<S>> = lock(&self.runs)
            .values()
            .filter(|r| r.thread_id == thread_id && r.is_active())
            .cloned()
            .collect();
        // Newest first: a rollback of each goes back to where the one before it started.
        active.sort_by(|a, b| b.run_id.cmp(&a.run_id));
        for run in active {
            self.stop(run, rollback).await?;
        }
        Ok(())
    }

    /// Stops `run` and waits for its end; with `rollback`, then takes its thread back to the
    /// checkpoint it started from (with that checkpoint's writes as they were) and deletes the
    /// run.
    async fn stop(&self, run: Live<S>, rollback: bool) -> Result<(), RunsError> {
        let _one = run.stopper.one_at_a_time().await;
        run.stopper.cancel();
        run.wait_end().await;
        if !rollback {
            return Ok(());
        }
        // Rolled back by the stop before this one (a rollback forgets the run).
        if !lock(&self.runs).contains_key(&run.run_id) {
            return Ok(());
        }
        // A run cancelled while it waited for a worker never touched its thread: rolling it
        // back is forgetting it (its thread may have moved on since it was created, by the runs
        // before it).
        if !lock(&self.runs).get(&run.run_id).is_some_and(|r| r.had_worker) {
            self.store.delete_run(&run.run_id)?;
            lock(&self.runs).remove(&run.run_id);
            return Ok(());
        }
        // Through the engine, under the thread's lease like every write to a thread: a run
        // that took the thread since (one queued behind) is left alone, and a rollback whose
        // lease was taken over meanwhile writes nothing.
        let mut lease = self.settings.overrides.lease.clone();
        if let LeasePolicy::Take { wait, .. } = &mut lease {
            *wait = false;
        }
        let to = run
            .rollback_to
            .clone()
            .map(|(checkpoint_id, writes)| RollbackTo { checkpoint_id, writes });
        match Engine::rollback(&self.store, &run.thread_id, to, &lease).await {
            Ok(()) => {}
            Err(EngineError::Busy(_)) => {
                return Err(RunsError::Conflict(format!(
                    "run {} stopped, but another run took thread {} before it could be rolled back",
                    run.run_id, run.thread_id
                )));
            }
            Err(e) => return Err(e.into()),
        }
        // The run made the thread's first checkpoint: the API's record of the thread (its
        // metadata) stays, as a thread created and never run.
        self.store.delete_run(&run.run_id)?;
        lock(&self.runs).remove(&run.run_id);
        Ok(())
    }
}

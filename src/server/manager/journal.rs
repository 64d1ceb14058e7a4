//! A claimed run's event log, kept with its commits: the [`Journal`] a worker of a shared
//! database gives the engine of each run it claims. Every event the run sends is recorded here
//! as it is sent; the run's commits go through [`RunLog::commit`], which writes the events
//! recorded so far and those that tell of the commit (a task's `node_end`, a step's
//! `step_end`) in the commit's own transaction, fenced by the claim's token. The worker writes
//! what is left between commits (tokens, custom events, a step's start) with
//! [`RunLog::flush`]. So a step whose checkpoint the thread has is told whole by the log, even
//! when its worker dies the moment after the commit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::lock;
use crate::checkpoint::queue::Logged;
use crate::checkpoint::{CheckpointError, Checkpointer, Put};
use crate::engine::events::{Envelope, Journal};

/// The log of one claimed run.
pub(crate) struct RunLog {
    store: Arc<dyn Checkpointer>,
    run_id: String,
    /// The claim's token: what fences every write to the log.
    claim: String,
    /// Recorded, not yet written: the events' bodies, in the order they were sent.
    recorded: Mutex<Vec<String>>,
    /// The sequence number the next record takes; held while one is written, so records are
    /// numbered in the order they reach the log.
    next: Mutex<u64>,
    /// The run is no longer this claim's (it was claimed again): nothing more is written.
    lost: AtomicBool,
    /// A commit is on its way from another thread ([`Journal::commit_coming`]): what is
    /// recorded waits for it rather than being written by [`RunLog::flush`].
    coming: AtomicBool,
    /// The run's first step's start was recorded ([`RunLog::start_unwritten`]).
    started: AtomicBool,
    /// The run's first step's start is among the records not yet taken for a write (set and
    /// cleared under `recorded`'s lock).
    start_unwritten: AtomicBool,
}

fn body(e: &Envelope) -> String {
    serde_json::to_string(e).unwrap_or_default()
}

impl RunLog {
    /// The log of run `run_id` under claim `claim`, its next record numbered `next`.
    pub(crate) fn new(store: Arc<dyn Checkpointer>, run_id: &str, claim: &str, next: u64) -> RunLog {
        RunLog {
            store,
            run_id: run_id.to_string(),
            claim: claim.to_string(),
            recorded: Mutex::new(Vec::new()),
            next: Mutex::new(next),
            lost: AtomicBool::new(false),
            coming: AtomicBool::new(false),
            started: AtomicBool::new(false),
            start_unwritten: AtomicBool::new(false),
        }
    }

    /// The sequence number the next record takes.
    pub(crate) fn next(&self) -> u64 {
        *lock(&self.next)
    }

    /// Whether the run's first step's start is recorded and not yet taken by a write or a
    /// commit (one that failed does not give it back: the next carries it all the same).
    pub(crate) fn start_unwritten(&self) -> bool {
        self.start_unwritten.load(Ordering::SeqCst)
    }

    /// Takes every record not yet written.
    fn take(&self) -> Vec<String> {
        let mut recorded = lock(&self.recorded);
        self.start_unwritten.store(false, Ordering::SeqCst);
        std::mem::take(&mut *recorded)
    }

    /// Drops every record not yet written: the run is handed back, not ended, and the worker
    /// that goes on with it tells its own.
    pub(crate) fn discard(&self) {
        drop(self.take());
    }

    /// Whether the run was found to be another claim's.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Writes what was recorded since the last write (unless a commit on its way will).
    /// `Ok(false)`: the run is no longer this claim's, and nothing was written.
    pub(crate) fn flush(&self) -> Result<bool, CheckpointError> {
        let mut next = lock(&self.next);
        if self.is_lost() {
            return Ok(false);
        }
        if self.coming.load(Ordering::SeqCst) {
            return Ok(true);
        }
        let bodies = self.take();
        if bodies.is_empty() {
            return Ok(true);
        }
        let queue = self.queue()?;
        match queue.append(&self.run_id, &self.claim, *next, &bodies) {
            Ok(true) => {
                *next += bodies.len() as u64;
                Ok(true)
            }
            Ok(false) => {
                self.lost.store(true, Ordering::SeqCst);
                Ok(false)
            }
            Err(e) => {
                self.put_back(bodies);
                Err(e)
            }
        }
    }

    fn queue(&self) -> Result<&dyn crate::checkpoint::queue::RunQueue, CheckpointError> {
        self.store
            .queue()
            .ok_or_else(|| CheckpointError::Backend("a run's log needs a database many processes share".into()))
    }

    /// Records taken for a write that failed go back before those recorded meanwhile.
    fn put_back(&self, mut bodies: Vec<String>) {
        let mut recorded = lock(&self.recorded);
        bodies.append(&mut recorded);
        *recorded = bodies;
    }
}

impl Journal for RunLog {
    fn record(&self, envelope: &Envelope) {
        let mut recorded = lock(&self.recorded);
        recorded.push(body(envelope));
        if envelope.ns.is_none()
            && matches!(envelope.event, crate::engine::events::Event::StepStart { .. })
            && !self.started.swap(true, Ordering::SeqCst)
        {
            self.start_unwritten.store(true, Ordering::SeqCst);
        }
    }

    fn commit_coming(&self) {
        self.coming.store(true, Ordering::SeqCst);
    }

    fn commit(&self, puts: Vec<Put>, synced: bool, told: &[Envelope]) -> Result<bool, CheckpointError> {
        let mut next = lock(&self.next);
        let mut bodies = self.take();
        // Taken: what is recorded from here on is anyone's to write.
        self.coming.store(false, Ordering::SeqCst);
        let recorded = bodies.len();
        bodies.extend(told.iter().map(body));
        let queue = self.queue()?;
        let log = Logged {
            run_id: &self.run_id,
            claim: &self.claim,
            from: *next,
            bodies: &bodies,
        };
        match queue.commit_logged(puts, synced, log) {
            Ok(durable) => {
                *next += bodies.len() as u64;
                Ok(durable)
            }
            Err(e) => {
                // What tells of the commit goes with it; what was sent before stays to be written.
                bodies.truncate(recorded);
                self.put_back(bodies);
                Err(e)
            }
        }
    }
}

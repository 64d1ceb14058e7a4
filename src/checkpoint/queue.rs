//! The run queue of a database many processes share: runs admitted to their thread one at a
//! time whichever process asks, claimed by one worker each, their events logged for readers on
//! any process, cancelled from anywhere, and taken over when their worker dies.
//!
//! A backend that can be shared (PostgreSQL) offers it through
//! [`super::Checkpointer::queue`]; an embedded one (SQLite, memory) has one process, whose run
//! manager keeps its line in memory.
//!
//! The rules, which the backend keeps in its transactions:
//! - Admission is atomic per thread: of two processes admitting `reject` runs to an idle
//!   thread at once, one succeeds.
//! - A worker claims only the runs of the workflows it serves (by their assistants' ids); a
//!   run no worker serves waits for one that does.
//! - A thread's runs execute one at a time, oldest first: only a thread's oldest active run is
//!   claimable, and only while no live lease holds the thread (a CLI run, say). Pending runs
//!   are claimed oldest first, before runs taken over from a worker that died.
//! - A claim takes the run (its row locked, others skipped) and its thread's lease in one
//!   transaction; the run's row names its worker.
//! - A worker is alive while its heartbeat row is fresh, by the database's clock. A running run
//!   whose worker is not, and whose thread's lease has expired, is claimable again: another
//!   worker resumes it from its last checkpoint.
//! - A run's events, its end and its release are written under its claim: each claim has a
//!   token of its own (its lease's owner), so a write from a claim the run no longer has — its
//!   worker taken for dead and the run claimed again, even by the same worker — is refused, and
//!   that execution stops.

use serde_json::Value;

use super::runs::{RunRow, RunStatus, ThreadMeta};
use super::{Lease, LeaseClaim, Put, Result};

/// A run a worker claimed: its row, its thread's lease (taken in the same transaction), and
/// whether a worker that died had it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub run: RunRow,
    pub lease: Lease,
    pub orphaned: bool,
    /// The sequence number its next event takes.
    pub next_event: u64,
    /// Its thread as read right after the claim, under the lease it took (`None`: not read).
    pub view: Option<Box<super::ThreadView>>,
}

/// The thread's record an admission writes when its caller did not read it (see
/// [`RunQueue::admit_stamped`]).
#[derive(Debug, Clone)]
pub struct Stamp {
    /// Set over the metadata of the record the thread has.
    pub keys: serde_json::Map<String, Value>,
    /// The record of a thread that has none.
    pub new: ThreadMeta,
    /// Whether a thread that does not exist at all may be created.
    pub create: bool,
    /// Now, milliseconds since the epoch: when the record's time to live starts again.
    pub now_ms: i64,
}

/// What an admission did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Admitted,
    /// Refused: the thread has an active run (`reject_if_busy`).
    Busy,
    /// Refused: the thread does not exist and may not be created.
    NoThread,
}

/// A run's end, as its worker records it.
#[derive(Debug, Clone, Copy)]
pub struct Ended<'a> {
    pub status: RunStatus,
    pub error: Option<&'a Value>,
    pub at: &'a str,
    /// The end's record in the run's log: its sequence number and body.
    pub record: Option<(u64, &'a str)>,
}

/// Records appended to a run's log under its claim (see [`RunQueue::append`]).
#[derive(Debug, Clone, Copy)]
pub struct Logged<'a> {
    pub run_id: &'a str,
    /// The claim's token.
    pub claim: &'a str,
    /// The sequence number of the first record.
    pub from: u64,
    pub bodies: &'a [String],
}

/// How deep the queue is, across every process of the database: what an operator scales
/// workers by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Depth {
    /// Runs admitted and not yet claimed (waiting for a worker, or for their thread's earlier
    /// run).
    pub pending: u64,
    /// Runs a worker holds.
    pub running: u64,
    /// How long the oldest pending run a worker could take now (its thread's oldest active
    /// run, the thread held by no lease) has waited since it was created, in milliseconds.
    pub oldest_pending_ms: Option<u64>,
    /// Workers whose heartbeat is fresh, by the database's clock.
    pub workers: u64,
}

/// What a process is told by the others, through the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A run was admitted: a worker may claim it.
    Queued,
    /// Run `0` logged events; with the records themselves when they are few and short enough
    /// to travel with the notice (a reader then need not read them from the log).
    Events(String, Option<std::sync::Arc<Records>>),
    /// Run `0` is asked to stop.
    Cancel(String),
    /// Run `0` ended.
    Ended(String),
    /// The notifications may have missed some: look at everything again.
    Lagged,
}

/// Records a notice carries: the bodies of a run's log from sequence number `from` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Records {
    pub from: u64,
    pub bodies: Vec<String>,
}

/// The queue a shared database keeps. Calls block, as the [`super::Checkpointer`]'s do.
pub trait RunQueue: Send + Sync {
    /// Writes `run` (`pending`) and, when given, its thread's record `thread`, unless
    /// `reject_if_busy` and its thread has an active run: `false` then, and nothing is written.
    /// Atomic per thread across processes.
    fn admit(&self, run: &RunRow, reject_if_busy: bool, thread: Option<&ThreadMeta>) -> Result<bool>;

    /// [`RunQueue::admit`], with the thread's record as the admission finds it, stamped: the
    /// stamp's keys set over its metadata, updated now, its time to live started again; a
    /// thread with no record gets `stamp.new`, and one that does not exist at all is refused
    /// unless `stamp.create`. Read, stamped and written under the admission's lock.
    fn admit_stamped(&self, run: &RunRow, reject_if_busy: bool, stamp: &Stamp) -> Result<Admission>;

    /// Claims the oldest claimable pending run for `worker` (none: the oldest run a dead worker
    /// left or a stopping one handed back), taking its thread's lease as `claim`
    /// says (its `thread_id` is filled in here). `None`: nothing to claim.
    fn claim(&self, worker: &str, claim: &LeaseClaim) -> Result<Option<Claimed>> {
        self.claim_serving(worker, claim, None)
    }

    /// [`RunQueue::claim`], of the runs whose assistant is one of `assistants` only (`None`:
    /// any): a worker claims the runs of the workflows it serves, and leaves the others for a
    /// worker that serves them.
    fn claim_serving(&self, worker: &str, claim: &LeaseClaim, assistants: Option<&[String]>)
    -> Result<Option<Claimed>>;

    /// Registers or renews `worker`'s heartbeat for `ttl`, by the database's clock.
    fn heartbeat(&self, worker: &str, ttl: std::time::Duration) -> Result<()>;

    /// Removes `worker`'s heartbeat (it stopped cleanly: its runs ended or were handed back).
    fn retire(&self, worker: &str) -> Result<()>;

    /// Hands a run stopped without ending back to the queue (if it is still claim `claim`'s), to be claimed again at
    /// once (a worker draining on shutdown).
    fn release(&self, run_id: &str, claim: &str) -> Result<()>;

    /// Asks run `run_id` to stop (`action`: `interrupt` or `rollback`). A pending run nobody
    /// claimed ends at once, `interrupted`: `true` then.
    fn cancel(&self, run_id: &str, action: &str) -> Result<bool>;

    /// What stop was asked of run `run_id`, if any.
    fn cancel_asked(&self, run_id: &str) -> Result<Option<String>> {
        Ok(self
            .cancels_asked(&[run_id.to_owned()])?
            .into_iter()
            .next()
            .map(|(_, action)| action))
    }

    /// The runs of `run_ids` a stop was asked of, each with its action: one look for many.
    fn cancels_asked(&self, run_ids: &[String]) -> Result<Vec<(String, String)>>;

    /// Appends events `bodies` to run `run_id`'s log from sequence number `from`, unless the
    /// run is no longer claim `claim`'s: `false` then.
    fn append(&self, run_id: &str, claim: &str, from: u64, bodies: &[String]) -> Result<bool>;

    /// Applies `puts` as [`super::Checkpointer::put_batch`] does (`synced` false: as
    /// `put_batch_unsynced`, whose answer it gives) and appends `log`'s records to its run's log,
    /// in one transaction: a run's events are durable with the commit they tell of. A run that
    /// is no longer `log.claim`'s refuses the whole commit with
    /// [`super::CheckpointError::LeaseLost`].
    fn commit_logged(&self, puts: Vec<Put>, synced: bool, log: Logged<'_>) -> Result<bool>;

    /// Run `run_id`'s logged events after sequence number `after`, in order, at most `limit`.
    fn events(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<(u64, String)>>;

    /// Records run `run_id`'s end, if it is still claim `claim`'s (or, `claim` a worker's id, if
    /// that worker has it: a cancel it was asked and could not do): its status and error, and the
    /// last event of its log, `end` (its sequence number and body), in one transaction — a
    /// reader that sees the run ended finds its end logged.
    fn finish(&self, run_id: &str, claim: &str, end: Ended<'_>) -> Result<()>;

    /// How deep the queue is now. Asked once, not retried: a database that cannot be reached
    /// says so at once.
    fn depth(&self) -> Result<Depth>;

    /// The notices of every process, from now on: admissions, cancels and ends, and with
    /// `events` the runs' events too (a reader's; a worker needs none of them). The receiver
    /// lags (and is told so by [`Notice::Lagged`]) rather than slowing the sender.
    fn subscribe(&self, events: bool) -> Result<tokio::sync::broadcast::Receiver<Notice>>;
}

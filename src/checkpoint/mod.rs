//! Stage 4: durable state. A thread is one conversation or job; each superstep of a run on it
//! ends in a [`Checkpoint`]. State values are stored per key and version: a key's value is
//! written only when its version changes, so a thread grows with what changed, not with
//! steps × state size (LangGraph's SqliteSaver re-serializes the whole state every step).
//!
//! Each task's writes are stored the moment the task finishes ([`PendingWrite`]s against the
//! checkpoint its step started from), so a crash mid-step never re-runs a finished task.
//!
//! A thread has one owner at a time: a [`Lease`] (owner id, process, host, expiry) taken with
//! one atomic upsert before anything runs on the thread, renewed while the run goes on, and
//! released at its end. Each acquisition has a generation; the owner presents it as a
//! [`Fence`] with its writes ([`Put::Fence`]), and a backend refuses a batch whose fence no
//! longer matches the lease, so a process that lost its lease cannot write any more.
//!
//! The format is shared by every backend: this module, `format.rs` (rows, encoding, the ops a
//! batch becomes and the rules for applying them), [`blobs`], [`runs`], [`cache`] and
//! [`crons`]; none
//! names a backend. A backend ([`sqlite`], [`memory`]) adds its SQL, connections and
//! transactions, and owns its I/O: the trait is synchronous, and a call is a send to the
//! backend's own thread (or runtime) and a wait for its answer.
//!
//! Architecture Invariant: checkpoint/ knows nothing of the engine, plans or providers; it
//! stores JSON by thread, checkpoint, key and version.

pub mod blobs;
pub mod cache;
pub mod crons;
mod format;
pub mod memory;
pub mod postgres;
pub mod queue;
pub mod runs;
pub mod sqlite;
pub mod users;

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use cache::{CacheEntry, CacheHead, CacheStore};
pub use crons::{Attempt, CronRow, CronStore, Delivery, DeliveryState};
pub use runs::{RunRow, RunStatus, RunStore, ThreadMeta, ThreadTtl, TraceRow};
pub use users::{ApiKey, QuotaLimits, QuotaUse, UserStore};

/// A thread's identity and what it was started with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Thread {
    pub thread_id: String,
    /// The workflow file the thread runs (as given when it was created).
    pub workflow: String,
    /// The plan hash of the workflow when the thread was created.
    pub plan_hash: String,
    /// The run input.
    pub input: Value,
    /// The run context (e.g. `user_id`).
    pub context: Value,
    /// The config overrides the thread was started with (`--set`).
    pub config: Value,
    /// Where the thread stands.
    pub status: ThreadStatus,
    /// RFC 3339 UTC.
    pub created_at: String,
    pub updated_at: String,
    /// When this thread was forked from another: `(thread_id, checkpoint_id)`.
    pub forked_from: Option<(String, String)>,
}

/// What a listing of threads shows: a [`Thread`] without what it was started with (an input
/// may be large, and a listing needs none of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadHead {
    pub thread_id: String,
    pub workflow: String,
    pub status: ThreadStatus,
    pub created_at: String,
    pub updated_at: String,
}

impl From<Thread> for ThreadHead {
    fn from(t: Thread) -> Self {
        ThreadHead {
            thread_id: t.thread_id,
            workflow: t.workflow,
            status: t.status,
            created_at: t.created_at,
            updated_at: t.updated_at,
        }
    }
}

/// Where a thread stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThreadStatus {
    /// A run is on it or was cut off (a crash): it can be continued.
    Running,
    /// Waiting at an interrupt for an answer.
    Interrupted,
    /// Finished: nothing left to run.
    Done,
    /// The last step failed; the last checkpoint is intact and resumable.
    Failed,
}

impl ThreadStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadStatus::Running => "running",
            ThreadStatus::Interrupted => "interrupted",
            ThreadStatus::Done => "done",
            ThreadStatus::Failed => "failed",
        }
    }
}

/// A task scheduled for the next superstep: a node, and its fan-out item if it has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// Deterministic: the same checkpoint schedules the same task ids.
    pub task_id: String,
    pub node: String,
    /// The fan-out item, for `send` targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<Value>,
}

/// The durable result of one superstep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Unique and increasing within a thread (UUIDv7).
    pub checkpoint_id: String,
    pub thread_id: String,
    pub parent_id: Option<String>,
    /// The superstep that produced it; the initial checkpoint (defaults, before any node) is -1.
    pub step: i64,
    /// Every state key's current version; the value of a key is stored once per version.
    pub versions: BTreeMap<String, u64>,
    /// Nodes that ran in the step that produced this checkpoint, in plan order.
    pub ran: Vec<String>,
    /// Keys whose version changed in that step.
    pub changed: Vec<String>,
    /// What runs next. Empty when the thread is done.
    pub next: Vec<TaskSpec>,
    /// The engine's own bookkeeping (join barriers, visit counts, pending interrupt), opaque here.
    pub meta: Value,
    pub plan_hash: String,
    /// RFC 3339 UTC.
    pub created_at: String,
}

/// One write a finished task made: to a state key, or an engine record (`kind` says which).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingWrite {
    pub task_id: String,
    /// Order of the write within its task.
    pub idx: u32,
    /// A state key, or an engine channel such as `__goto__`, `__error__`, `__interrupt__`.
    pub channel: String,
    pub value: Value,
}

/// One put of [`Checkpointer::put_batch`].
#[derive(Debug, Clone)]
pub enum Put {
    /// Refuses the whole batch with [`CheckpointError::LeaseLost`] unless the lease it names is
    /// still held by that owner at that generation. Checked where it stands in the batch, so it
    /// goes first.
    Fence(Fence),
    /// Creates a thread, as [`Checkpointer::create_thread`].
    Thread(Box<Thread>),
    /// Sets a thread's status, as [`Checkpointer::set_status`].
    Status {
        thread_id: String,
        status: ThreadStatus,
    },
    Checkpoint(Arc<Checkpoint>, Vec<(String, u64, Value)>),
    Writes {
        thread_id: String,
        checkpoint_id: String,
        writes: Vec<PendingWrite>,
    },
    /// Takes a thread back to its checkpoint `to` (a run rolled back): the checkpoints newer
    /// than `to` are deleted with their writes and the values they introduced, and so are the
    /// writes stored against `to` (a `Writes` put after it stores those it should keep).
    Truncate {
        thread_id: String,
        to: String,
    },
    /// Deletes a thread with its checkpoints, values and writes, as
    /// [`Checkpointer::delete_thread`].
    Delete(String),
}

/// Storage errors. Backends map their own errors into these.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("thread `{0}` does not exist")]
    NoThread(String),
    #[error("checkpoint `{1}` does not exist on thread `{0}`")]
    NoCheckpoint(String, String),
    #[error("thread `{0}` already exists")]
    ThreadExists(String),
    #[error("the checkpoint store failed: {0}")]
    Backend(String),
    /// The database could not be reached, or dropped the connection (a network database
    /// restarting, a connection terminated): the same call may succeed when tried again.
    #[error("the checkpoint database cannot be reached: {0}")]
    Unavailable(String),
    #[error("a stored value is corrupt: {0}")]
    Corrupt(String),
    /// Another owner holds the thread's lease, and it has not expired.
    #[error("{0}")]
    Leased(Box<Lease>),
    /// The lease a write was fenced with is no longer held by its owner (it expired and another
    /// owner took it): the write was refused.
    #[error(
        "the lease on thread `{0}` was lost (it expired and another process took the thread over); this run stopped writing"
    )]
    LeaseLost(String),
}

/// Who runs a thread. A lease row may exist for a thread id that has no thread row yet: the
/// lease is taken before the thread is created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub thread_id: String,
    /// Unique per run attempt (a UUIDv7).
    pub owner: String,
    /// Bumped each time the lease changes owner: the fence number of this acquisition.
    pub generation: u64,
    pub pid: u32,
    pub host: String,
    /// RFC 3339 UTC.
    pub acquired_at: String,
    /// Milliseconds since the Unix epoch; once passed, another owner may take the lease.
    pub expires_at_ms: i64,
}

impl Lease {
    /// Whether the lease still excludes other owners at `now_ms`.
    pub fn is_live(&self, now_ms: i64) -> bool {
        self.expires_at_ms > now_ms
    }

    /// What a holder presents with its writes.
    pub fn fence(&self) -> Fence {
        Fence {
            thread_id: self.thread_id.clone(),
            owner: self.owner.clone(),
            generation: self.generation,
        }
    }
}

impl std::fmt::Display for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "thread {} is running in process {} on host {} since {}",
            self.thread_id, self.pid, self.host, self.acquired_at
        )
    }
}

/// A request for a thread's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    pub thread_id: String,
    pub owner: String,
    pub pid: u32,
    pub host: String,
    /// How long the lease lasts without a renewal.
    pub ttl: std::time::Duration,
    /// Take the lease over from this owner even though it has not expired (its process is
    /// known to be gone). Only that owner: if another took it meanwhile, the claim fails.
    pub replace: Option<String>,
}

/// Proof of holding a lease: the leased thread, the owner and the generation it acquired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    pub thread_id: String,
    pub owner: String,
    pub generation: u64,
}

pub type Result<T> = std::result::Result<T, CheckpointError>;

/// What a thread's removal asks of the thread besides being free (see
/// [`Checkpointer::remove_thread`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removal {
    /// Only if its time to live ran out by then (milliseconds since the epoch; the API's record
    /// of it holds the expiry): the TTL sweeper's.
    pub expired_by: Option<i64>,
    /// Only if neither the thread, nor the API's record of it, nor any of its runs changed
    /// since then (RFC 3339): a prune's, and the TTL sweeper's (a thread is swept once idle for
    /// its time to live).
    pub idle_before: Option<String>,
}

impl Removal {
    /// Whether a thread meets the removal's conditions: `thread` is when it was last updated,
    /// `meta` the API's record of it, `run` when one of its runs was last updated.
    pub fn allows(&self, thread: Option<&str>, meta: Option<&ThreadMeta>, run: Option<&str>) -> bool {
        if let Some(by) = self.expired_by
            && meta.and_then(|m| m.ttl.as_ref()).is_none_or(|t| t.expires_at_ms > by)
        {
            return false;
        }
        match &self.idle_before {
            None => true,
            Some(cutoff) => {
                let mut times = thread.into_iter().chain(meta.map(|m| m.updated_at.as_str())).chain(run);
                times.all(|t| t < cutoff.as_str())
            }
        }
    }
}

/// What a thread's removal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// The thread is gone with everything of it.
    Removed,
    /// There is no such thread.
    Missing,
    /// A live lease holds it, or one of its runs is active: nothing was removed. Says which.
    Busy(String),
    /// It does not meet the removal's conditions (its time to live was extended, or it changed
    /// since): nothing was removed.
    Kept,
}

/// How hard a backend works to keep a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Survives a killed process (SQLite WAL + synchronous=NORMAL). The default.
    #[default]
    CrashSafe,
    /// Survives power loss (synchronous=FULL): at most one fsync per superstep.
    PowerSafe,
}

/// A thread, its latest checkpoint and its record, as [`Checkpointer::thread_view`] reads them.
#[derive(Debug, Clone, Default)]
pub struct ThreadView {
    pub thread: Option<Thread>,
    pub head: Option<Checkpoint>,
    pub meta: Option<runs::ThreadMeta>,
}

/// Where checkpoints are kept. Every method is durable (per the backend's [`Durability`]) when
/// it returns. Implementations are shared between tasks and threads.
///
/// The conformance suite in `tests/checkpoint.rs` runs against every implementation.
pub trait Checkpointer: runs::RunStore + cache::CacheStore + crons::CronStore + users::UserStore + Send + Sync {
    /// Creates a thread. Fails with [`CheckpointError::ThreadExists`] if it exists.
    fn create_thread(&self, thread: &Thread) -> Result<()>;

    /// Updates a thread's status and `updated_at`.
    fn set_status(&self, thread_id: &str, status: ThreadStatus) -> Result<()>;

    fn get_thread(&self, thread_id: &str) -> Result<Option<Thread>>;

    /// Every thread, most recently updated first.
    fn list_threads(&self) -> Result<Vec<Thread>>;

    /// [`Checkpointer::list_threads`] without inputs, contexts and configs (`runner threads`):
    /// a backend that stores them apart reads none of them.
    fn list_thread_heads(&self) -> Result<Vec<ThreadHead>> {
        Ok(self.list_threads()?.into_iter().map(ThreadHead::from).collect())
    }

    /// Stores a checkpoint and the values of the keys whose version it introduces
    /// (`(key, version, value)`), atomically. A value may be an [`extension`] of an earlier
    /// version of the same key.
    fn put_checkpoint(&self, checkpoint: &Checkpoint, values: &[(String, u64, Value)]) -> Result<()>;

    /// The checkpoint `checkpoint_id`, or the thread's latest when `None`; `None` also when the
    /// thread does not exist.
    fn get_checkpoint(&self, thread_id: &str, checkpoint_id: Option<&str>) -> Result<Option<Checkpoint>>;

    /// A thread and its latest checkpoint, read together: what a run opening the thread looks
    /// at. A network database answers both in one round trip.
    fn thread_and_head(&self, thread_id: &str) -> Result<(Option<Thread>, Option<Checkpoint>)> {
        match self.get_thread(thread_id)? {
            Some(thread) => Ok((Some(thread), self.get_checkpoint(thread_id, None)?)),
            None => Ok((None, None)),
        }
    }

    /// A thread, its latest checkpoint and its record ([`RunStore::get_thread_meta`]), read
    /// together: what a run starting on the thread looks at first. A network database answers
    /// all three in one round trip.
    fn thread_view(&self, thread_id: &str) -> Result<ThreadView> {
        let (thread, head) = self.thread_and_head(thread_id)?;
        Ok(ThreadView {
            thread,
            head,
            meta: self.get_thread_meta(thread_id)?,
        })
    }

    /// A checkpoint (the thread's latest when `None`) and the state at it, read together:
    /// what a run's reader shows first. A network database answers both in one round trip.
    fn checkpoint_state(
        &self,
        thread_id: &str,
        checkpoint_id: Option<&str>,
    ) -> Result<Option<(Checkpoint, Map<String, Value>)>> {
        let Some(cp) = self.get_checkpoint(thread_id, checkpoint_id)? else {
            return Ok(None);
        };
        let state = self.state(thread_id, &cp.versions)?;
        Ok(Some((cp, state)))
    }

    /// Every checkpoint of a thread, newest first.
    fn history(&self, thread_id: &str) -> Result<Vec<Checkpoint>>;

    /// The state at a checkpoint: each key's value at its version, extensions resolved.
    fn state(&self, thread_id: &str, versions: &BTreeMap<String, u64>) -> Result<Map<String, Value>>;

    /// One key's value at `version`, extensions resolved, reading nothing of the other keys
    /// (`runner state --key`).
    fn value(&self, thread_id: &str, key: &str, version: u64) -> Result<Value> {
        let mut one = self.state(thread_id, &BTreeMap::from([(key.to_owned(), version)]))?;
        one.remove(key)
            .ok_or_else(|| CheckpointError::Corrupt(format!("no value for `{key}` at version {version}")))
    }

    /// Stores a finished task's writes against the checkpoint its step started from.
    fn put_writes(&self, thread_id: &str, checkpoint_id: &str, writes: &[PendingWrite]) -> Result<()>;

    /// The writes stored against a checkpoint, in (task, idx) order.
    fn get_writes(&self, thread_id: &str, checkpoint_id: &str) -> Result<Vec<PendingWrite>>;

    /// Deletes a thread with its checkpoints, values and writes.
    fn delete_thread(&self, thread_id: &str) -> Result<()>;

    /// Removes a thread whole — its checkpoints, values, writes and long strings, its
    /// subgraphs' threads (`<id>/…`), the API's record of it, its runs and their logs, the crons
    /// that run on it — under
    /// its lease, taken for `claim` (its `thread_id` filled in here) before anything is
    /// removed: a thread a live lease of another holds, or one of whose runs is active (pending
    /// or running), is [`Removed::Busy`] and stays whole, and no run takes it while it goes
    /// (`claim.replace` names a holder known to be gone, whose lease is taken over at once).
    /// `removal` says what else it must meet. A backend many processes share does it in one
    /// transaction.
    fn remove_thread(&self, thread_id: &str, removal: &Removal, claim: &LeaseClaim) -> Result<Removed> {
        let thread = self.get_thread(thread_id)?;
        let meta = self.get_thread_meta(thread_id)?;
        if thread.is_none() && meta.is_none() && self.list_runs(Some(thread_id), &[])?.is_empty() {
            return Ok(Removed::Missing);
        }
        let lease = match self.acquire_lease(&LeaseClaim {
            thread_id: thread_id.to_owned(),
            ..claim.clone()
        }) {
            Ok(lease) => lease,
            Err(CheckpointError::Leased(holder)) => return Ok(Removed::Busy(holder.to_string())),
            Err(e) => return Err(e),
        };
        // Under the lease: no run starts on the thread while it is looked at and removed.
        let removed = (|| {
            let runs = self.list_runs(Some(thread_id), &[])?;
            if let Some(active) = runs.iter().find(|r| r.status.is_active()) {
                return Ok(Removed::Busy(format!(
                    "run {} on it is {}",
                    active.run_id,
                    active.status.as_str()
                )));
            }
            let updated = thread.as_ref().map(|t| t.updated_at.as_str());
            let run = runs.iter().map(|r| r.updated_at.as_str()).max();
            if !removal.allows(updated, meta.as_ref(), run) {
                return Ok(Removed::Kept);
            }
            let nested = format!("{thread_id}/");
            let mut puts = vec![Put::Fence(lease.fence())];
            puts.extend(
                self.list_thread_heads()?
                    .into_iter()
                    .filter(|t| t.thread_id.starts_with(&nested))
                    .map(|t| Put::Delete(t.thread_id)),
            );
            if thread.is_some() {
                puts.push(Put::Delete(thread_id.to_owned()));
            }
            self.put_batch(puts)?;
            self.delete_thread_meta(thread_id)?;
            Ok(Removed::Removed)
        })();
        // A lease left behind expires; the thread it named is gone.
        let _ = self.release_lease(&lease.fence());
        removed
    }

    /// Like [`Checkpointer::put_batch`], for puts a later `put_batch` will make durable: the
    /// backend may commit them without waiting for the disk (SQLite power-safe: no fsync; the
    /// next synced commit's fsync covers them). They survive a crash of the process at once.
    /// Returns whether they are already as durable as the store promises.
    fn put_batch_unsynced(&self, puts: Vec<Put>) -> Result<bool> {
        self.put_batch(puts).map(|()| true)
    }

    /// Several puts, in order, committed together where the backend can (SQLite: one
    /// transaction, so one fsync at most however many steps they hold).
    fn put_batch(&self, puts: Vec<Put>) -> Result<()>;

    /// Creates a thread with its first checkpoint, atomically: a crash leaves both or neither.
    /// `fence`, when given, must hold (see [`Put::Fence`]).
    fn create_thread_with_checkpoint(
        &self,
        fence: Option<&Fence>,
        thread: &Thread,
        checkpoint: &Checkpoint,
        values: Vec<(String, u64, Value)>,
    ) -> Result<()> {
        let mut puts = Vec::with_capacity(3);
        puts.extend(fence.cloned().map(Put::Fence));
        puts.push(Put::Thread(Box::new(thread.clone())));
        puts.push(Put::Checkpoint(Arc::new(checkpoint.clone()), values));
        self.put_batch(puts)
    }

    /// Takes the thread's lease for `claim.owner`, atomically: granted when there is none, when
    /// it has expired, when it is already this owner's (then only its expiry moves), or when it
    /// is `claim.replace`'s. Otherwise fails with [`CheckpointError::Leased`] naming the holder.
    fn acquire_lease(&self, claim: &LeaseClaim) -> Result<Lease>;

    /// Extends a held lease by `ttl` from now. Fails with [`CheckpointError::LeaseLost`] when
    /// the lease is no longer `fence`'s (an expired lease nobody took is still renewed).
    fn renew_lease(&self, fence: &Fence, ttl: std::time::Duration) -> Result<Lease>;

    /// Gives a lease up; nothing happens when it is no longer `fence`'s.
    fn release_lease(&self, fence: &Fence) -> Result<()>;

    /// The thread's lease row, live or expired, if there is one.
    fn lease(&self, thread_id: &str) -> Result<Option<Lease>>;

    /// Copies thread `from` whole as thread `new` (LangGraph's thread copy): its record, every
    /// checkpoint (same ids, same parents), every value and every record of finished and
    /// stopped tasks, in one batch. Values are copied resolved, so nothing of `new` refers back
    /// to `from`. Fails with [`CheckpointError::ThreadExists`] when `new` exists. `fence`, when
    /// given, must hold (see [`Put::Fence`]): the copy is written under `new`'s lease.
    fn copy_thread(&self, from: &str, new: &str, fence: Option<&Fence>) -> Result<Thread> {
        let mut thread = self
            .get_thread(from)?
            .ok_or_else(|| CheckpointError::NoThread(from.into()))?;
        let at = crate::clock::now();
        thread.thread_id = new.into();
        thread.created_at = at.clone();
        thread.updated_at = at;
        let mut puts: Vec<Put> = fence.cloned().map(Put::Fence).into_iter().collect();
        puts.push(Put::Thread(Box::new(thread.clone())));
        let mut stored: std::collections::HashSet<(String, u64)> = std::collections::HashSet::new();
        let mut history = self.history(from)?;
        history.reverse();
        for cp in history {
            let mut values = Vec::new();
            for (key, &version) in &cp.versions {
                if stored.insert((key.clone(), version)) {
                    values.push((key.clone(), version, self.value(from, key, version)?));
                }
            }
            let writes = self.get_writes(from, &cp.checkpoint_id)?;
            let copy = Checkpoint {
                thread_id: new.into(),
                ..cp
            };
            if !writes.is_empty() {
                puts.push(Put::Checkpoint(Arc::new(copy.clone()), values));
                puts.push(Put::Writes {
                    thread_id: new.into(),
                    checkpoint_id: copy.checkpoint_id.clone(),
                    writes,
                });
            } else {
                puts.push(Put::Checkpoint(Arc::new(copy), values));
            }
        }
        self.put_batch(puts)?;
        Ok(thread)
    }

    /// Starts thread `new` from `checkpoint_id` of `from` (time travel): `new` gets a copy of
    /// that checkpoint (same versions and values, no parent, a new id) and of `from`'s thread
    /// record with `forked_from` set. Values are copied resolved (no extension refers back to
    /// the original thread). The original thread is unchanged.
    fn fork(&self, from: &str, checkpoint_id: &str, new: &str) -> Result<Checkpoint>;

    /// Whether the store answers: one read (a health check).
    fn ping(&self) -> Result<()> {
        self.get_thread("").map(|_| ())
    }

    /// The run queue, when the store is a database many processes share (see [`queue`]);
    /// `None` for a store of one process, whose run manager keeps its line in memory.
    fn queue(&self) -> Option<&dyn queue::RunQueue> {
        None
    }
}

thread_local! {
    static ONE_TRY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes `call` with a network database's calls tried once when it cannot be reached
/// ([`CheckpointError::Unavailable`] at once), not again and again for the URL's `retry_for`:
/// for a caller that tries again itself, pausing without holding a thread meanwhile (a
/// stream's reader waiting out an outage, one of many).
pub fn trying_once<T>(call: impl FnOnce() -> T) -> T {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            ONE_TRY.set(self.0);
        }
    }
    let _reset = Reset(ONE_TRY.replace(true));
    call()
}

/// Whether the calls made now are tried once ([`trying_once`]).
pub fn tried_once() -> bool {
    ONE_TRY.get()
}

/// Whether `fence` still matches the lease row `held`.
pub fn check_fence(held: Option<&Lease>, fence: &Fence) -> Result<()> {
    match held {
        Some(l) if l.owner == fence.owner && l.generation == fence.generation => Ok(()),
        _ => Err(CheckpointError::LeaseLost(fence.thread_id.clone())),
    }
}

/// `now + ttl` in milliseconds, saturating.
pub fn expiry_ms(now: i64, ttl: std::time::Duration) -> i64 {
    now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))
}

/// The key of a stored value that extends the same key's value at an earlier version:
/// `{"$runner_extends": base_version, "items": [...]}`. Append-only keys store only what a
/// step adds, so a thread grows with what changed, not with steps × the key's size.
pub const EXTENDS: &str = "$runner_extends";

/// A stored value holding only the items added to the value at version `base`.
pub fn extension(base: u64, items: Vec<Value>) -> Value {
    let mut m = Map::new();
    m.insert(EXTENDS.into(), Value::from(base));
    m.insert("items".into(), Value::Array(items));
    Value::Object(m)
}

/// The base version and items of an extension, if `v` is one.
pub fn as_extension(v: &Value) -> Option<(u64, &Vec<Value>)> {
    let m = v.as_object()?;
    if m.len() != 2 {
        return None;
    }
    Some((m.get(EXTENDS)?.as_u64()?, m.get("items")?.as_array()?))
}

/// A key's value at `version`, following extensions down to a full value. `fetch` reads the
/// stored value of one version.
pub fn resolve(key: &str, version: u64, mut fetch: impl FnMut(u64) -> Result<Value>) -> Result<Value> {
    let mut parts: Vec<Vec<Value>> = Vec::new();
    let mut v = version;
    let mut stored = fetch(v)?;
    while let Some((base, items)) = as_extension(&stored) {
        if base >= v {
            return Err(CheckpointError::Corrupt(format!(
                "`{key}` version {v} extends version {base}"
            )));
        }
        parts.push(items.clone());
        v = base;
        stored = fetch(v)?;
    }
    let Value::Array(mut full) = stored else {
        if parts.is_empty() {
            return Ok(stored);
        }
        return Err(CheckpointError::Corrupt(format!(
            "`{key}` version {v} is extended but is not an array"
        )));
    };
    for items in parts.into_iter().rev() {
        full.extend(items);
    }
    Ok(Value::Array(full))
}

/// A new time-ordered id (UUIDv7) for threads and checkpoints.
pub fn new_id() -> String {
    // Encoded straight into a buffer: `to_string` goes through `fmt`, several times the cost,
    // and every step takes an id.
    let mut buf = uuid::Uuid::encode_buffer();
    uuid::Uuid::now_v7().hyphenated().encode_lower(&mut buf).to_owned()
}

/// Fixtures for the unit tests of the stores and of what uses them.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::{Checkpoint, Thread, ThreadStatus};

    /// A running thread `thread_id` of `w.yaml`, its plan hash `plan_hash`, made `at`.
    pub(crate) fn thread(thread_id: &str, plan_hash: &str, at: &str) -> Thread {
        Thread {
            thread_id: thread_id.into(),
            workflow: "w.yaml".into(),
            plan_hash: plan_hash.into(),
            input: json!({}),
            context: json!({}),
            config: json!({}),
            status: ThreadStatus::Running,
            created_at: at.into(),
            updated_at: at.into(),
            forked_from: None,
        }
    }

    /// The input checkpoint (step -1, no values, nothing next) of a thread.
    pub(crate) fn first_checkpoint(thread_id: &str, checkpoint_id: &str, plan_hash: &str, at: &str) -> Checkpoint {
        Checkpoint {
            checkpoint_id: checkpoint_id.into(),
            thread_id: thread_id.into(),
            parent_id: None,
            step: -1,
            versions: BTreeMap::new(),
            ran: Vec::new(),
            changed: Vec::new(),
            next: Vec::new(),
            meta: json!({}),
            plan_hash: plan_hash.into(),
            created_at: at.into(),
        }
    }
}

#[cfg(test)]
mod extension_tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ids_are_hyphenated_lowercase_uuids_that_sort_by_creation() {
        let ids: Vec<String> = (0..50).map(|_| new_id()).collect();
        for id in &ids {
            let uuid = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(uuid.get_version_num(), 7, "{id}");
            assert_eq!(*id, uuid.to_string(), "{id}");
        }
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    }

    #[test]
    fn extensions_resolve_down_to_a_full_value() {
        let rows = [
            json!([1]),
            extension(1, vec![json!(2), json!(3)]),
            extension(2, vec![json!(4)]),
        ];
        let fetch = |v: u64| Ok(rows[(v - 1) as usize].clone());
        assert_eq!(resolve("k", 3, fetch).unwrap(), json!([1, 2, 3, 4]));
        assert_eq!(resolve("k", 1, fetch).unwrap(), json!([1]));
        let cyclic = |_: u64| Ok(extension(5, vec![]));
        assert!(resolve("k", 3, cyclic).is_err());
        assert_eq!(as_extension(&json!({"$runner_extends": 1, "items": [], "x": 0})), None);
    }
}

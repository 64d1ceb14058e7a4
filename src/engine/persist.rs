//! Committing a run's checkpoints and task writes per its [`Persist`] mode, always in order:
//! a write never reaches the store before the checkpoint it refers to. Every put carries the
//! run's lease [`Fence`]: a run that lost its thread's lease has its writes refused.
//!
//! Events that promise durability (a task's `node_end`, a step's `step_end`) travel with the
//! put that stores what they report and are sent once it is committed, in every mode but
//! `exit` (which promises nothing before the run's end): whoever sees a `node_end` may rely on
//! the task not running again, even after a crash. A run whose events have a [`Journal`]
//! commits through it, those events in the same transaction as what they report.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::Persist;
use super::events::{Envelope, Event, Events, Journal};
use crate::checkpoint::{self, Checkpoint, CheckpointError, Checkpointer, Fence, PendingWrite, Put};

/// Commits `puts` (`synced` false: as `put_batch_unsynced`) with `after`, the events that tell
/// of them: through the run's journal when it has one, so the events are kept in the same
/// transaction. Answers whether the commit is as durable as the store promises, and the events
/// to deliver once it is.
fn commit(
    store: &dyn Checkpointer,
    events: &Events,
    puts: Vec<Put>,
    synced: bool,
    after: Vec<Event>,
) -> Result<(bool, Vec<Envelope>), CheckpointError> {
    let after: Vec<Envelope> = after.into_iter().map(|e| events.stamp(e)).collect();
    let durable = match events.journal() {
        Some(journal) => Journal::commit(&**journal, puts, synced, &after)?,
        None if synced => {
            store.put_batch(puts)?;
            true
        }
        None => store.put_batch_unsynced(puts)?,
    };
    Ok((durable, after))
}

/// Delivers events told after a commit (and, with a journal, already recorded with it).
fn deliver(events: &Events, after: Vec<Envelope>) {
    for e in after {
        events.forward(e);
    }
}

enum Job {
    Checkpoint(Arc<Checkpoint>, Vec<(String, u64, Value)>, Vec<Event>),
    /// Finished tasks' writes (`Put::Writes` each).
    Writes(Vec<Put>, Vec<Event>),
    Flush(mpsc::Sender<()>),
}

/// `Exit`: the newest checkpoint, and per key the one value it needs stored (its version's,
/// whole or as an extension of a committed version).
type Held = (Checkpoint, BTreeMap<String, (u64, Value)>);

/// Finished tasks' writes held for one commit, the events to send after it, and how many
/// tasks they are from.
#[derive(Default)]
struct Ready {
    puts: Vec<Put>,
    after: Vec<Event>,
    tasks: usize,
}

/// How many commits `async` mode may have waiting.
const QUEUE: usize = 256;

/// How many finished tasks' writes are held at most: a larger fan-out is committed in batches
/// of this many while the run settles the next tasks, so the store works alongside the run
/// instead of after it.
const BATCH: usize = 64;

pub(super) struct Persister {
    store: Arc<dyn Checkpointer>,
    mode: Persist,
    /// The lease every put is fenced with.
    fence: Fence,
    /// Where the events sent after a commit go.
    events: Events,
    /// `Exit`: the newest checkpoint and the values it references that are not committed yet,
    /// and the id of the last committed checkpoint (the held one's parent).
    held: Mutex<(Option<Held>, String)>,
    /// `Sync`: events of writes committed without waiting for the disk, sent once a synced
    /// commit (the step's checkpoint) has made them durable.
    unsynced: Mutex<Vec<Envelope>>,
    /// `Sync`, `Async`: finished tasks' writes not handed to the store yet, and their events.
    /// Tasks that finish while the run is busy with others are committed together by
    /// [`Persister::release`]: one commit for a burst of a fan-out rather than one per task.
    ready: Mutex<Ready>,
    /// `Sync`: the commit that opens a claimed run's turn ([`Persister::write_opening`]);
    /// every later write waits for it, and fails with its error.
    opening: Mutex<Opening>,
    /// `Async`: the ordered queue to the background committer.
    queue: Option<mpsc::SyncSender<Job>>,
    worker: Option<std::thread::JoinHandle<Result<(), CheckpointError>>>,
}

impl Drop for Persister {
    /// A run that stops on an error lets the commit opening its turn end first: whoever logs
    /// the run's end numbers its record after that commit's.
    fn drop(&mut self) {
        let _ = self.opened();
    }
}

/// Where the commit opening a claimed run's turn is ([`Persister::write_opening`]).
enum Opening {
    /// None waits: made, or never needed.
    Done,
    /// Its writes, until the run's first step has started ([`Persister::launch_opening`]), so
    /// that it carries the step's start with the run's.
    Waiting(Vec<Put>),
    /// Under way on a blocking thread while the run's first step runs: its outcome.
    UnderWay(mpsc::Receiver<Result<(), CheckpointError>>),
}

/// Commits the writes `fenced` that open a turn. Nothing waits to be told of them: their
/// events were recorded as they were sent.
fn open_turn(store: &dyn Checkpointer, events: &Events, fenced: Vec<Put>) -> Result<(), CheckpointError> {
    let _commit = super::trace::commit(None, fenced.len() - 1, true).entered();
    commit(store, events, fenced, true, Vec::new()).map(|_| ())
}

fn poisoned() -> CheckpointError {
    CheckpointError::Backend("the persister's lock was poisoned".into())
}

impl Persister {
    /// `committed` is the id of the checkpoint the run starts from (already stored).
    pub(super) fn new(
        store: Arc<dyn Checkpointer>,
        mode: Persist,
        committed: String,
        fence: Fence,
        events: Events,
    ) -> Persister {
        let (queue, worker) = if mode == Persist::Async {
            // Bounded: a run that outpaces the store waits for it rather than piling up steps.
            let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
            let s = store.clone();
            let f = fence.clone();
            let ev = events.clone();
            // The committer's spans belong to the run that queued the work.
            let run_span = tracing::Span::current();
            let handle = std::thread::spawn(move || {
                // Everything queued while the last commit ran goes into the next one: one
                // commit (one fsync, power-safe) for as many steps as are waiting.
                let mut first_error = None;
                while let Ok(job) = rx.recv() {
                    let mut puts = vec![Put::Fence(f.clone())];
                    let mut after = Vec::new();
                    let mut flushes = Vec::new();
                    let mut next = Some(job);
                    while let Some(job) = next {
                        match job {
                            Job::Checkpoint(cp, values, events) => {
                                puts.push(Put::Checkpoint(cp, values));
                                after.extend(events);
                            }
                            Job::Writes(writes, events) => {
                                puts.extend(writes);
                                after.extend(events);
                            }
                            Job::Flush(done) => flushes.push(done),
                        }
                        next = if flushes.is_empty() { rx.try_recv().ok() } else { None };
                    }
                    if puts.len() > 1 {
                        let _commit = super::trace::commit(Some(&run_span), puts.len() - 1, true).entered();
                        match commit(&*s, &ev, puts, true, after) {
                            Ok((_, after)) => deliver(&ev, after),
                            Err(e) => {
                                first_error.get_or_insert(e);
                            }
                        }
                    }
                    for done in flushes {
                        let _ = done.send(());
                    }
                }
                first_error.map_or(Ok(()), Err)
            });
            (Some(tx), Some(handle))
        } else {
            (None, None)
        };
        Persister {
            store,
            mode,
            fence,
            events,
            held: Mutex::new((None, committed)),
            unsynced: Mutex::new(Vec::new()),
            opening: Mutex::new(Opening::Done),
            ready: Mutex::new(Ready::default()),
            queue,
            worker,
        }
    }

    fn send(&self, job: Job) -> Result<(), CheckpointError> {
        match &self.queue {
            Some(q) => q
                .send(job)
                .map_err(|_| CheckpointError::Backend("the background committer stopped".into())),
            None => Err(CheckpointError::Backend("no background committer".into())),
        }
    }

    /// A step's checkpoint, committed with `last` (the result of the step's last task, stored
    /// against the checkpoint the step started from, where the history shows it) and
    /// `status` (the thread's, when the step ends the run); `after` is sent once they are
    /// committed. Answers whether `status` goes with them (`exit` commits only the run's
    /// last checkpoint, at its end: not then).
    pub(super) fn put_checkpoint(
        &self,
        cp: &Arc<Checkpoint>,
        values: Vec<(String, u64, Value)>,
        last: Option<Put>,
        status: Option<Put>,
        after: Vec<Event>,
    ) -> Result<bool, CheckpointError> {
        self.release()?;
        match self.mode {
            Persist::Sync => {
                let mut puts: Vec<Put> = last.into_iter().collect();
                puts.push(Put::Checkpoint(cp.clone(), values));
                puts.extend(status);
                self.put_told(puts, after)?;
                Ok(true)
            }
            Persist::Async => {
                if let Some(last) = last {
                    self.send(Job::Writes(vec![last], Vec::new()))?;
                }
                self.send(Job::Checkpoint(cp.clone(), values, after))?;
                if let Some(status) = status {
                    self.send(Job::Writes(vec![status], Vec::new()))?;
                }
                Ok(true)
            }
            Persist::Exit => {
                after.into_iter().for_each(|e| self.events.send(e));
                let mut guard = self.held.lock().map_err(|_| poisoned())?;
                let (held, committed) = &mut *guard;
                let mut acc = held.take().map(|(_, v)| v).unwrap_or_default();
                for (k, version, v) in values {
                    // Only the newest version of a key is referenced by the checkpoint that
                    // will be committed: a newer one replaces the held one, and an extension
                    // of the held one absorbs it.
                    let v = match acc.remove(&k) {
                        Some((held_version, held_value)) => absorb(held_version, held_value, v),
                        None => v,
                    };
                    acc.insert(k, (version, v));
                }
                let mut cp = Checkpoint::clone(cp);
                // Intermediate checkpoints are never written: the held one hangs off the last
                // committed one.
                cp.parent_id = Some(committed.clone());
                *held = Some((cp, acc));
                Ok(false)
            }
        }
    }

    /// A finished task's writes, held until [`Persister::release`] (or any later put) commits
    /// them with those of the tasks that finished meanwhile. In `Exit` mode there is no
    /// durability before the end, so they are kept only in memory (the checkpoint that
    /// follows carries their effect). `after` is sent once they are committed.
    pub(super) fn put_writes(
        &self,
        thread: &str,
        cp: &str,
        writes: Vec<PendingWrite>,
        after: Vec<Event>,
    ) -> Result<(), CheckpointError> {
        if self.mode == Persist::Exit {
            after.into_iter().for_each(|e| self.events.send(e));
            return Ok(());
        }
        let mut ready = self.ready.lock().map_err(|_| poisoned())?;
        // The writes of one step's tasks go in as one put: the store checks the thread and
        // the checkpoint once for all of them.
        match ready.puts.last_mut() {
            Some(Put::Writes {
                thread_id,
                checkpoint_id,
                writes: held,
            }) if thread_id == thread && checkpoint_id == cp => held.extend(writes),
            _ => ready.puts.push(Put::Writes {
                thread_id: thread.into(),
                checkpoint_id: cp.into(),
                writes,
            }),
        }
        ready.after.extend(after);
        ready.tasks += 1;
        Ok(())
    }

    /// Whether as many finished tasks' writes are held as go in one commit: time to
    /// [`Persister::release`] them even if other tasks have finished.
    pub(super) fn holds_a_batch(&self) -> bool {
        self.ready.lock().is_ok_and(|r| r.tasks >= BATCH)
    }

    /// Commits the writes [`Persister::put_writes`] holds, in one batch: for when the run has
    /// no other finished task at hand. It may block (`sync` commits, a full `async` queue).
    pub(super) fn release(&self) -> Result<(), CheckpointError> {
        self.opened()?;
        let Ready { puts, after, .. } = std::mem::take(&mut *self.ready.lock().map_err(|_| poisoned())?);
        if puts.is_empty() {
            return Ok(());
        }
        match self.mode {
            // One fsync per step however many tasks it has: finished tasks' writes are
            // committed at once (a crashed process keeps them) but synced by the step's
            // checkpoint commit, and their events wait for that where the store promises more
            // than this commit.
            Persist::Sync => {
                let mut fenced = Vec::with_capacity(puts.len() + 1);
                fenced.push(Put::Fence(self.fence.clone()));
                fenced.extend(puts);
                let _commit = super::trace::commit(None, fenced.len() - 1, false).entered();
                let (durable, after) = commit(&*self.store, &self.events, fenced, false, after)?;
                if durable {
                    deliver(&self.events, after);
                } else {
                    self.unsynced.lock().map_err(|_| poisoned())?.extend(after);
                }
                Ok(())
            }
            Persist::Async => self.send(Job::Writes(puts, after)),
            // Nothing is held in this mode.
            Persist::Exit => Ok(()),
        }
    }

    /// Makes everything so far durable, before the run writes to the store directly.
    pub(super) fn flush(&self) -> Result<(), CheckpointError> {
        self.release()?;
        match self.mode {
            // Writes committed unsynced are made durable (a synced commit of the fence alone),
            // and their events sent.
            Persist::Sync => {
                if self.unsynced.lock().map_err(|_| poisoned())?.is_empty() {
                    Ok(())
                } else {
                    self.put_now(Vec::new())
                }
            }
            Persist::Async => {
                let (tx, rx) = mpsc::channel();
                self.send(Job::Flush(tx))?;
                rx.recv()
                    .map_err(|_| CheckpointError::Backend("the background committer stopped".into()))
            }
            Persist::Exit => {
                let mut guard = self.held.lock().map_err(|_| poisoned())?;
                let (held, committed) = &mut *guard;
                if let Some((cp, values)) = held.take() {
                    let values: Vec<(String, u64, Value)> = values.into_iter().map(|(k, (v, x))| (k, v, x)).collect();
                    let id = cp.checkpoint_id.clone();
                    self.put_now(vec![Put::Checkpoint(Arc::new(cp), values)])?;
                    *committed = id;
                }
                Ok(())
            }
        }
    }

    /// Commits everything queued, then `puts`, fenced: for the records a run writes directly
    /// (pauses, interrupts, a failed step's finished tasks).
    pub(super) fn write_now(&self, puts: Vec<Put>) -> Result<(), CheckpointError> {
        // `sync`: the commit of `puts` is synced, and covers the unsynced writes itself.
        if self.mode == Persist::Sync {
            self.release()?;
        } else {
            self.flush()?;
        }
        self.put_now(puts)
    }

    /// What opens a turn (its thread, checkpoints and status), for a run that can be made
    /// again from a durable record of its own (`reproducible`: a queued run's row holds its
    /// input). In `sync` mode, with nothing written before it, it is committed on a blocking
    /// thread once the run's first step has started ([`Persister::launch_opening`]), while
    /// that step runs, and every later write waits for it: the step's commit still comes after
    /// it, and a process that dies first leaves the run to its next claim, which opens the
    /// turn again (the step would have run again anyway). Otherwise as
    /// [`Persister::write_now`].
    pub(super) fn write_opening(&self, puts: Vec<Put>, reproducible: bool) -> Result<(), CheckpointError> {
        let idle = self.ready.lock().map_err(|_| poisoned())?.puts.is_empty()
            && self.unsynced.lock().map_err(|_| poisoned())?.is_empty();
        if !(reproducible && idle && self.mode == Persist::Sync) || tokio::runtime::Handle::try_current().is_err() {
            return self.write_now(puts);
        }
        let mut fenced = Vec::with_capacity(puts.len() + 1);
        fenced.push(Put::Fence(self.fence.clone()));
        fenced.extend(puts);
        // The step's events (recorded as it runs) are logged after the turn, never before.
        if let Some(journal) = self.events.journal() {
            journal.commit_coming();
        }
        *self.opening.lock().map_err(|_| poisoned())? = Opening::Waiting(fenced);
        Ok(())
    }

    /// Starts the commit that opens the turn ([`Persister::write_opening`]), if it waits: for
    /// when the run's first step has started, so that the one write tells a reader both that
    /// the run started and what its first step starts from.
    pub(super) fn launch_opening(&self) -> Result<(), CheckpointError> {
        let mut opening = self.opening.lock().map_err(|_| poisoned())?;
        let Opening::Waiting(fenced) = std::mem::replace(&mut *opening, Opening::Done) else {
            return Ok(());
        };
        let (store, events, span) = (self.store.clone(), self.events.clone(), tracing::Span::current());
        let (tx, rx) = mpsc::channel();
        tokio::task::spawn_blocking(move || {
            let _in_run = span.enter();
            let _ = tx.send(open_turn(&*store, &events, fenced));
        });
        *opening = Opening::UnderWay(rx);
        Ok(())
    }

    /// Waits for the opening's commit when it is under way, or makes it here when it waits.
    fn opened(&self) -> Result<(), CheckpointError> {
        let opening = std::mem::replace(&mut *self.opening.lock().map_err(|_| poisoned())?, Opening::Done);
        match opening {
            Opening::Done => Ok(()),
            Opening::Waiting(fenced) => open_turn(&*self.store, &self.events, fenced),
            Opening::UnderWay(rx) => rx
                .recv()
                .map_err(|_| CheckpointError::Backend("the commit opening the turn was lost".into()))?,
        }
    }

    /// `puts` in one batch behind the run's fence; it makes earlier unsynced writes durable
    /// too, so their events go out.
    fn put_now(&self, puts: Vec<Put>) -> Result<(), CheckpointError> {
        self.put_told(puts, Vec::new())
    }

    /// [`Persister::put_now`], then `after`, the events that tell of `puts`.
    fn put_told(&self, puts: Vec<Put>, after: Vec<Event>) -> Result<(), CheckpointError> {
        self.opened()?;
        let mut fenced = Vec::with_capacity(puts.len() + 1);
        fenced.push(Put::Fence(self.fence.clone()));
        fenced.extend(puts);
        let span = super::trace::commit(None, fenced.len() - 1, true).entered();
        let (_, after) = commit(&*self.store, &self.events, fenced, true, after)?;
        drop(span);
        let synced = std::mem::take(&mut *self.unsynced.lock().map_err(|_| poisoned())?);
        deliver(&self.events, synced);
        deliver(&self.events, after);
        Ok(())
    }

    /// Commits what is left and stops the background committer, reporting its first error.
    pub(super) fn finish(mut self) -> Result<(), CheckpointError> {
        self.flush()?;
        drop(self.queue.take());
        if let Some(h) = self.worker.take() {
            h.join()
                .map_err(|_| CheckpointError::Backend("the background committer panicked".into()))??;
        }
        Ok(())
    }
}

/// The value to store for a key's new version `next`, when the key's uncommitted value at
/// `held_version` is about to be dropped: `next` itself, unless it extends that version, in
/// which case it is rebased onto what the held value rests on (a committed version, or
/// nothing when the held value is whole).
fn absorb(held_version: u64, held: Value, next: Value) -> Value {
    match checkpoint::as_extension(&next) {
        Some((base, items)) if base == held_version => {
            let items = items.clone();
            match checkpoint::as_extension(&held) {
                Some((held_base, held_items)) => {
                    let mut all = held_items.clone();
                    all.extend(items);
                    checkpoint::extension(held_base, all)
                }
                None => match held {
                    Value::Array(mut full) => {
                        full.extend(items);
                        Value::Array(full)
                    }
                    // Only arrays are extended, so this is a caller's bug; `next` is kept and
                    // the store reports the missing base when it resolves the value.
                    _ => next,
                },
            }
        }
        _ => next,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::checkpoint::sqlite::SqliteCheckpointer;
    use crate::checkpoint::{Durability, LeaseClaim, fixtures};

    /// A store holding thread `t` at checkpoint `c0`, leased; the lease's fence.
    fn store(dir: &std::path::Path) -> (Arc<SqliteCheckpointer>, Fence) {
        let store = SqliteCheckpointer::open(&dir.join("r.db"), Durability::PowerSafe).unwrap();
        let at = crate::clock::now();
        store.create_thread(&fixtures::thread("t", "h", &at)).unwrap();
        let cp = fixtures::first_checkpoint("t", "c0", "h", &at);
        store.put_checkpoint(&cp, &[]).unwrap();
        let lease = store
            .acquire_lease(&LeaseClaim {
                thread_id: "t".into(),
                owner: "me".into(),
                pid: 1,
                host: "here".into(),
                ttl: std::time::Duration::from_secs(60),
                replace: None,
            })
            .unwrap();
        (Arc::new(store), lease.fence())
    }

    fn write(task: &str) -> Vec<PendingWrite> {
        vec![PendingWrite {
            task_id: task.into(),
            idx: 0,
            channel: "k".into(),
            value: json!(task),
        }]
    }

    fn done(task: &str) -> Vec<Event> {
        vec![Event::NodeEnd {
            step: 0,
            node: "n".into(),
            task_id: task.into(),
            duration_ms: 0.0,
            keys: vec!["k".into()],
            writes: Default::default(),
            cached: false,
            outcome: Default::default(),
            cache_hit: false,
        }]
    }

    /// The tasks whose `node_end` was sent so far.
    fn ended(rx: &mut super::super::events::Receiver) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter_map(|e| match e.event {
                Event::NodeEnd { task_id, .. } => Some(task_id),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn tasks_finished_together_are_committed_together_and_reported_after_the_commit() {
        for mode in [Persist::Sync, Persist::Async] {
            let dir = tempfile::tempdir().unwrap();
            let (store, fence) = store(dir.path());
            let (events, mut rx) = Events::channel();
            let p = Persister::new(store.clone(), mode, "c0".into(), fence, events);
            let before = store.stats().unwrap();
            for task in ["a", "b", "c"] {
                p.put_writes("t", "c0", write(task), done(task)).unwrap();
            }
            // Held: nothing committed, nothing reported.
            let held = store.stats().unwrap();
            assert_eq!((held.commits, held.write_rows), (before.commits, 0), "{mode:?}");
            assert!(ended(&mut rx).is_empty(), "{mode:?}");
            p.release().unwrap();
            p.flush().unwrap();
            let after = store.stats().unwrap();
            assert_eq!(after.write_rows, 3, "{mode:?}");
            // One commit for the three tasks, and, power-safe, one sync (the flush's).
            assert_eq!(
                after.commits - before.commits,
                1 + u64::from(mode == Persist::Sync),
                "{mode:?}"
            );
            assert_eq!(ended(&mut rx), ["a", "b", "c"], "{mode:?}");
            p.finish().unwrap();
        }
    }

    #[test]
    fn a_fan_out_is_committed_in_batches() {
        let dir = tempfile::tempdir().unwrap();
        let (store, fence) = store(dir.path());
        let p = Persister::new(store.clone(), Persist::Sync, "c0".into(), fence, Events::none());
        for i in 0..BATCH {
            assert!(!p.holds_a_batch(), "{i}");
            p.put_writes("t", "c0", write(&format!("w#{i}")), Vec::new()).unwrap();
        }
        assert!(p.holds_a_batch());
        let before = store.stats().unwrap().commits;
        p.release().unwrap();
        assert!(!p.holds_a_batch());
        assert_eq!(store.stats().unwrap().commits, before + 1);
        assert_eq!(store.stats().unwrap().write_rows, BATCH as u64);
        p.finish().unwrap();
    }

    #[test]
    fn held_writes_reach_the_store_before_anything_put_after_them() {
        for mode in [Persist::Sync, Persist::Async] {
            let dir = tempfile::tempdir().unwrap();
            let (store, fence) = store(dir.path());
            let p = Persister::new(store.clone(), mode, "c0".into(), fence.clone(), Events::none());
            p.put_writes("t", "c0", write("a"), Vec::new()).unwrap();
            // A put straight to the store (a pause's record) finds the held write stored.
            p.write_now(vec![Put::Writes {
                thread_id: "t".into(),
                checkpoint_id: "c0".into(),
                writes: write("b"),
            }])
            .unwrap();
            let stored: Vec<String> = store
                .get_writes("t", "c0")
                .unwrap()
                .into_iter()
                .map(|w| w.task_id)
                .collect();
            assert_eq!(stored, ["a", "b"], "{mode:?}");
            p.finish().unwrap();
        }
    }

    #[test]
    fn a_newer_version_replaces_the_held_one_and_an_extension_is_absorbed() {
        // A whole value replaced, and one extended: the result is whole.
        assert_eq!(absorb(2, json!("old"), json!("new")), json!("new"));
        assert_eq!(
            absorb(2, json!([1, 2]), checkpoint::extension(2, vec![json!(3)])),
            json!([1, 2, 3])
        );
        // An extension of an extension rests on the committed base.
        assert_eq!(
            absorb(
                5,
                checkpoint::extension(3, vec![json!(4), json!(5)]),
                checkpoint::extension(5, vec![json!(6)])
            ),
            checkpoint::extension(3, vec![json!(4), json!(5), json!(6)])
        );
        // An extension of another (committed) version is kept as it is.
        let other = checkpoint::extension(1, vec![json!(9)]);
        assert_eq!(absorb(5, json!([1]), other.clone()), other);
    }
}

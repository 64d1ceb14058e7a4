//! In-memory checkpointer (tests, `--db :memory:`): the same observable behaviour as
//! [`super::sqlite::SqliteCheckpointer`] — ordering, errors, fork semantics, one value per key
//! and version — without durability. The conformance suite in `tests/checkpoint.rs` holds both
//! to it.

mod cache;
mod crons;
mod runs;
mod users;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Map, Value};

use super::{
    Checkpoint, CheckpointError, Checkpointer, Fence, Lease, LeaseClaim, PendingWrite, Put, Result, Thread,
    ThreadStatus,
};

/// A [`Checkpointer`] in a `Mutex`.
#[derive(Default)]
pub struct MemoryCheckpointer {
    inner: Mutex<Store>,
    /// Keep only each thread's latest checkpoint (and what it references): a run that keeps
    /// nothing afterwards (`--db :memory:`) then needs memory for its state, not its history.
    latest_only: bool,
    /// Runs and thread metadata (`runs.rs`).
    runs: Mutex<runs::Memory>,
    /// Cached task results (`cache.rs`).
    cache: Mutex<cache::Memory>,
    /// Crons and webhook deliveries (`crons.rs`).
    crons: Mutex<crons::Memory>,
}

#[derive(Default)]
struct Store {
    threads: HashMap<String, Entry>,
    /// Bumped by every thread update; orders `list_threads` as SQLite's `touched` column does.
    touched: u64,
    /// By thread id; a lease may exist before its thread does.
    leases: HashMap<String, Lease>,
}

struct Entry {
    thread: Thread,
    touched: u64,
    /// Shared with the engine that put them: storing one copies nothing.
    checkpoints: HashMap<String, Arc<Checkpoint>>,
    values: HashMap<(String, u64), Value>,
    /// `(checkpoint_id, task_id, idx) → (channel, value)`: iteration is (task, idx) order.
    writes: BTreeMap<(String, String, u32), (String, Value)>,
}

impl Store {
    fn delete_thread(&mut self, thread_id: &str) -> Result<()> {
        self.threads
            .remove(thread_id)
            .map(drop)
            .ok_or_else(|| CheckpointError::NoThread(thread_id.into()))
    }

    /// Deletes the checkpoints of `thread_id` newer than `to`, the values they introduced and
    /// every write stored against `to` or them ([`Put::Truncate`]).
    fn truncate(&mut self, thread_id: &str, to: &str) -> Result<()> {
        let entry = self.entry_mut(thread_id)?;
        let versions = entry.checkpoint(to)?.versions.clone();
        entry.checkpoints.retain(|id, _| id.as_str() <= to);
        entry.writes.retain(|(id, _, _), _| id.as_str() < to);
        entry
            .values
            .retain(|(k, v), _| versions.get(k).is_some_and(|kept| v <= kept));
        Ok(())
    }

    fn entry(&self, thread_id: &str) -> Result<&Entry> {
        self.threads
            .get(thread_id)
            .ok_or_else(|| CheckpointError::NoThread(thread_id.into()))
    }

    fn entry_mut(&mut self, thread_id: &str) -> Result<&mut Entry> {
        self.threads
            .get_mut(thread_id)
            .ok_or_else(|| CheckpointError::NoThread(thread_id.into()))
    }

    fn touch(&mut self) -> u64 {
        self.touched += 1;
        self.touched
    }

    fn set_status(&mut self, thread_id: &str, status: ThreadStatus) -> Result<()> {
        self.entry(thread_id)?;
        let touched = self.touch();
        let entry = self.entry_mut(thread_id)?;
        entry.thread.status = status;
        entry.thread.updated_at = crate::clock::now();
        entry.touched = touched;
        Ok(())
    }

    fn create_thread(&mut self, thread: &Thread) -> Result<()> {
        if self.threads.contains_key(&thread.thread_id) {
            return Err(CheckpointError::ThreadExists(thread.thread_id.clone()));
        }
        self.insert(thread.clone());
        Ok(())
    }

    /// Takes the checkpoint and values by value: a batch hands over what it owns, so a step's
    /// checkpoint is not copied once more on its way in.
    fn put_checkpoint(
        &mut self,
        latest_only: bool,
        checkpoint: Arc<Checkpoint>,
        values: Vec<(String, u64, Value)>,
    ) -> Result<()> {
        let entry = self.entry_mut(&checkpoint.thread_id)?;
        if entry.checkpoints.contains_key(&checkpoint.checkpoint_id) {
            return Err(super::format::duplicate_checkpoint(
                &checkpoint.thread_id,
                &checkpoint.checkpoint_id,
            ));
        }
        for (key, version, value) in values {
            // Without history the base of an extension is about to go: keep the value whole.
            let value = match super::as_extension(&value) {
                Some(_) if latest_only => {
                    let stored = &entry.values;
                    super::resolve(&key, version, |v| {
                        if v == version {
                            Ok(value.clone())
                        } else {
                            stored
                                .get(&(key.clone(), v))
                                .cloned()
                                .ok_or_else(|| CheckpointError::Corrupt(format!("no value for `{key}` at version {v}")))
                        }
                    })?
                }
                _ => value,
            };
            // Once per version: the first value stored for a version stays.
            entry.values.entry((key, version)).or_insert(value);
        }
        if latest_only {
            // Every checkpoint and write stored so far is older than this one: none is kept.
            entry.checkpoints.clear();
            entry.writes.clear();
            let versions = &checkpoint.versions;
            entry.values.retain(|(k, v), _| versions.get(k) == Some(v));
        }
        entry.checkpoints.insert(checkpoint.checkpoint_id.clone(), checkpoint);
        Ok(())
    }

    fn put_writes(&mut self, thread_id: &str, checkpoint_id: &str, writes: &[PendingWrite]) -> Result<()> {
        let entry = self.entry_mut(thread_id)?;
        entry.checkpoint(checkpoint_id)?;
        for w in writes {
            entry.writes.insert(
                (checkpoint_id.to_owned(), w.task_id.clone(), w.idx),
                (w.channel.clone(), w.value.clone()),
            );
        }
        Ok(())
    }

    fn insert(&mut self, thread: Thread) -> &mut Entry {
        let touched = self.touch();
        self.threads.entry(thread.thread_id.clone()).or_insert(Entry {
            thread,
            touched,
            checkpoints: HashMap::new(),
            values: HashMap::new(),
            writes: BTreeMap::new(),
        })
    }
}

impl Entry {
    fn checkpoint(&self, checkpoint_id: &str) -> Result<&Checkpoint> {
        self.checkpoints
            .get(checkpoint_id)
            .map(|c| &**c)
            .ok_or_else(|| CheckpointError::NoCheckpoint(self.thread.thread_id.clone(), checkpoint_id.into()))
    }

    /// Newest first: by checkpoint id (time-ordered), descending. A branch from an older
    /// checkpoint is newer than the steps it leaves, whatever its step.
    fn history(&self) -> Vec<&Checkpoint> {
        let mut all: Vec<&Checkpoint> = self.checkpoints.values().map(|c| &**c).collect();
        all.sort_by(|a, b| b.checkpoint_id.cmp(&a.checkpoint_id));
        all
    }

    fn value(&self, key: &str, version: u64) -> Result<&Value> {
        self.values.get(&(key.to_owned(), version)).ok_or_else(|| {
            CheckpointError::Corrupt(format!(
                "thread `{}` has no value for `{key}` at version {version}",
                self.thread.thread_id
            ))
        })
    }
}

impl MemoryCheckpointer {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps only each thread's latest checkpoint: `history` has one entry and
    /// `fork` works only from it. For runs whose history is not wanted.
    pub fn ephemeral() -> Self {
        MemoryCheckpointer {
            latest_only: true,
            ..Self::default()
        }
    }

    /// How many `(thread, key, version)` values are stored (SQLite's `state_values` rows).
    pub fn value_rows(&self) -> Result<u64> {
        Ok(self.lock()?.threads.values().map(|e| e.values.len() as u64).sum())
    }

    fn lock_runs(&self) -> Result<MutexGuard<'_, runs::Memory>> {
        self.runs
            .lock()
            .map_err(|_| CheckpointError::Backend("the in-memory store is poisoned".into()))
    }

    fn lock_crons(&self) -> Result<MutexGuard<'_, crons::Memory>> {
        self.crons
            .lock()
            .map_err(|_| CheckpointError::Backend("the in-memory store is poisoned".into()))
    }

    fn lock_cache(&self) -> Result<MutexGuard<'_, cache::Memory>> {
        self.cache
            .lock()
            .map_err(|_| CheckpointError::Backend("the in-memory store is poisoned".into()))
    }

    fn lock(&self) -> Result<MutexGuard<'_, Store>> {
        self.inner
            .lock()
            .map_err(|_| CheckpointError::Backend("the in-memory store is poisoned".into()))
    }
}

impl Checkpointer for MemoryCheckpointer {
    fn create_thread(&self, thread: &Thread) -> Result<()> {
        self.lock()?.create_thread(thread)
    }

    fn set_status(&self, thread_id: &str, status: ThreadStatus) -> Result<()> {
        self.lock()?.set_status(thread_id, status)
    }

    fn get_thread(&self, thread_id: &str) -> Result<Option<Thread>> {
        Ok(self.lock()?.threads.get(thread_id).map(|e| e.thread.clone()))
    }

    fn list_threads(&self) -> Result<Vec<Thread>> {
        let store = self.lock()?;
        let mut all: Vec<_> = store.threads.values().collect();
        all.sort_by_key(|e| std::cmp::Reverse(e.touched));
        Ok(all.into_iter().map(|e| e.thread.clone()).collect())
    }

    fn put_checkpoint(&self, checkpoint: &Checkpoint, values: &[(String, u64, Value)]) -> Result<()> {
        self.lock()?
            .put_checkpoint(self.latest_only, Arc::new(checkpoint.clone()), values.to_vec())
    }

    fn get_checkpoint(&self, thread_id: &str, checkpoint_id: Option<&str>) -> Result<Option<Checkpoint>> {
        let store = self.lock()?;
        let Some(entry) = store.threads.get(thread_id) else {
            return Ok(None);
        };
        Ok(match checkpoint_id {
            Some(id) => entry.checkpoints.get(id).map(|c| Checkpoint::clone(c)),
            None => entry.history().first().map(|c| (*c).clone()),
        })
    }

    fn history(&self, thread_id: &str) -> Result<Vec<Checkpoint>> {
        let store = self.lock()?;
        Ok(store.entry(thread_id)?.history().into_iter().cloned().collect())
    }

    fn state(&self, thread_id: &str, versions: &BTreeMap<String, u64>) -> Result<Map<String, Value>> {
        let store = self.lock()?;
        let entry = store.entry(thread_id)?;
        versions
            .iter()
            .map(|(key, &version)| {
                Ok((
                    key.clone(),
                    super::resolve(key, version, |v| entry.value(key, v).cloned())?,
                ))
            })
            .collect()
    }

    fn put_writes(&self, thread_id: &str, checkpoint_id: &str, writes: &[PendingWrite]) -> Result<()> {
        self.lock()?.put_writes(thread_id, checkpoint_id, writes)
    }

    fn get_writes(&self, thread_id: &str, checkpoint_id: &str) -> Result<Vec<PendingWrite>> {
        let store = self.lock()?;
        let entry = store.entry(thread_id)?;
        entry.checkpoint(checkpoint_id)?;
        let from = (checkpoint_id.to_owned(), String::new(), 0);
        Ok(entry
            .writes
            .range(from..)
            .take_while(|((cp, _, _), _)| cp == checkpoint_id)
            .map(|((_, task_id, idx), (channel, value))| PendingWrite {
                task_id: task_id.clone(),
                idx: *idx,
                channel: channel.clone(),
                value: value.clone(),
            })
            .collect())
    }

    fn delete_thread(&self, thread_id: &str) -> Result<()> {
        self.lock()?.delete_thread(thread_id)
    }

    /// Under one lock, so no reader sees half a batch. A put that fails stops the batch; those
    /// before it stay (nothing in memory outlives a crash, so only errors can split a batch).
    fn put_batch(&self, puts: Vec<Put>) -> Result<()> {
        let mut store = self.lock()?;
        for put in puts {
            match put {
                Put::Fence(fence) => super::check_fence(store.leases.get(&fence.thread_id), &fence)?,
                Put::Thread(thread) => store.create_thread(&thread)?,
                Put::Status { thread_id, status } => store.set_status(&thread_id, status)?,
                Put::Checkpoint(cp, values) => store.put_checkpoint(self.latest_only, cp, values)?,
                Put::Writes {
                    thread_id,
                    checkpoint_id,
                    writes,
                } => store.put_writes(&thread_id, &checkpoint_id, &writes)?,
                Put::Truncate { thread_id, to } => store.truncate(&thread_id, &to)?,
                Put::Delete(thread_id) => store.delete_thread(&thread_id)?,
            }
        }
        Ok(())
    }

    fn acquire_lease(&self, claim: &LeaseClaim) -> Result<Lease> {
        let mut store = self.lock()?;
        let lease = super::format::grant_lease(
            store.leases.get(&claim.thread_id),
            claim,
            crate::clock::now_ms(),
            &crate::clock::now(),
        )?;
        store.leases.insert(claim.thread_id.clone(), lease.clone());
        Ok(lease)
    }

    fn renew_lease(&self, fence: &Fence, ttl: std::time::Duration) -> Result<Lease> {
        let mut store = self.lock()?;
        match store.leases.get_mut(&fence.thread_id) {
            Some(held) if held.owner == fence.owner && held.generation == fence.generation => {
                held.expires_at_ms = super::expiry_ms(crate::clock::now_ms(), ttl);
                Ok(held.clone())
            }
            _ => Err(CheckpointError::LeaseLost(fence.thread_id.clone())),
        }
    }

    fn release_lease(&self, fence: &Fence) -> Result<()> {
        let mut store = self.lock()?;
        if super::check_fence(store.leases.get(&fence.thread_id), fence).is_ok() {
            store.leases.remove(&fence.thread_id);
        }
        Ok(())
    }

    fn lease(&self, thread_id: &str) -> Result<Option<Lease>> {
        Ok(self.lock()?.leases.get(thread_id).cloned())
    }

    fn fork(&self, from: &str, checkpoint_id: &str, new: &str) -> Result<Checkpoint> {
        let mut store = self.lock()?;
        let source = store.entry(from)?;
        let mut checkpoint = source.checkpoint(checkpoint_id)?.clone();
        if store.threads.contains_key(new) {
            return Err(CheckpointError::ThreadExists(new.into()));
        }
        // Everything is read and checked before anything is written: a fork is all or nothing.
        let values = checkpoint
            .versions
            .iter()
            .map(|(key, &version)| {
                Ok((
                    (key.clone(), version),
                    super::resolve(key, version, |v| source.value(key, v).cloned())?,
                ))
            })
            .collect::<Result<HashMap<_, _>>>()?;
        let at = crate::clock::now();
        let mut thread = source.thread.clone();
        thread.thread_id = new.into();
        thread.status = ThreadStatus::Running;
        thread.created_at = at.clone();
        thread.updated_at = at.clone();
        thread.forked_from = Some((from.into(), checkpoint_id.into()));
        checkpoint.checkpoint_id = super::new_id();
        checkpoint.thread_id = new.into();
        checkpoint.parent_id = None;
        checkpoint.created_at = at;

        let entry = store.insert(thread);
        entry.values = values;
        entry
            .checkpoints
            .insert(checkpoint.checkpoint_id.clone(), Arc::new(checkpoint.clone()));
        Ok(checkpoint)
    }
}

//! The stored format, shared by every backend: what a row holds ([`ThreadRow`],
//! [`CheckpointRow`]: JSON columns as text, long strings as references to blobs), how a value
//! is encoded and decoded ([`encode`], [`decode`]), and the writes a backend applies ([`Op`]):
//! the [`Put`]s of a batch turned into rows before any I/O, so a backend's writer only runs
//! its SQL. The rules a backend keeps when applying them are written here once:
//!
//! - A batch ([`Op::Batch`]) is all or nothing, applied in order; a failing op undoes the
//!   batch and nothing else committed with it (SQLite: a savepoint per command in a group
//!   commit; a network database: a savepoint, or one transaction per batch).
//! - [`Op::Fence`] refuses the batch with [`CheckpointError::LeaseLost`] unless the lease row
//!   is still the fence's ([`super::check_fence`]), read in the same transaction as the writes.
//! - A lease is granted by [`grant_lease`]'s rule, in one atomic step (SQLite: one upsert).
//! - A thread, a checkpoint and the values it introduces are inserted once: a repeated
//!   checkpoint id is refused ([`duplicate_checkpoint`]), a value already stored for a key and
//!   version is kept; pending writes of a task replace those with the same `(task, idx)`.
//! - Every op checks what it refers to (its thread, its checkpoint): SQLite with a query, a
//!   network database with its tables' keys where it can (a query is a round trip).
//!
//! A backend owns its SQL, its connections and its transactions; it does not re-encode.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Checkpoint, CheckpointError, Fence, Lease, LeaseClaim, PendingWrite, Put, Result, Thread, ThreadStatus};

/// A thread as stored, JSON columns as text.
#[derive(Clone)]
pub(crate) struct ThreadRow {
    pub(crate) thread_id: String,
    pub(crate) workflow: String,
    pub(crate) plan_hash: String,
    pub(crate) input: String,
    pub(crate) context: String,
    pub(crate) config: String,
    pub(crate) status: String,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    pub(crate) forked_from: Option<(String, String)>,
}

impl ThreadRow {
    /// `blobs` collects the long strings the row refers to.
    pub(crate) fn from_thread(t: &Thread, blobs: &mut Vec<(String, String)>) -> Result<Self> {
        Ok(ThreadRow {
            thread_id: t.thread_id.clone(),
            workflow: t.workflow.clone(),
            plan_hash: t.plan_hash.clone(),
            input: encode(&t.input, blobs)?,
            context: encode(&t.context, blobs)?,
            config: encode(&t.config, blobs)?,
            status: t.status.as_str().into(),
            created_at: t.created_at.clone(),
            updated_at: t.updated_at.clone(),
            forked_from: t.forked_from.clone(),
        })
    }

    /// `blob` reads a long string by hash (see [`decode`]).
    pub(crate) fn into_thread(self, blob: &mut impl FnMut(&str) -> Result<Option<String>>) -> Result<Thread> {
        let status = parse_status(&self.status)?;
        Ok(Thread {
            input: decode("a thread input", &self.input, blob)?,
            context: decode("a thread context", &self.context, blob)?,
            config: decode("a thread config", &self.config, blob)?,
            thread_id: self.thread_id,
            workflow: self.workflow,
            plan_hash: self.plan_hash,
            status,
            created_at: self.created_at,
            updated_at: self.updated_at,
            forked_from: self.forked_from,
        })
    }
}

/// A checkpoint as stored, JSON columns as text.
pub(crate) struct CheckpointRow {
    pub(crate) thread_id: String,
    pub(crate) checkpoint_id: String,
    pub(crate) parent_id: Option<String>,
    pub(crate) step: i64,
    pub(crate) versions: String,
    pub(crate) ran: String,
    pub(crate) changed: String,
    pub(crate) next: String,
    pub(crate) meta: String,
    pub(crate) plan_hash: String,
    pub(crate) created_at: String,
}

impl CheckpointRow {
    /// `blobs` collects the long strings the row refers to.
    pub(crate) fn from_checkpoint(c: &Checkpoint, blobs: &mut Vec<(String, String)>) -> Result<Self> {
        Ok(CheckpointRow {
            thread_id: c.thread_id.clone(),
            checkpoint_id: c.checkpoint_id.clone(),
            parent_id: c.parent_id.clone(),
            step: c.step,
            versions: to_json(&c.versions)?,
            ran: to_json(&c.ran)?,
            changed: to_json(&c.changed)?,
            next: to_json(&c.next)?,
            meta: encode(&c.meta, blobs)?,
            plan_hash: c.plan_hash.clone(),
            created_at: c.created_at.clone(),
        })
    }

    /// The versions it records, read without the rest of it.
    pub(crate) fn versions(&self) -> Result<BTreeMap<String, u64>> {
        from_json("checkpoint versions", &self.versions)
    }

    /// `blob` reads a long string by hash (see [`decode`]).
    pub(crate) fn into_checkpoint(self, blob: &mut impl FnMut(&str) -> Result<Option<String>>) -> Result<Checkpoint> {
        Ok(Checkpoint {
            versions: self.versions()?,
            ran: from_json("checkpoint `ran`", &self.ran)?,
            changed: from_json("checkpoint `changed`", &self.changed)?,
            next: from_json("checkpoint `next`", &self.next)?,
            meta: decode("checkpoint meta", &self.meta, blob)?,
            checkpoint_id: self.checkpoint_id,
            thread_id: self.thread_id,
            parent_id: self.parent_id,
            step: self.step,
            plan_hash: self.plan_hash,
            created_at: self.created_at,
        })
    }
}

/// A write, encoded by the caller so a backend's writer only does its SQL.
pub(crate) enum Op {
    CreateThread(ThreadRow),
    /// Long strings `(hash, text)` that `thread_id` refers to.
    Blobs {
        thread_id: String,
        blobs: Vec<(String, String)>,
    },
    SetStatus {
        thread_id: String,
        status: ThreadStatus,
        at: String,
    },
    PutCheckpoint {
        row: CheckpointRow,
        /// `(key, version, value JSON)`.
        values: Vec<(String, i64, String)>,
    },
    PutWrites {
        thread_id: String,
        checkpoint_id: String,
        /// `(task_id, idx, channel, value JSON)`.
        writes: Vec<(String, i64, String, String)>,
    },
    DeleteThread(String),
    /// [`Put::Truncate`].
    Truncate {
        thread_id: String,
        to: String,
    },
    /// Fails unless the lease is still the fence's.
    Fence(Fence),
    /// `now` and `expires` (milliseconds) by this process's clock; `claim.ttl` for a backend
    /// that times leases by its own.
    AcquireLease {
        claim: LeaseClaim,
        now: i64,
        expires: i64,
        at: String,
    },
    /// `expires` by this process's clock; `ttl` for a backend that times leases by its own.
    RenewLease {
        fence: Fence,
        expires: i64,
        ttl: std::time::Duration,
    },
    ReleaseLease(Fence),
    /// Several ops applied in order, all or nothing.
    Batch(Vec<Op>),
    Fork {
        from: String,
        checkpoint_id: String,
        new: String,
        new_checkpoint_id: String,
        at: String,
    },
}

/// What an applied [`Op`] answers.
pub(crate) enum Done {
    Unit,
    Forked(Box<Checkpoint>),
    Lease(Box<Lease>),
}

impl Done {
    pub(crate) fn into_lease(self) -> Result<Lease> {
        match self {
            Done::Lease(lease) => Ok(*lease),
            _ => Err(CheckpointError::Backend("the writer did not answer a lease".into())),
        }
    }

    pub(crate) fn into_forked(self) -> Result<Checkpoint> {
        match self {
            Done::Forked(checkpoint) => Ok(*checkpoint),
            _ => Err(CheckpointError::Backend("the writer did not answer a fork".into())),
        }
    }
}

/// One op for puts applied in order.
pub(crate) fn batch_op(puts: Vec<Put>) -> Result<Op> {
    let ops = puts
        .into_iter()
        .map(|put| match put {
            Put::Fence(fence) => Ok(Op::Fence(fence)),
            Put::Thread(thread) => create_thread_op(&thread),
            Put::Status { thread_id, status } => Ok(status_op(thread_id, status)),
            Put::Checkpoint(cp, values) => checkpoint_op(&cp, &values),
            Put::Writes {
                thread_id,
                checkpoint_id,
                writes,
            } => writes_op(thread_id, checkpoint_id, &writes),
            Put::Truncate { thread_id, to } => Ok(Op::Truncate { thread_id, to }),
            Put::Delete(thread_id) => Ok(Op::DeleteThread(thread_id)),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Op::Batch(ops))
}

/// A new thread as one write, long strings stored apart.
pub(crate) fn create_thread_op(thread: &Thread) -> Result<Op> {
    let mut blobs = Vec::new();
    let row = ThreadRow::from_thread(thread, &mut blobs)?;
    Ok(with_blobs(&thread.thread_id, blobs, Op::CreateThread(row)))
}

/// A status change, at this moment.
pub(crate) fn status_op(thread_id: String, status: ThreadStatus) -> Op {
    Op::SetStatus {
        thread_id,
        status,
        at: crate::clock::now(),
    }
}

/// A checkpoint and its values as one write, long strings stored apart.
pub(crate) fn checkpoint_op(checkpoint: &Checkpoint, values: &[(String, u64, Value)]) -> Result<Op> {
    let mut blobs = Vec::new();
    let row = CheckpointRow::from_checkpoint(checkpoint, &mut blobs)?;
    let values = values
        .iter()
        .map(|(key, version, value)| Ok((key.clone(), version_to_stored(*version)?, encode(value, &mut blobs)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(with_blobs(
        &checkpoint.thread_id,
        blobs,
        Op::PutCheckpoint { row, values },
    ))
}

/// Pending writes as one write: rows `(task_id, idx, channel, value JSON)`.
pub(crate) fn writes_op(thread_id: String, checkpoint_id: String, writes: &[PendingWrite]) -> Result<Op> {
    let mut blobs = Vec::new();
    let writes = writes
        .iter()
        .map(|w| {
            Ok((
                w.task_id.clone(),
                i64::from(w.idx),
                w.channel.clone(),
                encode(&w.value, &mut blobs)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(with_blobs(
        &thread_id,
        blobs,
        Op::PutWrites {
            thread_id: thread_id.clone(),
            checkpoint_id,
            writes,
        },
    ))
}

/// `op` preceded by storing the long strings it refers to, all or nothing.
fn with_blobs(thread_id: &str, blobs: Vec<(String, String)>, op: Op) -> Op {
    if blobs.is_empty() {
        return op;
    }
    Op::Batch(vec![
        Op::Blobs {
            thread_id: thread_id.to_owned(),
            blobs,
        },
        op,
    ])
}

/// The lease `claim` gets when the thread's lease row is `held` at `now_ms`: granted when there
/// is none, when it has expired, when it is already the claim's owner's (then only its expiry
/// moves) or when it is `claim.replace`'s; a new owner takes the next generation. Otherwise
/// [`CheckpointError::Leased`] naming the holder. A backend applies it atomically (SQLite: one
/// upsert whose `WHERE` is this rule).
pub(crate) fn grant_lease(held: Option<&Lease>, claim: &LeaseClaim, now_ms: i64, at: &str) -> Result<Lease> {
    let expires_at_ms = super::expiry_ms(now_ms, claim.ttl);
    Ok(match held {
        Some(held) if held.owner == claim.owner => Lease {
            expires_at_ms,
            ..held.clone()
        },
        Some(held) if held.is_live(now_ms) && claim.replace.as_deref() != Some(held.owner.as_str()) => {
            return Err(CheckpointError::Leased(Box::new(held.clone())));
        }
        held => Lease {
            thread_id: claim.thread_id.clone(),
            owner: claim.owner.clone(),
            generation: held.map_or(1, |h| h.generation + 1),
            pid: claim.pid,
            host: claim.host.clone(),
            acquired_at: at.to_owned(),
            expires_at_ms,
        },
    })
}

pub(crate) fn parse_status(status: &str) -> Result<ThreadStatus> {
    Ok(match status {
        "running" => ThreadStatus::Running,
        "interrupted" => ThreadStatus::Interrupted,
        "done" => ThreadStatus::Done,
        "failed" => ThreadStatus::Failed,
        other => return Err(CheckpointError::Corrupt(format!("thread status `{other}`"))),
    })
}

/// A key version as stored: a signed 64-bit integer, as SQL databases have.
pub(crate) fn version_to_stored(version: u64) -> Result<i64> {
    i64::try_from(version).map_err(|_| CheckpointError::Backend(format!("version {version} exceeds SQLite's range")))
}

/// A lease generation as stored.
pub(crate) fn generation_to_stored(generation: u64) -> Result<i64> {
    i64::try_from(generation)
        .map_err(|_| CheckpointError::Backend(format!("lease generation {generation} exceeds SQLite's range")))
}

pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    serde_json::to_string(value).map_err(|e| CheckpointError::Backend(format!("cannot serialize: {e}")))
}

pub(crate) fn from_json<T: DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| CheckpointError::Corrupt(format!("{what}: {e}")))
}

/// JSON text for storage: long strings replaced by references, collected in `blobs`.
pub(crate) fn encode(value: &Value, blobs: &mut Vec<(String, String)>) -> Result<String> {
    match super::blobs::externalize(value) {
        None => to_json(value),
        Some((replaced, found)) => {
            blobs.extend(found);
            to_json(&replaced)
        }
    }
}

/// A stored JSON text, references to long strings resolved; `blob` reads one by hash (`None`:
/// not stored), and is called only for a text that holds a reference.
pub(crate) fn decode(what: &str, text: &str, blob: &mut impl FnMut(&str) -> Result<Option<String>>) -> Result<Value> {
    let mut value = from_json(what, text)?;
    if text.contains(super::blobs::BLOB) {
        super::blobs::internalize(&mut value, &mut |hash: &str| {
            blob(hash)?.ok_or_else(|| CheckpointError::Corrupt(format!("no stored text {hash} ({what})")))
        })?;
    }
    Ok(value)
}

pub(crate) fn missing_value(thread_id: &str, key: &str, version: u64) -> CheckpointError {
    CheckpointError::Corrupt(format!(
        "thread `{thread_id}` has no value for `{key}` at version {version}"
    ))
}

/// Checkpoint ids are fresh UUIDv7s; a repeated one is a caller's bug, refused rather than merged.
pub(crate) fn duplicate_checkpoint(thread_id: &str, checkpoint_id: &str) -> CheckpointError {
    CheckpointError::Backend(format!(
        "checkpoint `{checkpoint_id}` already exists on thread `{thread_id}`"
    ))
}

//! A thread taken back to a checkpoint it had (a server's run rolled back, LangGraph's
//! `multitask_strategy: rollback` and `cancel?action=rollback`), under the thread's lease: the
//! checkpoints after it deleted with their writes and values, its writes as they were, its
//! status as they say, in one batch fenced by the lease, so a run that took the thread since
//! is never written over.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::{Engine, EngineError, lease};
use crate::checkpoint::{Checkpointer, Fence, PendingWrite, Put, ThreadStatus};

/// Where a rollback takes a thread: a checkpoint and the writes it had then.
#[derive(Debug, Clone)]
pub struct RollbackTo {
    pub checkpoint_id: String,
    pub writes: Vec<PendingWrite>,
}

impl Engine {
    /// Takes thread `thread_id` back to `to` (none: to before its first checkpoint, which
    /// deletes the thread's checkpoints and its record in the store) under its lease, taken per
    /// `lease`. A lease another run holds is [`EngineError::Busy`]; nothing is written then.
    pub async fn rollback(
        store: &Arc<dyn Checkpointer>,
        thread_id: &str,
        to: Option<RollbackTo>,
        lease: &super::LeasePolicy,
    ) -> Result<(), EngineError> {
        let never = AtomicBool::new(false);
        let held = lease::take(store, thread_id, lease, &never).await?;
        let done = rolled_back(store.as_ref(), thread_id, to, held.fence());
        let released = held.release();
        done?;
        released
    }
}

fn rolled_back(
    store: &dyn Checkpointer,
    thread_id: &str,
    to: Option<RollbackTo>,
    fence: &Fence,
) -> Result<(), EngineError> {
    let mut puts = vec![Put::Fence(fence.clone())];
    match to {
        Some(RollbackTo { checkpoint_id, writes }) => {
            let status = if !super::waiting_gates(&writes).is_empty() {
                ThreadStatus::Interrupted
            } else if store
                .get_checkpoint(thread_id, Some(&checkpoint_id))?
                .is_some_and(|cp| cp.next.is_empty())
            {
                ThreadStatus::Done
            } else {
                ThreadStatus::Running
            };
            puts.push(Put::Truncate {
                thread_id: thread_id.to_string(),
                to: checkpoint_id.clone(),
            });
            if !writes.is_empty() {
                puts.push(Put::Writes {
                    thread_id: thread_id.to_string(),
                    checkpoint_id,
                    writes,
                });
            }
            puts.push(Put::Status {
                thread_id: thread_id.to_string(),
                status,
            });
        }
        None if store.get_thread(thread_id)?.is_some() => puts.push(Put::Delete(thread_id.to_string())),
        // Nothing was ever stored: nothing to take back.
        None => return Ok(()),
    }
    Ok(store.put_batch(puts)?)
}

//! State edits, LangGraph's `update_state(values, as_node)`: values written to a thread's latest
//! checkpoint (or an older one, which forks the thread there) as a new checkpoint, under the
//! thread's lease. As a node, the values are that node's write, folded through the reducers, and
//! the thread goes on from what the node's edges say; without one they replace the keys' values
//! outright and the pending tasks stay.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use super::task::Next;
use super::{Engine, EngineError, Meta, NewValues, lease};
use crate::checkpoint::{self, Checkpoint, Fence, Put, ThreadStatus};
use crate::compile::{NodeIx, Plan};

/// Why a state edit cannot be applied. The thread is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("the workflow has no node `{node}`{hint}")]
    NoSuchNode { node: String, hint: String },
    #[error("the state has no key `{key}`{hint}")]
    NoSuchKey { key: String, hint: String },
    #[error("the edit of `{key}` does not match its schema: {why}")]
    Schema { key: String, why: String },
    #[error(
        "a Send runs a fan-out target on its argument, and `{node}` is not one (no `send` edge reaches it, so it takes no item)"
    )]
    NotASendTarget { node: String },
    /// The write as the node could not be folded, or its edges not followed.
    #[error("as `{node}`: {message}")]
    AsNode { node: String, message: String },
}

/// What a command's `goto` runs next: a node, or a node given an argument (LangGraph's
/// `Send(node, arg)`), which runs as one of the node's fan-out tasks with `arg` as its item.
#[derive(Debug, Clone, PartialEq)]
pub enum Goto {
    Node(String),
    Send { node: String, arg: Value },
}

/// The node `target` runs in `plan` (`None` for `END`): one of its nodes, and for a Send one of
/// its fan-out targets, whose tasks take the Send's argument as their item.
pub fn goto_target(plan: &Plan, target: &Goto) -> Result<Option<NodeIx>, EditError> {
    let (node, send) = match target {
        Goto::Node(node) if matches!(node.as_str(), "END" | "__end__") => return Ok(None),
        Goto::Node(node) => (node, false),
        Goto::Send { node, .. } => (node, true),
    };
    let Some(ix) = plan.node_by_name(node) else {
        return Err(EditError::NoSuchNode {
            node: node.clone(),
            hint: hint(node, plan.nodes().values().map(|n| n.name.as_str())),
        });
    };
    if send && plan.nodes()[&ix].item.is_none() {
        return Err(EditError::NotASendTarget { node: node.clone() });
    }
    Ok(Some(ix))
}

impl Engine {
    /// Edits the state of a thread at its latest checkpoint, as a new checkpoint. With
    /// `as_node`, `values` are written as that node's write through the reducers (a message
    /// is appended to an `add_messages` key, an `overwrite(...)` marker replaces) and the thread
    /// continues from what the node's edges say on the edited state: the node's successors are
    /// scheduled beside the pending tasks of other nodes, and a pending task of the node itself
    /// counts as done. Without it, the values replace the keys' values outright and the pending
    /// tasks stay. Continue the thread with [`Engine::resume`].
    pub async fn update_state(
        &self,
        thread_id: &str,
        values: Vec<(String, Value)>,
        as_node: Option<&str>,
    ) -> Result<Checkpoint, EngineError> {
        self.update_state_at(thread_id, values, as_node, None).await
    }

    /// [`Engine::update_state`] at checkpoint `at` of the thread (none: its latest). An older
    /// checkpoint forks the thread there, as a run from it does: the edit's checkpoint is `at`'s
    /// child and the thread's new head, and the branch it leaves keeps its checkpoints.
    pub async fn update_state_at(
        &self,
        thread_id: &str,
        values: Vec<(String, Value)>,
        as_node: Option<&str>,
        at: Option<&str>,
    ) -> Result<Checkpoint, EngineError> {
        let held = lease::take(&self.store, thread_id, &self.options.lease, &self.cancel).await?;
        let edited = self.edit(thread_id, values, as_node, at, held.fence());
        let released = held.release();
        let edited = edited?;
        released?;
        Ok(edited)
    }

    /// LangGraph's `Command(update=, goto=)` given as a run's input, applied to the thread's
    /// latest checkpoint as a new checkpoint under the thread's lease: `update`'s values are
    /// written through the keys' reducers, as a run's input is (a message is appended to an
    /// `add_messages` key); `goto`'s nodes and sends are what runs next, in place of the
    /// pending tasks (`END` alone: nothing; a gate that waited is dropped); a send's node must
    /// be a fan-out target, whose tasks take an item. Without `goto` the pending tasks
    /// and their gates' records stay, so an answer can follow. Continue the thread with
    /// [`Engine::resume`] or [`Engine::answer`].
    pub async fn command(
        &self,
        thread_id: &str,
        update: Vec<(String, Value)>,
        goto: Option<Vec<Goto>>,
    ) -> Result<Checkpoint, EngineError> {
        // A lease claimed for the run (a worker's claim of a queued run) stays the run's: the
        // command writes under it and leaves it held, for the run that follows to renew and
        // release. Taken and released here, it would be gone when the run writes.
        let policy = match &self.options.lease {
            lease::LeasePolicy::Claimed { lease, .. } => lease::LeasePolicy::Under(lease.fence()),
            other => other.clone(),
        };
        let held = lease::take(&self.store, thread_id, &policy, &self.cancel).await?;
        let done = self.commanded(thread_id, &update, goto, held.fence());
        let released = held.release();
        let done = done?;
        released?;
        Ok(done)
    }

    fn commanded(
        &self,
        thread_id: &str,
        update: &[(String, Value)],
        goto: Option<Vec<Goto>>,
        fence: &Fence,
    ) -> Result<Checkpoint, EngineError> {
        let (thread, cp) = self.head(thread_id, update)?;
        let mut meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        let state = self.store.state(&thread.thread_id, &cp.versions)?;
        // The step of the checkpoint the command makes: the next one when `goto` runs nodes.
        let written_at = if goto.is_some() { cp.step + 1 } else { cp.step };
        let writer = super::task_id(thread_id, UPDATE_TASK, written_at, meta.branch, None);
        let writes: super::apply::Updates = update
            .iter()
            .map(|(k, v)| (k.as_str(), vec![("input", writer.as_str(), v)]))
            .collect();
        let folded = self
            .fold_writes(&state, &cp.versions, &mut meta, &writes)
            .map_err(|e| EngineError::Input(format!("command.update: {e}")))?;
        meta.source = Some(super::Source::Update);
        meta.run = self.options.metadata.as_deref().cloned();
        let (step, next, records) = match goto {
            None => (
                cp.step,
                cp.next.clone(),
                self.store.get_writes(thread_id, &cp.checkpoint_id)?,
            ),
            Some(targets) => {
                let mut next = Vec::new();
                for target in targets {
                    if let Some(ix) = goto_target(&self.plan, &target)? {
                        next.push(match target {
                            Goto::Send { arg, .. } => Next::Send(ix, arg),
                            Goto::Node(_) => Next::Node(ix),
                        });
                    }
                }
                meta.barriers.clear();
                meta.deferred.clear();
                let branch = meta.branch;
                let next = self.hold_deferred(
                    &mut meta,
                    self.schedule(next, thread_id, cp.step + 2, branch),
                    thread_id,
                    cp.step + 2,
                );
                (cp.step + 1, next, Vec::new())
            }
        };
        let edited = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(cp.checkpoint_id.clone()),
            step,
            versions: folded.versions,
            ran: Vec::new(),
            changed: folded.changed,
            next,
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            plan_hash: self.plan.hash().to_string(),
            created_at: crate::clock::now(),
            ..cp
        };
        let mut puts = vec![
            Put::Fence(fence.clone()),
            Put::Checkpoint(Arc::new(edited.clone()), folded.stored),
        ];
        if !records.is_empty() {
            puts.push(Put::Writes {
                thread_id: thread_id.to_string(),
                checkpoint_id: edited.checkpoint_id.clone(),
                writes: records,
            });
        }
        puts.push(settled(thread_id, &edited));
        self.store.put_batch(puts)?;
        Ok(edited)
    }

    /// The thread and its latest checkpoint, with every key `values` names checked to exist.
    fn head(
        &self,
        thread_id: &str,
        values: &[(String, Value)],
    ) -> Result<(checkpoint::Thread, Checkpoint), EngineError> {
        let thread = self
            .store
            .get_thread(thread_id)?
            .ok_or_else(|| EngineError::NoThread(thread_id.to_string()))?;
        let cp = self
            .store
            .get_checkpoint(thread_id, None)?
            .ok_or_else(|| EngineError::NoThread(thread_id.to_string()))?;
        for (key, _) in values {
            if !self.plan.state().contains_key(key) {
                return Err(EditError::NoSuchKey {
                    key: key.clone(),
                    hint: hint(key, self.plan.state().keys().map(String::as_str)),
                }
                .into());
            }
        }
        Ok((thread, cp))
    }

    fn edit(
        &self,
        thread_id: &str,
        values: Vec<(String, Value)>,
        as_node: Option<&str>,
        at: Option<&str>,
        fence: &Fence,
    ) -> Result<Checkpoint, EngineError> {
        let (thread, head) = self.head(thread_id, &values)?;
        let forked = at.is_some_and(|at| at != head.checkpoint_id);
        // An older checkpoint is the base of a new branch, its values carried to versions no
        // branch has used (see `branch`), stored with the edit's checkpoint.
        let (cp, carried) = match at.filter(|_| forked) {
            Some(at) => {
                let from = self
                    .store
                    .get_checkpoint(thread_id, Some(at))?
                    .ok_or_else(|| EngineError::Input(format!("thread `{thread_id}` has no checkpoint `{at}`")))?;
                // The edit is the thread's head: the newest checkpoint, whatever its step.
                self.branch(thread_id, from)?
            }
            None => (head, Vec::new()),
        };
        let mut meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        meta.source = Some(super::Source::Update);
        meta.run = self.options.metadata.as_deref().cloned();
        let (edited, stored) = match as_node {
            None => self.replaced(&cp, &mut meta, values)?,
            Some(node) => self.as_node(&thread, &cp, &carried, &mut meta, &values, node)?,
        };
        // The carried values first: an edited key's new version comes after its carried one.
        let stored: NewValues = carried.into_iter().chain(stored).collect();
        let edited = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            parent_id: Some(cp.checkpoint_id.clone()),
            meta: serde_json::to_value(&meta).unwrap_or_default(),
            plan_hash: self.plan.hash().to_string(),
            created_at: crate::clock::now(),
            ..edited
        };
        let mut puts = vec![
            Put::Fence(fence.clone()),
            Put::Checkpoint(Arc::new(edited.clone()), stored),
        ];
        // As a node, the edit decides what is left to run; a fork's head is the edit's: the
        // thread is done, or can be continued (no gate waits: the edit's checkpoint has no
        // records).
        if as_node.is_some() || forked {
            puts.push(settled(thread_id, &edited));
        }
        self.store.put_batch(puts)?;
        Ok(edited)
    }

    /// The values replace the keys' values outright, each checked against its key's schema;
    /// the step and the pending tasks stay.
    fn replaced(
        &self,
        cp: &Checkpoint,
        meta: &mut Meta,
        values: Vec<(String, Value)>,
    ) -> Result<(Checkpoint, NewValues), EngineError> {
        let mut versions = cp.versions.clone();
        let mut changed = Vec::new();
        let mut stored = Vec::new();
        for (key, value) in values {
            if let Some(why) = self.validators.violation(&key, &value) {
                return Err(EditError::Schema { key, why }.into());
            }
            let version = versions.get(&key).copied().unwrap_or(0) + 1;
            versions.insert(key.clone(), version);
            // A whole value ends the key's chain of stored extensions.
            meta.chains.insert(key.clone(), 0);
            changed.push(key.clone());
            stored.push((key, version, value));
        }
        let edited = Checkpoint {
            versions,
            ran: Vec::new(),
            changed,
            ..cp.clone()
        };
        Ok((edited, stored))
    }

    /// The values as `node`'s write through the reducers, and the tasks after it: the pending
    /// tasks of other nodes and what `node`'s edges say on the edited state.
    fn as_node(
        &self,
        thread: &checkpoint::Thread,
        cp: &Checkpoint,
        carried: &NewValues,
        meta: &mut Meta,
        values: &[(String, Value)],
        node: &str,
    ) -> Result<(Checkpoint, NewValues), EngineError> {
        let Some(ix) = self.plan.node_by_name(node) else {
            return Err(EditError::NoSuchNode {
                node: node.to_string(),
                hint: hint(node, self.plan.nodes().values().map(|n| n.name.as_str())),
            }
            .into());
        };
        let failed = |message: String| EditError::AsNode {
            node: node.to_string(),
            message,
        };
        // A carried value is not stored yet: it is read from `carried`, the rest from the store.
        let stored_before: BTreeMap<String, u64> = cp
            .versions
            .iter()
            .filter(|(k, _)| !carried.iter().any(|(c, _, _)| c == *k))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        let mut state = self.store.state(&thread.thread_id, &stored_before)?;
        for (key, _, value) in carried {
            state.insert(key.clone(), value.clone());
        }
        let writer = super::task_id(&thread.thread_id, node, cp.step + 1, meta.branch, None);
        let writes: super::apply::Updates = values
            .iter()
            .map(|(k, v)| (k.as_str(), vec![(node, writer.as_str(), v)]))
            .collect();
        let folded = self
            .fold_writes(&state, &cp.versions, meta, &writes)
            .map_err(|e| failed(e.to_string()))?;
        for (key, value) in folded.values {
            state.insert(key, value);
        }
        let step = cp.step + 1;
        let input = meta.input.clone().unwrap_or_else(|| thread.input.clone());
        let branches = &self.plan.nodes()[&ix].branches;
        let mut next = self
            .route_outside(thread, &input, &state, step, self.limit(), node, branches)
            .map_err(failed)?;
        self.join(meta, ix, node, &mut next);
        // The pending tasks of other nodes still run; a pending task of `node` is what the
        // edit stands for.
        let pending = cp.next.iter().filter(|t| t.node != node).filter_map(|t| {
            let ix = self.plan.node_by_name(&t.node)?;
            Some(match &t.item {
                Some(item) => Next::Send(ix, item.clone()),
                None => Next::Node(ix),
            })
        });
        let next: Vec<Next> = pending.chain(next).collect();
        // A deferred node the edit's edges reach waits like one a step reached.
        let branch = meta.branch;
        let next = self.hold_deferred(
            meta,
            self.schedule(next, &thread.thread_id, step + 1, branch),
            &thread.thread_id,
            step + 1,
        );
        let edited = Checkpoint {
            step,
            versions: folded.versions,
            ran: vec![node.to_string()],
            changed: folded.changed,
            next,
            ..cp.clone()
        };
        Ok((edited, folded.stored))
    }
}

/// The writer of a command's `update` (as LangGraph writes it: a task of its own, not a node's).
const UPDATE_TASK: &str = "__update__";

/// " (did you mean `x`?)" for a near miss among `names`, else nothing.
fn hint<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> String {
    crate::diag::did_you_mean(name, names)
        .map(|s| format!(" (did you mean `{s}`?)"))
        .unwrap_or_default()
}

/// The thread's status once an edit decided what is left to run: done when nothing is, else
/// running (continued by the next run).
fn settled(thread_id: &str, edited: &Checkpoint) -> Put {
    Put::Status {
        thread_id: thread_id.to_string(),
        status: if edited.next.is_empty() {
            ThreadStatus::Done
        } else {
            ThreadStatus::Running
        },
    }
}

impl Engine {
    /// An engine that only reads and folds `plan`'s checkpoints (no node runs): what
    /// [`Engine::pending_state`] needs.
    fn reader(plan: Arc<Plan>, store: Arc<dyn crate::checkpoint::Checkpointer>) -> Engine {
        static NOTHING: std::sync::OnceLock<Arc<super::Services>> = std::sync::OnceLock::new();
        let services = NOTHING
            .get_or_init(|| Arc::new(super::Services::with_kinds(super::Kinds::default())))
            .clone();
        Engine::sharing(plan, store, services, super::events::Events::none())
    }

    /// The state at `cp` as LangGraph's `get_state` shows a thread's head: the results its
    /// finished tasks stored (a step cut short by a gate keeps them) applied through the
    /// reducers, in plan order, and the tasks still to run. A checkpoint whose tasks have no
    /// results is its own state and tasks.
    pub fn pending_state(
        plan: Arc<Plan>,
        store: Arc<dyn crate::checkpoint::Checkpointer>,
        cp: &Checkpoint,
    ) -> Result<(serde_json::Map<String, Value>, Vec<crate::checkpoint::TaskSpec>), EngineError> {
        let engine = Engine::reader(plan, store);
        let mut state = engine.store.state(&cp.thread_id, &cp.versions)?;
        let pending = engine.store.get_writes(&cp.thread_id, &cp.checkpoint_id)?;
        let mut finished: Vec<(crate::checkpoint::TaskSpec, super::task::Done)> = Vec::new();
        let mut left = Vec::new();
        for t in &cp.next {
            match super::apply::cached(&pending, &t.task_id, &engine.plan, true) {
                Some(Ok(done)) if t.node != super::START_TASK => finished.push((t.clone(), done)),
                _ => left.push(t.clone()),
            }
        }
        if finished.is_empty() {
            return Ok((state, cp.next.clone()));
        }
        let outcomes: Vec<(crate::checkpoint::TaskSpec, super::step::StepResult)> = finished
            .into_iter()
            .map(|(t, d)| (t, super::step::StepResult::Done(d)))
            .collect();
        let done = engine.in_plan_order(&outcomes);
        let updates = super::apply::updates_of(&done);
        let mut meta: Meta = serde_json::from_value(cp.meta.clone()).unwrap_or_default();
        let folded = engine
            .fold_writes(&state, &cp.versions, &mut meta, &updates)
            .map_err(|e| EngineError::Input(e.to_string()))?;
        for (key, value) in folded.values {
            state.insert(key, value);
        }
        Ok((state, left))
    }
}

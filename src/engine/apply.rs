//! Applying a step: its writes folded into the state in plan order (then fan-out index)
//! through each key's reducer, write conflicts refused, each new value checked against its
//! key's schema and stored whole or as an extension of the previous version; and a finished
//! task's result encoded as the one record that lets a crash skip it.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::kind::Handoff;
use super::step::{StepResult, follow};
use super::task::{self, Next};
use super::values::{self, ReduceError, Scope};
use super::{DONE, Engine, EngineError, IDX_DONE, MAX_CHAIN, Meta, NewValues, Run};
use crate::checkpoint::{self, Checkpoint, PendingWrite, TaskSpec};
use crate::compile::{NodeIx, Plan, Reducer, Target};

/// Why a step's writes cannot be applied. The step then does not happen: the state is as
/// before it, and the tasks' stored results let a fixed workflow go on without running them.
#[derive(Debug, thiserror::Error)]
pub(super) enum ApplyError {
    #[error("node `{node}` wrote `{key}`, which is not a state key")]
    NotAStateKey { node: String, key: String },
    #[error("write conflict: {} wrote `{key}` in the same superstep, and `{key}` has no reducer (give it one, e.g. `reducer: append`)", .nodes.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(" and "))]
    Conflict { key: String, nodes: Vec<String> },
    #[error("`{key}`: {source}")]
    Reduce {
        key: String,
        #[source]
        source: ReduceError,
    },
    #[error("the new value of `{key}` (written by `{node}`) does not match its schema: {why}")]
    Schema { key: String, node: String, why: String },
    #[error("routing after `{node}`: {message}")]
    Routing { node: String, message: String },
}

/// A stored task result that no longer fits the workflow.
#[derive(Debug, thiserror::Error)]
pub(super) enum DecodeError {
    #[error(
        "the workflow changed since task `{task}` finished: the node `{node}` it chose next is gone; pass --force to continue without it, or start a new thread"
    )]
    SuccessorGone { task: String, node: String },
    #[error("the stored result of task `{task}` is not readable: {why}")]
    Unreadable { task: String, why: String },
}

impl From<DecodeError> for EngineError {
    fn from(e: DecodeError) -> EngineError {
        EngineError::Incompatible(e.to_string())
    }
}

/// A step's writes by key, in the order they apply: the node that wrote each, its writer (the
/// task, `input`, or the node a state edit writes as) and the value.
pub(super) type Updates<'a> = BTreeMap<&'a str, Vec<(&'a str, &'a str, &'a Value)>>;

/// The writes of finished tasks (in plan order) by key: each with its node and task.
pub(super) fn updates_of<'a>(done: &[(&'a TaskSpec, &'a task::Done)]) -> Updates<'a> {
    let mut updates: Updates = BTreeMap::new();
    for (t, d) in done {
        for (k, v) in &d.writes {
            updates
                .entry(k.as_str())
                .or_default()
                .push((t.node.as_str(), t.task_id.as_str(), v));
        }
    }
    updates
}

/// A step's writes folded into new values: the versions after the step, the keys that
/// changed, what to store for each, and each key's new value.
pub(super) struct Folded {
    pub(super) versions: BTreeMap<String, u64>,
    pub(super) changed: Vec<String>,
    pub(super) stored: NewValues,
    pub(super) values: Vec<(String, Value)>,
}

impl Engine {
    /// Applies a step's writes in plan order through the reducers, checks them, and schedules
    /// the next step. Returns the new checkpoint and the values it introduces; on success
    /// `run.state` (and the scope value of it) is the state after the step.
    pub(super) fn apply(
        &self,
        run: &mut Run,
        outcomes: &[(TaskSpec, StepResult)],
        step: i64,
    ) -> Result<(Checkpoint, NewValues), ApplyError> {
        let done = self.in_plan_order(outcomes);
        let updates = updates_of(&done);
        for (t, d) in &done {
            self.count_usage(&mut run.meta, &t.node, &d.usage);
        }
        let folded = self.fold(run, &updates)?;
        // Routing sees the state after the step; if routing fails, the step did not happen.
        let previous: Vec<(String, Option<Value>)> = folded
            .values
            .into_iter()
            .map(|(k, v)| (k.clone(), run.state.insert(k, v)))
            .collect();
        run.state_view
            .update(&run.state, previous.iter().map(|(k, _)| k.as_str()));
        let (next, ran) = match self.route(run, &done, step) {
            Ok(routed) => routed,
            Err(message) => {
                for (k, old) in previous {
                    match old {
                        Some(v) => run.state.insert(k, v),
                        None => run.state.remove(&k),
                    };
                }
                run.state_view = values::StateView::new(&run.state);
                return Err(message);
            }
        };
        let branch = run.meta.branch;
        run.meta.source = None;
        run.meta.run = self.options.metadata.as_deref().cloned();
        let thread = run.shared.thread_id.clone();
        let next = self.hold_deferred(
            &mut run.meta,
            self.schedule(next, &thread, step + 1, branch),
            &thread,
            step + 1,
        );
        let cp = Checkpoint {
            checkpoint_id: checkpoint::new_id(),
            thread_id: run.shared.thread_id.clone(),
            parent_id: Some(run.cp.checkpoint_id.clone()),
            step,
            versions: folded.versions,
            ran,
            changed: folded.changed,
            next,
            meta: serde_json::to_value(&run.meta).unwrap_or_default(),
            plan_hash: self.plan.hash().to_string(),
            created_at: crate::clock::now(),
        };
        Ok((cp, folded.stored))
    }

    /// The finished tasks of a step, in plan order, then fan-out index: the order their writes
    /// apply in, whatever order they finished in. `outcomes` are in the step's order, which
    /// lists a node's fan-out items by index, and the sort is stable, so it keeps them so.
    pub(super) fn in_plan_order<'a>(
        &self,
        outcomes: &'a [(TaskSpec, StepResult)],
    ) -> Vec<(&'a TaskSpec, &'a task::Done)> {
        let order = |t: &TaskSpec| {
            self.plan
                .node_by_name(&t.node)
                .and_then(|ix| self.plan.nodes().get_index_of(&ix))
                .unwrap_or(usize::MAX)
        };
        let mut done: Vec<(&TaskSpec, &task::Done)> = outcomes
            .iter()
            .filter_map(|(t, r)| match r {
                StepResult::Done(d) => Some((t, d)),
                _ => None,
            })
            .collect();
        done.sort_by_key(|(t, _)| order(t));
        done
    }

    /// Folds each key's writes (by node, in order) through its reducer and checks the result.
    fn fold(&self, run: &mut Run, updates: &Updates) -> Result<Folded, ApplyError> {
        self.fold_writes(&run.state, &run.cp.versions, &mut run.meta, updates)
    }

    /// [`Engine::fold`] on a state outside a run: the state and versions of a checkpoint, and
    /// the meta of the checkpoint being made. Each write's writer (a task id, unique in the
    /// thread) makes the ids of the messages written without one ([`values::message_id`]).
    pub(super) fn fold_writes(
        &self,
        state: &Map<String, Value>,
        versions: &BTreeMap<String, u64>,
        meta: &mut Meta,
        updates: &Updates,
    ) -> Result<Folded, ApplyError> {
        let mut folded = Folded {
            versions: versions.clone(),
            changed: Vec::new(),
            stored: Vec::new(),
            values: Vec::with_capacity(updates.len()),
        };
        for (key, writes) in updates {
            let Some(channel) = self.plan.state().get(*key) else {
                return Err(ApplyError::NotAStateKey {
                    node: writes[0].0.to_string(),
                    key: key.to_string(),
                });
            };
            if !channel.reducer.combines() && writes.len() > 1 {
                return Err(ApplyError::Conflict {
                    key: key.to_string(),
                    nodes: writes.iter().map(|(n, _, _)| n.to_string()).collect(),
                });
            }
            let current = state.get(*key).unwrap_or(&Value::Null);
            let reduced = values::reduce(
                &self.plan,
                &channel.reducer,
                current,
                writes
                    .iter()
                    .map(|(_, writer, v)| {
                        // Only add_messages gives ids; any other reducer is spared the string.
                        let ids = match channel.reducer {
                            Reducer::AddMessages => values::message_id(writer),
                            _ => String::new(),
                        };
                        ((*v).clone(), ids)
                    })
                    .collect(),
            )
            .map_err(|source| ApplyError::Reduce {
                key: key.to_string(),
                source,
            })?;
            let value = reduced.value;
            if let Some(why) = self.validators.violation(*key, &value) {
                return Err(ApplyError::Schema {
                    key: key.to_string(),
                    node: writes[0].0.to_string(),
                    why,
                });
            }
            let version = folded.versions.get(*key).copied().unwrap_or(0) + 1;
            folded.versions.insert(key.to_string(), version);
            folded.changed.push(key.to_string());
            // An overwritten value need not begin with the old one: it is stored whole.
            let extension = if reduced.overwritten {
                meta.chains.insert(key.to_string(), 0);
                None
            } else {
                stored_extension(meta, key, &channel.reducer, current, &value)
            };
            let stored = match extension {
                Some(items) => checkpoint::extension(version - 1, items),
                None => value.clone(),
            };
            folded.stored.push((key.to_string(), version, stored));
            folded.values.push((key.to_string(), value));
        }
        Ok(folded)
    }

    /// Where the step's tasks lead, on the state after the step: the successors they chose,
    /// their branches, and the joins they complete. Returns the successors and the nodes that
    /// ran.
    fn route(
        &self,
        run: &mut Run,
        done: &[(&TaskSpec, &task::Done)],
        step: i64,
    ) -> Result<(Vec<Next>, Vec<String>), ApplyError> {
        let shared = run.shared.clone();
        let after_step = Arc::new(Scope::over(
            &run.constants,
            BTreeMap::from([("state".to_string(), run.state_view.value())]),
            Some(self.plan.clone()),
        ));
        let meta = &mut run.meta;
        let mut next: Vec<Next> = Vec::new();
        let mut ran = Vec::new();
        for (t, d) in done {
            ran.push(t.node.clone());
            if self.node_spec(&t.node).is_some_and(|n| n.common().max_visits.is_some()) {
                *meta.visits.entry(t.node.clone()).or_insert(0) += 1;
            }
            let Some(ix) = self.plan.node_by_name(&t.node) else {
                continue;
            };
            next.extend(d.next.iter().cloned());
            // A node that hands off to the parent ends this run: its edges are not followed.
            if d.handled || d.next.iter().any(|n| matches!(n, Next::Handoff(_))) {
                continue;
            }
            let run_var = values::run_value(&shared.thread_id, step, &t.node, shared.end_step - step - 1);
            let scope = Arc::new(after_step.with([("run".to_string(), run_var)])).value();
            for b in &self.plan.nodes()[&ix].branches {
                follow(&shared, b, &scope, &mut next).map_err(|e| ApplyError::Routing {
                    node: t.node.clone(),
                    message: e.message,
                })?;
            }
            self.join(meta, ix, &t.node, &mut next);
        }
        ran.dedup();
        let handoffs: Vec<Handoff> = next
            .iter()
            .filter_map(|n| match n {
                Next::Handoff(h) => Some(h.clone()),
                _ => None,
            })
            .collect();
        if let Some(h) = handoffs.first()
            && !shared.as_child
        {
            let node = done
                .iter()
                .find(|(_, d)| d.next.iter().any(|n| matches!(n, Next::Handoff(_))))
                .map(|(t, _)| t.node.clone())
                .unwrap_or_default();
            return Err(ApplyError::Routing {
                node,
                message: format!(
                    "it hands off to the parent's node `{}`, but this workflow runs on its own: a handoff needs a workflow that runs it as a subgraph",
                    h.to
                ),
            });
        }
        // A handoff ends the run after this step: what else the step scheduled never runs.
        // The checkpoint records the handoffs, so the parent reads them again after a crash.
        if !handoffs.is_empty() {
            next.clear();
        }
        meta.handoffs = handoffs;
        Ok((next, ran))
    }

    /// Records that `node` ran toward each join it is a source of; a join whose sources have
    /// all run since its target last ran fires.
    pub(super) fn join(&self, meta: &mut Meta, ix: NodeIx, node: &str, next: &mut Vec<Next>) {
        for (j, (sources, target)) in self.plan.joins().iter().enumerate() {
            if sources.contains(&ix) {
                let barrier = meta.barriers.entry(j).or_default();
                barrier.insert(node.to_string());
                if sources.iter().all(|s| barrier.contains(self.plan.name_of(*s))) {
                    barrier.clear();
                    next.push(match target {
                        Target::Node(n) => Next::Node(*n),
                        Target::End => Next::End,
                    });
                }
            }
        }
    }
}

/// What an append-only key stores for a step: the items it added, extending the previous
/// version; a full value (none here) every `MAX_CHAIN` versions keeps reads short. (`exit`
/// mode commits only the last checkpoint: its persister folds the extensions of skipped
/// versions together.)
fn stored_extension(
    meta: &mut Meta,
    key: &str,
    reducer: &Reducer,
    current: &Value,
    value: &Value,
) -> Option<Vec<Value>> {
    match (reducer, current, value) {
        (Reducer::Append | Reducer::Extend | Reducer::Union, Value::Array(old), Value::Array(new))
            if new.len() >= old.len() =>
        {
            let chain = meta.chains.entry(key.to_string()).or_insert(0);
            if *chain < MAX_CHAIN {
                *chain += 1;
                Some(new[old.len()..].to_vec())
            } else {
                *chain = 0;
                None
            }
        }
        _ => None,
    }
}

/// A finished task's result as one stored write: its state writes, the successors it chose
/// (by node name: indices shift when the workflow is edited), whether its error handler took
/// over, and its usage.
pub(super) fn encode(task_id: &str, done: &task::Done, plan: &Plan) -> Vec<PendingWrite> {
    let next: Vec<Value> = done
        .next
        .iter()
        .map(|n| match n {
            Next::Node(ix) => json!({"to": plan.name_of(*ix)}),
            Next::End => json!({"end": true}),
            Next::Send(ix, item) => json!({"send": plan.name_of(*ix), "item": item}),
            Next::Handoff(h) => json!({"handoff": h}),
        })
        .collect();
    let writes: Vec<Value> = done.writes.iter().map(|(k, v)| json!([k, v])).collect();
    let mut value = json!({"writes": writes});
    if !next.is_empty() {
        value["next"] = Value::Array(next);
    }
    if done.handled {
        value["handled"] = Value::Bool(true);
    }
    if done.usage.calls > 0 {
        value["usage"] = serde_json::to_value(done.usage).unwrap_or_default();
    }
    vec![PendingWrite {
        task_id: task_id.into(),
        idx: IDX_DONE,
        channel: DONE.into(),
        value,
    }]
}

/// A task finished before (its result stored), decoded. A successor whose node is gone from
/// the workflow is an error, or dropped with `force`.
pub(super) fn cached(
    pending: &[PendingWrite],
    task_id: &str,
    plan: &Plan,
    force: bool,
) -> Option<Result<task::Done, DecodeError>> {
    let w = pending.iter().find(|w| w.task_id == task_id && w.channel == DONE)?;
    Some(decode(w, plan, force))
}

pub(super) fn decode(w: &PendingWrite, plan: &Plan, force: bool) -> Result<task::Done, DecodeError> {
    let mut done = task::Done::default();
    for pair in w.value.get("writes").and_then(Value::as_array).into_iter().flatten() {
        if let (Some(k), Some(v)) = (pair.get(0).and_then(Value::as_str), pair.get(1)) {
            done.writes.push((k.to_string(), v.clone()));
        }
    }
    done.handled = w.value.get("handled").and_then(Value::as_bool).unwrap_or(false);
    done.usage = w
        .value
        .get("usage")
        .and_then(|u| serde_json::from_value(u.clone()).ok())
        .unwrap_or_default();
    // Names; databases written by earlier builds hold plan indices (and `"to": "END"`).
    let to_ix = |v: &Value| -> Result<Option<NodeIx>, DecodeError> {
        match v {
            Value::String(name) => match plan.node_by_name(name) {
                Some(ix) => Ok(Some(ix)),
                None if force => Ok(None),
                None => Err(DecodeError::SuccessorGone {
                    task: w.task_id.clone(),
                    node: name.clone(),
                }),
            },
            _ => Ok(v
                .as_u64()
                .map(|i| petgraph::stable_graph::NodeIndex::new(i as usize))
                .filter(|ix| plan.nodes().contains_key(ix))),
        }
    };
    for n in w.value.get("next").and_then(Value::as_array).into_iter().flatten() {
        if n.get("end").is_some() || n.get("to") == Some(&json!("END")) {
            done.next.push(Next::End);
        } else if let Some(to) = n.get("to") {
            done.next.extend(to_ix(to)?.map(Next::Node));
        } else if let Some(h) = n.get("handoff") {
            let h = serde_json::from_value::<Handoff>(h.clone()).map_err(|e| DecodeError::Unreadable {
                task: w.task_id.clone(),
                why: format!("its handoff: {e}"),
            })?;
            done.next.push(Next::Handoff(h));
        } else if let Some(to) = n.get("send") {
            let item = n.get("item").cloned().unwrap_or(Value::Null);
            done.next.extend(to_ix(to)?.map(|ix| Next::Send(ix, item)));
        }
    }
    Ok(done)
}

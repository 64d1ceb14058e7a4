//! A superstep's tasks and what follows them: tasks finished before a crash taken from their
//! records, the others run concurrently (each storing its result as it finishes), pauses at
//! `interrupt_before` / `interrupt_after`, where branches lead, and the next step's tasks
//! (joins fire once all their sources ran; each fan-out item is its own task).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::FutureExt;
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tracing::Instrument;

use super::apply::{cached, encode};
use super::cache;
use super::events::{Event, TaskOutcome};
use super::gates::reported;
use super::kind::NodeError;
use super::persist::Persister;
use super::task::{self, Next, Outcome};
use super::values::{self, Scope};
use super::{
    AFTER, BEFORE, DONE, End, Engine, EngineError, IDX_ANSWERED, IDX_INTERRUPT, INTERRUPT, Meta, RESUME, RESUME_TO,
    RESUMED, Run, Shared,
};
use crate::checkpoint::{self, Checkpoint, PendingWrite, Put, TaskSpec};
use crate::compile::{Branch, NodeIx, Target};

/// What the step's last task leaves to the step's commit: its result (stored with the step's
/// checkpoint, in the same commit) and its `node_end`, sent after that commit.
#[derive(Default)]
pub(super) struct Deferred {
    pub(super) events: Vec<Event>,
    pub(super) writes: Vec<PendingWrite>,
}

/// What became of one task of a step.
#[derive(Debug, Clone)]
pub(super) enum StepResult {
    Done(task::Done),
    Interrupt(Value),
    Failed(NodeError),
}

/// The answers task `task_id` used before, in the order given.
pub(super) fn earlier_answers(pending: &[PendingWrite], task_id: &str) -> Vec<Value> {
    let mut earlier: Vec<&PendingWrite> = pending
        .iter()
        .filter(|w| w.task_id == task_id && w.channel == RESUMED && w.idx >= IDX_ANSWERED)
        .collect();
    earlier.sort_by_key(|w| w.idx);
    earlier.into_iter().map(|w| w.value.clone()).collect()
}

/// A task to start: its index in the step, its node, the answer it resumes with (and which
/// gate inside it the answer is for), and why it may not call a model (a spent budget).
type ToRun = (usize, NodeIx, Option<task::Resume>, Option<NodeError>);

impl Engine {
    /// Runs the step's tasks: those already finished before a crash are taken from their stored
    /// writes; the others run concurrently, each storing its writes as it finishes. Returns
    /// each task's result, in the step's order, and the events to send once the step's
    /// checkpoint is committed.
    pub(super) async fn run_step(
        &self,
        run: &Run,
        step: i64,
    ) -> Result<(Vec<(TaskSpec, StepResult)>, Deferred), EngineError> {
        let cp = &run.cp;
        let base = Arc::new(Scope::over(
            &run.constants,
            BTreeMap::from([("state".to_string(), run.state_view.value())]),
            Some(self.plan.clone()),
        ));
        let (mut results, mut to_run, mut keys) = self.prepare_tasks(run, step, &base)?;
        // A task's future is made when it starts, not before: a fan-out of a thousand holds a
        // thousand of them, so they are not also kept in a list.
        let start = |(i, ix, resume, spent): ToRun| {
            let t = &cp.next[i];
            let span = super::trace::task(run.shared.plan.name_of(ix), &t.task_id, step);
            let fut = task::run(
                run.shared.clone(),
                ix,
                t.task_id.clone(),
                t.item.clone(),
                base.clone(),
                step,
                resume,
                spent,
            )
            .instrument(span);
            // `map`, not an async block: a block awaiting a captured future keeps two copies.
            fut.map(move |out| (i, out))
        };
        // One task runs in place; several run on the runtime's workers, in parallel. In place,
        // boxed: this future would otherwise hold the task's future three times over (in
        // `inline`, taken out of it, and awaited), and so would every future awaiting it.
        let mut inline = if to_run.len() == 1 {
            to_run.pop().map(|args| Box::pin(start(args)))
        } else {
            None
        };
        let mut set = JoinSet::new();
        let mut remaining = to_run.len() + usize::from(inline.is_some());
        let mut deferred = Deferred::default();
        // Each task is polled once here, in plan order, before it goes to the workers: a task
        // that needs no waiting (a gate, a `set`) is settled at once, so what such tasks tell
        // (a gate's interrupt, a write) comes in plan order, as on LangGraph, not in the order
        // threads happen to finish them. (The first poll's wakers are registered again by the
        // worker's poll.)
        for args in to_run {
            let mut fut = Box::pin(start(args));
            match futures::poll!(fut.as_mut()) {
                std::task::Poll::Ready((i, (outcome, duration_ms))) => {
                    remaining -= 1;
                    let result = self.settle(run, &cp.next[i], outcome, duration_ms, step, remaining, &mut deferred)?;
                    self.cache_keep(keys[i].take(), &cp.next[i], &result);
                    results[i] = Some(result);
                }
                std::task::Poll::Pending => {
                    set.spawn(fut);
                }
            }
        }
        loop {
            let joined = match inline.take() {
                Some(fut) => Ok(fut.await),
                // Tasks that finished meanwhile are settled before the writes of those settled
                // so far are committed: one commit for all of them (up to a batch).
                None => {
                    let ready = if run.persister.holds_a_batch() {
                        None
                    } else {
                        set.try_join_next()
                    };
                    match ready {
                        Some(joined) => joined,
                        None => {
                            tokio::task::block_in_place(|| run.persister.release())?;
                            match set.join_next().await {
                                Some(joined) => joined,
                                None => break,
                            }
                        }
                    }
                }
            };
            remaining -= 1;
            let (i, (outcome, duration_ms)) = joined.map_err(|e| {
                EngineError::Store(checkpoint::CheckpointError::Backend(format!("a task panicked: {e}")))
            })?;
            let result = self.settle(run, &cp.next[i], outcome, duration_ms, step, remaining, &mut deferred)?;
            self.cache_keep(keys[i].take(), &cp.next[i], &result);
            results[i] = Some(result);
        }
        let out: Vec<(TaskSpec, StepResult)> = cp
            .next
            .iter()
            .zip(results)
            .filter_map(|(t, r)| r.map(|r| (t.clone(), r)))
            .collect();
        // A step that stops (failure, interrupt) keeps its finished tasks' writes: the last one
        // to finish was not stored yet.
        if out.iter().any(|(_, r)| !matches!(r, StepResult::Done(_))) {
            self.keep_writes(&run.persister, &run.shared.thread_id, cp, &run.pending, &out)?;
            for e in deferred.events.drain(..) {
                self.events.send(e);
            }
            deferred.writes.clear();
        }
        Ok((out, deferred))
    }

    /// The step's results known before anything runs (tasks finished before a crash, tasks of
    /// nodes gone from the workflow, cache hits), the tasks to start, and where the cached
    /// nodes' tasks keep their results.
    #[allow(clippy::type_complexity)]
    fn prepare_tasks(
        &self,
        run: &Run,
        step: i64,
        base: &Arc<Scope>,
    ) -> Result<(Vec<Option<StepResult>>, Vec<ToRun>, Vec<Option<cache::Key>>), EngineError> {
        let (cp, pending) = (&run.cp, &run.pending);
        let mut results: Vec<Option<StepResult>> = vec![None; cp.next.len()];
        let mut keys: Vec<Option<cache::Key>> = std::iter::repeat_with(|| None).take(cp.next.len()).collect();
        let mut digests = cache::StepDigests::default();
        let mut hits = false;
        let mut to_run = Vec::new();
        for (i, t) in cp.next.iter().enumerate() {
            if let Some(done) = cached(pending, &t.task_id, &self.plan, run.shared.force) {
                let done = done?;
                self.events.send(Event::NodeEnd {
                    step,
                    node: t.node.clone(),
                    task_id: t.task_id.clone(),
                    duration_ms: 0.0,
                    keys: done.writes.iter().map(|(k, _)| k.clone()).collect(),
                    writes: written(&done),
                    cached: true,
                    outcome: TaskOutcome::Done,
                    cache_hit: false,
                });
                results[i] = Some(StepResult::Done(done));
                continue;
            }
            let Some(ix) = self.plan.node_by_name(&t.node) else {
                results[i] = Some(StepResult::Failed(NodeError::invalid(format!(
                    "node `{}` is not in this workflow",
                    t.node
                ))));
                continue;
            };
            let resume = pending
                .iter()
                .find(|w| w.task_id == t.task_id && w.channel == RESUME)
                .map(|w| task::Resume {
                    answer: w.value.clone(),
                    to: pending
                        .iter()
                        .find(|r| r.task_id == t.task_id && r.channel == RESUME_TO)
                        .and_then(|r| r.value.as_str().map(str::to_string)),
                    earlier: earlier_answers(pending, &t.task_id),
                });
            let (resumes, key) = (resume.is_some(), &mut keys[i]);
            if let Some(hit) = self.cache_lookup(run, base, step, t, ix, resumes, &mut digests, key)? {
                results[i] = Some(hit);
                hits = true;
                continue;
            }
            to_run.push((i, ix, resume, self.spent(&t.node, &run.meta, &run.started_with)));
        }
        // Hits are stored before the other tasks start, not with the last of them: their
        // `node_end` waits for nothing.
        if hits {
            tokio::task::block_in_place(|| run.persister.release())?;
        }
        Ok((results, to_run, keys))
    }

    /// Records how task `t` ended. A finished task's writes are stored as soon as the step
    /// has no other finished task at hand (with theirs), unless it is the step's last
    /// (`remaining` is 0): that one is stored with the step's checkpoint, one commit for both,
    /// and its `node_end` goes to `deferred`. Either way `node_end` follows the commit.
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        run: &Run,
        t: &TaskSpec,
        outcome: Outcome,
        duration_ms: f64,
        step: i64,
        remaining: usize,
        deferred: &mut Deferred,
    ) -> Result<StepResult, EngineError> {
        let end = |keys: Vec<String>, writes, outcome| Event::NodeEnd {
            step,
            node: t.node.clone(),
            task_id: t.task_id.clone(),
            duration_ms,
            keys,
            writes,
            cached: false,
            outcome,
            cache_hit: false,
        };
        Ok(match outcome {
            Outcome::Done(mut done) => {
                self.identify(&mut done, &t.task_id);
                let event = end(
                    done.writes.iter().map(|(k, _)| k.clone()).collect(),
                    written(&done),
                    TaskOutcome::Done,
                );
                let writes = encode(&t.task_id, &done, &self.plan);
                if remaining > 0 {
                    run.persister
                        .put_writes(&run.shared.thread_id, &run.cp.checkpoint_id, writes, vec![event])?;
                } else {
                    deferred.events.push(event);
                    deferred.writes.extend(writes);
                }
                StepResult::Done(done)
            }
            Outcome::Interrupt(payload) => {
                let payload = self.stop_at_gate(run, t, payload)?;
                self.events
                    .send(end(Vec::new(), Default::default(), TaskOutcome::Interrupted));
                StepResult::Interrupt(payload)
            }
            Outcome::Failed(e) => {
                self.events
                    .send(end(Vec::new(), Default::default(), TaskOutcome::Failed));
                StepResult::Failed(e)
            }
        })
    }

    /// Gives the messages a task writes to `add_messages` keys the ids the state will hold
    /// them under ([`values::identify_messages`]).
    fn identify(&self, done: &mut task::Done, task_id: &str) {
        for (key, value) in &mut done.writes {
            if self
                .plan
                .state()
                .get(key)
                .is_some_and(|c| c.reducer == crate::compile::Reducer::AddMessages)
            {
                let ids = values::message_id(task_id);
                *value = values::identify_messages(std::mem::take(value), &ids);
            }
        }
    }

    /// Stores the interrupt task `t` stopped at, and reports it.
    fn stop_at_gate(&self, run: &Run, t: &TaskSpec, payload: Value) -> Result<Value, EngineError> {
        let mut writes = vec![PendingWrite {
            task_id: t.task_id.clone(),
            idx: IDX_INTERRUPT,
            channel: INTERRUPT.into(),
            value: payload.clone(),
        }];
        // An answered task that stops again (a subgraph at its next gate, a gate at its next
        // question) has used its answer: it is kept as a record, not passed again, and among
        // the task's earlier answers, in order.
        if let Some(answer) = run
            .pending
            .iter()
            .find(|w| w.task_id == t.task_id && w.channel == RESUME)
        {
            writes.push(PendingWrite {
                channel: RESUMED.into(),
                ..answer.clone()
            });
            let n = earlier_answers(&run.pending, &t.task_id).len() as u32;
            writes.push(PendingWrite {
                channel: RESUMED.into(),
                idx: IDX_ANSWERED + n,
                ..answer.clone()
            });
        }
        run.persister.write_now(vec![Put::Writes {
            thread_id: run.shared.thread_id.clone(),
            checkpoint_id: run.cp.checkpoint_id.clone(),
            writes,
        }])?;
        self.events.send(Event::Interrupt {
            node: t.node.clone(),
            task_id: t.task_id.clone(),
            payload: payload.clone(),
        });
        Ok(payload)
    }

    /// Stops before the step when a node it would run has `interrupt_before` (unless the run
    /// continues past that very gate).
    pub(super) fn gate_before(&self, run: &mut Run) -> Result<Option<End>, EngineError> {
        if std::mem::take(&mut run.skip_before) {
            return Ok(None);
        }
        let gated: Vec<String> = run
            .cp
            .next
            .iter()
            .filter(|t| {
                self.node_spec(&t.node).is_some_and(|s| s.common().interrupt_before)
                    || self.options.gates.before.contains(&t.node)
            })
            .map(|t| t.node.clone())
            .collect();
        if gated.is_empty() {
            return Ok(None);
        }
        let pause = self.pause(&run.persister, &run.thread.thread_id, &run.cp, "before", &gated)?;
        Ok(Some(End::interrupted(vec![pause])))
    }

    /// Stores the writes of finished tasks that are not stored yet.
    pub(super) fn keep_writes(
        &self,
        persister: &Persister,
        thread: &str,
        cp: &Checkpoint,
        pending: &[PendingWrite],
        outcomes: &[(TaskSpec, StepResult)],
    ) -> Result<(), EngineError> {
        let writes: Vec<PendingWrite> = outcomes
            .iter()
            .filter_map(|(t, r)| match r {
                StepResult::Done(done) if !pending.iter().any(|w| w.task_id == t.task_id && w.channel == DONE) => {
                    Some(encode(&t.task_id, done, &self.plan))
                }
                // Why a task failed, for whoever looks at the checkpoint (the task runs again
                // when the thread is continued: this is no result).
                StepResult::Failed(e) => Some(vec![PendingWrite {
                    task_id: t.task_id.clone(),
                    idx: super::IDX_ERROR,
                    channel: super::ERROR.into(),
                    value: json!({"class": e.class.name(), "message": e.message}),
                }]),
                _ => None,
            })
            .flatten()
            .collect();
        persister.write_now(vec![Put::Writes {
            thread_id: thread.into(),
            checkpoint_id: cp.checkpoint_id.clone(),
            writes,
        }])?;
        Ok(())
    }

    /// Turns successors into the tasks of `step` on `branch`: a node triggered several times
    /// runs once; each fan-out item is its own task; tasks are ordered by the plan.
    pub(super) fn schedule(&self, next: Vec<Next>, thread: &str, step: i64, branch: u32) -> Vec<TaskSpec> {
        let mut plain: BTreeSet<usize> = BTreeSet::new();
        let mut sends: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
        for n in next {
            match n {
                Next::End | Next::Handoff(_) => {}
                Next::Node(ix) => {
                    plain.insert(self.plan.nodes().get_index_of(&ix).unwrap_or(usize::MAX));
                }
                Next::Send(ix, item) => sends
                    .entry(self.plan.nodes().get_index_of(&ix).unwrap_or(usize::MAX))
                    .or_default()
                    .push(item),
            }
        }
        let mut tasks = Vec::new();
        let positions: BTreeSet<usize> = plain.iter().chain(sends.keys()).copied().collect();
        for pos in positions {
            let Some((_, node)) = self.plan.nodes().get_index(pos) else {
                continue;
            };
            if plain.contains(&pos) {
                tasks.push(TaskSpec {
                    task_id: super::task_id(thread, &node.name, step, branch, None),
                    node: node.name.clone(),
                    item: None,
                });
            }
            for (i, item) in sends.remove(&pos).unwrap_or_default().into_iter().enumerate() {
                tasks.push(TaskSpec {
                    task_id: super::task_id(thread, &node.name, step, branch, Some(i)),
                    node: node.name.clone(),
                    item: Some(item),
                });
            }
        }
        tasks
    }

    /// Holds back the deferred nodes (`defer: true`) among `tasks` while anything else is
    /// scheduled: they wait in `meta` and run, once each however often they were triggered,
    /// in the first step that would otherwise run nothing (LangGraph's deferred nodes). `step`
    /// is the step the tasks run in.
    pub(super) fn hold_deferred(
        &self,
        meta: &mut Meta,
        tasks: Vec<TaskSpec>,
        thread: &str,
        step: i64,
    ) -> Vec<TaskSpec> {
        let deferred = |t: &TaskSpec| {
            t.item.is_none()
                && self
                    .plan
                    .node_by_name(&t.node)
                    .is_some_and(|ix| self.plan.nodes()[&ix].spec.common().defer)
        };
        let (held, now): (Vec<TaskSpec>, Vec<TaskSpec>) = tasks.into_iter().partition(deferred);
        if !now.is_empty() {
            meta.deferred.extend(held.into_iter().map(|t| t.node));
            return now;
        }
        let mut waiting = std::mem::take(&mut meta.deferred);
        waiting.extend(held.into_iter().map(|t| t.node));
        let next = waiting
            .into_iter()
            .filter_map(|name| self.plan.node_by_name(&name))
            .map(Next::Node)
            .collect();
        self.schedule(next, thread, step, meta.branch)
    }

    /// Stops durably before or after `nodes` (`interrupt_before` / `interrupt_after`): the
    /// pause is recorded against the checkpoint the run will continue from.
    pub(super) fn pause(
        &self,
        persister: &Persister,
        thread_id: &str,
        cp: &Checkpoint,
        kind: &str,
        nodes: &[String],
    ) -> Result<Value, EngineError> {
        let payload = json!({"kind": kind, "nodes": nodes});
        let task_id = if kind == "after" { AFTER } else { BEFORE };
        let record = PendingWrite {
            task_id: task_id.into(),
            idx: IDX_INTERRUPT,
            channel: INTERRUPT.into(),
            value: payload.clone(),
        };
        persister.write_now(vec![Put::Writes {
            thread_id: thread_id.into(),
            checkpoint_id: cp.checkpoint_id.clone(),
            writes: vec![record],
        }])?;
        self.events.send(Event::Interrupt {
            node: nodes.join(","),
            task_id: task_id.into(),
            payload: payload.clone(),
        });
        Ok(json!({"node": nodes[0], "task_id": task_id, "kind": kind, "payload": payload}))
    }
}

/// A finished task's writes by key, as its `NodeEnd` event tells them.
fn written(done: &task::Done) -> serde_json::Map<String, Value> {
    done.writes.iter().cloned().collect()
}

/// Where a branch leads, evaluated in `scope` (the state after the step).
pub(super) fn follow(
    shared: &Shared,
    b: &Branch,
    scope: &minijinja::Value,
    next: &mut Vec<Next>,
) -> Result<(), NodeError> {
    match b {
        Branch::Always(ts) => next.extend(ts.iter().map(|t| match t {
            Target::Node(n) => Next::Node(*n),
            Target::End => Next::End,
        })),
        Branch::Route(clauses) => next.extend(task::choose(shared, clauses, scope)?),
        Branch::Send(s) => {
            let items = values::eval(&shared.plan, s.foreach, scope).map_err(NodeError::invalid)?;
            let Value::Array(items) = items else {
                return Err(NodeError::invalid("a fan-out's `foreach` did not yield an array"));
            };
            next.extend(items.into_iter().map(|i| Next::Send(s.to, i)));
        }
    }
    Ok(())
}

/// A step in which a task failed or stopped at a gate ends the run. The step is not applied
/// and the thread's stored usage stays as it was, but what a failed step's tasks spent on
/// models was spent: the run's report counts it.
pub(super) fn stopped(meta: &mut Meta, outcomes: &[(TaskSpec, StepResult)]) -> Option<End> {
    let failed: Vec<String> = outcomes
        .iter()
        .filter_map(|(t, o)| match o {
            StepResult::Failed(e) => Some(format!("node `{}` failed: {}", t.node, e.message)),
            _ => None,
        })
        .collect();
    if !failed.is_empty() {
        let class = outcomes.iter().find_map(|(_, o)| match o {
            StepResult::Failed(e) => Some(e.class.name().to_string()),
            _ => None,
        });
        for (_, o) in outcomes {
            match o {
                StepResult::Done(d) => meta.usage.add(&d.usage),
                StepResult::Failed(e) => meta.usage.add(&e.usage),
                StepResult::Interrupt(_) => {}
            }
        }
        return Some(End {
            error_class: class,
            ..End::failed(failed.join("; "))
        });
    }
    let interrupts: Vec<Value> = outcomes
        .iter()
        .flat_map(|(t, o)| match o {
            StepResult::Interrupt(p) => reported(t, p),
            _ => Vec::new(),
        })
        .collect();
    (!interrupts.is_empty()).then(|| End::interrupted(interrupts))
}

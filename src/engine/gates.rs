//! Gates: which interrupts a checkpoint waits at, how they are reported, and which one an
//! answer is for — addressed by task id or node, and through a subgraph's task as
//! `<task>/<gate>`. Answers are checked here before anything is stored.

use serde_json::{Value, json};

use super::events::Events;
use super::thread::Answer;
use super::{
    AFTER, BEFORE, DONE, Engine, EngineError, IDX_RESUME, IDX_RESUME_TO, INTERRUPT, RESUME, RESUME_TO, RESUMED, Run,
};
use crate::checkpoint::{Checkpoint, PendingWrite, Put, TaskSpec};

/// Keys of the interrupt payload of a node waiting inside a child run (a node with a child
/// plan): the node, the child's thread, and the child's gates when it waits at several. The
/// engine follows them down to the gate an answer is for.
pub const CHILD_NODE: &str = "subgraph";
pub const CHILD_THREAD: &str = "subgraph_thread";
pub const CHILD_GATES: &str = "interrupts";

impl Engine {
    /// Takes the run's answer, checked and stored under the lease (of two racing answers, the
    /// second finds the gate answered). Without an answer, a thread paused before a node goes
    /// on past the pause: no answer is needed there.
    pub(super) fn take_answer(&self, run: &mut Run, answer: Option<&Answer>) -> Result<(), EngineError> {
        let waiting = waiting_gates(&run.pending);
        let Some(answer) = answer else {
            run.skip_before = waiting.iter().any(|w| w.task_id == BEFORE && is_before(w));
            return Ok(());
        };
        let (gate, inner) = self.addressed_gate(&run.thread.thread_id, &run.cp, &waiting, answer.to.as_deref())?;
        if gate.task_id == BEFORE || gate.task_id == AFTER {
            run.skip_before = is_before(gate);
            return Ok(());
        }
        let node = gate_node(&run.cp, gate);
        self.validate_answer(gate, &node, &answer.value, inner.as_deref(), &run.pending)?;
        let task = gate.task_id.clone();
        let writes = vec![
            PendingWrite {
                task_id: task.clone(),
                idx: IDX_RESUME,
                channel: RESUME.into(),
                value: answer.value.clone(),
            },
            // Which of a subgraph's gates the answer is for (null: its only one).
            PendingWrite {
                task_id: task.clone(),
                idx: IDX_RESUME_TO,
                channel: RESUME_TO.into(),
                value: inner.map_or(Value::Null, Value::String),
            },
        ];
        run.persister.write_now(vec![Put::Writes {
            thread_id: run.thread.thread_id.clone(),
            checkpoint_id: run.cp.checkpoint_id.clone(),
            writes: writes.clone(),
        }])?;
        run.pending
            .retain(|p| !(p.task_id == task && (p.idx == IDX_RESUME || p.idx == IDX_RESUME_TO)));
        run.pending.extend(writes);
        Ok(())
    }

    /// The gate an answer is for: the only one waiting, or the one `to` names (by task id or
    /// node). With no gate waiting, says whether one was answered already.
    pub(super) fn addressed_gate<'a>(
        &self,
        thread: &str,
        cp: &Checkpoint,
        waiting: &[&'a PendingWrite],
        to: Option<&str>,
    ) -> Result<(&'a PendingWrite, Option<String>), EngineError> {
        if waiting.is_empty() {
            return Err(if self.was_answered(thread, to)? {
                EngineError::AlreadyAnswered(thread.into())
            } else {
                EngineError::NotInterrupted(thread.into())
            });
        }
        let node_of = |w: &PendingWrite| gate_node(cp, w);
        let describe = |ws: &[&PendingWrite]| -> Vec<String> {
            ws.iter()
                .map(|w| {
                    let node = node_of(w);
                    if node == w.task_id {
                        format!("`{node}`")
                    } else {
                        format!("`{}` (node `{node}`)", w.task_id)
                    }
                })
                .collect()
        };
        let Some(to) = to else {
            return match waiting {
                [one] => Ok((one, None)),
                many => Err(EngineError::WhichGate {
                    thread: thread.into(),
                    pending: describe(many),
                }),
            };
        };
        let find = |to: &str| -> Vec<&'a PendingWrite> {
            let by_id: Vec<&PendingWrite> = waiting.iter().copied().filter(|w| w.task_id == to).collect();
            if by_id.is_empty() {
                waiting.iter().copied().filter(|w| node_of(w) == to).collect()
            } else {
                by_id
            }
        };
        // `sub/gate`: the gate `gate` inside the subgraph task `sub`.
        let (matches, inner) = match (find(to), to.split_once('/')) {
            (found, Some((head, rest))) if found.is_empty() => (find(head), Some(rest.to_string())),
            (found, _) => (found, None),
        };
        match matches.as_slice() {
            [one] => Ok((one, inner)),
            [] if self.was_answered(thread, Some(to))? => Err(EngineError::AlreadyAnswered(thread.into())),
            [] => Err(EngineError::NoSuchGate {
                thread: thread.into(),
                to: to.into(),
                pending: describe(waiting),
            }),
            many => Err(EngineError::WhichGate {
                thread: thread.into(),
                pending: describe(many),
            }),
        }
    }

    /// Whether a gate of the thread (the one `to` names, if given) was answered, at any
    /// checkpoint. Only asked when an answer finds no gate waiting.
    pub(super) fn was_answered(&self, thread: &str, to: Option<&str>) -> Result<bool, EngineError> {
        for cp in self.store.history(thread)? {
            let writes = self.store.get_writes(thread, &cp.checkpoint_id)?;
            if writes.iter().any(|w| {
                (w.channel == RESUME || w.channel == RESUMED)
                    && to.is_none_or(|to| {
                        let head = to.split('/').next().unwrap_or(to);
                        [to, head].iter().any(|a| w.task_id == *a || gate_node(&cp, w) == *a)
                    })
            }) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Checks an answer against the response schema of the gate that is waiting, following
    /// subgraphs down to the gate (`child_to` addresses it among the child's gates).
    pub(super) fn validate_answer(
        &self,
        waiting: &PendingWrite,
        node: &str,
        answer: &Value,
        child_to: Option<&str>,
        pending: &[PendingWrite],
    ) -> Result<(), EngineError> {
        let Some(ix) = self.plan.node_by_name(node) else {
            return Ok(());
        };
        // A node with a child plan is answered inside the child, at the gate it waits at.
        if let Some(child) = self.plan.subgraphs().get(&ix).cloned() {
            let child_thread = waiting
                .value
                .get(CHILD_THREAD)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if let Some(cp) = self.store.get_checkpoint(&child_thread, None)? {
                let writes = self.store.get_writes(&child_thread, &cp.checkpoint_id)?;
                let waiting_inside = waiting_gates(&writes);
                let engine = Engine::sharing(child, self.store.clone(), self.services.clone(), Events::none());
                // The child's gates are addressed as `<this task>/<gate>`.
                let inside = |e: EngineError| match e {
                    EngineError::WhichGate { pending, .. } => EngineError::WhichGate {
                        thread: child_thread.clone(),
                        pending: pending.iter().map(|p| nested(&waiting.task_id, p)).collect(),
                    },
                    EngineError::NoSuchGate { to, pending, .. } => EngineError::NoSuchGate {
                        thread: child_thread.clone(),
                        to: format!("{}/{to}", waiting.task_id),
                        pending: pending.iter().map(|p| nested(&waiting.task_id, p)).collect(),
                    },
                    other => other,
                };
                let (w, deeper) = engine
                    .addressed_gate(&child_thread, &cp, &waiting_inside, child_to)
                    .map_err(inside)?;
                let inner_node = gate_node(&cp, w);
                return engine
                    .validate_answer(w, &inner_node, answer, deeper.as_deref(), &writes)
                    .map_err(inside);
            }
            return Ok(());
        }
        let node = &self.plan.nodes()[&ix];
        let answered = super::step::earlier_answers(pending, &waiting.task_id).len();
        let Ok(kind) = self.services.kinds.of(node) else {
            return Ok(());
        };
        if let Some(schema) = kind.answer_schema(node, answered) {
            let v = jsonschema::draft202012::new(schema).map_err(|e| EngineError::BadAnswer(e.to_string()))?;
            if let Some(why) = crate::compile::schemas::first_violation(&v, answer) {
                return Err(EngineError::BadAnswer(why));
            }
        }
        match kind.refuse_answer(node, &waiting.value, answer) {
            Some(why) => Err(EngineError::BadAnswer(why)),
            None => Ok(()),
        }
    }
}

/// How a task's stop is reported: one gate, or (a subgraph stopped at several) each of the
/// child's gates, addressed `<task>/<gate>`.
pub(super) fn reported(t: &TaskSpec, payload: &Value) -> Vec<Value> {
    match payload.get(CHILD_GATES).and_then(Value::as_array) {
        Some(inner) if inner.len() > 1 => inner
            .iter()
            .map(|i| {
                // Shaped as a single gate's: the child's interrupt, marked with its subgraph.
                let mut p = i.clone();
                if let (Value::Object(m), Some(sub)) = (&mut p, payload.get(CHILD_THREAD)) {
                    m.insert(CHILD_NODE.into(), Value::String(t.node.clone()));
                    m.insert(CHILD_THREAD.into(), sub.clone());
                }
                json!({
                    "node": t.node,
                    "task_id": format!("{}/{}", t.task_id, i["task_id"].as_str().unwrap_or_default()),
                    "kind": "node",
                    "payload": p,
                })
            })
            .collect(),
        _ => vec![json!({"node": t.node, "task_id": t.task_id, "kind": "node", "payload": payload})],
    }
}

/// A child's gate as its parent's caller addresses it.
pub(super) fn nested(task_id: &str, described: &str) -> String {
    format!("`{task_id}/{}", described.trim_start_matches('`'))
}

/// The node of a gate record: its task's node, or the nodes a pause stopped at.
pub(super) fn gate_node(cp: &Checkpoint, w: &PendingWrite) -> String {
    if let Some(nodes) = w.value.get("nodes").and_then(Value::as_array)
        && (w.task_id == BEFORE || w.task_id == AFTER)
    {
        return nodes.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",");
    }
    cp.next
        .iter()
        .find(|t| t.task_id == w.task_id)
        .map(|t| t.node.clone())
        .unwrap_or_else(|| w.task_id.clone())
}

/// Whether a pause record is an `interrupt_before` (the node has not run yet).
pub(super) fn is_before(w: &PendingWrite) -> bool {
    w.value.get("kind").and_then(Value::as_str) == Some("before")
}

/// Every gate record of a checkpoint, its tasks' pauses included, answered or not: what a
/// thread's history shows.
pub fn recorded_gates(pending: &[PendingWrite]) -> Vec<&PendingWrite> {
    pending.iter().filter(|w| w.channel == INTERRUPT).collect()
}

/// Whether a gate record is a pause before or after nodes (`interrupt_before` /
/// `interrupt_after`), which no answer is for.
pub fn is_pause(w: &PendingWrite) -> bool {
    w.task_id == BEFORE || w.task_id == AFTER
}

/// Why each task of a checkpoint that failed failed, by task id: `class: message`.
pub fn task_errors(pending: &[PendingWrite]) -> std::collections::HashMap<String, String> {
    pending
        .iter()
        .filter(|w| w.channel == super::ERROR)
        .map(|w| {
            let text = |k: &str| w.value.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
            (w.task_id.clone(), format!("{}: {}", text("class"), text("message")))
        })
        .collect()
}

/// What each finished task of a checkpoint wrote, by task id, from the results stored with it.
pub fn task_results(pending: &[PendingWrite]) -> std::collections::HashMap<String, serde_json::Map<String, Value>> {
    pending
        .iter()
        .filter(|w| w.channel == DONE)
        .map(|w| {
            let writes = w
                .value
                .get("writes")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|pair| Some((pair.get(0)?.as_str()?.to_string(), pair.get(1)?.clone())))
                .collect();
            (w.task_id.clone(), writes)
        })
        .collect()
}

/// The gates a checkpoint waits at: its interrupt records whose task has neither finished nor
/// been answered, in task order.
/// The gates a checkpoint's records wait at: the interrupts of tasks that have neither finished
/// nor been answered (a server reports them as a thread's pending interrupts).
pub fn waiting_gates(pending: &[PendingWrite]) -> Vec<&PendingWrite> {
    pending
        .iter()
        .filter(|w| w.channel == INTERRUPT)
        .filter(|w| {
            !pending
                .iter()
                .any(|o| o.task_id == w.task_id && (o.channel == DONE || o.channel == RESUME))
        })
        .collect()
}

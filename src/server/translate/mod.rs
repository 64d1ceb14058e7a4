//! A run's engine events as LangGraph's stream modes say them, event for event as the
//! reference server sends them (its order, its payloads, its quirks): `values` (the state after
//! the input, after each step that changed it, and at each interrupt with `__interrupt__`),
//! `updates` (each task's own writes as it finishes, `__interrupt__` at a gate, a cached
//! result marked so), `messages` (tuples of a streamed piece or a whole message and its
//! metadata), the legacy `messages/*`, `custom` (what a node emitted, as it emitted it),
//! `tasks` (each task's start with its input, and its result), `checkpoints` and `debug`; with
//! `stream_subgraphs`, the same from inside subgraphs, named `mode|node:task`; and `events`,
//! LangChain's callback events (`callbacks.rs`), from every namespace.
//!
//! Everything shown is read from the engine's events and, where they only name it, from the
//! checkpoint store (a step's checkpoint, sent after its commit, is readable then).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Map, Value, json};

mod callbacks;

use super::Shared;
use super::messages;
use super::sse::Modes;
use crate::checkpoint::{Checkpoint, Checkpointer, TaskSpec};
use crate::compile::Plan;
use crate::engine::events::{Envelope, Event, TaskOutcome};
use crate::engine::{EngineError, RunOutcome, Source, Status};

/// What the stream says of the run it belongs to.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunInfo {
    pub run_id: String,
    pub thread_id: String,
    pub graph_id: String,
    pub assistant_id: String,
    /// The run's metadata, as its checkpoints keep it (`config.metadata`): the graph, the
    /// assistant, the run, and what the client sent.
    pub metadata: Map<String, Value>,
    /// `config.configurable` as the client sent it.
    pub configurable: Map<String, Value>,
    /// The run gave its thread new input: the thread's two newest checkpoints are this run's.
    pub new_input: bool,
    /// What the run was given, as the client sent it: its input, or its command as
    /// LangGraph's `Command` (`{graph, update, resume, goto}`).
    pub input: Value,
}

impl RunInfo {
    /// `config.configurable` of the run at checkpoint `id` of namespace `ns`.
    fn configurable(&self, ns: &str, id: &str) -> Value {
        let mut c = self.configurable.clone();
        for (k, v) in [
            ("thread_id", json!(self.thread_id)),
            ("checkpoint_ns", json!(ns)),
            ("checkpoint_id", json!(id)),
            ("run_id", json!(self.run_id)),
            ("graph_id", json!(self.graph_id)),
            ("assistant_id", json!(self.assistant_id)),
            ("user_id", json!("")),
            ("langgraph_auth_user_id", json!("")),
            ("langgraph_auth_user", Value::Null),
            ("langgraph_auth_permissions", json!([])),
        ] {
            c.insert(k.into(), v);
        }
        json!({"configurable": c})
    }

    /// What a task's `tasks` event says of the run.
    fn task_metadata(&self) -> Value {
        let mut m = self.metadata.clone();
        m.remove("thread_id");
        Value::Object(m)
    }
}

/// One namespace of the run: its graph, or a subgraph's child run.
struct Scope {
    /// The thread its checkpoints are on (a subgraph's child has its own).
    thread_id: String,
    plan: Arc<Plan>,
    message_keys: Vec<String>,
    /// The state as of its last checkpoint, with the step's changes once they are told.
    values: Map<String, Value>,
    /// Its last committed checkpoint: the tasks of the step that runs.
    head: Option<Checkpoint>,
    /// The checkpoint its run started from.
    start: String,
    /// Its thread existed before the run (a child run that goes on, rather than starts).
    resumed: bool,
    /// The step that runs.
    step: i64,
    /// Whether what it starts from was told.
    started: bool,
    /// The tasks of the step that stopped at a gate.
    stopped: HashSet<String>,
    /// The step's tasks that finished, with what they wrote.
    finished: Vec<(String, Map<String, Value>)>,
    /// The step changed the state.
    changed: bool,
}

/// Turns a run's events into stream-mode events.
pub(crate) struct Translate {
    modes: Modes,
    app: Shared,
    store: Arc<dyn Checkpointer>,
    run: RunInfo,
    plan: Arc<Plan>,
    scopes: HashMap<Option<Arc<str>>, Scope>,
    /// The gates the run stopped at, as LangGraph's `Interrupt`s.
    pub interrupts: Vec<Value>,
    /// The tasks whose model calls stream, and the id of the message each streams.
    streamed: HashMap<String, String>,
    /// The ids of the run graph's messages a client has had: the input's and those sent since.
    sent: HashSet<String>,
    /// The text each task streamed so far (the legacy `messages` mode sends it whole).
    partial: HashMap<String, String>,
    /// What the `events` mode remembers.
    callbacks: callbacks::Callbacks,
}

/// A stream event: its name (with `|namespace` inside a subgraph) and data.
type Out = Vec<(String, Value)>;

impl Translate {
    pub(crate) fn new(modes: Modes, app: &Shared, run: RunInfo, plan: Arc<Plan>) -> Translate {
        Translate {
            modes,
            app: app.clone(),
            store: app.store.clone(),
            run,
            plan,
            scopes: HashMap::new(),
            interrupts: Vec::new(),
            streamed: HashMap::new(),
            sent: HashSet::new(),
            partial: HashMap::new(),
            callbacks: callbacks::Callbacks::default(),
        }
    }

    /// The run graph's state as the stream last showed it, as the API shows state.
    pub(crate) fn values(&self) -> Map<String, Value> {
        match self.scopes.get(&None) {
            Some(s) => messages::served_state(s.values.clone(), &s.plan),
            None => Map::new(),
        }
    }

    /// The stream events `envelope` makes.
    pub(crate) fn on(&mut self, envelope: Envelope) -> Out {
        let ns = envelope.ns;
        self.measure(&envelope.event);
        // The callback events read the scopes as the other modes leave them (a run's scope
        // opened, a step's state loaded), and come first, as the reference sends them.
        let for_callbacks = self.modes.events.then(|| envelope.event.clone());
        let mut out = Vec::new();
        let shown = ns.is_none() || self.modes.subgraphs;
        match envelope.event {
            Event::RunStart {
                thread_id,
                checkpoint_id,
                resumed,
                ..
            } => self.open(&ns, thread_id, checkpoint_id, resumed),
            Event::StepStart { step, .. } => {
                self.begin_step(&ns, step, shown, &mut out);
            }
            Event::Token {
                node,
                task_id,
                message_id,
                text,
            } if shown => self.token(&ns, &node, &task_id, &message_id, text, &mut out),
            Event::Custom { data, .. } if shown && self.modes.custom => {
                out.push((name("custom", &ns), data));
            }
            // A result stored before (a step resumed after a gate or a crash) or found in the
            // node's cache is shown as LangGraph shows a cached task.
            Event::NodeEnd {
                node,
                task_id,
                writes,
                cached,
                cache_hit,
                outcome,
                ..
            } => self.task_end(
                &ns,
                shown,
                &node,
                &task_id,
                writes,
                cached || cache_hit,
                outcome,
                &mut out,
            ),
            Event::Interrupt { task_id, payload, .. } => self.interrupted(&ns, shown, &task_id, &payload, &mut out),
            Event::StateUpdate { values, .. } => {
                if let Some(s) = self.scopes.get_mut(&ns) {
                    s.changed |= !values.is_empty();
                    s.values.extend(values);
                }
            }
            Event::StepEnd {
                checkpoint_id,
                checkpoint,
                ..
            } => self.end_step(&ns, shown, &checkpoint_id, checkpoint, &mut out),
            _ => {}
        }
        match for_callbacks {
            Some(event) => {
                let mut first = Vec::new();
                self.callbacks(&ns, &event, &mut first);
                first.extend(out);
                first
            }
            None => out,
        }
    }

    /// A run (the run's own, or a subgraph's child) starts on `thread_id`, from checkpoint
    /// `start`.
    fn open(&mut self, ns: &Option<Arc<str>>, thread_id: String, start: String, resumed: bool) {
        let Some(plan) = messages::plan_of(&self.plan, ns.as_deref()) else {
            return;
        };
        let message_keys = messages::keys(&plan);
        self.scopes.insert(
            ns.clone(),
            Scope {
                thread_id,
                plan,
                message_keys,
                values: Map::new(),
                head: None,
                start,
                resumed,
                step: 0,
                started: false,
                stopped: HashSet::new(),
                finished: Vec::new(),
                changed: false,
            },
        );
    }

    /// A step of namespace `ns` starts: first (once per run) what the run starts from, then
    /// each task's start.
    fn begin_step(&mut self, ns: &Option<Arc<str>>, step: i64, shown: bool, out: &mut Out) {
        let Some(scope) = self.scopes.get_mut(ns) else { return };
        scope.step = step;
        scope.stopped.clear();
        scope.finished.clear();
        scope.changed = false;
        if !scope.started {
            scope.started = true;
            let thread = scope.thread_id.clone();
            let start = (!scope.start.is_empty()).then(|| scope.start.clone());
            // The checkpoint and its state in one read.
            let head = self.store.checkpoint_state(&thread, start.as_deref()).ok().flatten();
            if let Some((head, values)) = head {
                if let Some(s) = self.scopes.get_mut(ns) {
                    s.values = values;
                }
                if ns.is_none() {
                    self.sent = self.message_ids();
                }
                if shown {
                    self.started(ns, &head, out);
                }
                if let Some(s) = self.scopes.get_mut(ns) {
                    s.head = Some(head);
                }
            }
        }
        if shown && (self.modes.tasks || self.modes.debug) {
            let Some(scope) = self.scopes.get(ns) else { return };
            let Some(head) = &scope.head else { return };
            let input = messages::served_state(scope.values.clone(), &scope.plan);
            let tasks: Vec<Value> = head
                .next
                .iter()
                .map(|t| {
                    json!({
                        "id": t.task_id,
                        "name": t.node,
                        "input": t.item.clone().unwrap_or_else(|| Value::Object(input.clone())),
                        "triggers": triggers(t),
                        "metadata": self.run.task_metadata(),
                    })
                })
                .collect();
            for task in tasks {
                if self.modes.tasks {
                    out.push((name("tasks", ns), task.clone()));
                }
                if self.modes.debug {
                    out.push((name("debug", ns), debug(step, "task", task)));
                }
            }
        }
    }

    /// What a run starts from: a run that wrote new input shows the checkpoint before it, the
    /// state it wrote (if it wrote any) and the checkpoint after; a run that goes on shows the
    /// state and the checkpoint it goes on from.
    fn started(&mut self, ns: &Option<Arc<str>>, head: &Checkpoint, out: &mut Out) {
        let Some(scope) = self.scopes.get(ns) else { return };
        let fresh_input = match ns {
            None => self.run.new_input,
            // A subgraph's child that starts writes its input; one that goes on does not.
            Some(_) => !scope.resumed && crate::engine::checkpoint_source(head) == Source::Loop,
        };
        let values = messages::served_state(scope.values.clone(), &scope.plan);
        if fresh_input {
            // Shown only by the modes that show checkpoints.
            let before = head
                .parent_id
                .as_deref()
                .filter(|_| self.modes.checkpoints || self.modes.debug)
                .and_then(|p| self.store.get_checkpoint(&scope.thread_id, Some(p)).ok().flatten());
            if let Some(before) = &before {
                self.checkpoint(ns, before, false, out);
            }
            if self.modes.values && !head.changed.is_empty() {
                out.push((name("values", ns), Value::Object(values)));
            }
            self.checkpoint(ns, head, false, out);
        } else {
            if self.modes.values {
                out.push((name("values", ns), Value::Object(values)));
            }
            self.checkpoint(ns, head, true, out);
        }
    }

    fn token(
        &mut self,
        ns: &Option<Arc<str>>,
        node: &str,
        task_id: &str,
        message_id: &str,
        text: String,
        out: &mut Out,
    ) {
        let meta = self.message_meta(ns, node, task_id, true);
        if self.modes.partial {
            let first = !self.partial.contains_key(task_id);
            let so_far = self.partial.entry(task_id.to_string()).or_default();
            so_far.push_str(&text);
            let message = partial(message_id, so_far.clone());
            if first {
                out.push((
                    name("messages/metadata", ns),
                    json!({ message_id: {"metadata": meta.clone()} }),
                ));
            }
            out.push((name("messages/partial", ns), json!([message])));
        }
        if self.modes.messages {
            out.push((name("messages", ns), json!([chunk(message_id, text, None), meta])));
        }
        self.sent.insert(message_id.to_string());
        self.streamed.insert(task_id.to_string(), message_id.to_string());
    }

    /// A task of namespace `ns` ended: its update, its result, the messages it wrote.
    #[allow(clippy::too_many_arguments)]
    fn task_end(
        &mut self,
        ns: &Option<Arc<str>>,
        shown: bool,
        node: &str,
        task_id: &str,
        writes: Map<String, Value>,
        cached: bool,
        outcome: TaskOutcome,
        out: &mut Out,
    ) {
        let so_far = self.partial.remove(task_id);
        let streamed = self.streamed.remove(task_id);
        if outcome != TaskOutcome::Done {
            return;
        }
        // The legacy mode ends a streamed message with it whole, once more.
        if let (Some(text), Some(id)) = (so_far, &streamed)
            && shown
            && self.modes.partial
        {
            out.push((name("messages/partial", ns), json!([partial(id, text)])));
        }
        let Some(scope) = self.scopes.get_mut(ns) else { return };
        if scope.stopped.contains(task_id) {
            return;
        }
        scope.finished.push((task_id.to_string(), writes.clone()));
        let step = scope.step;
        let writes = messages::served(writes, &scope.message_keys);
        if !shown {
            return;
        }
        if let Some(id) = streamed
            && self.modes.messages
        {
            let meta = self.message_meta(ns, node, task_id, true);
            out.push((
                name("messages", ns),
                json!([chunk(&id, String::new(), Some("last")), meta]),
            ));
        }
        self.whole_messages(ns, node, task_id, &writes, out);
        let update = if writes.is_empty() {
            Value::Null
        } else {
            Value::Object(writes.clone())
        };
        if cached {
            if self.modes.updates {
                out.push((
                    name("updates", ns),
                    json!({ node: update, "__metadata__": {"cached": true} }),
                ));
            }
            return;
        }
        if self.modes.updates {
            out.push((name("updates", ns), json!({ node: update })));
        }
        if self.modes.tasks || self.modes.debug {
            let task = json!({"id": task_id, "name": node, "error": null, "result": writes, "interrupts": []});
            if self.modes.tasks {
                out.push((name("tasks", ns), task.clone()));
            }
            if self.modes.debug {
                out.push((name("debug", ns), debug(step, "task_result", task)));
            }
        }
    }

    /// `messages` events for the messages a shown task (of namespace `ns`) wrote that the
    /// client has not had, whole: LangGraph sends what a node writes without streaming it as
    /// one complete message (the legacy mode as `messages/complete` after its
    /// `messages/metadata`). A message sent once, inside a subgraph or at the top, is not sent
    /// again when the node around the subgraph writes it.
    fn whole_messages(
        &mut self,
        ns: &Option<Arc<str>>,
        node: &str,
        task_id: &str,
        writes: &Map<String, Value>,
        out: &mut Out,
    ) {
        if !(self.modes.messages || self.modes.partial) {
            return;
        }
        let keys = self.scopes.get(ns).map(|s| s.message_keys.clone()).unwrap_or_default();
        let fresh: Vec<Value> = keys
            .iter()
            .filter_map(|k| writes.get(k))
            .flat_map(|v| match v {
                Value::Array(items) => items.clone(),
                one => vec![one.clone()],
            })
            .filter(|m| m.get("type").and_then(Value::as_str) != Some("remove"))
            .collect();
        for m in fresh {
            let Some(id) = m.get("id").and_then(Value::as_str).map(str::to_string) else {
                continue;
            };
            if !self.sent.insert(id.clone()) {
                continue;
            }
            let meta = self.message_meta(ns, node, task_id, false);
            if self.modes.partial {
                out.push((
                    name("messages/metadata", ns),
                    json!({ id.as_str(): {"metadata": meta.clone()} }),
                ));
                out.push((name("messages/complete", ns), json!([m.clone()])));
            }
            if self.modes.messages {
                out.push((name("messages", ns), json!([m, meta])));
            }
        }
    }

    /// A task of namespace `ns` stopped at a gate: its interrupt, as an update and (with the
    /// state it stopped on) as values.
    fn interrupted(&mut self, ns: &Option<Arc<str>>, shown: bool, task_id: &str, payload: &Value, out: &mut Out) {
        let prefix = ns_tasks(ns);
        let Some(scope) = self.scopes.get_mut(ns) else { return };
        scope.stopped.insert(task_id.to_string());
        let interrupts: Vec<Value> = flatten(&format!("{prefix}{task_id}"), payload)
            .into_iter()
            .map(|(id, value)| json!({"id": id, "value": value, "response_schema": null}))
            .collect();
        if ns.is_none() {
            self.interrupts.extend(interrupts.iter().cloned());
        }
        if !shown {
            return;
        }
        if self.modes.updates {
            out.push((name("updates", ns), json!({"__interrupt__": interrupts.clone()})));
        }
        if self.modes.tasks || self.modes.debug {
            let node = self
                .scopes
                .get(ns)
                .and_then(|s| s.head.as_ref())
                .and_then(|h| h.next.iter().find(|t| t.task_id == task_id))
                .map(|t| t.node.clone())
                .unwrap_or_default();
            let step = self.scopes.get(ns).map_or(0, |s| s.step);
            let task =
                json!({"id": task_id, "name": node, "error": null, "result": {}, "interrupts": interrupts.clone()});
            if self.modes.tasks {
                out.push((name("tasks", ns), task.clone()));
            }
            if self.modes.debug {
                out.push((name("debug", ns), debug(step, "task_result", task)));
            }
        }
        if self.modes.values {
            let Some(scope) = self.scopes.get(ns) else { return };
            let mut values = messages::served_state(scope.values.clone(), &scope.plan);
            values.insert("__interrupt__".into(), Value::Array(interrupts));
            out.push((name("values", ns), Value::Object(values)));
        }
    }

    /// A step of namespace `ns` committed checkpoint `checkpoint_id` (`carried`: the event
    /// has it): the state after it, and the checkpoint. The state is the one the step started
    /// from with the step's changes (`state_update` tells each changed key's whole value): not
    /// read back.
    fn end_step(
        &mut self,
        ns: &Option<Arc<str>>,
        shown: bool,
        checkpoint_id: &str,
        carried: Option<Arc<Checkpoint>>,
        out: &mut Out,
    ) {
        let Some(scope) = self.scopes.get(ns) else { return };
        let committed = match carried {
            Some(cp) if cp.checkpoint_id == checkpoint_id => Some(Arc::unwrap_or_clone(cp)),
            _ => self
                .store
                .get_checkpoint(&scope.thread_id, Some(checkpoint_id))
                .ok()
                .flatten(),
        };
        if shown && self.modes.values && scope.changed {
            let values = messages::served_state(scope.values.clone(), &scope.plan);
            out.push((name("values", ns), Value::Object(values)));
        }
        if let Some(cp) = committed {
            if shown {
                self.checkpoint(ns, &cp, false, out);
            }
            if let Some(s) = self.scopes.get_mut(ns) {
                s.head = Some(cp);
                s.finished.clear();
                s.changed = false;
            }
        }
    }

    /// The `checkpoints` and `debug` events of checkpoint `cp` of namespace `ns`. `stored`:
    /// the run goes on from it, and it is shown as stored (its metadata with the run's);
    /// otherwise as the run made it.
    fn checkpoint(&self, ns: &Option<Arc<str>>, cp: &Checkpoint, stored: bool, out: &mut Out) {
        if !(self.modes.checkpoints || self.modes.debug) {
            return;
        }
        let Some(scope) = self.scopes.get(ns) else { return };
        let ns_text = ns.as_deref().unwrap_or_default();
        let values = match self.store.state(&scope.thread_id, &cp.versions) {
            Ok(v) => messages::served_state(v, &scope.plan),
            Err(_) => return,
        };
        let parents = self.parents(ns);
        let metadata = if stored {
            let mut m = super::threads::checkpoint_metadata(cp, &self.run.thread_id);
            m.insert("parents".into(), parents);
            Value::Object(m)
        } else {
            json!({"source": crate::engine::checkpoint_source(cp).as_str(), "step": cp.step, "parents": parents})
        };
        let config = self.run.configurable(ns_text, &cp.checkpoint_id);
        // A checkpoint the run goes on from shows its parent as stored (an id, no more); one it
        // made, as the run's.
        let parent_config = cp.parent_id.as_deref().map(|p| {
            if stored {
                json!({"configurable": {"thread_id": self.run.thread_id, "checkpoint_ns": ns_text, "checkpoint_id": p}})
            } else {
                self.run.configurable(ns_text, p)
            }
        });
        // A checkpoint just made has no gate records yet, whatever the store holds by now; one
        // the run goes on from shows those it stopped at (the one being answered too).
        let pending: Vec<(String, Value)> = if stored {
            let writes = self
                .store
                .get_writes(&scope.thread_id, &cp.checkpoint_id)
                .unwrap_or_default();
            super::threads::recorded_interrupts(cp, &writes)
                .into_iter()
                .map(|(task, mut i)| {
                    i["response_schema"] = Value::Null;
                    (task, i)
                })
                .collect()
        } else {
            Vec::new()
        };
        let child = |t: &TaskSpec| {
            scope.plan.node_by_name(&t.node).is_some_and(|ix| scope.plan.subgraphs().contains_key(&ix)).then(|| {
                json!({"checkpoint_ns": format!("{}{}:{}", ns_prefix(ns_text), t.node, t.task_id), "thread_id": self.run.thread_id})
            })
        };
        let task_interrupts = |t: &TaskSpec| -> Vec<Value> {
            pending
                .iter()
                .filter(|(task, _)| *task == t.task_id)
                .map(|(_, i)| i.clone())
                .collect()
        };
        let reference =
            |id: &str| json!({"checkpoint_id": id, "checkpoint_ns": ns_text, "thread_id": self.run.thread_id});
        if self.modes.checkpoints {
            let tasks: Vec<Value> = cp
                .next
                .iter()
                .map(|t| {
                    json!({"id": t.task_id, "name": t.node, "interrupts": task_interrupts(t),
                           "state": child(t).map(|c| json!({"configurable": c}))})
                })
                .collect();
            out.push((
                name("checkpoints", ns),
                json!({
                    "config": config, "parent_config": parent_config, "values": values,
                    "metadata": metadata, "next": cp.next.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(),
                    "tasks": tasks,
                }),
            ));
        }
        if self.modes.debug {
            let tasks: Vec<Value> = cp
                .next
                .iter()
                .map(|t| {
                    let mut task = json!({"id": t.task_id, "name": t.node, "interrupts": task_interrupts(t)});
                    match child(t) {
                        Some(c) => task["checkpoint"] = c,
                        None => task["state"] = Value::Null,
                    }
                    task
                })
                .collect();
            let payload = json!({
                "checkpoint": reference(&cp.checkpoint_id),
                "parent_checkpoint": cp.parent_id.as_deref().map(reference),
                "config": config, "parent_config": parent_config, "values": values,
                "metadata": metadata, "next": cp.next.iter().map(|t| t.node.as_str()).collect::<Vec<_>>(),
                "tasks": tasks,
            });
            out.push((name("debug", ns), debug(cp.step, "checkpoint", payload)));
        }
    }

    /// The checkpoints of the namespaces above `ns`, by namespace (`""` for the run's graph).
    fn parents(&self, ns: &Option<Arc<str>>) -> Value {
        let mut parents = Map::new();
        let Some(ns) = ns else { return Value::Object(parents) };
        let segments: Vec<&str> = ns.split('|').collect();
        for depth in 0..segments.len() {
            let key: Option<Arc<str>> = (depth > 0).then(|| Arc::from(segments[..depth].join("|")));
            if let Some(head) = self.scopes.get(&key).and_then(|s| s.head.as_ref()) {
                parents.insert(
                    key.as_deref().unwrap_or_default().to_string(),
                    json!(head.checkpoint_id),
                );
            }
        }
        Value::Object(parents)
    }

    /// The metadata of a `messages` event from task `task_id` of `node` in namespace `ns`:
    /// what the run is, and where in it the task runs. `streamed`: a model call's pieces
    /// (they name the namespace of the call), rather than a message written whole.
    fn message_meta(&self, ns: &Option<Arc<str>>, node: &str, task_id: &str, streamed: bool) -> Value {
        let mut meta = self.run.metadata.clone();
        let own = format!("{node}:{task_id}");
        let ns_text = ns.as_deref().unwrap_or_default();
        let full = match ns {
            Some(ns) => format!("{ns}|{own}"),
            None => own.clone(),
        };
        let task = self
            .scopes
            .get(ns)
            .and_then(|s| s.head.as_ref())
            .and_then(|h| h.next.iter().find(|t| t.task_id == task_id).cloned());
        let step = self.scopes.get(ns).map_or(0, |s| s.step);
        meta.insert("run_attempt".into(), json!(1));
        meta.insert("langgraph_step".into(), json!(step));
        meta.insert("langgraph_node".into(), json!(node));
        meta.insert(
            "langgraph_triggers".into(),
            json!(
                task.as_ref()
                    .map_or_else(|| vec![format!("branch:to:{node}")], triggers)
            ),
        );
        meta.insert(
            "langgraph_path".into(),
            json!(if task.as_ref().is_some_and(|t| t.item.is_some()) {
                ["__pregel_push", node]
            } else {
                ["__pregel_pull", node]
            }),
        );
        meta.insert("langgraph_checkpoint_ns".into(), json!(full));
        if streamed {
            meta.insert(
                "checkpoint_ns".into(),
                json!(if ns.is_some() { ns_text.to_string() } else { own }),
            );
        }
        Value::Object(meta)
    }

    /// The ids of the messages in the run graph's state.
    fn message_ids(&self) -> HashSet<String> {
        let Some(scope) = self.scopes.get(&None) else {
            return HashSet::new();
        };
        scope
            .message_keys
            .iter()
            .filter_map(|k| scope.values.get(k).and_then(Value::as_array))
            .flatten()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// Feeds the server's latency histograms: every step (subgraphs' included) and every model
    /// call.
    fn measure(&mut self, event: &Event) {
        let metrics = &self.app.metrics;
        match event {
            Event::StepEnd { duration_ms, .. } => metrics.steps.observe_ms(*duration_ms),
            Event::ModelEnd { duration_ms, .. } => metrics.model_calls.observe_ms(*duration_ms),
            _ => {}
        }
    }

    /// The stream events that close a run: a step cut short by a gate shows the state with
    /// what its finished tasks wrote; a failed run, the error it failed with.
    pub(crate) fn finish(&mut self, outcome: &Result<RunOutcome, EngineError>) -> Out {
        match outcome {
            Ok(o) if o.status == Status::Interrupted => {
                let finished = self.scopes.get(&None).is_some_and(|s| !s.finished.is_empty());
                if !(finished && self.modes.values) {
                    return Vec::new();
                }
                let Some(head) = self.scopes.get(&None).and_then(|s| s.head.clone()) else {
                    return Vec::new();
                };
                match crate::engine::Engine::pending_state(self.plan.clone(), self.store.clone(), &head) {
                    Ok((values, _)) => vec![(
                        "values".into(),
                        Value::Object(messages::served_state(values, &self.plan)),
                    )],
                    Err(_) => Vec::new(),
                }
            }
            Ok(o) if o.status == Status::Failed => vec![("error".into(), failure(o))],
            Ok(_) => Vec::new(),
            Err(e) => vec![(
                "error".into(),
                json!({"error": "EngineError", "message": e.to_string()}),
            )],
        }
    }
}

pub(crate) use super::manager::failure;

/// An event's name inside namespace `ns`: `mode|ns`.
fn name(mode: &str, ns: &Option<Arc<str>>) -> String {
    match ns {
        Some(ns) => format!("{mode}|{ns}"),
        None => mode.to_string(),
    }
}

/// `ns` followed by the separator, or nothing at the top.
fn ns_prefix(ns: &str) -> String {
    if ns.is_empty() { String::new() } else { format!("{ns}|") }
}

/// The tasks a namespace runs inside, as an interrupt's id names them: `task/task/`.
fn ns_tasks(ns: &Option<Arc<str>>) -> String {
    ns.as_deref()
        .into_iter()
        .flat_map(|ns| ns.split('|'))
        .map(|segment| {
            let task = segment.split_once(':').map_or(segment, |(_, task)| task);
            format!("{task}/")
        })
        .collect()
}

/// What scheduled a task, as LangGraph names its triggers: a fan-out item is pushed to it,
/// anything else reaches it by an edge.
fn triggers(t: &TaskSpec) -> Vec<String> {
    if t.item.is_some() {
        vec!["__pregel_push".into()]
    } else {
        vec![format!("branch:to:{}", t.node)]
    }
}

/// The gates an interrupt record of task `id` stands for, as LangGraph shows them: the value
/// a node interrupted with, and an id. A subgraph's task reports the gates its child waits
/// at; each is shown as the child showed it, its id the path of tasks down to it
/// (`task/child-task`), which is how an answer addresses it.
pub(crate) fn flatten(id: &str, value: &Value) -> Vec<(String, Value)> {
    use crate::engine::{CHILD_GATES, CHILD_THREAD};
    if value.get(CHILD_THREAD).is_none() {
        return vec![(id.to_string(), value.clone())];
    }
    let inner: Vec<&Value> = match value.get(CHILD_GATES).and_then(Value::as_array) {
        Some(gates) => gates.iter().collect(),
        None => vec![value],
    };
    inner
        .into_iter()
        .flat_map(|gate| {
            let task = gate.get("task_id").and_then(Value::as_str).unwrap_or_default();
            flatten(&format!("{id}/{task}"), gate.get("payload").unwrap_or(&Value::Null))
        })
        .collect()
}

/// A piece of the message a task's model call streams: every piece of one call shares its id,
/// as LangChain's `AIMessageChunk`s do, and it is the id the reply has in the state once the
/// task writes it to a messages key ([`crate::engine::message_id`]).
fn chunk(id: &str, text: String, position: Option<&str>) -> Value {
    json!({
        "type": "AIMessageChunk", "content": text, "id": id,
        "additional_kwargs": {}, "response_metadata": {}, "name": null, "tool_calls": [],
        "invalid_tool_calls": [], "tool_call_chunks": [], "usage_metadata": null,
        "chunk_position": position,
    })
}

/// The message a streamed reply is so far, as the legacy `messages` mode shows it.
fn partial(id: &str, text: String) -> Value {
    json!({
        "type": "ai", "content": text, "id": id, "additional_kwargs": {}, "response_metadata": {},
        "name": null, "tool_calls": [], "invalid_tool_calls": [], "usage_metadata": null,
    })
}

/// A `debug` event: `{step, timestamp, type, payload}`.
fn debug(step: i64, kind: &str, payload: Value) -> Value {
    json!({"step": step, "timestamp": crate::clock::now(), "type": kind, "payload": payload})
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::flatten;

    /// A subgraph's gate is shown as the child's node raised it, its id the path of tasks to
    /// it; a subgraph waiting at several shows each.
    #[test]
    fn a_subgraphs_gates_are_shown_as_their_nodes_raised_them() {
        let own = json!({"message": "a?"});
        assert_eq!(flatten("pa:1", &own), [("pa:1".to_string(), own.clone())]);
        let one = json!({"node": "ask", "task_id": "ask:1", "kind": "node", "payload": {"message": "colour?"},
                         "subgraph": "inner", "subgraph_thread": "t/1/inner:1"});
        assert_eq!(
            flatten("inner:1", &one),
            [("inner:1/ask:1".to_string(), json!({"message": "colour?"}))]
        );
        let deeper = json!({"node": "inner", "task_id": "inner:1", "kind": "node", "payload": one,
                            "subgraph": "outer", "subgraph_thread": "t/1/outer:1"});
        assert_eq!(flatten("outer:1", &deeper)[0].0, "outer:1/inner:1/ask:1");
        let two = json!({"subgraph": "sub", "subgraph_thread": "t/1/sub:1", "interrupts": [
            {"node": "pa", "task_id": "pa:1", "kind": "node", "payload": {"message": "a?"}},
            {"node": "pb", "task_id": "pb:1", "kind": "node", "payload": {"message": "b?"}},
        ]});
        let ids: Vec<String> = flatten("sub:1", &two).into_iter().map(|(id, _)| id).collect();
        assert_eq!(ids, ["sub:1/pa:1", "sub:1/pb:1"]);
    }
}

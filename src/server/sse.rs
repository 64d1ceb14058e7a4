//! The event stream of a run as the LangGraph API frames it: `event: NAME`, `data: JSON` and a
//! blank line, every line ended by CRLF; and the engine's events turned into the stream modes
//! a client asked for (`values`, `updates`, `custom`, `messages-tuple`, the legacy `messages`,
//! `tasks`, `checkpoints`, `debug`), namespaced `mode|node:task` inside subgraphs. The same
//! events feed the server's step and model-call latency metrics.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{Map, Value, json};

use super::Shared;
use crate::checkpoint::Checkpointer;
use crate::engine::events::{Envelope, Event};
use crate::engine::{EngineError, RunOutcome, Status};

/// One event, framed; `id` (for runs a client may rejoin) comes after the data, as the
/// reference server frames it.
pub(crate) fn frame(event: &str, data: &Value, id: Option<usize>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\r\ndata: ");
    // A `Value` always serialises; compact JSON has no line breaks, so one `data:` line holds it.
    out.extend_from_slice(serde_json::to_string(data).unwrap_or_default().as_bytes());
    if let Some(id) = id {
        out.extend_from_slice(format!("\r\nid: {id}").as_bytes());
    }
    out.extend_from_slice(b"\r\n\r\n");
    Bytes::from(out)
}

/// The stream modes LangGraph knows. `events`, `tools` and `lifecycle` (LangChain callback
/// events and the newer protocol's channels) are accepted and produce no events.
const KNOWN: &[&str] = &[
    "values",
    "updates",
    "custom",
    "messages",
    "messages-tuple",
    "tasks",
    "checkpoints",
    "debug",
    "events",
    "tools",
    "lifecycle",
];

/// Which events a client asked for.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Modes {
    values: bool,
    updates: bool,
    custom: bool,
    /// `messages-tuple`: streamed model tokens as `messages` events.
    messages: bool,
    /// The legacy `messages`: `messages/metadata` once per message, then `messages/partial`
    /// with the message so far.
    partial: bool,
    /// Each task's start and result.
    tasks: bool,
    /// Each checkpoint as `{config, parent_config, values, metadata, next, tasks}`.
    checkpoints: bool,
    /// Checkpoints, task starts and task results wrapped as `{step, timestamp, type, payload}`.
    debug: bool,
    /// Events from inside subgraphs too, namespaced.
    subgraphs: bool,
}

impl Modes {
    /// `stream_mode` as sent: a name or a list of names; absent means `values`.
    pub(super) fn parse(stream_mode: Option<&Value>, subgraphs: bool) -> Result<Modes, String> {
        let names: Vec<&str> = match stream_mode {
            None | Some(Value::Null) => vec!["values"],
            Some(Value::String(s)) => vec![s.as_str()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|i| i.as_str().ok_or_else(|| format!("stream_mode holds {i}, not a name")))
                .collect::<Result<_, _>>()?,
            Some(other) => return Err(format!("stream_mode must be a name or a list of names, not {other}")),
        };
        let mut modes = Modes {
            subgraphs,
            ..Modes::default()
        };
        for name in names {
            match name {
                "values" => modes.values = true,
                "updates" => modes.updates = true,
                "custom" => modes.custom = true,
                "messages-tuple" => modes.messages = true,
                "messages" => modes.partial = true,
                "tasks" => modes.tasks = true,
                "checkpoints" => modes.checkpoints = true,
                "debug" => modes.debug = true,
                n if KNOWN.contains(&n) => {}
                n => return Err(format!("unknown stream_mode `{n}`; known: {}", KNOWN.join(", "))),
            }
        }
        Ok(modes)
    }
}

/// The state of one namespace (the run's graph, or a subgraph) as its events tell it.
#[derive(Default)]
struct Scope {
    values: Map<String, Value>,
    /// The tasks that ended in the current step: node, task id and the keys it wrote.
    ended: Vec<(String, String, Vec<String>)>,
}

/// Turns a run's events into stream-mode events.
pub(crate) struct Translate {
    modes: Modes,
    app: Shared,
    store: Arc<dyn Checkpointer>,
    thread_id: String,
    scopes: HashMap<Option<Arc<str>>, Scope>,
    /// The gates the run stopped at, as LangGraph's `Interrupt`s.
    pub interrupts: Vec<Value>,
    /// The class of the last node error, named in the `error` event of a failed run.
    error_class: Option<String>,
    /// The run started and its first step has not: the state it starts from is still to show.
    initial: bool,
    /// The run's graph: which keys of each namespace's state hold messages.
    plan: Arc<crate::compile::Plan>,
    /// What every `messages` event's metadata says of the run: `run_id`, `thread_id`,
    /// `graph_id`, `assistant_id`.
    run: Map<String, Value>,
    /// The step each namespace runs.
    steps: HashMap<Option<Arc<str>>, i64>,
    /// The tasks that streamed tokens, whose message ends with their node: the message's id.
    streamed: HashMap<String, String>,
    /// The ids of the run graph's messages a client has had: those it started with (its input
    /// is not sent back) and those sent since, whole or as streamed pieces.
    sent: std::collections::HashSet<String>,
    /// The text each task streamed so far (the legacy `messages` mode sends it whole each time).
    partial: HashMap<String, String>,
    /// Tasks that called a model in the current step, by namespace and node (the usage report
    /// names the node, and comes just before the task's end).
    called: HashMap<(Option<Arc<str>>, String), usize>,
}

impl Translate {
    /// `run` is what `messages` metadata says of the run (`run_id`, `graph_id`, …).
    pub(super) fn new(
        modes: Modes,
        app: &Shared,
        thread_id: String,
        run: Map<String, Value>,
        plan: Arc<crate::compile::Plan>,
    ) -> Translate {
        Translate {
            plan,
            run,
            steps: HashMap::new(),
            streamed: Default::default(),
            sent: Default::default(),
            partial: HashMap::new(),
            called: HashMap::new(),
            modes,
            app: app.clone(),
            store: app.store.clone(),
            thread_id,
            scopes: HashMap::new(),
            interrupts: Vec::new(),
            error_class: None,
            initial: false,
        }
    }

    /// The run's state as the stream last showed it, its messages as LangChain dicts.
    pub(super) fn values(&self) -> Map<String, Value> {
        let values = self.scopes.get(&None).map(|s| s.values.clone()).unwrap_or_default();
        super::messages::served(values, &self.message_keys(&None))
    }

    /// The ids of the messages in the run graph's state.
    fn message_ids(&self) -> std::collections::HashSet<String> {
        let Some(scope) = self.scopes.get(&None) else {
            return Default::default();
        };
        self.message_keys(&None)
            .iter()
            .filter_map(|k| scope.values.get(k).and_then(Value::as_array))
            .flatten()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// `messages` events for the messages the step's tasks wrote to the run graph's message
    /// keys that the client has not had, whole (LangGraph sends what a node returns without
    /// streaming it as one complete message; the legacy mode as `messages/complete` after its
    /// `messages/metadata`), each with the metadata of the first task that wrote its key.
    fn whole_messages(&mut self, keys: &[String], name: &dyn Fn(&str) -> String, out: &mut Vec<(String, Value)>) {
        let Some(scope) = self.scopes.get(&None) else {
            return;
        };
        let mut fresh = Vec::new();
        for key in keys {
            let Some(writer) = scope.ended.iter().find(|(_, _, written)| written.contains(key)) else {
                continue;
            };
            for m in scope.values.get(key).and_then(Value::as_array).into_iter().flatten() {
                let Some(id) = m.get("id").and_then(Value::as_str) else {
                    continue;
                };
                if !self.sent.contains(id) {
                    fresh.push((writer.0.clone(), id.to_string(), m.clone()));
                }
            }
        }
        for (node, id, m) in fresh {
            let meta = self.message_meta(&node, &None);
            let m = super::messages::message(m);
            if self.modes.partial {
                out.push((
                    name("messages/metadata"),
                    json!({ id.as_str(): {"metadata": meta.clone()} }),
                ));
                out.push((name("messages/complete"), json!([m.clone()])));
            }
            if self.modes.messages {
                out.push((name("messages"), json!([m, meta])));
            }
            self.sent.insert(id);
        }
    }

    /// The keys of namespace `ns`'s state that hold messages.
    fn message_keys(&self, ns: &Option<Arc<str>>) -> Vec<String> {
        super::messages::plan_of(&self.plan, ns.as_deref())
            .map(super::messages::keys)
            .unwrap_or_default()
    }

    /// The stream events `envelope` makes.
    pub(super) fn on(&mut self, envelope: Envelope) -> Vec<(String, Value)> {
        let ns = envelope.ns;
        self.measure(&ns, &envelope.event);
        if ns.is_some() && !self.modes.subgraphs {
            return Vec::new();
        }
        let name = |mode: &str| match &ns {
            Some(ns) => format!("{mode}|{ns}"),
            None => mode.to_string(),
        };
        let mut out = Vec::new();
        let top = ns.is_none();
        let modes = self.modes;
        match envelope.event {
            Event::RunStart { .. } if top => self.initial = true,
            Event::StepStart { step, .. } if top && self.initial => {
                // The state the run starts from (on a new thread: its input) is the checkpoint
                // before its first step: read by its step, as the head may already be further.
                self.initial = false;
                let before = self
                    .store
                    .history(&self.thread_id)
                    .ok()
                    .and_then(|h| h.into_iter().find(|c| c.step == step - 1));
                if let Some(cp) = &before
                    && let Ok(values) = self.store.state(&self.thread_id, &cp.versions)
                {
                    self.scopes.entry(None).or_default().values = values;
                }
                self.sent = self.message_ids();
                if modes.values {
                    out.push((name("values"), Value::Object(self.values())));
                }
                if let Some(cp) = &before {
                    self.checkpoint(cp, step - 1, &mut out);
                }
            }
            Event::StepStart { step, .. } => {
                self.steps.insert(ns.clone(), step);
            }
            Event::NodeStart { node, task_id, step } if modes.tasks || modes.debug => {
                let task = json!({"id": task_id, "name": node, "input": null, "triggers": []});
                if modes.debug {
                    out.push((name("debug"), debug(step, "task", &task)));
                }
                if modes.tasks {
                    out.push((name("tasks"), task));
                }
            }
            Event::Token {
                node,
                task_id,
                message_id,
                text,
            } if modes.messages || modes.partial => {
                if modes.partial {
                    let first = !self.partial.contains_key(&task_id);
                    let so_far = self.partial.entry(task_id.clone()).or_default();
                    so_far.push_str(&text);
                    let so_far = so_far.clone();
                    let mut message = chunk(&message_id, so_far, None);
                    message["type"] = json!("ai");
                    if first {
                        let id = message["id"].as_str().unwrap_or_default().to_string();
                        let meta = self.message_meta(&node, &ns);
                        out.push((name("messages/metadata"), json!({ id: {"metadata": meta} })));
                    }
                    out.push((name("messages/partial"), json!([message])));
                }
                if modes.messages {
                    let piece = chunk(&message_id, text, None);
                    out.push((name("messages"), json!([piece, self.message_meta(&node, &ns)])));
                }
                self.sent.insert(message_id.clone());
                self.streamed.insert(task_id, message_id);
            }
            Event::NodeEnd {
                node, keys, task_id, ..
            } => {
                self.partial.remove(&task_id);
                if let Some(id) = self.streamed.remove(&task_id)
                    && modes.messages
                {
                    let chunk = chunk(&id, String::new(), Some("last"));
                    out.push((name("messages"), json!([chunk, self.message_meta(&node, &ns)])));
                }
                self.scopes
                    .entry(ns.clone())
                    .or_default()
                    .ended
                    .push((node, task_id, keys));
            }
            Event::StateUpdate { values, .. } => {
                self.scopes.entry(ns.clone()).or_default().values.extend(values);
            }
            Event::StepEnd {
                checkpoint_id, step, ..
            } => {
                let committed = if top {
                    self.store
                        .get_checkpoint(&self.thread_id, Some(&checkpoint_id))
                        .ok()
                        .flatten()
                } else {
                    None
                };
                if let Some(cp) = &committed
                    && let Ok(values) = self.store.state(&self.thread_id, &cp.versions)
                {
                    // The committed checkpoint is the truth; the step's updates are only what
                    // changed.
                    self.scopes.entry(None).or_default().values = values;
                }
                let message_keys = self.message_keys(&ns);
                if top && (modes.messages || modes.partial) {
                    self.whole_messages(&message_keys, &name, &mut out);
                }
                let scope = self.scopes.entry(ns.clone()).or_default();
                for (node, task_id, keys) in std::mem::take(&mut scope.ended) {
                    let update: Map<String, Value> = keys
                        .iter()
                        .filter_map(|k| scope.values.get(k).map(|v| (k.clone(), v.clone())))
                        .collect();
                    let update = super::messages::served(update, &message_keys);
                    if modes.tasks || modes.debug {
                        let result: Vec<Value> = update.iter().map(|(k, v)| json!([k, v])).collect();
                        let task =
                            json!({"id": task_id, "name": node, "error": null, "result": result, "interrupts": []});
                        if modes.debug {
                            out.push((name("debug"), debug(step, "task_result", &task)));
                        }
                        if modes.tasks {
                            out.push((name("tasks"), task));
                        }
                    }
                    if modes.updates {
                        let update = if update.is_empty() {
                            Value::Null
                        } else {
                            Value::Object(update)
                        };
                        out.push((name("updates"), json!({ node: update })));
                    }
                }
                if modes.values {
                    let values = super::messages::served(scope.values.clone(), &message_keys);
                    out.push((name("values"), Value::Object(values)));
                }
                if let Some(cp) = &committed {
                    self.checkpoint(cp, step, &mut out);
                }
            }
            Event::Custom { event, data, .. } if modes.custom => {
                out.push((name("custom"), json!({"event": event, "data": data})));
            }
            Event::Interrupt { task_id, payload, .. } => {
                let interrupt = json!({"value": payload, "id": task_id});
                if modes.updates {
                    out.push((name("updates"), json!({"__interrupt__": [interrupt.clone()]})));
                }
                if top {
                    self.interrupts.push(interrupt);
                }
            }
            Event::Error { class: Some(class), .. } if top => self.error_class = Some(class),
            _ => {}
        }
        out
    }

    /// Feeds the server's latency histograms: every step (subgraphs' included) and every task
    /// that called a model.
    fn measure(&mut self, ns: &Option<Arc<str>>, event: &Event) {
        let metrics = &self.app.metrics;
        match event {
            Event::StepEnd { duration_ms, .. } => metrics.steps.observe_ms(*duration_ms),
            Event::Usage { node, usage } if usage.calls > 0 => {
                *self.called.entry((ns.clone(), node.clone())).or_default() += 1;
            }
            Event::NodeEnd { node, duration_ms, .. } => {
                if let Some(n) = self.called.get_mut(&(ns.clone(), node.clone())) {
                    metrics.model_calls.observe_ms(*duration_ms);
                    *n -= 1;
                    if *n == 0 {
                        self.called.remove(&(ns.clone(), node.clone()));
                    }
                }
            }
            _ => {}
        }
    }

    /// The `checkpoints` and `debug` events of checkpoint `cp` of the run's thread.
    fn checkpoint(&self, cp: &crate::checkpoint::Checkpoint, step: i64, out: &mut Vec<(String, Value)>) {
        if !(self.modes.checkpoints || self.modes.debug) {
            return;
        }
        let Ok(state) = super::threads::state_json(&self.app, &self.thread_id, cp, &self.message_keys(&None)) else {
            return;
        };
        let config = |id: &Value| json!({"configurable": {"thread_id": self.thread_id, "checkpoint_ns": "", "checkpoint_id": id}});
        let parent = match &state["parent_checkpoint_id"] {
            Value::Null => Value::Null,
            id => config(id),
        };
        let payload = json!({
            "config": config(&state["checkpoint_id"]),
            "parent_config": parent,
            "values": state["values"],
            "metadata": state["metadata"],
            "next": state["next"],
            "tasks": state["tasks"],
        });
        if self.modes.debug {
            out.push(("debug".into(), debug(step, "checkpoint", &payload)));
        }
        if self.modes.checkpoints {
            out.push(("checkpoints".into(), payload));
        }
    }

    /// The metadata of a `messages` event from `node` in namespace `ns`.
    fn message_meta(&self, node: &str, ns: &Option<Arc<str>>) -> Value {
        let mut meta = self.run.clone();
        let ns_text = ns.as_deref().unwrap_or_default();
        meta.insert("langgraph_node".into(), json!(node));
        meta.insert("langgraph_step".into(), json!(self.steps.get(ns).copied().unwrap_or(0)));
        meta.insert("langgraph_checkpoint_ns".into(), json!(ns_text));
        meta.insert("checkpoint_ns".into(), json!(ns_text));
        Value::Object(meta)
    }

    /// The stream events that close a run: the final values with its interrupts, or the error
    /// it failed with.
    pub(super) fn finish(&mut self, outcome: &Result<RunOutcome, EngineError>) -> Vec<(String, Value)> {
        match outcome {
            Ok(o) if o.status == Status::Interrupted && self.modes.values => {
                let mut values = self.values();
                values.insert("__interrupt__".into(), Value::Array(self.interrupts.clone()));
                vec![("values".into(), Value::Object(values))]
            }
            Ok(o) if o.status == Status::Failed => vec![(
                "error".into(),
                json!({
                    "error": self.error_class.clone().unwrap_or_else(|| "RunError".into()),
                    "message": o.error.clone().unwrap_or_default(),
                }),
            )],
            Ok(_) => Vec::new(),
            Err(e) => vec![(
                "error".into(),
                json!({"error": "EngineError", "message": e.to_string()}),
            )],
        }
    }
}

/// A piece of the message a task's model call streams: every piece of one call shares its id,
/// as LangChain's `AIMessageChunk`s do, and it is the id the reply has in the state once the
/// task writes it to a messages key ([`crate::engine::message_id`]), so a client joins the
/// streamed reply with the stored one.
fn chunk(id: &str, text: String, position: Option<&str>) -> Value {
    json!({
        "type": "AIMessageChunk", "content": text, "id": id,
        "additional_kwargs": {}, "response_metadata": {}, "name": null, "tool_calls": [],
        "invalid_tool_calls": [], "tool_call_chunks": [], "usage_metadata": null,
        "chunk_position": position,
    })
}

/// A `debug` event: `{step, timestamp, type, payload}`.
fn debug(step: i64, kind: &str, payload: &Value) -> Value {
    json!({"step": step, "timestamp": crate::clock::now(), "type": kind, "payload": payload})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_end_every_line_with_crlf() {
        let f = frame("values", &json!({"a": "x\ny"}), None);
        assert_eq!(&f[..], b"event: values\r\ndata: {\"a\":\"x\\ny\"}\r\n\r\n");
        let f = frame("values", &json!(1), Some(7));
        assert_eq!(&f[..], b"event: values\r\ndata: 1\r\nid: 7\r\n\r\n");
    }

    #[test]
    fn stream_modes_are_checked() {
        assert!(Modes::parse(Some(&json!(["values", "messages-tuple", "custom"])), false).is_ok());
        assert!(Modes::parse(Some(&json!("updates")), false).unwrap().updates);
        assert!(Modes::parse(None, false).unwrap().values);
        let e = Modes::parse(Some(&json!(["valuez"])), false).unwrap_err();
        assert!(e.starts_with("unknown stream_mode `valuez`"), "{e}");
    }
}

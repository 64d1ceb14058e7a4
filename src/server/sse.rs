//! The event stream of a run as the LangGraph API frames it: `event: NAME`, `data: JSON` and a
//! blank line, every line ended by CRLF; and the engine's events turned into the stream modes
//! a client asked for (`values`, `updates`, `custom`, `messages-tuple`, `tasks`), namespaced `mode|node:task` inside
//! subgraphs.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use serde_json::{Map, Value, json};

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

/// The stream modes LangGraph knows. Those runner produces are `values`, `updates`, `custom`,
/// `messages-tuple` and `tasks`; the others are accepted (clients such as agent-chat-ui always ask for `messages-tuple`) and
/// produce no events yet.
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
    /// Each task's start and result.
    tasks: bool,
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
                "tasks" => modes.tasks = true,
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
    store: Arc<dyn Checkpointer>,
    thread_id: String,
    scopes: HashMap<Option<Arc<str>>, Scope>,
    /// The gates the run stopped at, as LangGraph's `Interrupt`s.
    pub interrupts: Vec<Value>,
    /// The class of the last node error, named in the `error` event of a failed run.
    error_class: Option<String>,
    /// The run started and its first step has not: the state it starts from is still to show.
    initial: bool,
    /// What every `messages` event's metadata says of the run: `run_id`, `thread_id`,
    /// `graph_id`, `assistant_id`.
    run: Map<String, Value>,
    /// The step each namespace runs.
    steps: HashMap<Option<Arc<str>>, i64>,
    /// The tasks that streamed tokens, whose message ends with their node.
    streamed: std::collections::HashSet<String>,
}

impl Translate {
    /// `run` is what `messages` metadata says of the run (`run_id`, `graph_id`, …).
    pub(super) fn new(
        modes: Modes,
        store: Arc<dyn Checkpointer>,
        thread_id: String,
        run: Map<String, Value>,
    ) -> Translate {
        Translate {
            run,
            steps: HashMap::new(),
            streamed: Default::default(),
            modes,
            store,
            thread_id,
            scopes: HashMap::new(),
            interrupts: Vec::new(),
            error_class: None,
            initial: false,
        }
    }

    /// The run's state as the stream last showed it.
    pub(super) fn values(&self) -> Map<String, Value> {
        self.scopes.get(&None).map(|s| s.values.clone()).unwrap_or_default()
    }

    /// The stream events `envelope` makes.
    pub(super) fn on(&mut self, envelope: Envelope) -> Vec<(String, Value)> {
        let ns = envelope.ns;
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
                if let Some(cp) = before
                    && let Ok(values) = self.store.state(&self.thread_id, &cp.versions)
                {
                    self.scopes.entry(None).or_default().values = values;
                }
                if modes.values {
                    out.push((name("values"), Value::Object(self.values())));
                }
            }
            Event::StepStart { step, .. } => {
                self.steps.insert(ns.clone(), step);
            }
            Event::NodeStart { node, task_id, .. } if modes.tasks => {
                out.push((
                    name("tasks"),
                    json!({"id": task_id, "name": node, "input": null, "triggers": []}),
                ));
            }
            Event::Token { node, task_id, text } if modes.messages => {
                self.streamed.insert(task_id.clone());
                let chunk = self.chunk(&task_id, text, None);
                out.push((name("messages"), json!([chunk, self.message_meta(&node, &ns)])));
            }
            Event::NodeEnd {
                node, keys, task_id, ..
            } => {
                if self.streamed.remove(&task_id) {
                    let chunk = self.chunk(&task_id, String::new(), Some("last"));
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
            Event::StepEnd { checkpoint_id, .. } => {
                if top
                    && let Ok(Some(cp)) = self.store.get_checkpoint(&self.thread_id, Some(&checkpoint_id))
                    && let Ok(values) = self.store.state(&self.thread_id, &cp.versions)
                {
                    // The committed checkpoint is the truth; the step's updates are only what
                    // changed.
                    self.scopes.entry(None).or_default().values = values;
                }
                let scope = self.scopes.entry(ns.clone()).or_default();
                for (node, task_id, keys) in std::mem::take(&mut scope.ended) {
                    let update: Map<String, Value> = keys
                        .iter()
                        .filter_map(|k| scope.values.get(k).map(|v| (k.clone(), v.clone())))
                        .collect();
                    if modes.tasks {
                        let result: Vec<Value> = update.iter().map(|(k, v)| json!([k, v])).collect();
                        out.push((
                            name("tasks"),
                            json!({"id": task_id, "name": node, "error": null, "result": result, "interrupts": []}),
                        ));
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
                    out.push((name("values"), Value::Object(scope.values.clone())));
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

    /// A piece of the message a task's model call streams: every piece of one call shares its
    /// id, as LangChain's `AIMessageChunk`s do.
    fn chunk(&self, task_id: &str, text: String, position: Option<&str>) -> Value {
        let run = self.run.get("run_id").and_then(Value::as_str).unwrap_or_default();
        json!({
            "type": "AIMessageChunk", "content": text, "id": format!("run-{run}-{task_id}"),
            "additional_kwargs": {}, "response_metadata": {}, "name": null, "tool_calls": [],
            "invalid_tool_calls": [], "tool_call_chunks": [], "usage_metadata": null,
            "chunk_position": position,
        })
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

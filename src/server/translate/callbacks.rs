//! The `events` stream mode: a run's engine events as LangChain's callback events, in the
//! shape of `astream_events` v2 as the reference server streams them for `stream_mode:
//! "events"` — one `events` event each, whatever the namespace: the graph's `on_chain_start`
//! and `on_chain_end`; each task's `on_chain_start`, `on_chain_stream` (its writes) and
//! `on_chain_end`; a subgraph's own chain inside its task's; each model call's
//! `on_chat_model_start`, `on_chat_model_stream` per streamed piece and `on_chat_model_end`
//! with the reply and its `usage_metadata`; each tool call's `on_tool_start` and `on_tool_end`.
//! Every event names its run (`run_id`) and the runs around it (`parent_ids`, outermost
//! first): the graph's is the API run's id, a task's its task id, a model call's its call id.
//!
//! What runner adds: a model call's metadata says its model (`ls_model_name`), profile and
//! cost (`cost_usd`); retries and `http` requests come as `on_custom_event`s named
//! `runner.retry` and `runner.http`. A node's custom events (`emit`) are not here, as a
//! LangGraph node's stream writer's are not: they are the `custom` mode's.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{Out, Translate, chunk};
use crate::engine::events::Usage;
use crate::engine::events::{Event, TaskOutcome};

/// What the `events` mode remembers between engine events.
#[derive(Debug, Default)]
pub(super) struct Callbacks {
    /// The graph's `on_chain_start` was sent.
    started: bool,
    /// Each running task's input, by task id: its `on_chain_end` says it again.
    inputs: std::collections::HashMap<String, Value>,
    /// The model call each task has under way.
    calls: std::collections::HashMap<String, Call>,
    /// Each running subgraph's input, by namespace.
    children: std::collections::HashMap<Arc<str>, Value>,
}

/// A model call under way.
#[derive(Debug)]
struct Call {
    id: String,
    /// Its model's name as LangChain's class.
    name: &'static str,
    profile: String,
    model: String,
    /// A piece of its reply was streamed.
    streamed: bool,
}

/// The name LangChain gives a chat model of a profile's API (its class).
fn model_class(provider: &str) -> &'static str {
    match provider {
        "openai" => "ChatOpenAI",
        "anthropic" => "ChatAnthropic",
        _ => "ChatMock",
    }
}

/// LangChain's `usage_metadata` of a call's usage.
fn usage_metadata(u: &Usage) -> Value {
    json!({"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "total_tokens": u.total_tokens})
}

impl Translate {
    /// The run ids around a task of namespace `ns`, outermost first: the API run's, then for
    /// each subgraph its task's and its own chain's.
    fn parent_ids(&self, ns: &Option<Arc<str>>) -> Vec<Value> {
        let mut ids = vec![json!(self.run.run_id)];
        let mut prefix = String::new();
        for segment in ns.as_deref().into_iter().flat_map(|ns| ns.split('|')) {
            let task = segment.split_once(':').map_or(segment, |(_, t)| t);
            ids.push(json!(task));
            if !prefix.is_empty() {
                prefix.push('|');
            }
            prefix.push_str(segment);
            ids.push(json!(self.child_run_id(&prefix)));
        }
        ids
    }

    /// The run id of the chain of the subgraph running at namespace `ns`.
    fn child_run_id(&self, ns: &str) -> String {
        uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{}|{ns}", self.run.run_id).as_bytes(),
        )
        .to_string()
    }

    /// A task's metadata in a callback event: the message metadata of its node, and inside a
    /// subgraph the namespace it runs in.
    fn task_meta(&self, ns: &Option<Arc<str>>, node: &str, task_id: &str) -> Value {
        let mut meta = self.message_meta(ns, node, task_id, false);
        if let (Some(ns), Value::Object(m)) = (ns, &mut meta) {
            m.insert("checkpoint_ns".into(), json!(ns.as_ref()));
        }
        meta
    }

    /// What task `task_id` of namespace `ns` reads: its fan-out item, else the state of its step.
    fn task_input(&self, ns: &Option<Arc<str>>, task_id: &str) -> Value {
        let Some(scope) = self.scopes.get(ns) else {
            return Value::Null;
        };
        let item = scope
            .head
            .as_ref()
            .and_then(|h| h.next.iter().find(|t| t.task_id == task_id))
            .and_then(|t| t.item.clone());
        item.unwrap_or_else(|| Value::Object(super::messages::served_state(scope.values.clone(), &scope.plan)))
    }

    /// The `events` mode's events for one engine event of namespace `ns`.
    pub(super) fn callbacks(&mut self, ns: &Option<Arc<str>>, event: &Event, out: &mut Out) {
        let mut push = |data: Value| out.push(("events".to_string(), data));
        match event {
            Event::RunStart { .. } => match ns {
                None if !self.callbacks.started => {
                    self.callbacks.started = true;
                    push(json!({
                        "event": "on_chain_start", "data": {"input": self.run.input.clone()},
                        "name": self.run.graph_id, "tags": [], "run_id": self.run.run_id,
                        "metadata": self.run.metadata, "parent_ids": [],
                    }));
                }
                None => {}
                Some(child) => {
                    // A subgraph's chain, inside the task that runs it: its input is the task's.
                    let (outer, task) = split_last(child);
                    let Some((node, task)) = task.split_once(':') else {
                        return;
                    };
                    let input = self.callbacks.inputs.get(task).cloned().unwrap_or(Value::Null);
                    self.callbacks.children.insert(child.clone(), input.clone());
                    let name = super::messages::plan_of(&self.plan, Some(&**child)).map(|p| p.name().to_string());
                    let mut meta = self.message_meta(&outer, node, task, false);
                    if let Value::Object(m) = &mut meta {
                        m.insert("checkpoint_ns".into(), json!(child.as_ref()));
                    }
                    let mut parents = self.parent_ids(&outer);
                    parents.push(json!(task));
                    push(json!({
                        "event": "on_chain_start", "data": {"input": input}, "name": name,
                        "tags": ["seq:step:1"], "run_id": self.child_run_id(child), "metadata": meta,
                        "parent_ids": parents,
                    }));
                }
            },
            Event::NodeStart {
                step, node, task_id, ..
            } => {
                let input = self.task_input(ns, task_id);
                self.callbacks.inputs.insert(task_id.clone(), input.clone());
                push(json!({
                    "event": "on_chain_start", "data": {"input": input}, "name": node,
                    "tags": [format!("graph:step:{step}")], "run_id": task_id,
                    "metadata": self.task_meta(ns, node, task_id), "parent_ids": self.parent_ids(ns),
                }));
            }
            Event::ModelStart {
                node,
                task_id,
                call_id,
                profile,
                model,
                provider,
                messages,
            } => {
                self.callbacks.calls.insert(
                    task_id.clone(),
                    Call {
                        id: call_id.clone(),
                        name: model_class(provider),
                        profile: profile.clone(),
                        model: model.clone(),
                        streamed: false,
                    },
                );
                let mut data = Map::new();
                if let Some(m) = messages {
                    data.insert("input".into(), json!({"messages": [m]}));
                }
                push(json!({
                    "event": "on_chat_model_start", "data": data, "name": model_class(provider),
                    "tags": ["seq:step:1"], "run_id": call_id,
                    "metadata": self.model_meta(ns, node, task_id, profile, model, None),
                    "parent_ids": self.task_parents(ns, task_id),
                }));
            }
            Event::Token {
                node,
                task_id,
                message_id,
                text,
            } => {
                let Some(call) = self.callbacks.calls.get_mut(task_id) else {
                    return;
                };
                call.streamed = true;
                let (call_id, name, profile, model) =
                    (call.id.clone(), call.name, call.profile.clone(), call.model.clone());
                push(json!({
                    "event": "on_chat_model_stream", "data": {"chunk": chunk(message_id, text.clone(), None)},
                    "run_id": call_id, "name": name, "tags": ["seq:step:1"],
                    "metadata": self.model_meta(ns, node, task_id, &profile, &model, None),
                    "parent_ids": self.task_parents(ns, task_id),
                }));
            }
            Event::ModelEnd {
                node,
                task_id,
                call_id,
                profile,
                model,
                usage,
                reply,
                error,
                ..
            } => {
                let call = self.callbacks.calls.remove(task_id);
                let streamed = call.as_ref().is_some_and(|c| c.streamed);
                let name = call.map_or("ChatMock", |c| c.name);
                let id = crate::engine::message_id(task_id);
                let meta = self.model_meta(ns, node, task_id, profile, model, Some(usage));
                let parents = self.task_parents(ns, task_id);
                if streamed {
                    push(json!({
                        "event": "on_chat_model_stream", "data": {"chunk": chunk(&id, String::new(), Some("last"))},
                        "run_id": call_id, "name": name, "tags": ["seq:step:1"],
                        "metadata": self.model_meta(ns, node, task_id, profile, model, None), "parent_ids": parents,
                    }));
                }
                let mut data = Map::new();
                match (reply, error) {
                    (Some(reply), _) => {
                        let mut message = super::messages::message(json!({
                            "role": "assistant", "content": reply["content"], "tool_calls": reply["tool_calls"], "id": id,
                        }));
                        message["usage_metadata"] = usage_metadata(usage);
                        data.insert("output".into(), message);
                    }
                    (None, Some(e)) => {
                        data.insert("error".into(), json!(e));
                    }
                    (None, None) => {}
                }
                push(json!({
                    "event": "on_chat_model_end", "data": data, "run_id": call_id, "name": name,
                    "tags": ["seq:step:1"], "metadata": meta, "parent_ids": parents,
                }));
            }
            Event::ToolStart {
                node,
                task_id,
                call_id,
                tool,
                args,
            } => push(json!({
                "event": "on_tool_start", "data": {"input": args}, "name": tool, "tags": [],
                "run_id": tool_run_id(task_id, call_id), "metadata": self.task_meta(ns, node, task_id),
                "parent_ids": self.task_parents(ns, task_id),
            })),
            Event::ToolEnd {
                node,
                task_id,
                call_id,
                tool,
                result,
                error,
                ..
            } => {
                let mut data = json!({"output": result});
                if let Some(e) = error {
                    data["error"] = json!(e);
                }
                push(json!({
                    "event": "on_tool_end", "data": data, "name": tool, "tags": [],
                    "run_id": tool_run_id(task_id, call_id), "metadata": self.task_meta(ns, node, task_id),
                    "parent_ids": self.task_parents(ns, task_id),
                }));
            }
            Event::Retry { node, task_id, .. } | Event::Http { node, task_id, .. } => {
                let (name, mut data) = match event {
                    Event::Retry { .. } => ("runner.retry", serde_json::to_value(event).unwrap_or_default()),
                    _ => ("runner.http", serde_json::to_value(event).unwrap_or_default()),
                };
                if let Value::Object(d) = &mut data {
                    d.remove("type");
                }
                push(json!({
                    "event": "on_custom_event", "name": name, "data": data, "tags": [], "run_id": task_id,
                    "metadata": self.task_meta(ns, node, task_id), "parent_ids": self.task_parents(ns, task_id),
                }));
            }
            Event::NodeEnd {
                node,
                task_id,
                writes,
                outcome,
                cached,
                cache_hit,
                ..
            } => {
                let input = self.callbacks.inputs.remove(task_id);
                // A task that stopped at a gate or failed has no end; one whose result was
                // stored before (or cached) did not run in this run.
                if *outcome != TaskOutcome::Done || *cached || *cache_hit {
                    return;
                }
                let keys = self.scopes.get(ns).map(|s| s.message_keys.clone()).unwrap_or_default();
                let writes = Value::Object(super::messages::served(writes.clone(), &keys));
                let meta = self.task_meta(ns, node, task_id);
                let parents = self.parent_ids(ns);
                let step = self.scopes.get(ns).map_or(0, |s| s.step);
                let tags = json!([format!("graph:step:{step}")]);
                push(json!({
                    "event": "on_chain_stream", "run_id": task_id, "name": node, "tags": tags,
                    "metadata": meta, "data": {"chunk": writes}, "parent_ids": parents,
                }));
                push(json!({
                    "event": "on_chain_end", "data": {"output": writes, "input": input.unwrap_or(Value::Null)},
                    "run_id": task_id, "name": node, "tags": tags, "metadata": meta, "parent_ids": parents,
                }));
            }
            Event::RunEnd { status, .. } => {
                let ended = matches!(status.as_str(), "done" | "interrupted");
                let output = self
                    .scopes
                    .get(ns)
                    .map(|s| Value::Object(super::messages::served_state(s.values.clone(), &s.plan)));
                match ns {
                    None if ended => push(json!({
                        "event": "on_chain_end", "data": {"output": output},
                        "run_id": self.run.run_id, "name": self.run.graph_id, "tags": [],
                        "metadata": self.run.metadata, "parent_ids": [],
                    })),
                    None => {}
                    Some(child) => {
                        let input = self.callbacks.children.remove(child).unwrap_or(Value::Null);
                        if !ended {
                            return;
                        }
                        let (outer, task) = split_last(child);
                        let Some((node, task)) = task.split_once(':') else {
                            return;
                        };
                        let name = super::messages::plan_of(&self.plan, Some(&**child)).map(|p| p.name().to_string());
                        let mut meta = self.message_meta(&outer, node, task, false);
                        if let Value::Object(m) = &mut meta {
                            m.insert("checkpoint_ns".into(), json!(child.as_ref()));
                        }
                        let mut parents = self.parent_ids(&outer);
                        parents.push(json!(task));
                        push(json!({
                            "event": "on_chain_end", "data": {"output": output, "input": input}, "name": name,
                            "tags": ["seq:step:1"], "run_id": self.child_run_id(child), "metadata": meta,
                            "parent_ids": parents,
                        }));
                    }
                }
            }
            _ => {}
        }
    }

    /// The run ids around a call made by task `task_id` of namespace `ns`: the task's own last.
    fn task_parents(&self, ns: &Option<Arc<str>>, task_id: &str) -> Vec<Value> {
        let mut ids = self.parent_ids(ns);
        ids.push(json!(task_id));
        ids
    }

    /// A model call's metadata: its task's, as a streamed message's, with what runner adds —
    /// the model, the profile and, once it ended, what it cost.
    fn model_meta(
        &self,
        ns: &Option<Arc<str>>,
        node: &str,
        task_id: &str,
        profile: &str,
        model: &str,
        usage: Option<&Usage>,
    ) -> Value {
        let mut meta = self.message_meta(ns, node, task_id, true);
        if let Value::Object(m) = &mut meta {
            m.insert("ls_model_type".into(), json!("chat"));
            m.insert("ls_model_name".into(), json!(model));
            m.insert("model_profile".into(), json!(profile));
            if let Some(u) = usage {
                m.insert("cost_usd".into(), json!(u.cost));
            }
        }
        meta
    }
}

/// `ns` less its last segment, and that segment.
fn split_last(ns: &str) -> (Option<Arc<str>>, &str) {
    match ns.rsplit_once('|') {
        Some((outer, last)) => (Some(Arc::from(outer)), last),
        None => (None, ns),
    }
}

/// The run id of tool call `call_id` of task `task_id`.
fn tool_run_id(task_id: &str, call_id: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, format!("{task_id}/{call_id}").as_bytes()).to_string()
}

//! A run's trace, built from its engine events as they happen, where the run executes (this
//! process, or the worker that claimed it): a span for the run, each superstep (a subgraph's
//! inside the task that runs it), each task, each model call, tool call, `http` request and
//! retry, with its times relative to the run's start; and what the run spent on models, in all,
//! by node and by model. Kept in the run store as the run goes (`RunTask`), so a finished run's
//! trace survives the process, and one running on a worker is read by any server.
//!
//! Bounded: a task's writes, a fan-out item, a tool call's arguments and result are cut to
//! [`PAYLOAD_LIMIT`] bytes of JSON (the span's `truncated` says which, and how long each was),
//! and past [`MAX_SPANS`] spans the rest are counted, not kept. A task reads the state of the
//! checkpoint before its step: a top-level step's span and its tasks' name it
//! (`input_checkpoint_id`, the thread's checkpoint the run went on from or the previous step
//! made) and the step's span names the one it made (`checkpoint_id`); the states themselves
//! are the thread's (`GET /threads/{id}/state/{checkpoint_id}`). A subgraph's checkpoints are
//! its own thread's, so its spans name none.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::engine::events::Usage;
use crate::engine::events::{Envelope, Event, PAYLOAD_LIMIT, TaskOutcome, bounded};

/// The most spans a trace keeps.
pub(crate) const MAX_SPANS: usize = 5_000;

/// One span.
#[derive(Debug, Clone)]
struct Span {
    id: String,
    parent: Option<String>,
    kind: &'static str,
    name: String,
    node: Option<String>,
    step: Option<i64>,
    start_ms: f64,
    end_ms: Option<f64>,
    status: &'static str,
    /// Everything else it says: `error`, `input`, `writes`, `model`, `usage`, `truncated`, ...
    fields: Map<String, Value>,
}

impl Span {
    fn json(&self) -> Value {
        let mut v = json!({
            "id": self.id, "kind": self.kind, "name": self.name, "start_ms": round(self.start_ms),
            "end_ms": self.end_ms.map(round), "status": self.status,
        });
        if let Some(p) = &self.parent {
            v["parent"] = json!(p);
        }
        if let Some(n) = &self.node {
            v["node"] = json!(n);
        }
        if let Some(s) = self.step {
            v["step"] = json!(s);
        }
        if let Value::Object(m) = &mut v {
            m.extend(self.fields.clone());
        }
        v
    }

    /// Records `value` as field `key`, cut to the payload limit (saying so).
    fn payload(&mut self, key: &str, value: &Value) {
        let (shown, cut) = bounded(value, PAYLOAD_LIMIT);
        self.fields.insert(key.into(), shown);
        if let Some(bytes) = cut {
            let truncated = self
                .fields
                .entry("truncated")
                .or_insert_with(|| Value::Object(Map::new()));
            truncated[key] = json!(bytes);
        }
    }
}

fn round(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// What model calls spent: in all, and by one key.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Spent {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    pub(crate) cost_usd: f64,
    pub(crate) calls: u64,
}

impl Spent {
    fn add_usage(&mut self, u: &Usage) {
        self.input_tokens += u.prompt_tokens;
        self.output_tokens += u.completion_tokens;
        self.cost_usd += u.cost;
        self.calls += u.calls;
    }

    fn add(&mut self, o: &Spent) {
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cost_usd += o.cost_usd;
        self.calls += o.calls;
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "total_tokens": self.input_tokens + self.output_tokens,
            // Sums of floats drift in their last digits; a cost is shown to the nano-dollar.
            "cost_usd": (self.cost_usd * 1e9).round() / 1e9, "calls": self.calls,
        })
    }

    fn from_json(v: &Value) -> Spent {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        Spent {
            input_tokens: n("input_tokens"),
            output_tokens: n("output_tokens"),
            cost_usd: v.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0),
            calls: n("calls"),
        }
    }
}

/// A run's usage: in all, by node (a subgraph's nodes as `node:child`) and by model.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct UsageSums {
    pub(crate) total: Spent,
    pub(crate) by_node: indexmap::IndexMap<String, Spent>,
    pub(crate) by_model: indexmap::IndexMap<String, Spent>,
}

impl UsageSums {
    pub(crate) fn json(&self) -> Value {
        let map = |m: &indexmap::IndexMap<String, Spent>| -> Map<String, Value> {
            m.iter().map(|(k, s)| (k.clone(), s.json())).collect()
        };
        json!({"total": self.total.json(), "by_node": map(&self.by_node), "by_model": map(&self.by_model)})
    }

    pub(crate) fn from_json(v: &Value) -> UsageSums {
        let map = |key: &str| {
            v.get(key)
                .and_then(Value::as_object)
                .map(|m| m.iter().map(|(k, s)| (k.clone(), Spent::from_json(s))).collect())
                .unwrap_or_default()
        };
        UsageSums {
            total: v.get("total").map(Spent::from_json).unwrap_or_default(),
            by_node: map("by_node"),
            by_model: map("by_model"),
        }
    }

    /// Adds `other` (another run's) in.
    pub(crate) fn add(&mut self, other: &UsageSums) {
        self.total.add(&other.total);
        for (k, s) in &other.by_node {
            self.by_node.entry(k.clone()).or_default().add(s);
        }
        for (k, s) in &other.by_model {
            self.by_model.entry(k.clone()).or_default().add(s);
        }
    }
}

/// A run's trace as it is built.
#[derive(Debug)]
pub(crate) struct Recorder {
    run_id: String,
    thread_id: String,
    spans: Vec<Span>,
    /// Where each open span is, by what its events name: `run`, a step (`ns|step`), a task
    /// (its id), a model call (its id), a tool call (`task/call`).
    open: HashMap<String, usize>,
    /// The last error of each node (by namespace and node), for its failed task.
    errors: HashMap<(Option<Arc<str>>, String), String>,
    dropped: u64,
    usage: UsageSums,
    started_at: Option<String>,
    ended_at: Option<String>,
    /// The first event's `elapsed_ms`, and what to add to a time measured from it: the time
    /// from a resumed trace's start to this process's first event.
    origin: Option<f64>,
    offset_ms: f64,
    /// Epoch milliseconds of the trace's start (kept in the stored trace, for a resumed run).
    started_ms: Option<i64>,
    next_id: u64,
    /// Changed since it was last stored.
    dirty: bool,
    /// The thread's latest checkpoint as the run's events tell it: the one the next top-level
    /// step reads.
    head: Option<String>,
}

impl Recorder {
    /// The trace of run `run_id` of `thread_id`, going on from `earlier` (a trace stored by a
    /// process that executed the run before this one, which resumes it).
    pub(crate) fn new(run_id: &str, thread_id: &str, earlier: Option<&Value>) -> Recorder {
        let mut r = Recorder {
            run_id: run_id.into(),
            thread_id: thread_id.into(),
            spans: Vec::new(),
            open: HashMap::new(),
            errors: HashMap::new(),
            dropped: 0,
            usage: UsageSums::default(),
            started_at: None,
            ended_at: None,
            origin: None,
            offset_ms: 0.0,
            started_ms: None,
            next_id: 1,
            dirty: false,
            head: None,
        };
        if let Some(t) = earlier {
            r.started_at = t.get("started_at").and_then(Value::as_str).map(str::to_string);
            r.started_ms = t.get("started_ms").and_then(Value::as_i64);
            r.dropped = t.get("dropped_spans").and_then(Value::as_u64).unwrap_or(0);
            r.usage = t.get("usage").map(UsageSums::from_json).unwrap_or_default();
            for s in t.get("spans").and_then(Value::as_array).into_iter().flatten() {
                let Some(span) = span_of(s) else { continue };
                r.next_id = r
                    .next_id
                    .max(span.id.trim_start_matches('s').parse::<u64>().unwrap_or(0) + 1);
                r.spans.push(span);
            }
        }
        r
    }

    /// Whether anything changed since [`Recorder::stored`].
    pub(crate) fn dirty(&self) -> bool {
        self.dirty
    }

    /// Marks the trace as stored.
    pub(crate) fn stored(&mut self) {
        self.dirty = false;
    }

    /// What the run spent so far.
    pub(crate) fn usage(&self) -> &UsageSums {
        &self.usage
    }

    /// The trace as the API shows it (its `status` is the run's row's, which the caller adds).
    pub(crate) fn json(&self) -> Value {
        let mut spans: Vec<Value> = self.spans.iter().map(Span::json).collect();
        // An unfinished span says so, and runs to now.
        for s in &mut spans {
            if s["end_ms"].is_null() {
                s["status"] = json!("running");
            }
        }
        let mut v = json!({
            "run_id": self.run_id, "thread_id": self.thread_id, "started_at": self.started_at,
            "ended_at": self.ended_at, "spans": spans, "usage": self.usage.json(),
        });
        if let Some(ms) = self.started_ms {
            v["started_ms"] = json!(ms);
        }
        if self.dropped > 0 {
            v["dropped_spans"] = json!(self.dropped);
        }
        v
    }

    fn at(&mut self, e: &Envelope) -> f64 {
        let origin = *self.origin.get_or_insert(e.elapsed_ms);
        e.elapsed_ms - origin + self.offset_ms
    }

    /// Opens a span; `key` finds it again. None when the trace is full.
    fn open(&mut self, key: String, mut span: Span) -> Option<usize> {
        if self.spans.len() >= MAX_SPANS {
            self.dropped += 1;
            return None;
        }
        span.id = format!("s{}", self.next_id);
        self.next_id += 1;
        self.spans.push(span);
        let at = self.spans.len() - 1;
        self.open.insert(key, at);
        Some(at)
    }

    fn span(&self, parent: Option<String>, kind: &'static str, name: &str, start_ms: f64) -> Span {
        Span {
            id: String::new(),
            parent,
            kind,
            name: name.into(),
            node: None,
            step: None,
            start_ms,
            end_ms: None,
            status: "running",
            fields: Map::new(),
        }
    }

    fn id_of(&self, key: &str) -> Option<String> {
        self.open.get(key).map(|i| self.spans[*i].id.clone())
    }

    /// The span a step of namespace `ns` hangs from: the run's, or the task running the
    /// subgraph.
    fn step_parent(&self, ns: &Option<Arc<str>>) -> Option<String> {
        match ns.as_deref().and_then(|ns| ns.rsplit('|').next()) {
            Some(segment) => {
                let task = segment.split_once(':').map_or(segment, |(_, t)| t);
                self.id_of(task).or_else(|| self.id_of("run"))
            }
            None => self.id_of("run"),
        }
    }

    /// Names on a top-level step's or task's span the checkpoint whose state it reads.
    fn read_from(&self, ns: &Option<Arc<str>>, span: &mut Span) {
        if let (None, Some(head)) = (ns, &self.head) {
            span.fields.insert("input_checkpoint_id".into(), json!(head));
        }
    }

    /// Closes the span under `key` at `end_ms`.
    fn close(&mut self, key: &str, end_ms: f64, status: &'static str) -> Option<&mut Span> {
        let i = self.open.remove(key)?;
        let span = &mut self.spans[i];
        span.end_ms = Some(end_ms);
        span.status = status;
        Some(span)
    }

    /// Takes one event of the run.
    pub(crate) fn on(&mut self, e: &Envelope) {
        let t = self.at(e);
        let ns = &e.ns;
        self.dirty = true;
        match &e.event {
            Event::RunStart {
                workflow,
                checkpoint_id,
                ..
            } if ns.is_none() => {
                if !checkpoint_id.is_empty() {
                    self.head = Some(checkpoint_id.clone());
                }
                if self.started_at.is_none() {
                    self.started_at = Some(e.ts.clone());
                    self.started_ms = Some(crate::clock::now_ms());
                } else if let Some(start) = self.started_ms {
                    // A resumed run: its times go on from the trace's start.
                    self.offset_ms = (crate::clock::now_ms() - start).max(0) as f64;
                    self.ended_at = None;
                    // The run's span goes on where the killed process left it.
                    if let Some(i) = self.spans.iter().position(|s| s.kind == "run") {
                        self.spans[i].end_ms = None;
                        self.spans[i].status = "running";
                        self.open.insert("run".into(), i);
                    } else {
                        let span = self.span(None, "run", &workflow_name(workflow), self.offset_ms);
                        self.open("run".into(), span);
                    }
                    return;
                }
                let name = workflow_name(workflow);
                let span = self.span(None, "run", &name, t);
                self.open("run".into(), span);
            }
            Event::StepStart { step, .. } => {
                let parent = self.step_parent(ns);
                let mut span = self.span(parent, "step", &format!("step {step}"), t);
                span.step = Some(*step);
                self.read_from(ns, &mut span);
                self.open(step_key(ns, *step), span);
            }
            Event::StepEnd {
                step, checkpoint_id, ..
            } => {
                if let Some(span) = self.close(&step_key(ns, *step), t, "ok") {
                    span.fields.insert("checkpoint_id".into(), json!(checkpoint_id));
                }
                if ns.is_none() {
                    self.head = Some(checkpoint_id.clone());
                }
            }
            Event::NodeStart {
                step,
                node,
                task_id,
                item,
            } => {
                let parent = self.id_of(&step_key(ns, *step)).or_else(|| self.step_parent(ns));
                let mut span = self.span(parent, "task", node, t);
                span.node = Some(node_path(ns, node));
                span.step = Some(*step);
                span.fields.insert("task_id".into(), json!(task_id));
                self.read_from(ns, &mut span);
                if let Some(item) = item {
                    span.payload("input", item);
                }
                self.open(task_id.clone(), span);
            }
            Event::NodeEnd {
                step,
                node,
                task_id,
                writes,
                outcome,
                cached,
                cache_hit,
                ..
            } => {
                let status = match outcome {
                    TaskOutcome::Done if *cached || *cache_hit => "cached",
                    TaskOutcome::Done => "ok",
                    TaskOutcome::Interrupted => "interrupted",
                    TaskOutcome::Failed => "error",
                };
                let error = (*outcome == TaskOutcome::Failed)
                    .then(|| self.errors.remove(&(ns.clone(), node.clone())))
                    .flatten();
                if !self.open.contains_key(task_id.as_str()) {
                    // A result stored before (a resumed step) or cached: it ran no time here.
                    let parent = self.id_of(&step_key(ns, *step)).or_else(|| self.step_parent(ns));
                    let mut span = self.span(parent, "task", node, t);
                    span.node = Some(node_path(ns, node));
                    span.step = Some(*step);
                    span.fields.insert("task_id".into(), json!(task_id));
                    self.read_from(ns, &mut span);
                    self.open(task_id.clone(), span);
                }
                let writes = Value::Object(writes.clone());
                if let Some(span) = self.close(task_id, t, status) {
                    if !writes.as_object().is_some_and(Map::is_empty) {
                        span.payload("writes", &writes);
                    }
                    if let Some(error) = error {
                        span.fields.insert("error".into(), json!(error));
                    }
                }
            }
            Event::Error {
                node: Some(node),
                message,
                ..
            } => {
                self.errors.insert((ns.clone(), node.clone()), message.clone());
            }
            Event::ModelStart {
                node,
                task_id,
                call_id,
                profile,
                model,
                provider,
                ..
            } => {
                let parent = self.id_of(task_id);
                let mut span = self.span(parent, "model", model, t);
                span.node = Some(node_path(ns, node));
                span.fields.insert("model".into(), json!(model));
                span.fields.insert("profile".into(), json!(profile));
                span.fields.insert("provider".into(), json!(provider));
                self.open(call_id.clone(), span);
            }
            Event::ModelEnd {
                node,
                call_id,
                model,
                duration_ms,
                usage,
                error,
                ..
            } => {
                let path = node_path(ns, node);
                let mut spent = Spent::default();
                spent.add_usage(usage);
                self.usage.total.add(&spent);
                self.usage.by_node.entry(path).or_default().add(&spent);
                self.usage.by_model.entry(model.clone()).or_default().add(&spent);
                let status = if error.is_some() { "error" } else { "ok" };
                if let Some(span) = self.close(call_id, t, status) {
                    span.start_ms = span.start_ms.min(t - duration_ms);
                    span.fields.insert(
                        "usage".into(),
                        json!({"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                               "cost_usd": usage.cost}),
                    );
                    if let Some(e) = error {
                        span.fields.insert("error".into(), json!(e));
                    }
                }
            }
            Event::ToolStart {
                node,
                task_id,
                call_id,
                tool,
                args,
            } => {
                let parent = self.id_of(task_id);
                let mut span = self.span(parent, "tool", tool, t);
                span.node = Some(node_path(ns, node));
                span.fields.insert("call_id".into(), json!(call_id));
                span.payload("input", args);
                self.open(format!("{task_id}/{call_id}"), span);
            }
            Event::ToolEnd {
                task_id,
                call_id,
                result,
                error,
                ..
            } => {
                let status = if error.is_some() { "error" } else { "ok" };
                if let Some(span) = self.close(&format!("{task_id}/{call_id}"), t, status) {
                    match error {
                        Some(e) => {
                            span.fields.insert("error".into(), json!(e));
                        }
                        None => span.payload("output", result),
                    }
                }
            }
            Event::Http {
                node,
                task_id,
                method,
                url,
                status,
                duration_ms,
                bytes,
                error,
            } => {
                let parent = self.id_of(task_id);
                let mut span = self.span(parent, "http", &format!("{method} {url}"), t - duration_ms);
                span.node = Some(node_path(ns, node));
                span.end_ms = Some(t);
                span.status = match (status, error) {
                    (Some(s), _) if *s < 400 => "ok",
                    _ => "error",
                };
                span.fields.insert("http_status".into(), json!(status));
                span.fields.insert("bytes".into(), json!(bytes));
                if let Some(e) = error {
                    span.fields.insert("error".into(), json!(e));
                }
                let key = format!("http/{}", self.next_id);
                if self.open(key.clone(), span).is_some() {
                    self.open.remove(&key);
                }
            }
            Event::Retry {
                node,
                task_id,
                attempt,
                error,
                delay_ms,
            } => {
                let parent = self.id_of(task_id);
                let mut span = self.span(parent, "retry", &format!("retry after attempt {attempt}"), t);
                span.node = Some(node_path(ns, node));
                span.end_ms = Some(t + delay_ms);
                span.status = "ok";
                span.fields.insert("attempt".into(), json!(attempt));
                span.fields.insert("error".into(), json!(error));
                let key = format!("retry/{}", self.next_id);
                if self.open(key.clone(), span).is_some() {
                    self.open.remove(&key);
                }
            }
            Event::RunEnd { status, .. } if ns.is_none() => {
                self.ended_at = Some(e.ts.clone());
                let status = match status.as_str() {
                    "done" => "ok",
                    "interrupted" => "interrupted",
                    "cancelled" => "cancelled",
                    _ => "error",
                };
                // What was still open ended with the run.
                let open: Vec<String> = self.open.keys().filter(|k| *k != "run").cloned().collect();
                for key in open {
                    self.close(&key, t, status);
                }
                self.close("run", t, status);
            }
            _ => {}
        }
    }
}

/// A workflow file's name without its folder.
fn workflow_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_stem()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn step_key(ns: &Option<Arc<str>>, step: i64) -> String {
    format!("{}|step:{step}", ns.as_deref().unwrap_or_default())
}

/// A node's path: its name, inside a subgraph `node:child` as LangGraph's drawing names it.
fn node_path(ns: &Option<Arc<str>>, node: &str) -> String {
    let mut path = String::new();
    for segment in ns.as_deref().into_iter().flat_map(|ns| ns.split('|')) {
        path.push_str(segment.split_once(':').map_or(segment, |(n, _)| n));
        path.push(':');
    }
    path.push_str(node);
    path
}

/// A stored span read back (a resumed run's trace).
fn span_of(v: &Value) -> Option<Span> {
    let text = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let kind = match v.get("kind").and_then(Value::as_str)? {
        "run" => "run",
        "step" => "step",
        "task" => "task",
        "model" => "model",
        "tool" => "tool",
        "http" => "http",
        _ => "retry",
    };
    let status = match v.get("status").and_then(Value::as_str).unwrap_or("ok") {
        "ok" => "ok",
        "cached" => "cached",
        "interrupted" => "interrupted",
        "cancelled" => "cancelled",
        "running" => "cancelled",
        _ => "error",
    };
    let mut fields = v.as_object()?.clone();
    for k in [
        "id", "parent", "kind", "name", "node", "step", "start_ms", "end_ms", "status",
    ] {
        fields.remove(k);
    }
    let start_ms = v.get("start_ms").and_then(Value::as_f64).unwrap_or(0.0);
    Some(Span {
        id: text("id")?,
        parent: text("parent"),
        kind,
        name: text("name").unwrap_or_default(),
        node: text("node"),
        step: v.get("step").and_then(Value::as_i64),
        start_ms,
        // A span the killed process left open ended when it did, as far as anyone knows.
        end_ms: Some(v.get("end_ms").and_then(Value::as_f64).unwrap_or(start_ms)),
        status,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: f64, ns: Option<&str>, event: Event) -> Envelope {
        Envelope {
            ts: crate::clock::now(),
            elapsed_ms: ms,
            ns: ns.map(Arc::from),
            event,
        }
    }

    fn usage(prompt: u64, completion: u64, cost: f64) -> Usage {
        Usage {
            cost,
            ..Usage::tokens(prompt, completion)
        }
    }

    /// One step of task `t1` of node `ask`, with a model call of `model`.
    fn step(r: &mut Recorder, t0: f64, step: i64, model: &str, writes: Value) {
        r.on(&at(
            t0,
            None,
            Event::StepStart {
                step,
                tasks: vec!["t1".into()],
                nodes: vec!["ask".into()],
            },
        ));
        r.on(&at(
            t0 + 1.0,
            None,
            Event::NodeStart {
                step,
                node: "ask".into(),
                task_id: format!("t{step}"),
                item: None,
            },
        ));
        r.on(&at(
            t0 + 2.0,
            None,
            Event::ModelStart {
                node: "ask".into(),
                task_id: format!("t{step}"),
                call_id: format!("c{step}"),
                profile: "default".into(),
                model: model.into(),
                provider: "mock".into(),
                messages: None,
            },
        ));
        r.on(&at(
            t0 + 7.0,
            None,
            Event::ModelEnd {
                node: "ask".into(),
                task_id: format!("t{step}"),
                call_id: format!("c{step}"),
                profile: "default".into(),
                model: model.into(),
                duration_ms: 5.0,
                usage: usage(100, 10, 0.5),
                reply: None,
                error: None,
            },
        ));
        r.on(&at(
            t0 + 8.0,
            None,
            Event::NodeEnd {
                step,
                node: "ask".into(),
                task_id: format!("t{step}"),
                duration_ms: 7.0,
                keys: vec![],
                writes: writes.as_object().cloned().unwrap_or_default(),
                cached: false,
                outcome: TaskOutcome::Done,
                cache_hit: false,
            },
        ));
        r.on(&at(
            t0 + 9.0,
            None,
            Event::StepEnd {
                step,
                checkpoint_id: format!("cp{step}"),
                duration_ms: 9.0,
                checkpoint: None,
            },
        ));
    }

    fn start(r: &mut Recorder, t0: f64) {
        r.on(&at(
            t0,
            None,
            Event::RunStart {
                thread_id: "t".into(),
                workflow: "/w/chat.yaml".into(),
                resumed: false,
                checkpoint_id: String::new(),
            },
        ));
    }

    /// Spans nest as the run did, a large write is cut and says so, and usage sums by node and
    /// model; a run resumed by another process goes on with the trace the first stored.
    #[test]
    fn a_trace_nests_cuts_sums_and_goes_on_after_a_resume() {
        let mut r = Recorder::new("r", "t", None);
        start(&mut r, 100.0);
        step(&mut r, 100.0, 1, "m1", json!({"big": "x".repeat(10_000)}));
        let t = r.json();
        let spans = t["spans"].as_array().unwrap();
        let kinds: Vec<&str> = spans.iter().map(|s| s["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["run", "step", "task", "model"]);
        assert_eq!(spans[0]["status"], "running", "the run has not ended");
        assert_eq!(
            (&spans[1]["parent"], &spans[2]["parent"], &spans[3]["parent"]),
            (&spans[0]["id"], &spans[1]["id"], &spans[2]["id"])
        );
        assert_eq!(
            (spans[3]["start_ms"].as_f64(), spans[3]["end_ms"].as_f64()),
            (Some(2.0), Some(7.0))
        );
        assert_eq!(spans[2]["truncated"]["writes"], 10_010);
        assert!(spans[2]["writes"].as_str().unwrap().len() <= PAYLOAD_LIMIT);
        assert_eq!(spans[1]["checkpoint_id"], "cp1");

        // Another process resumes the run from what was stored.
        let mut again = Recorder::new("r", "t", Some(&t));
        start(&mut again, 0.0);
        step(&mut again, 0.0, 2, "m2", json!({"small": 1}));
        again.on(&at(
            20.0,
            None,
            Event::RunEnd {
                status: "done".into(),
                steps: 2,
                duration_ms: 20.0,
                turn_usage: Usage::default(),
                thread_usage: Usage::default(),
            },
        ));
        let t = again.json();
        let spans = t["spans"].as_array().unwrap();
        let runs: Vec<&Value> = spans.iter().filter(|s| s["kind"] == "run").collect();
        assert_eq!(runs.len(), 1, "one run span: {t}");
        assert_eq!(runs[0]["status"], "ok");
        let ids: Vec<&str> = spans.iter().map(|s| s["id"].as_str().unwrap()).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "span ids stay unique: {ids:?}");
        assert_eq!(t["usage"]["total"]["calls"], 2);
        assert_eq!(t["usage"]["by_node"]["ask"]["input_tokens"], 200);
        assert_eq!(t["usage"]["by_model"]["m2"]["cost_usd"], 0.5);
        assert!(!t["ended_at"].is_null());
    }

    /// A subgraph's steps hang from the task that runs it, and its nodes' usage is named by
    /// their path.
    #[test]
    fn a_subgraphs_steps_hang_from_its_task() {
        let mut r = Recorder::new("r", "t", None);
        start(&mut r, 0.0);
        r.on(&at(
            1.0,
            None,
            Event::StepStart {
                step: 1,
                tasks: vec!["p".into()],
                nodes: vec!["child".into()],
            },
        ));
        r.on(&at(
            2.0,
            None,
            Event::NodeStart {
                step: 1,
                node: "child".into(),
                task_id: "p".into(),
                item: Some(json!({"i": 1})),
            },
        ));
        r.on(&at(
            3.0,
            Some("child:p"),
            Event::StepStart {
                step: 1,
                tasks: vec!["q".into()],
                nodes: vec!["write".into()],
            },
        ));
        r.on(&at(
            4.0,
            Some("child:p"),
            Event::ModelEnd {
                node: "write".into(),
                task_id: "q".into(),
                call_id: "c".into(),
                profile: "default".into(),
                model: "m".into(),
                duration_ms: 1.0,
                usage: usage(1, 2, 0.0),
                reply: None,
                error: None,
            },
        ));
        let t = r.json();
        let spans = t["spans"].as_array().unwrap();
        assert_eq!(spans[2]["input"], json!({"i": 1}));
        assert_eq!(spans[3]["kind"], "step");
        assert_eq!(spans[3]["parent"], spans[2]["id"]);
        assert!(
            spans[3].get("input_checkpoint_id").is_none(),
            "a subgraph's checkpoints are its own thread's"
        );
        assert_eq!(t["usage"]["by_node"]["child:write"]["output_tokens"], 2);
    }

    /// A top-level step and its tasks name the checkpoint whose state they read: the one the run
    /// went on from, then the one the step before made.
    #[test]
    fn a_task_names_the_checkpoint_it_read() {
        let mut r = Recorder::new("r", "t", None);
        r.on(&at(
            0.0,
            None,
            Event::RunStart {
                thread_id: "t".into(),
                workflow: "/w/chat.yaml".into(),
                resumed: false,
                checkpoint_id: "cp0".into(),
            },
        ));
        step(&mut r, 1.0, 1, "m", json!({"a": 1}));
        step(&mut r, 20.0, 2, "m", json!({"a": 2}));
        let t = r.json();
        let read: Vec<(&str, i64, &str, &str)> = t["spans"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["kind"] == "step" || s["kind"] == "task")
            .map(|s| {
                (
                    s["kind"].as_str().unwrap(),
                    s["step"].as_i64().unwrap(),
                    s["input_checkpoint_id"].as_str().unwrap_or("-"),
                    s["checkpoint_id"].as_str().unwrap_or("-"),
                )
            })
            .collect();
        assert_eq!(
            read,
            [
                ("step", 1, "cp0", "cp1"),
                ("task", 1, "cp0", "-"),
                ("step", 2, "cp1", "cp2"),
                ("task", 2, "cp1", "-"),
            ]
        );
    }
}

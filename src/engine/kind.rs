//! What the engine asks of a node kind, and what it gives one.
//!
//! The engine never names a kind. It holds a [`Kinds`] registry (in the run's [`Services`]),
//! finds each node's kind there by the name the plan gives it, and asks the kind, through
//! [`NodeKind`], everything that differs between kinds: how to run an attempt, whether a
//! failure retries by default, whether a spent budget holds the node back, which schema an
//! answer to it must match and whether an answer fits the interrupt it answers. A kind is one module of `nodes/` implementing this trait, plus one
//! line registering it.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use indexmap::IndexMap;
use minijinja::Value as JValue;
use serde_json::{Map, Value};

use super::Services;
use super::events::Events;
use super::values;
use crate::checkpoint::{Checkpointer, Fence};
use crate::compile::kind::{Data, KindDecl, KindSet};
use crate::compile::{Compiled, ExprId, NodeIx, NodeValidators, Plan, PlanNode, TemplateId};
use crate::error_class::ErrorClass;
use crate::providers::Usage;

/// A node kind, as the engine sees it: its declaration (name, schema, compile step: see
/// [`KindDecl`]) and how it runs.
pub trait NodeKind: KindDecl {
    /// Runs one attempt of a node of this kind.
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a>;

    /// Whether a spent budget (`limits`, the node's `budget`) stops a node of this kind before
    /// it runs: true for kinds whose runs spend on models.
    fn held_by_budget(&self) -> bool {
        false
    }

    /// The schema an answer to a node of this kind waiting at a gate must match, if it has
    /// one, when the task was given `answered` answers before. (A node with a child plan is
    /// answered inside the child; the engine follows it.)
    fn answer_schema<'p>(&self, _node: &'p PlanNode, _answered: usize) -> Option<&'p Value> {
        None
    }

    /// Why `answer`, which matches [`NodeKind::answer_schema`], still cannot answer the
    /// interrupt `payload` a task of this node stopped with (what a schema fixed at compile
    /// time cannot know: how many calls a review asks about), or `None` when it can. Checked
    /// with the schema, before the answer is stored: an answer the task would fail on is
    /// refused and the gate kept, never stored to fail every resume after it.
    fn refuse_answer(&self, _node: &PlanNode, _payload: &Value, _answer: &Value) -> Option<String> {
        None
    }
}

/// An attempt under way: finished already, or a future to await. Kinds that do not wait on
/// anything (pure state updates, events, gates) answer at once, so a step of many such tasks
/// allocates no futures for them.
pub enum Attempt<'a> {
    Ready(Result<NodeOutput, NodeFailure>),
    Pending(BoxFuture<'a, Result<NodeOutput, NodeFailure>>),
}

/// The node kinds a run knows, by name, in the order they were given. A copy shares the
/// registry (every run of a server copies the server's).
#[derive(Clone, Default)]
pub struct Kinds {
    by_name: Arc<IndexMap<&'static str, Arc<dyn NodeKind>>>,
}

impl Kinds {
    /// A registry of `kinds`; a later kind of the same name replaces an earlier one.
    pub fn new(kinds: impl IntoIterator<Item = Arc<dyn NodeKind>>) -> Kinds {
        let mut out = Kinds::default();
        for k in kinds {
            out = out.with(k);
        }
        out
    }

    /// This registry with `kind` added (replacing a kind of the same name).
    pub fn with(mut self, kind: Arc<dyn NodeKind>) -> Kinds {
        Arc::make_mut(&mut self.by_name).insert(kind.name(), kind);
        self
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn NodeKind>> {
        self.by_name.get(name)
    }

    /// The kind of `node`, or an error naming the kind no registry entry has.
    pub fn of(&self, node: &PlanNode) -> Result<&Arc<dyn NodeKind>, NodeError> {
        let name = node.spec.kind_name();
        self.get(name)
            .ok_or_else(|| NodeError::invalid(format!("no node kind `{name}` is registered with this run")))
    }

    /// The registered names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.by_name.keys().copied().collect()
    }

    /// The same kinds as the compiler sees them.
    pub fn decls(&self) -> KindSet {
        KindSet::new(self.by_name.values().map(|k| k.clone() as Arc<dyn KindDecl>))
    }
}

/// The same kinds under the same names (the same objects, not look-alikes).
impl PartialEq for Kinds {
    fn eq(&self, other: &Kinds) -> bool {
        self.by_name.len() == other.by_name.len()
            && self
                .by_name
                .iter()
                .all(|(name, k)| other.by_name.get(name).is_some_and(|o| Arc::ptr_eq(k, o)))
    }
}

impl fmt::Debug for Kinds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

/// What a running node can reach.
pub struct NodeCtx<'a> {
    pub plan: &'a Arc<Plan>,
    pub node: &'a PlanNode,
    pub ix: NodeIx,
    /// The scope of the node's fields: state, input, config, context, run, params, item.
    pub base: &'a Arc<values::Scope>,
    /// `base` as a minijinja value.
    pub scope: JValue,
    pub task_id: &'a str,
    pub step: i64,
    pub events: &'a Events,
    /// Providers and the other clients and stores of the run.
    pub services: &'a Arc<Services>,
    /// The answer to this task's interrupt, when the run resumes it.
    pub resume: Option<&'a Value>,
    /// Which of a subgraph's gates the answer is for, when it waits at several.
    pub resume_to: Option<&'a str>,
    /// The answers this task was given before `resume`, in order (a gate that asks several
    /// questions, one at a time).
    pub answered: &'a [Value],
    pub store: &'a Arc<dyn Checkpointer>,
    pub thread_id: &'a str,
    /// The lease the run writes under (a subgraph runs its child thread under it).
    pub fence: &'a Fence,
    /// Per node, a validator built on first use and kept by the plan for all its runs.
    pub(super) validators: &'a NodeValidators,
}

impl NodeCtx<'_> {
    /// The node's compiled configuration, as its kind's own type.
    pub fn config<T: std::any::Any>(&self) -> Result<&T, NodeError> {
        self.node.config.get::<T>().ok_or_else(|| {
            NodeError::invalid(format!(
                "node `{}` of kind `{}` was compiled by another kind",
                self.node.name,
                self.node.spec.kind_name()
            ))
        })
    }

    /// An engine for a child run of this task (a subgraph, a workflow run as a tool): on the
    /// same store and services, its events nested under this task, writing under this run's
    /// lease, and ending at a handoff to the parent.
    pub fn child_engine(&self, child: Arc<Plan>) -> super::Engine {
        self.child_engine_with(child, false)
    }

    /// [`NodeCtx::child_engine`]; with `forward_custom`, the child's custom events are this
    /// task's own (see [`super::events::Events::nested_forwarding`]).
    pub fn child_engine_with(&self, child: Arc<Plan>, forward_custom: bool) -> super::Engine {
        let events = if forward_custom {
            self.events.nested_forwarding(&self.node.name, self.task_id)
        } else {
            self.events.nested(&self.node.name, self.task_id)
        };
        super::Engine::sharing(child, self.store.clone(), self.services.clone(), events).with_options(
            super::RunOptions {
                lease: super::LeasePolicy::Under(self.fence.clone()),
                as_child: true,
                ..super::RunOptions::default()
            },
        )
    }

    /// Sends one model call through `provider` for the model profile `name`, reported as a
    /// `model_start` and a `model_end` event: the model it stands for, how long the call took,
    /// what it spent (its usage priced by the profile, counted as one call at least) and its
    /// reply, or why it failed. The reply's usage is priced so.
    pub async fn chat(
        &self,
        provider: &dyn crate::providers::Provider,
        name: &str,
        profile: &crate::spec::ModelProfile,
        request: crate::providers::ChatRequest,
        tokens: Option<crate::providers::TokenSink<'_>>,
    ) -> Result<crate::providers::ChatResponse, crate::providers::ProviderError> {
        use super::events::{Event, REPLY_TEXT_LIMIT, cut};
        let on = self.events.is_on();
        let call_id = if on {
            uuid::Uuid::now_v7().to_string()
        } else {
            String::new()
        };
        if on {
            let messages = crate::providers::trace::capture_content().then(|| {
                Value::Array(
                    request
                        .messages
                        .iter()
                        .map(|m| serde_json::json!({"role": m.role, "content": crate::secrets::scrub(&m.content)}))
                        .collect(),
                )
            });
            self.events.send(Event::ModelStart {
                node: self.node.name.clone(),
                task_id: self.task_id.to_string(),
                call_id: call_id.clone(),
                profile: name.to_string(),
                model: request.model.clone(),
                provider: provider_name(profile.provider).to_string(),
                messages,
            });
        }
        let model = request.model.clone();
        let started = std::time::Instant::now();
        let mut result = provider.chat(request, tokens).await;
        if let Ok(reply) = &mut result {
            reply.usage.calls = reply.usage.calls.max(1);
            crate::providers::price(profile, &mut reply.usage);
        }
        if on {
            let (usage, reply, error) = match &result {
                Ok(reply) => {
                    let text = crate::secrets::scrub(&reply.text);
                    let mut shown = serde_json::json!({
                        "content": cut(&text, REPLY_TEXT_LIMIT),
                        "tool_calls": reply.tool_calls,
                    });
                    if text.len() > REPLY_TEXT_LIMIT {
                        shown["truncated"] = Value::Bool(true);
                    }
                    (reply.usage, Some(shown), None)
                }
                // A failed call is still a call; its tokens, if any, are unknown.
                Err(e) => (
                    Usage {
                        calls: 1,
                        ..Usage::default()
                    },
                    None,
                    Some(crate::secrets::scrub(&e.to_string()).into_owned()),
                ),
            };
            self.events.send(Event::ModelEnd {
                node: self.node.name.clone(),
                task_id: self.task_id.to_string(),
                call_id,
                profile: name.to_string(),
                model: result.as_ref().ok().and_then(|r| r.model.clone()).unwrap_or(model),
                duration_ms: started.elapsed().as_secs_f64() * 1000.0,
                usage,
                reply,
                error,
            });
        }
        result
    }

    /// The node's own `timeout` (the limit of each attempt), if it has one.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.node.timeout
    }

    /// The validator of `schema`, built the first time this node asks and kept for later
    /// attempts and tasks of the node (a node has one schema to check its results against).
    pub fn validator(&self, schema: &Value) -> Result<&jsonschema::Validator, NodeError> {
        self.validators.get(self.ix, schema).map_err(NodeError::invalid)
    }

    /// Runs `node` — compiled by its kind, not in the graph (a tool's `run`) — as part of
    /// this task, its fields evaluated in this node's scope with `vars` added. Only the
    /// node's kind runs: it writes no state and routes nowhere; its output is returned,
    /// scrubbed like any node's. A failed attempt is retried as a task of that node would be:
    /// by its own `retry` policy, else its kind's default; what failed attempts spent is
    /// counted.
    pub async fn run_nested(&self, node: &PlanNode, vars: Vec<(String, JValue)>) -> Result<NodeOutput, NodeFailure> {
        let policy = &node.retry;
        let mut spent = crate::providers::Usage::default();
        let mut attempt = 1;
        loop {
            match self.attempt_nested(node, vars.clone()).await {
                Ok(mut out) => {
                    out.usage.add(&spent);
                    return Ok(out);
                }
                Err(NodeFailure::Error(mut e)) => {
                    e.usage.add(&spent);
                    let Some(delay) = super::task::retry_delay(policy, attempt, &e) else {
                        return Err(e.into());
                    };
                    self.events.send(super::events::Event::Retry {
                        node: node.name.clone(),
                        task_id: self.task_id.to_string(),
                        attempt,
                        error: e.message.clone(),
                        delay_ms: delay.as_secs_f64() * 1000.0,
                    });
                    tokio::time::sleep(delay).await;
                    spent = e.usage;
                    attempt += 1;
                }
                Err(other) => return Err(other),
            }
        }
    }

    async fn attempt_nested(&self, node: &PlanNode, vars: Vec<(String, JValue)>) -> Result<NodeOutput, NodeFailure> {
        let base = Arc::new(self.base.with(vars));
        let scope = base.value();
        // Its own validator: the nested node's schema is not this node's.
        let validators = NodeValidators::new([self.ix]);
        let ctx = NodeCtx {
            plan: self.plan,
            node,
            ix: self.ix,
            base: &base,
            scope,
            task_id: self.task_id,
            step: self.step,
            events: self.events,
            services: self.services,
            resume: None,
            resume_to: None,
            answered: &[],
            store: self.store,
            thread_id: self.thread_id,
            fence: self.fence,
            validators: &validators,
        };
        execute(&ctx).await
    }
}

/// The name of a profile's API, as events and traces say it.
fn provider_name(kind: crate::spec::Provider) -> &'static str {
    match kind {
        crate::spec::Provider::Openai => "openai",
        crate::spec::Provider::Anthropic => "anthropic",
        crate::spec::Provider::Mock => "mock",
    }
}

/// What a node produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeOutput {
    pub output: Value,
    pub usage: Usage,
}

/// Why a node did not end with its output alone.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFailure {
    Error(NodeError),
    /// The node stops the run until an answer comes (the payload is shown to the person).
    Interrupt(Value),
    /// The node's subgraph handed off: the node continues at the handoffs' targets instead of
    /// its own `goto` and edges (like an interrupt, this bubbles up from the child).
    Handoff(Box<HandedOff>),
}

/// A subgraph's handoff to its parent: the parent's node to run next (or `END`) and the
/// writes to the parent's state, which go through the parent's reducers.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Handoff {
    pub to: String,
    pub writes: Vec<(String, Value)>,
}

/// What a subgraph node produced when its child handed off.
#[derive(Debug, Clone, PartialEq)]
pub struct HandedOff {
    pub output: NodeOutput,
    pub handoffs: Vec<Handoff>,
}

/// A typed node error: the class decides whether a retry policy retries it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeError {
    pub class: ErrorClass,
    pub message: String,
    /// A wait the remote side asked for (HTTP Retry-After), in seconds.
    pub retry_after: Option<f64>,
    /// What the attempt spent on models before it failed (an llm node whose replies never
    /// matched its schema paid for every one of them): budgets and the run's usage count it.
    pub usage: Usage,
}

impl NodeError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> NodeError {
        NodeError {
            class,
            message: message.into(),
            retry_after: None,
            usage: Usage::default(),
        }
    }

    /// The same error, carrying what was spent before it.
    pub fn spent(mut self, usage: Usage) -> NodeError {
        self.usage = usage;
        self
    }

    pub fn invalid(message: impl Into<String>) -> NodeError {
        NodeError::new(ErrorClass::Invalid, message)
    }
}

impl From<crate::net::FetchError> for NodeError {
    fn from(e: crate::net::FetchError) -> Self {
        NodeError {
            retry_after: e.retry_after,
            ..NodeError::new(e.class, e.message)
        }
    }
}

impl From<NodeError> for NodeFailure {
    fn from(e: NodeError) -> Self {
        NodeFailure::Error(e)
    }
}

/// Runs one attempt of a node by its kind.
///
/// What a node returns (its output, its error message, an interrupt's payload) is scrubbed of
/// every known secret ([`crate::secrets`]) before the engine sees it, so no event,
/// checkpoint or printed error can hold one.
pub(super) async fn execute(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let kind = ctx.services.kinds.of(ctx.node)?;
    // Only the boxed future is held across the await, so this future stays a few words long
    // whatever the kind, and a step of 1,000 tasks holds 1,000 of them.
    let pending = match kind.run(ctx) {
        Attempt::Ready(r) => return scrubbed(r),
        Attempt::Pending(f) => f,
    };
    scrubbed(pending.await)
}

fn scrubbed(result: Result<NodeOutput, NodeFailure>) -> Result<NodeOutput, NodeFailure> {
    use crate::secrets;
    match result {
        Ok(mut out) => {
            out.output = secrets::scrub_value(std::mem::take(&mut out.output));
            Ok(out)
        }
        Err(NodeFailure::Error(mut e)) => {
            e.message = secrets::scrub_string(std::mem::take(&mut e.message));
            Err(NodeFailure::Error(e))
        }
        Err(NodeFailure::Interrupt(payload)) => Err(NodeFailure::Interrupt(secrets::scrub_value(payload))),
        Err(NodeFailure::Handoff(mut h)) => {
            h.output.output = secrets::scrub_value(std::mem::take(&mut h.output.output));
            for handoff in &mut h.handoffs {
                for (_, v) in &mut handoff.writes {
                    *v = secrets::scrub_value(std::mem::take(v));
                }
            }
            Err(NodeFailure::Handoff(h))
        }
    }
}

/// Renders template `id`; `field` names it in an error (`/prompt`).
pub fn render(ctx: &NodeCtx<'_>, id: &TemplateId, field: &str) -> Result<String, NodeError> {
    render_in(ctx.plan, id, &ctx.scope).map_err(|e| match e {
        RenderError::Missing(e) => NodeError::invalid(e),
        RenderError::Failed(e) => NodeError::invalid(format!("{field}: {e}")),
    })
}

/// Renders template `id` if the node has one (an optional field).
pub fn render_opt(ctx: &NodeCtx<'_>, id: Option<&TemplateId>, field: &str) -> Result<Option<String>, NodeError> {
    id.map(|id| render(ctx, id, field)).transpose()
}

/// Evaluates the data field `data` (named `field` in errors) in `scope`. An empty map is no
/// value.
pub fn data(ctx: &NodeCtx<'_>, data: Option<&Data>, field: &str, scope: &JValue) -> Result<Option<Value>, NodeError> {
    match data {
        None => Ok(None),
        Some(Data::One(c)) => eval_compiled(ctx.plan, c, scope)
            .map(Some)
            .map_err(|e| NodeError::invalid(format!("{field}: {e}"))),
        Some(Data::Map(entries)) if entries.is_empty() => Ok(None),
        Some(Data::Map(entries)) => {
            let mut out = Map::with_capacity(entries.len());
            for (key, c) in entries {
                let v =
                    eval_compiled(ctx.plan, c, scope).map_err(|e| NodeError::invalid(format!("{field}/{key}: {e}")))?;
                out.insert(key.clone(), v);
            }
            Ok(Some(Value::Object(out)))
        }
    }
}

/// Evaluates the optional expression field `id` (named `field` in errors) in the node's scope.
pub fn value(ctx: &NodeCtx<'_>, id: Option<ExprId>, field: &str) -> Result<Option<Value>, NodeError> {
    id.map(|id| values::eval(ctx.plan, id, &ctx.scope).map_err(|e| NodeError::invalid(format!("{field}: {e}"))))
        .transpose()
}

/// Evaluates expression `id` in `scope`.
pub fn eval(ctx: &NodeCtx<'_>, id: ExprId, scope: &JValue) -> Result<Value, NodeError> {
    values::eval(ctx.plan, id, scope).map_err(NodeError::invalid)
}

enum RenderError {
    Missing(String),
    Failed(String),
}

fn render_in(plan: &Plan, id: &TemplateId, scope: &JValue) -> Result<String, RenderError> {
    let t = plan
        .exprs()
        .env()
        .get_template(&id.0)
        .map_err(|e| RenderError::Missing(values::describe(&e)))?;
    t.render(scope.clone())
        .map_err(|e| RenderError::Failed(values::describe(&e)))
}

fn eval_compiled(plan: &Plan, c: &Compiled, scope: &JValue) -> Result<Value, String> {
    match c {
        Compiled::Expr(id) => values::eval(plan, *id, scope),
        Compiled::Literal(v) => Ok(v.clone()),
        Compiled::Template(id) => render_in(plan, id, scope)
            .map(Value::String)
            .map_err(|(RenderError::Missing(e) | RenderError::Failed(e))| e),
    }
}

/// A value as text: strings as they are, anything else as JSON.
pub fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{NodeCtx, execute};

    fn future_size<'a, F: std::future::Future>(_: fn(&'a NodeCtx<'a>) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// A step of 1,000 tasks holds 1,000 of these futures.
    #[test]
    fn an_attempt_future_stays_small() {
        let size = future_size(execute);
        assert!(size <= 64, "execute's future takes {size} bytes");
    }
}

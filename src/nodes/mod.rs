//! What each node kind does when it runs, one file per kind. A node gets its compiled fields
//! and a scope, and returns its `output` (and usage) or a typed failure; the engine turns the
//! output into state writes and routing.
//!
//! Every built-in kind runs; each fails with a typed error the retry policy and `on_error`
//! can act on.

mod emit;
mod http;
mod index;
mod interrupt;
mod llm;
mod load;
mod rerank;
mod retrieve;
mod save;
mod scrape;
mod search;
mod services;
mod store;
pub(crate) mod subgraph;

pub use services::{ReadRoots, Services};

use std::sync::Arc;

use minijinja::Value as JValue;
use serde_json::{Map, Value};

use crate::checkpoint::Checkpointer;
use crate::compile::{Compiled, NodeIx, Plan, PlanNode};
use crate::engine::events::Events;
use crate::engine::values;
use crate::error_class::ErrorClass;
use crate::providers::Usage;
use crate::spec::NodeSpec;

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
    pub services: &'a Services,
    /// The answer to this task's interrupt, when the run resumes it.
    pub resume: Option<&'a Value>,
    /// Which of a subgraph's gates the answer is for, when it waits at several.
    pub resume_to: Option<&'a str>,
    pub store: &'a Arc<dyn Checkpointer>,
    pub thread_id: &'a str,
    /// The lease the run writes under (a subgraph runs its child thread under it).
    pub fence: &'a crate::checkpoint::Fence,
    /// Validators of llm output schemas, by node.
    pub outputs: &'a crate::compile::Validators<NodeIx>,
}

impl NodeCtx<'_> {
    /// The node's own `timeout` (the limit of each attempt), if it has one.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.node.spec.common().timeout.as_ref().and_then(|d| d.to_std())
    }
}

/// What a node produced.
#[derive(Debug, Clone, Default)]
pub struct NodeOutput {
    pub output: Value,
    pub usage: Usage,
}

/// Why a node did not produce an output.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeFailure {
    Error(NodeError),
    /// The node stops the run until an answer comes (the payload is shown to the person).
    Interrupt(Value),
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

pub fn class_name(c: ErrorClass) -> &'static str {
    match c {
        ErrorClass::Timeout => "timeout",
        ErrorClass::RateLimit => "rate_limit",
        ErrorClass::Server => "server",
        ErrorClass::Network => "network",
        ErrorClass::Stream => "stream",
        ErrorClass::BadRequest => "bad_request",
        ErrorClass::Auth => "auth",
        ErrorClass::Invalid => "invalid",
        ErrorClass::Budget => "budget",
        ErrorClass::All => "all",
    }
}

/// Runs one attempt of a node.
///
/// Each kind's future is boxed: this function's own future stays a few words long instead of
/// as large as the largest kind's, and a step of 1,000 tasks holds 1,000 of them.
///
/// What a node returns (its output, its error message, an interrupt's payload) is scrubbed of
/// every known secret ([`crate::secrets`]) before the engine sees it, so no event,
/// checkpoint or printed error can hold one.
pub async fn execute(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    scrubbed(attempt(ctx).await)
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
    }
}

async fn attempt(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    match &ctx.node.spec {
        NodeSpec::Set(_) => Ok(NodeOutput::default()),
        NodeSpec::Emit(_) => emit::run(ctx),
        NodeSpec::Interrupt(_) => interrupt::run(ctx),
        NodeSpec::Llm(n) => Box::pin(llm::run(ctx, &n.kind)).await,
        NodeSpec::Subgraph(_) => Box::pin(subgraph::run(ctx)).await,
        NodeSpec::Index(_) => Box::pin(index::run(ctx)).await,
        NodeSpec::Retrieve(_) => Box::pin(retrieve::run(ctx)).await,
        NodeSpec::Store(_) => Box::pin(store::run(ctx)).await,
        NodeSpec::Load(_) => Box::pin(load::run(ctx)).await,
        NodeSpec::Save(_) => Box::pin(save::run(ctx)).await,
        NodeSpec::Http(n) => Box::pin(http::run(ctx, &n.kind)).await,
        NodeSpec::Search(n) => Box::pin(search::run(ctx, &n.kind)).await,
        NodeSpec::Scrape(n) => Box::pin(scrape::run(ctx, &n.kind)).await,
    }
}

/// Renders the template compiled for field `rel` (e.g. `/prompt`), if the node has one.
pub fn render(ctx: &NodeCtx<'_>, rel: &str) -> Result<Option<String>, NodeError> {
    match ctx.node.fields.get(rel) {
        Some(Compiled::Template(id)) => {
            let t = ctx
                .plan
                .exprs
                .env()
                .get_template(&id.0)
                .map_err(|e| NodeError::invalid(values::describe(&e)))?;
            t.render(ctx.scope.clone())
                .map(Some)
                .map_err(|e| NodeError::invalid(format!("{rel}: {}", values::describe(&e))))
        }
        Some(Compiled::Literal(v)) => Ok(Some(v.as_str().map_or_else(|| v.to_string(), str::to_string))),
        Some(Compiled::Expr(id)) => values::eval(ctx.plan, *id, &ctx.scope)
            .map(|v| Some(text_of(&v)))
            .map_err(NodeError::invalid),
        None => Ok(None),
    }
}

/// Evaluates the data field `rel`: one expression, or a map of expressions and literals
/// compiled as `rel/key`.
pub fn data(ctx: &NodeCtx<'_>, rel: &str, scope: &JValue) -> Result<Option<Value>, NodeError> {
    if let Some(c) = ctx.node.fields.get(rel) {
        return eval_compiled(ctx.plan, c, scope)
            .map(Some)
            .map_err(|e| NodeError::invalid(format!("{rel}: {e}")));
    }
    let prefix = format!("{rel}/");
    let mut out = Map::new();
    for (path, c) in &ctx.node.fields {
        if let Some(key) = path.strip_prefix(&prefix) {
            let v = eval_compiled(ctx.plan, c, scope).map_err(|e| NodeError::invalid(format!("{path}: {e}")))?;
            out.insert(key.replace("~1", "/").replace("~0", "~"), v);
        }
    }
    Ok(if out.is_empty() { None } else { Some(Value::Object(out)) })
}

fn eval_compiled(plan: &Plan, c: &Compiled, scope: &JValue) -> Result<Value, String> {
    match c {
        Compiled::Expr(id) => values::eval(plan, *id, scope),
        Compiled::Literal(v) => Ok(v.clone()),
        Compiled::Template(id) => plan
            .exprs
            .env()
            .get_template(&id.0)
            .and_then(|t| t.render(scope.clone()))
            .map(Value::String)
            .map_err(|e| values::describe(&e)),
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
        assert!(size <= 64, "nodes::execute's future takes {size} bytes");
    }
}

//! `subgraph`: runs another workflow with its own state on a child thread namespaced under the
//! parent's (`<parent>/<step>/<task>`), so a crash or an interrupt inside it resumes inside it.
//! The child's input comes from the node's `input` map; its output (declared output keys, or
//! its final state) is the node's `output`. An interrupt inside the child interrupts the parent;
//! the answer given to the parent is passed down. The child runs under the parent's lease.
//! A child that hands off (a `goto` clause with `handoff:`) ends there; this node then goes to
//! the parent node the handoff names instead of its own `goto` and edges, and the handoff's
//! writes are this node's writes, through the parent's reducers.
//! Its thread and first checkpoint are written together, so a parent killed as the child
//! starts finds either no child (and starts it) or a child it can continue.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data};
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape, declared_props};
use crate::diag::Code;
use crate::engine::kind::{Attempt, HandedOff, NodeKind};
use crate::engine::{Answer, CHILD_GATES, CHILD_NODE, CHILD_THREAD, Start, Status};

/// Runs another workflow file with its own state.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(crate) struct SubgraphNode {
    /// The workflow file, relative to this one.
    pub workflow: String,
    /// The child's input: `key: expression`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub input: IndexMap<String, Value>,
    /// Whose custom events the child's `emit`s are: `child` (default), namespaced under this
    /// task as a subgraph's, so only a client that asks for subgraphs' events gets them; or
    /// `parent`, this node's own, as they happen (LangGraph's node that streams its
    /// subgraph's custom events and writes each with its own stream writer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_events: Option<CustomEvents>,
}

/// Whose custom events a subgraph's `emit`s are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CustomEvents {
    Child,
    Parent,
}

/// A `subgraph` node, compiled (its child plan is the plan's, by node).
struct Config {
    input: Data,
    forward_custom: bool,
}

/// The `subgraph` kind.
pub(crate) struct Subgraph;

impl KindDecl for Subgraph {
    fn name(&self) -> &'static str {
        "subgraph"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<SubgraphNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: SubgraphNode = cx.own()?;
        let input_value = Value::Object(n.input.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
        let input = cx.data(&["input"], &input_value, None);
        let child = cx.child("workflow", &n.workflow);
        let shape = match &child {
            Some(child) => {
                check_input(cx, &n, child.input_schema());
                Shape::Fields(
                    child
                        .output()
                        .map_or_else(|| child.state().keys().cloned().collect(), <[String]>::to_vec),
                )
            }
            None => Shape::Any,
        };
        child?;
        let forward_custom = n.custom_events == Some(CustomEvents::Parent);
        Some((
            KindConfig::new(Config {
                input: input?,
                forward_custom,
            }),
            shape,
        ))
    }
}

/// Checks the node's `input` against the child's input schema: no field the child does not
/// take, every field it requires.
fn check_input(cx: &mut KindCx<'_, '_, '_>, n: &SubgraphNode, schema: Option<&Value>) {
    let src = cx.source();
    let mut misspelt = Vec::new();
    if let Some(Some(props)) = schema.map(declared_props) {
        for key in n.input.keys() {
            if !props.contains(key) {
                misspelt.extend(crate::diag::did_you_mean(key, props.iter().map(String::as_str)).map(str::to_string));
                let d = src
                    .diag_key(
                        Code::UnknownField,
                        &cx.at(&["input", key]),
                        format!("the subgraph's input has no field `{key}`"),
                    )
                    .suggest(key, props.iter().map(String::as_str));
                cx.report(d);
            }
        }
    }
    // A required field given under a misspelt name was reported as such.
    let required = schema.and_then(|s| s.get("required")).and_then(Value::as_array);
    let missing: Vec<&str> = required
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|r| !n.input.contains_key(*r) && !misspelt.iter().any(|m| m == r))
        .collect();
    if !missing.is_empty() {
        let list = missing.iter().map(|m| format!("`{m}`")).collect::<Vec<_>>().join(", ");
        let at = if cx.fields().contains_key("input") {
            cx.at(&["input"])
        } else {
            cx.at(&[])
        };
        let d = src
            .diag_key(
                Code::MissingField,
                &at,
                format!("the subgraph's input requires {list}, which this node does not give"),
            )
            .help(format!("add `input: {{{}: <expression>}}`", missing.join(": ..., ")));
        cx.report(d);
    }
}

/// The child thread of a subgraph task.
pub(crate) fn child_thread_id(parent: &str, step: i64, task_id: &str) -> String {
    format!("{parent}/{step}/{task_id}")
}

async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let config = ctx.config::<Config>()?;
    let Some(child) = ctx.plan.subgraphs().get(&ctx.ix).cloned() else {
        return Err(NodeError::invalid("the subgraph's plan is missing").into());
    };
    let input = data(ctx, Some(&config.input), "/input", &ctx.scope)?.unwrap_or_else(|| json!({}));
    run_child(ctx, child, input, config.forward_custom).await
}

/// Runs `child` on this task's child thread with `input` (the parent's context passed on when
/// the child takes one): started the first time, continued after a crash or an interrupt. Its
/// output is the node's; an interrupt inside it interrupts this node, a handoff hands off.
pub(super) async fn run_child(
    ctx: &NodeCtx<'_>,
    child: std::sync::Arc<crate::compile::Plan>,
    input: Value,
    forward_custom: bool,
) -> Result<NodeOutput, NodeFailure> {
    let thread = child_thread_id(ctx.thread_id, ctx.step, ctx.task_id);
    let context = ctx
        .scope
        .get_attr("context")
        .ok()
        .and_then(|c| crate::engine::values::to_json(&c).ok())
        .filter(|_| child.context_schema().is_some());
    let engine = ctx.child_engine_with(child.clone(), forward_custom);
    // The child is started the first time, and continued (with the parent's answer, when it
    // has one) after a crash or an interrupt: the engine tells which under the child's lease.
    let start = Start {
        thread_id: Some(thread.clone()),
        workflow: child.path().display().to_string(),
        input: Some(input),
        context,
        config: Vec::new(),
    };
    let answer = ctx.resume.cloned().map(|value| Answer {
        to: ctx.resume_to.map(str::to_string),
        value,
    });
    let outcome = engine
        .start_or_continue(start, answer)
        .await
        .map_err(|e| NodeError::invalid(format!("subgraph: {e}")))?;
    match outcome.status {
        // The child handed off: this node continues where it says, with its writes. The child's
        // checkpoint records the handoff, so a parent that crashed reads it again from there.
        Status::Done if !outcome.handoffs.is_empty() => Err(NodeFailure::Handoff(Box::new(HandedOff {
            output: NodeOutput {
                output: outcome.output,
                usage: outcome.unreported_usage,
            },
            handoffs: outcome.handoffs,
        }))),
        Status::Done => Ok(NodeOutput {
            output: outcome.output,
            usage: outcome.unreported_usage,
        }),
        Status::Interrupted => {
            let mut payload = outcome.interrupt.unwrap_or(Value::Null);
            if let Value::Object(m) = &mut payload {
                m.insert(CHILD_NODE.into(), Value::String(ctx.node.name.clone()));
                m.insert(CHILD_THREAD.into(), Value::String(thread));
                // Every gate the child waits at; the parent reports each as `<task>/<gate>`.
                if outcome.interrupts.len() > 1 {
                    m.insert(CHILD_GATES.into(), Value::Array(outcome.interrupts));
                }
            }
            Err(NodeFailure::Interrupt(payload))
        }
        // The child's calls are the parent's too, whether or not it got anywhere.
        Status::Failed => Err(NodeError::invalid(format!(
            "subgraph `{}` failed: {}",
            child.name(),
            outcome.error.unwrap_or_default()
        ))
        .spent(outcome.unreported_usage)
        .into()),
        Status::Cancelled => Err(NodeError::invalid("the subgraph was cancelled").into()),
    }
}

impl NodeKind for Subgraph {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(run(ctx)))
    }
}

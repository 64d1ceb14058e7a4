//! `subgraph`: runs another workflow with its own state on a child thread namespaced under the
//! parent's (`<parent>/<step>/<task>`), so a crash or an interrupt inside it resumes inside it.
//! The child's input comes from the node's `input` map; its output (declared output keys, or
//! its final state) is the node's `output`. An interrupt inside the child interrupts the parent;
//! the answer given to the parent is passed down. The child runs under the parent's lease.
//! Its thread and first checkpoint are written together, so a parent killed as the child
//! starts finds either no child (and starts it) or a child it can continue.

use serde_json::{Value, json};

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data};
use crate::engine::kind::{Attempt, NodeKind};
use crate::engine::{Answer, CHILD_GATES, CHILD_NODE, CHILD_THREAD, Engine, LeasePolicy, RunOptions, Start, Status};

/// The child thread of a subgraph task.
pub fn child_thread_id(parent: &str, step: i64, task_id: &str) -> String {
    format!("{parent}/{step}/{task_id}")
}

pub async fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let Some(child) = ctx.plan.subgraphs.get(&ctx.ix).cloned() else {
        return Err(NodeError::invalid("the subgraph's plan is missing").into());
    };
    let thread = child_thread_id(ctx.thread_id, ctx.step, ctx.task_id);
    let input = data(ctx, "/input", &ctx.scope)?.unwrap_or_else(|| json!({}));
    let context = ctx
        .scope
        .get_attr("context")
        .ok()
        .and_then(|c| crate::engine::values::to_json(&c).ok())
        .filter(|_| child.context_schema.is_some());
    let engine = Engine::new(
        child.clone(),
        ctx.store.clone(),
        ctx.services.clone(),
        ctx.events.nested(&ctx.node.name, ctx.task_id),
    )
    .with_options(RunOptions {
        lease: LeasePolicy::Under(ctx.fence.clone()),
        ..RunOptions::default()
    });
    // The child is started the first time, and continued (with the parent's answer, when it
    // has one) after a crash or an interrupt: the engine tells which under the child's lease.
    let start = Start {
        thread_id: Some(thread.clone()),
        workflow: child.path.display().to_string(),
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
        Status::Done => Ok(NodeOutput {
            output: outcome.output,
            usage: outcome.usage,
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
        Status::Failed => Err(NodeError::invalid(format!(
            "subgraph `{}` failed: {}",
            child.name,
            outcome.error.unwrap_or_default()
        ))
        .into()),
        Status::Cancelled => Err(NodeError::invalid("the subgraph was cancelled").into()),
    }
}

/// The `subgraph` kind.
pub struct Subgraph;

impl NodeKind for Subgraph {
    fn name(&self) -> &'static str {
        "subgraph"
    }

    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Pending(Box::pin(run(ctx)))
    }
}

//! `emit`: custom events on the run's stream (e.g. a mindmap's `node_added`).

use serde_json::Value;

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data};
use crate::engine::events::Event;
use crate::engine::kind::{Attempt, NodeKind};
use crate::engine::values::{self, to_jinja};
use crate::spec::NodeSpec;

/// Emits one event, or one per element of `foreach` (each seeing its element as `item`).
/// The output is the list of payloads emitted.
pub fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    let NodeSpec::Emit(spec) = &ctx.node.spec else {
        unreachable!("dispatched on kind")
    };
    let mut payloads = Vec::new();
    match ctx.node.fields.get("/foreach") {
        Some(crate::compile::Compiled::Expr(id)) => {
            let items = values::eval(ctx.plan, *id, &ctx.scope).map_err(NodeError::invalid)?;
            let Value::Array(items) = items else {
                return Err(NodeError::invalid("`foreach` did not yield an array").into());
            };
            for item in items {
                let scope = scope_with_item(ctx, &item);
                payloads.push(data(ctx, "/data", &scope)?.unwrap_or(item));
            }
        }
        _ => payloads.push(data(ctx, "/data", &ctx.scope)?.unwrap_or(Value::Null)),
    }
    for payload in &payloads {
        ctx.events.send(Event::Custom {
            node: ctx.node.name.clone(),
            event: spec.kind.event.clone(),
            data: payload.clone(),
        });
    }
    Ok(NodeOutput {
        output: Value::Array(payloads),
        ..Default::default()
    })
}

fn scope_with_item(ctx: &NodeCtx<'_>, item: &Value) -> minijinja::Value {
    ctx.base.with([("item".to_string(), to_jinja(item))]).into_value()
}

/// The `emit` kind.
pub struct Emit;

impl NodeKind for Emit {
    fn name(&self) -> &'static str {
        "emit"
    }

    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(run(ctx))
    }
}

//! `interrupt`: a human-in-the-loop gate. Without an answer it stops the run with its rendered
//! message and payload; resumed with an answer (already validated against the gate's response
//! schema by the engine) it outputs the answer.

use serde_json::{Map, Value};

use super::{NodeCtx, NodeFailure, NodeOutput, data, render};
use crate::compile::{Compiled, PlanNode};
use crate::engine::kind::{Attempt, NodeKind};

pub fn run(ctx: &NodeCtx<'_>) -> Result<NodeOutput, NodeFailure> {
    if let Some(answer) = ctx.resume {
        return Ok(NodeOutput {
            output: answer.clone(),
            ..Default::default()
        });
    }
    let mut payload = Map::new();
    if let Some(message) = render(ctx, "/message")? {
        payload.insert("message".into(), Value::String(message));
    }
    if let Some(data) = data(ctx, "/payload", &ctx.scope)? {
        payload.insert("payload".into(), data);
    }
    if let Some(crate::compile::Compiled::Literal(schema)) = ctx.node.fields.get("/response") {
        payload.insert("response_schema".into(), strip_internal(schema));
    }
    Err(NodeFailure::Interrupt(Value::Object(payload)))
}

/// The response schema as shown to a person: without the attached `types`/`files` containers
/// unless it refers into them.
fn strip_internal(schema: &Value) -> Value {
    let text = schema.to_string();
    let mut s = schema.clone();
    if let Value::Object(m) = &mut s {
        if !text.contains("#/types/") {
            m.remove("types");
        }
        if !text.contains("#/files/") {
            m.remove("files");
        }
    }
    s
}

/// The `interrupt` kind.
pub struct Interrupt;

impl NodeKind for Interrupt {
    fn name(&self) -> &'static str {
        "interrupt"
    }

    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(run(ctx))
    }

    fn answer_schema<'p>(&self, node: &'p PlanNode) -> Option<&'p Value> {
        match node.fields.get("/response") {
            Some(Compiled::Literal(schema)) => Some(schema),
            _ => None,
        }
    }
}

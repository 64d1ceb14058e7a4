//! `emit`: custom events on the run's stream (e.g. a mindmap's `node_added`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NodeCtx, NodeError, NodeFailure, NodeOutput, data, eval};
use crate::compile::ExprId;
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape};
use crate::engine::events::Event;
use crate::engine::kind::{Attempt, NodeKind};
use crate::engine::values::to_jinja;

/// Emits a custom event on the run's event stream (e.g. a mindmap's `node_added`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub(super) struct EmitNode {
    /// The event name.
    pub event: String,
    /// The event payload: an expression, or a map of expressions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Emit one event per element of this expression's array (seen as `item` in `data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreach: Option<String>,
}

/// An `emit` node, compiled.
struct Config {
    event: String,
    data: Option<Data>,
    foreach: Option<ExprId>,
}

/// The `emit` kind.
pub(super) struct Emit;

impl KindDecl for Emit {
    fn name(&self) -> &'static str {
        "emit"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<EmitNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: EmitNode = cx.own()?;
        let foreach = cx.expr("foreach");
        let item = n.foreach.is_some().then_some("item");
        let data = match &n.data {
            Some(d) => Some(cx.data(&["data"], d, item)?),
            None => None,
        };
        let config = Config {
            event: n.event,
            data,
            foreach,
        };
        Some((KindConfig::new(config), Shape::Any))
    }
}

impl NodeKind for Emit {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(
            ctx.config::<Config>()
                .map_err(NodeFailure::from)
                .and_then(|c| run(ctx, c)),
        )
    }
}

/// Emits one event, or one per element of `foreach` (each seeing its element as `item`).
/// The output is the list of payloads emitted.
fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    let mut payloads = Vec::new();
    match config.foreach {
        Some(id) => {
            let Value::Array(items) = eval(ctx, id, &ctx.scope)? else {
                return Err(NodeError::invalid("`foreach` did not yield an array").into());
            };
            for item in items {
                let scope = scope_with_item(ctx, &item);
                payloads.push(data(ctx, config.data.as_ref(), "/data", &scope)?.unwrap_or(item));
            }
        }
        None => payloads.push(data(ctx, config.data.as_ref(), "/data", &ctx.scope)?.unwrap_or(Value::Null)),
    }
    for payload in &payloads {
        ctx.events.send(Event::Custom {
            node: ctx.node.name.clone(),
            event: config.event.clone(),
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

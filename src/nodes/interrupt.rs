//! `interrupt`: a human-in-the-loop gate. Without an answer it stops the run with its rendered
//! message and payload; resumed with an answer (already validated against the gate's response
//! schema by the engine) it outputs the answer.

use indexmap::IndexMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{NodeCtx, NodeFailure, NodeOutput, data, render_opt};
use crate::compile::kind::{Data, KindConfig, KindCx, KindDecl, Shape, optional};
use crate::compile::{PlanNode, TemplateId};
use crate::diag::Code;
use crate::engine::kind::{Attempt, NodeKind};
use crate::spec::JsonSchemaDoc;

/// A human-in-the-loop gate: stops the run durably until `runner resume --answer`.
/// The answer is `output` in `update` and `goto`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct InterruptNode {
    /// Text shown to the person answering (template).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Data shown with the message: a map of expressions.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub payload: IndexMap<String, Value>,
    /// JSON Schema an answer must match; a bad answer is refused and the gate stays open.
    pub response: JsonSchemaDoc,
}

/// An `interrupt` node, compiled.
struct Config {
    message: Option<TemplateId>,
    payload: Option<Data>,
    /// The response schema, resolved (self-contained).
    response: Value,
}

/// The `interrupt` kind.
pub struct Interrupt;

impl KindDecl for Interrupt {
    fn name(&self) -> &'static str {
        "interrupt"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<InterruptNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: InterruptNode = cx.own()?;
        let message = n.message.as_ref().map(|text| cx.template(&["message"], text));
        let payload = Value::Object(n.payload.into_iter().collect());
        let payload = cx.data(&["payload"], &payload, None);
        let response = cx.schema(&["response"], &n.response.0);
        let followed = cx.followed(&response);
        if accepts_anything(&followed) {
            let d = cx
                .source()
                .diag(Code::InterruptResponse, &cx.at(&["response"]), "the gate's response schema accepts any answer")
                .help("declare what an answer looks like, e.g. {type: object, required: [action], properties: {action: {enum: [accept, edit, respond, ignore]}}}");
            cx.report(d);
        }
        let shape = Shape::of_schema(&followed);
        let config = Config {
            message: optional(message)?,
            payload: Some(payload?),
            response,
        };
        Some((KindConfig::new(config), shape))
    }

    fn is_gate(&self) -> bool {
        true
    }
}

impl NodeKind for Interrupt {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(
            ctx.config::<Config>()
                .map_err(NodeFailure::from)
                .and_then(|c| run(ctx, c)),
        )
    }

    fn answer_schema<'p>(&self, node: &'p PlanNode) -> Option<&'p Value> {
        node.config.get::<Config>().map(|c| &c.response)
    }
}

fn run(ctx: &NodeCtx<'_>, config: &Config) -> Result<NodeOutput, NodeFailure> {
    if let Some(answer) = ctx.resume {
        return Ok(NodeOutput {
            output: answer.clone(),
            ..Default::default()
        });
    }
    let mut payload = Map::new();
    if let Some(message) = render_opt(ctx, config.message.as_ref(), "/message")? {
        payload.insert("message".into(), Value::String(message));
    }
    if let Some(data) = data(ctx, config.payload.as_ref(), "/payload", &ctx.scope)? {
        payload.insert("payload".into(), data);
    }
    payload.insert("response_schema".into(), strip_internal(&config.response));
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

/// Whether a schema admits any value (it constrains nothing a gate's answer could break).
fn accepts_anything(schema: &Value) -> bool {
    match schema {
        Value::Bool(b) => *b,
        Value::Object(m) => ![
            "type",
            "properties",
            "required",
            "enum",
            "const",
            "anyOf",
            "oneOf",
            "allOf",
            "$ref",
            "items",
        ]
        .iter()
        .any(|k| m.contains_key(*k)),
        _ => true,
    }
}

//! `set`: pure state updates. The node itself produces nothing (`output` is null) unless it
//! renders a `template` (its text is then `output`); its `update` and `goto`, which every kind
//! has, do the work.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NodeCtx, NodeOutput, render};
use crate::compile::TemplateId;
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape, optional};
use crate::engine::kind::{Attempt, NodeKind};
use crate::spec::TextSource;

/// Pure state updates: `update` (and `goto`), with the text of an optional template.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub(super) struct SetNode {
    /// A template rendered in the node's scope (a file under prompts/, or `{text: ...}`):
    /// `output` is its text, for `update` to write where it belongs (a report, a reply).
    /// Without it `output` is null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<TextSource>,
}

/// The `set` kind.
pub(super) struct Set;

impl KindDecl for Set {
    fn name(&self) -> &'static str {
        "set"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<SetNode>(generator, self.name())
    }

    fn compile(&self, cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        let n: SetNode = cx.own()?;
        let template = n.template.as_ref().map(|t| cx.text_source("template", t));
        let template: Option<TemplateId> = optional(template)?;
        let shape = if template.is_some() { Shape::Text } else { Shape::Null };
        Some((KindConfig::new(template), shape))
    }
}

impl NodeKind for Set {
    fn run<'a>(&'a self, ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        let output = ctx.config::<Option<TemplateId>>().and_then(|template| match template {
            Some(id) => render(ctx, id, "/template").map(|text| NodeOutput {
                output: Value::String(text),
                ..NodeOutput::default()
            }),
            None => Ok(NodeOutput::default()),
        });
        Attempt::Ready(output.map_err(Into::into))
    }
}

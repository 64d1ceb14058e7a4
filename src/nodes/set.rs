//! `set`: pure state updates. The node itself produces nothing (`output` is null); its
//! `update` and `goto`, which every kind has, do the work.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{NodeCtx, NodeOutput};
use crate::compile::kind::{KindConfig, KindCx, KindDecl, Shape};
use crate::engine::kind::{Attempt, NodeKind};

/// Pure state updates: only `update` (and `goto`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub(super) struct SetNode {}

/// The `set` kind.
pub(super) struct Set;

impl KindDecl for Set {
    fn name(&self) -> &'static str {
        "set"
    }

    fn schema(&self, generator: &mut schemars::SchemaGenerator) -> Value {
        crate::spec::schema::kind_def::<SetNode>(generator, self.name())
    }

    fn compile(&self, _cx: &mut KindCx<'_, '_, '_>) -> Option<(KindConfig, Shape)> {
        Some((KindConfig::new(()), Shape::Null))
    }
}

impl NodeKind for Set {
    fn run<'a>(&'a self, _ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(Ok(NodeOutput::default()))
    }
}

//! `set`: pure state updates. The node itself produces nothing (`output` is null); its
//! `update` and `goto`, which every kind has, do the work.

use super::{NodeCtx, NodeOutput};
use crate::engine::kind::{Attempt, NodeKind};

/// The `set` kind.
pub struct Set;

impl NodeKind for Set {
    fn name(&self) -> &'static str {
        "set"
    }

    fn run<'a>(&'a self, _ctx: &'a NodeCtx<'a>) -> Attempt<'a> {
        Attempt::Ready(Ok(NodeOutput::default()))
    }
}

//! The built-in node kinds, one file per kind. Each implements the engine's
//! [`NodeKind`](crate::engine::kind::NodeKind): a node gets its compiled fields and a scope,
//! and returns its `output` (and usage) or a typed failure; the engine turns the output into
//! state writes and routing. [`builtin`] registers them, one line per kind.
//!
//! Every built-in kind runs; each fails with a typed error the retry policy and `on_error`
//! can act on.

mod agent;
mod emit;
mod http;
mod index;
mod interrupt;
mod llm;
mod load;
pub(crate) mod mcp;
mod rerank;
mod retrieve;
mod save;
mod scrape;
mod search;
mod set;
mod store;
pub(crate) mod subgraph;
mod tools;

use std::sync::Arc;

use crate::engine::kind::{Kinds, NodeKind};
pub use crate::engine::kind::{
    NodeCtx, NodeError, NodeFailure, NodeOutput, data, eval, render, render_opt, text_of, value,
};
pub use crate::engine::{ReadRoots, Services};
use crate::providers::Providers;

/// The built-in node kinds.
pub fn builtin() -> Kinds {
    let kinds: [Arc<dyn NodeKind>; 15] = [
        Arc::new(llm::Llm),
        Arc::new(set::Set),
        Arc::new(emit::Emit),
        Arc::new(interrupt::Interrupt),
        Arc::new(subgraph::Subgraph),
        Arc::new(http::Http),
        Arc::new(search::Search),
        Arc::new(scrape::Scrape),
        Arc::new(index::Index),
        Arc::new(retrieve::Retrieve),
        Arc::new(store::Store),
        Arc::new(load::Load),
        Arc::new(save::Save),
        Arc::new(tools::Tools::default()),
        Arc::new(agent::Agent),
    ];
    Kinds::new(kinds)
}

/// The services of a run with the built-in kinds and nothing else (see
/// [`Services::with_kinds`]).
impl Default for Services {
    fn default() -> Services {
        Services::with_kinds(builtin())
    }
}

impl From<Providers> for Services {
    fn from(providers: Providers) -> Services {
        Services {
            providers,
            ..Services::default()
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every kind the language has is registered, under its own name.
    #[test]
    fn every_kind_is_registered() {
        let kinds = super::builtin();
        assert_eq!(
            kinds.names(),
            [
                "llm",
                "set",
                "emit",
                "interrupt",
                "subgraph",
                "http",
                "search",
                "scrape",
                "index",
                "retrieve",
                "store",
                "load",
                "save",
                "tools",
                "agent"
            ]
        );
    }
}

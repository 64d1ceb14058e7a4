//! Cost caps checked against the prices they depend on: a `max_cost` (the workflow's
//! `limits` or a node's `budget`) over a model profile without `pricing` counts that model's
//! calls as costing nothing, so the cap never triggers.

use super::nodes::Build;
use crate::diag::Code;
use crate::spec::load::push_pointer;

impl Build<'_, '_> {
    /// Warns of each cost cap that a call to an unpriced model profile escapes: the
    /// workflow's cap for every such profile a node calls, a node's cap for its own.
    pub(super) fn check_cost_caps(&mut self) {
        let unpriced = |name: &str| self.wf.models.get(name).is_some_and(|p| p.pricing.is_none());
        let mut found = Vec::new();
        if self.wf.limits.as_ref().is_some_and(|l| l.max_cost.is_some()) {
            let mut seen = Vec::new();
            for (_, name) in &self.model_uses {
                if unpriced(name) && !seen.contains(name) {
                    seen.push(name.clone());
                    found.push(("/limits/max_cost".to_string(), name.clone(), "`limits.max_cost`"));
                }
            }
        }
        for (pointer, name) in &self.model_uses {
            let Some(node) = pointer.strip_suffix("/model").filter(|n| n.starts_with("/nodes/")) else {
                continue;
            };
            let cap = push_pointer(&push_pointer(node, "budget"), "max_cost");
            let capped = self.src.doc.value.pointer(&format!("{node}/budget/max_cost")).is_some();
            if capped && unpriced(name) {
                found.push((cap, name.clone(), "the node's `budget.max_cost`"));
            }
        }
        for (at, name, what) in found {
            let d = self
                .src
                .diag(
                    Code::UnpricedCostCap,
                    &at,
                    format!("{what} caps cost, but model profile `{name}` has no `pricing`: its calls count as costing 0, so the cap never triggers"),
                )
                .help(format!(
                    "give `{name}` a `pricing: {{input: …, output: …}}` (per million tokens), or cap `max_tokens` or `max_llm_calls` instead"
                ));
            self.diags.push(d);
        }
    }
}

//! Budgets: what a turn and each node have spent on models against `limits` and their
//! `budget`, and how often each node with a `max_visits` has run.

use std::collections::BTreeMap;

use super::kind::NodeError;
use super::{Engine, Meta};
use crate::checkpoint::Checkpoint;
use crate::providers::Usage;

impl Engine {
    /// Why node `name` may not call a model in this step: a budget of the turn, or of the node,
    /// is spent. Only llm nodes are held back; the others run on.
    pub(super) fn spent(&self, name: &str, meta: &Meta, started_with: &Usage) -> Option<NodeError> {
        let node = &self.plan.nodes()[&self.plan.node_by_name(name)?];
        if !self.services.kinds.of(node).is_ok_and(|k| k.held_by_budget()) {
            return None;
        }
        let spec = &node.spec;
        let quota = || {
            let budget = self.options.quota.as_ref()?;
            spent_by(budget, &meta.usage.less(started_with), "the user's quota")
        };
        let why = spent_by(self.plan.budget(), &meta.turn, "limits")
            .or_else(quota)
            .or_else(|| {
                let budget = spec.common().budget.as_ref()?;
                let used = meta.node_usage.get(name).copied().unwrap_or_default();
                spent_by(budget, &used, &format!("the budget of `{name}`"))
            })?;
        Some(NodeError::new(crate::error_class::ErrorClass::Budget, why))
    }

    /// Counts a finished task's usage: the thread's, the turn's, and the node's own when it
    /// has a budget.
    pub(super) fn count_usage(&self, meta: &mut Meta, node: &str, usage: &Usage) {
        meta.usage.add(usage);
        meta.turn.add(usage);
        if self.node_spec(node).is_some_and(|s| s.common().budget.is_some()) {
            meta.node_usage.entry(node.to_string()).or_default().add(usage);
        }
    }

    /// A node about to run more often than its `max_visits` fails the step before it runs.
    pub(super) fn over_visits(&self, cp: &Checkpoint, meta: &Meta) -> Option<String> {
        let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
        for t in &cp.next {
            *counts.entry(t.node.as_str()).or_default() += 1;
        }
        counts.into_iter().find_map(|(node, n)| {
            let max = self.node_spec(node)?.common().max_visits?;
            let total = meta.visits.get(node).copied().unwrap_or(0) + n;
            (total > max).then(|| format!("node `{node}` would run {total} times, more than its max_visits of {max}"))
        })
    }
}

/// Which cap of `budget` (named `owner` in the message) `used` has reached, if any.
fn spent_by(budget: &crate::spec::Budget, used: &Usage, owner: &str) -> Option<String> {
    if let Some(max) = budget.max_cost
        && used.cost >= max
    {
        return Some(format!(
            "{owner}: max_cost of {max} is spent ({:.4} used); raise it, or handle the `budget` error with on_error",
            used.cost
        ));
    }
    if let Some(max) = budget.max_tokens
        && used.total_tokens >= max
    {
        return Some(format!(
            "{owner}: max_tokens of {max} is spent ({} used); raise it, or handle the `budget` error with on_error",
            used.total_tokens
        ));
    }
    if let Some(max) = budget.max_llm_calls
        && used.calls >= max
    {
        return Some(format!(
            "{owner}: max_llm_calls of {max} is spent ({} made); raise it, or handle the `budget` error with on_error",
            used.calls
        ));
    }
    None
}

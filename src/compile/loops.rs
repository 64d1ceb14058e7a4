//! Graph defects that show only over several steps: a join waiting for a node that runs only
//! after it, and a loop whose every exit condition reads state nothing writes. Part of the
//! compile stage; reads the plan being built and reports diagnostics.

use std::collections::{HashSet, VecDeque};

use indexmap::IndexMap;
use petgraph::Direction;
use petgraph::visit::EdgeRef;

use super::nodes::Build;
use super::plan::*;
use crate::diag::Code;
use crate::spec::load::push_pointer;

/// Nodes reachable from START without passing through `avoid`.
fn reach_avoiding(b: &Build, avoid: Option<NodeIx>) -> HashSet<NodeIx> {
    let mut seen = HashSet::from([b.start]);
    let mut queue = VecDeque::from([b.start]);
    while let Some(n) = queue.pop_front() {
        for e in b.graph.edges_directed(n, Direction::Outgoing) {
            let next = e.target();
            if Some(next) != avoid && seen.insert(next) {
                queue.push_back(next);
            }
        }
    }
    seen
}

fn name(b: &Build, ix: NodeIx) -> String {
    b.drafts.get(&ix).map_or_else(|| "?".into(), |d| d.name.clone())
}

/// E409: a join one of whose sources can run only after the join's target has run, so the
/// target waits forever. Returns whether one was found.
pub(super) fn dead_joins(b: &mut Build) -> bool {
    let everywhere = reach_avoiding(b, None);
    let mut found = false;
    for (i, (sources, target)) in b.joins.clone().into_iter().enumerate() {
        let Target::Node(t) = target else { continue };
        let before = reach_avoiding(b, Some(t));
        // A source that cannot run at all is reported as unreachable by the analysis.
        let late: Vec<String> = sources
            .iter()
            .filter(|s| !before.contains(s) && everywhere.contains(s))
            .map(|s| format!("`{}`", name(b, *s)))
            .collect();
        if late.is_empty() {
            continue;
        }
        found = true;
        let target = name(b, t);
        let all = sources.iter().map(|s| name(b, *s)).collect::<Vec<_>>().join(", ");
        let at = b
            .join_sites
            .get(i)
            .map_or_else(|| "/edges".to_string(), |p| push_pointer(p, "from"));
        let (them, run) = if late.len() == 1 {
            (late[0].clone(), "runs")
        } else {
            (late.join(" and "), "run")
        };
        b.diags.push(
            b.src
                .diag(
                    Code::DeadJoin,
                    &at,
                    format!("the join [{all}] -> `{target}` can never fire: {them} {run} only after `{target}`"),
                )
                .help(format!(
                    "a join waits until all its sources have run; join only nodes that can run before `{target}`, or use separate edges"
                )),
        );
    }
    found
}

/// Nodes reachable from START without passing through any of `avoid`.
fn reach_avoiding_all(b: &Build, avoid: &HashSet<NodeIx>) -> HashSet<NodeIx> {
    let mut seen = HashSet::from([b.start]);
    let mut queue = VecDeque::from([b.start]);
    while let Some(n) = queue.pop_front() {
        for e in b.graph.edges_directed(n, Direction::Outgoing) {
            let next = e.target();
            if !avoid.contains(&next) && seen.insert(next) {
                queue.push_back(next);
            }
        }
    }
    seen
}

/// E403: a loop whose only ways out are route conditions that read nothing the loop can
/// change: state keys that no node writes, or that only nodes which cannot run while the loop
/// does write (a node that runs once before the loop is entered, or one reached only through
/// the loop's exits); input, config, context.
pub(super) fn constant_exits(b: &mut Build) {
    let mut writers: IndexMap<String, Vec<NodeIx>> = IndexMap::new();
    for (ix, d) in &b.drafts {
        for (key, _) in &d.writes {
            let w = writers.entry(key.clone()).or_default();
            if !w.contains(ix) {
                w.push(*ix);
            }
        }
    }
    let reachable = reach_avoiding(b, None);
    let sccs = petgraph::algo::tarjan_scc(&b.graph);
    // Nodes that run in a cycle may run again at any time.
    let cyclic: HashSet<NodeIx> = sccs
        .iter()
        .filter(|scc| scc.len() > 1 || b.graph.contains_edge(scc[0], scc[0]))
        .flatten()
        .copied()
        .collect();
    let mut found = Vec::new();
    for scc in sccs.clone() {
        let members: HashSet<NodeIx> = scc.iter().copied().collect();
        let is_loop = scc.len() > 1 || b.graph.contains_edge(scc[0], scc[0]);
        if !is_loop || !scc.iter().all(|n| b.drafts.contains_key(n) && reachable.contains(n)) {
            continue;
        }
        let outside = |t: &Target| match t {
            Target::End => true,
            Target::Node(n) => !members.contains(n),
        };
        let mut exits: Vec<(String, String)> = Vec::new();
        let mut other_exit = false;
        let mut order: Vec<NodeIx> = scc.clone();
        order.sort_by_key(|n| b.index.get_index_of(name(b, *n).as_str()));
        for n in &order {
            let d = &b.drafts[n];
            let mut conditions = b.conditions.iter().filter(|(from, _, _)| from == n);
            for branch in &d.branches {
                match branch {
                    Branch::Always(ts) => other_exit |= ts.iter().any(outside),
                    Branch::Send(s) => other_exit |= !members.contains(&s.to),
                    Branch::Route(clauses) => {
                        for c in clauses {
                            let leaves = match &c.then {
                                ClauseTarget::Nodes(ts) => ts.iter().any(outside),
                                ClauseTarget::Send(s) => !members.contains(&s.to),
                                ClauseTarget::Handoff(_) => true,
                            };
                            let cond = if c.when.is_some() { conditions.next() } else { None };
                            match (leaves, cond) {
                                (false, _) => {}
                                (true, Some((_, at, text))) => exits.push((at.clone(), text.clone())),
                                (true, None) => other_exit = true,
                            }
                        }
                    }
                }
            }
            // A node's own choice (`goto`) leaves the loop as a route does: by a condition, or
            // by its default clause. What a `goto` reads of the node's output changes each pass.
            for (i, c) in d.goto.iter().enumerate() {
                let leaves = match &c.then {
                    ClauseTarget::Nodes(ts) => ts.iter().any(outside),
                    ClauseTarget::Send(s) => !members.contains(&s.to),
                    ClauseTarget::Handoff(_) => true,
                };
                if !leaves {
                    continue;
                }
                match c.when.and_then(|id| b.exprs.source(id)) {
                    Some(text) => {
                        let at = format!("{}/goto/{i}/when", d.pointer);
                        let at = if b.src.doc.value.pointer(&at).is_some() {
                            at
                        } else {
                            d.pointer.clone()
                        };
                        exits.push((at, text.to_string()));
                    }
                    None => other_exit = true,
                }
            }
            // Its error handler, joins and its child's handoffs (edges of the node's own choice
            // too) may leave the loop as well.
            let child = d.subgraph.is_some();
            other_exit |= b.graph.edges_directed(*n, Direction::Outgoing).any(|e| {
                !members.contains(&e.target())
                    && match e.weight() {
                        Flow::Static | Flow::Conditional { .. } | Flow::Send { .. } => false,
                        Flow::Goto { .. } => child,
                        Flow::Join | Flow::OnError => true,
                    }
            });
        }
        if other_exit || exits.is_empty() {
            continue;
        }
        // Outside the loop, what may run while it does: a node reachable from START without
        // entering the loop, unless it runs once, before any node of the loop (every way to
        // the loop passes through it, and it is in no cycle). A node reached only through
        // the loop's exits runs, if ever, after the loop has ended.
        let free = reach_avoiding_all(b, &members);
        let concurrent = |w: NodeIx| {
            members.contains(&w)
                || (free.contains(&w)
                    && (cyclic.contains(&w) || reach_avoiding(b, Some(w)).iter().any(|n| members.contains(n))))
        };
        let mut unwritten: Vec<String> = Vec::new();
        let constant = exits.iter().all(|(_, text)| match reads(b, text) {
            Some(keys) => {
                let fixed = keys
                    .iter()
                    .all(|k| writers.get(k).is_none_or(|ws| !ws.iter().any(|w| concurrent(*w))));
                unwritten.extend(keys);
                fixed && !unwritten.is_empty()
            }
            None => false,
        });
        if constant {
            unwritten.sort();
            unwritten.dedup();
            let names: Vec<String> = order.iter().map(|n| format!("`{}`", name(b, *n))).collect();
            // The nodes outside the loop that write what its exits read: before it or after it.
            let (mut before, mut after): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
            for key in &unwritten {
                for w in writers.get(key).into_iter().flatten() {
                    let n = format!("`{}`", name(b, *w));
                    let list = if free.contains(w) { &mut before } else { &mut after };
                    if !list.contains(&n) {
                        list.push(n);
                    }
                }
            }
            let mut outside = Vec::new();
            if !before.is_empty() {
                outside.push(format!("{} before it is entered", before.join(", ")));
            }
            if !after.is_empty() {
                outside.push(format!("{} after it has ended", after.join(", ")));
            }
            found.push((exits[0].0.clone(), names, unwritten, outside.join(", and ")));
        }
    }
    for (at, names, keys, outside) in found {
        let keys_list = keys
            .iter()
            .map(|k| format!("`state.{k}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let what = if names.len() == 1 {
            format!("the loop of node {}", names[0])
        } else {
            format!("the loop through {}", names.join(", "))
        };
        b.diags.push(
            b.src
                .diag(
                    Code::NoExit,
                    &at,
                    if outside.is_empty() {
                        format!("{what} can never end: its exit conditions read {keys_list}, which no node writes")
                    } else {
                        format!(
                            "{what} can never end: its exit conditions read {keys_list}, which no node of the loop \
                             writes (only {outside})"
                        )
                    },
                )
                .help(format!(
                    "have a node of the loop write {} (e.g. in its `update`), or exit on something the loop changes",
                    keys.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                )),
        );
    }
}

/// W412: a node in a loop writes a list written out item by item (`"[output]"`) to an array
/// key whose reducer replaces: each pass drops the items the last one wrote, where the author
/// most likely meant to collect them. A list that reads the key itself (`state.k + [output]`)
/// collects by hand and is not reported.
pub(super) fn replaced_in_loops(b: &mut Build) {
    let mut found = Vec::new();
    for scc in petgraph::algo::tarjan_scc(&b.graph) {
        let is_loop = scc.len() > 1 || b.graph.contains_edge(scc[0], scc[0]);
        if !is_loop {
            continue;
        }
        let mut order: Vec<NodeIx> = scc.iter().copied().filter(|n| b.drafts.contains_key(n)).collect();
        order.sort_by_key(|n| b.index.get_index_of(name(b, *n).as_str()));
        for n in order {
            let d = &b.drafts[&n];
            for (key, writer) in &d.update {
                let Some(channel) = b.state.get(key) else { continue };
                let is_array =
                    channel.schema.get("type").and_then(|t| t.as_str()) == Some("array") || channel.default.is_array();
                if !matches!(channel.reducer, Reducer::Replace) || !is_array {
                    continue;
                }
                let Writer::Expr(id) = writer else { continue };
                let Some(text) = b.exprs.source(*id) else { continue };
                if !is_list_display(text) {
                    continue;
                }
                let reads_itself = b.exprs.names_of(text).is_some_and(|names| {
                    names
                        .vars
                        .iter()
                        .any(|v| v.split('.').take(2).eq(["state", key.as_str()]))
                });
                if reads_itself {
                    continue;
                }
                // Where the node writes it, or the node when its kind's defaults do.
                let at = push_pointer(&push_pointer(&d.pointer, "update"), key);
                let at = if b.src.doc.value.pointer(&at).is_some() {
                    at
                } else {
                    d.pointer.clone()
                };
                found.push((at, d.name.clone(), key.clone(), text.trim().to_string()));
            }
        }
    }
    for (at, node, key, text) in found {
        b.diags.push(
            b.src
                .diag(
                    Code::ReplacedInLoop,
                    &at,
                    format!(
                        "`{node}` runs in a loop and writes the list `{text}` to `{key}`, a key without a reducer: \
                         each pass replaces the list the last one wrote, so only the last pass's items are kept"
                    ),
                )
                .help(format!(
                    "give `{key}` `reducer: append` to collect every pass's items (`add_messages` for messages), or write `state.{key} + [...]`"
                )),
        );
    }
}

/// Whether the expression `text` is a list written out item by item (`[output]`).
fn is_list_display(text: &str) -> bool {
    matches!(
        minijinja::machinery::parse_expr(text),
        Ok(minijinja::machinery::ast::Expr::List(_))
    )
}

/// The state keys a condition reads (through predicates too), when everything else it reads
/// is fixed for the run (input, config, context); `None` when it reads something that changes
/// (`run`, or anything not known here).
fn reads(b: &Build, text: &str) -> Option<Vec<String>> {
    let names = b.exprs.names_of(text)?;
    let mut keys = Vec::new();
    for var in names.vars.iter() {
        let mut parts = var.split('.');
        match (parts.next(), parts.next()) {
            (Some("state"), Some(key)) if b.sym.state.iter().any(|k| k == key) => keys.push(key.to_string()),
            // A method of the state (`state.get('done')`) reads what cannot be told here.
            (Some("input" | "config" | "context"), _) => {}
            (Some(root), None) if b.defs.predicates.contains_key(root) => {
                let def = &b.defs.predicates[root];
                keys.extend(reads(b, &def.value)?);
            }
            _ => return None,
        }
    }
    Some(keys)
}

//! Whole-graph analysis, once every edge and node is known: an entry, reachability from
//! START, a way out to END from every loop, dead ends, and write conflicts between nodes that
//! can run in the same superstep.

use std::collections::{HashMap, HashSet, VecDeque};

use petgraph::Direction;
use petgraph::visit::EdgeRef;

use super::nodes::Build;
use super::plan::*;
use crate::diag::Code;
use crate::spec::load::push_pointer;

/// Whole-graph checks, once every edge and node is known.
pub(super) fn analyze(b: &mut Build) {
    if b.graph.edges_directed(b.start, Direction::Outgoing).next().is_none() {
        let at = if b.src.doc.value.get("edges").is_some() {
            "/edges"
        } else {
            ""
        };
        b.diags.push(
            b.src
                .diag(Code::NoEntry, at, "START has no outgoing edge, so nothing would run")
                .help(match b.index.keys().next() {
                    Some(first) => format!("add `- START -> {first}`"),
                    None => "add nodes and an edge `START -> first_node`".into(),
                }),
        );
        return;
    }
    let reachable = bfs(b, b.start, Direction::Outgoing);
    for (name, ix) in b.index.clone() {
        // A node named START or END was reported as reserved; its edges mean something else.
        if !reachable.contains(&ix) && name != "START" && name != "END" {
            let pointer = push_pointer("/nodes", &name);
            b.diags.push(
                b.src
                    .diag_key(
                        Code::Unreachable,
                        &pointer,
                        format!("node `{name}` can never run: no path leads to it from START"),
                    )
                    .help(format!("add an edge to it, e.g. `- some_node -> {name}`, or remove it")),
            );
        }
    }
    // Terminals: END, nodes with no way out (a warning of their own), and nodes whose routing
    // may select nothing (a route without default, a fan-out over an empty list).
    let mut terminals = vec![b.end];
    for (name, ix) in b.index.clone() {
        let outgoing = b
            .graph
            .edges_directed(ix, Direction::Outgoing)
            .any(|e| !matches!(e.weight(), Flow::OnError));
        if !outgoing {
            terminals.push(ix);
            if reachable.contains(&ix) {
                let pointer = push_pointer("/nodes", &name);
                b.diags.push(
                    b.src
                        .diag_key(
                            Code::SilentEnd,
                            &pointer,
                            format!("node `{name}` has no outgoing edge, so its branch would end silently after it"),
                        )
                        .help(format!("if the run may end here, say so with `- {name} -> END`; otherwise add the edge it is missing")),
                );
            }
        }
        let may_stop = b.drafts.get(&ix).is_some_and(|d| {
            d.branches.iter().any(|br| match br {
                Branch::Route(cs) => !cs.iter().any(|c| c.when.is_none()),
                Branch::Send(_) => true,
                _ => false,
            }) || d.branches.iter().all(|br| matches!(br, Branch::Send(_))) && !d.branches.is_empty()
        });
        if may_stop {
            terminals.push(ix);
        }
    }
    // One search from every terminal at once: a search per terminal would cross the shared
    // ancestry of every branch again (quadratic in a wide graph).
    let can_finish = bfs_from(b, terminals, Direction::Incoming);
    let sccs = petgraph::algo::tarjan_scc(&b.graph);
    let mut reported = HashSet::new();
    for scc in sccs {
        let stuck: Vec<NodeIx> = scc
            .iter()
            .copied()
            .filter(|ix| reachable.contains(ix) && !can_finish.contains(ix) && b.drafts.contains_key(ix))
            .collect();
        if stuck.is_empty() {
            continue;
        }
        let mut names: Vec<(usize, String)> = stuck
            .iter()
            .filter_map(|ix| {
                b.index
                    .get_index_of(b.drafts[ix].name.as_str())
                    .map(|i| (i, b.drafts[ix].name.clone()))
            })
            .collect();
        names.sort();
        let first = names[0].1.clone();
        if !reported.insert(first.clone()) {
            continue;
        }
        let list = names
            .iter()
            .map(|(_, n)| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let msg = if names.len() == 1 {
            format!("END cannot be reached from node {list}")
        } else {
            format!("nodes {list} loop with no way out to END")
        };
        b.diags.push(
            b.src
                .diag_key(Code::NoExit, &push_pointer("/nodes", &first), msg)
                .help("add a route clause that leaves the loop, e.g. `- {when: \"state.done\", to: END}`"),
        );
    }
    write_conflicts(b);
}

fn bfs(b: &Build, from: NodeIx, dir: Direction) -> HashSet<NodeIx> {
    bfs_from(b, vec![from], dir)
}

/// Every node reachable from any of `from` (them included), following edges in `dir`.
fn bfs_from(b: &Build, from: Vec<NodeIx>, dir: Direction) -> HashSet<NodeIx> {
    let mut seen: HashSet<NodeIx> = from.iter().copied().collect();
    let mut queue = VecDeque::from(from);
    while let Some(n) = queue.pop_front() {
        for e in b.graph.edges_directed(n, dir) {
            let next = if dir == Direction::Outgoing {
                e.target()
            } else {
                e.source()
            };
            if seen.insert(next) {
                queue.push_back(next);
            }
        }
    }
    seen
}

/// The sets of nodes one node may trigger together (one set per combination of choices).
fn alternatives(branches: &[Branch], goto: &[Clause], joins_from: &[NodeIx]) -> Vec<Vec<NodeIx>> {
    let mut fixed: Vec<NodeIx> = joins_from.to_vec();
    let mut choices: Vec<Vec<Vec<NodeIx>>> = Vec::new();
    let nodes = |ts: &[Target]| {
        ts.iter()
            .filter_map(|t| if let Target::Node(n) = t { Some(*n) } else { None })
            .collect::<Vec<_>>()
    };
    let clause_sets = |cs: &[Clause]| {
        let mut alts: Vec<Vec<NodeIx>> = cs
            .iter()
            .map(|c| match &c.then {
                ClauseTarget::Nodes(ts) => nodes(ts),
                ClauseTarget::Send(s) => vec![s.to],
                // The subgraph ends: nothing of this workflow runs after it.
                ClauseTarget::Handoff(_) => Vec::new(),
            })
            .collect();
        if !cs.iter().any(|c| c.when.is_none()) {
            alts.push(Vec::new());
        }
        alts
    };
    for br in branches {
        match br {
            Branch::Always(ts) => fixed.extend(nodes(ts)),
            Branch::Send(s) => fixed.push(s.to),
            Branch::Route(cs) => choices.push(clause_sets(cs)),
        }
    }
    if !goto.is_empty() {
        choices.push(clause_sets(goto));
    }
    let mut out = vec![fixed];
    for alts in choices {
        if out.len() * alts.len() > 64 {
            // Too many combinations: over-approximate with every choice at once.
            for o in &mut out {
                o.extend(alts.iter().flatten().copied());
            }
            continue;
        }
        out = out
            .iter()
            .flat_map(|o| alts.iter().map(move |a| o.iter().chain(a).copied().collect()))
            .collect();
    }
    for o in &mut out {
        o.sort();
        o.dedup();
    }
    out
}

/// E404: explores the supersteps the graph allows (as sets of nodes) and reports two nodes
/// that may run in the same step writing a key without a reducer, and fanned-out nodes
/// writing one (their parallel copies would conflict).
fn write_conflicts(b: &mut Build) {
    let replace = |b: &Build, key: &str| b.state.get(key).is_some_and(|c| !c.reducer.combines());
    // `(pointer, key, node, other, other's pointer)`, each `(key, node, other)` once.
    let mut report: Vec<(String, String, String, String, Option<String>)> = Vec::new();
    let mut reported: HashSet<(String, String, String)> = HashSet::new();
    for d in b.drafts.values() {
        if let Some(item) = &d.item {
            for (key, at) in &d.writes {
                if replace(b, key) && reported.insert((key.clone(), d.name.clone(), format!("fan-out:{item}"))) {
                    report.push((at.clone(), key.clone(), d.name.clone(), format!("fan-out:{item}"), None));
                }
            }
        }
    }
    let mut joins_from: HashMap<NodeIx, Vec<NodeIx>> = HashMap::new();
    for (sources, t) in &b.joins {
        if let Target::Node(n) = t {
            for s in sources {
                joins_from.entry(*s).or_default().push(*n);
            }
        }
    }
    let mut alt_cache: HashMap<NodeIx, Vec<Vec<NodeIx>>> = HashMap::new();
    for (ix, d) in &b.drafts {
        alt_cache.insert(
            *ix,
            // A subgraph that hands off replaces the node's own routing with its target.
            alternatives(&d.branches, &d.goto, joins_from.get(ix).map_or(&[][..], |v| v))
                .into_iter()
                .chain(d.handoffs.iter().map(|t| vec![*t]))
                .collect(),
        );
    }
    let mut frontier_queue: VecDeque<Vec<NodeIx>> = alternatives(&b.entry, &[], &[])
        .into_iter()
        .filter(|f| !f.is_empty())
        .collect();
    let mut seen: HashSet<Vec<NodeIx>> = frontier_queue.iter().cloned().collect();
    let mut explored = 0;
    while let Some(frontier) = frontier_queue.pop_front() {
        explored += 1;
        if explored > 20_000 {
            break;
        }
        // The members writing each `replace` key, found from their writes (not by comparing
        // every pair of members: a fan-out from START can put thousands in one set). Each
        // writer after the first is reported against the first, so k writers of a key make
        // k - 1 reports, not k² / 2.
        let mut writers: HashMap<&str, (NodeIx, &str, &str)> = HashMap::new();
        for n in &frontier {
            let Some(d) = b.drafts.get(n) else { continue };
            for (key, at) in &d.writes {
                if !replace(b, key) {
                    continue;
                }
                match writers.get(key.as_str()) {
                    None => {
                        writers.insert(key, (*n, d.name.as_str(), at.as_str()));
                    }
                    Some((first, first_name, first_at)) if first != n => {
                        let found = (
                            at.clone(),
                            key.clone(),
                            d.name.clone(),
                            first_name.to_string(),
                            Some(first_at.to_string()),
                        );
                        if reported.insert((found.1.clone(), found.2.clone(), found.3.clone())) {
                            report.push(found);
                        }
                    }
                    Some(_) => {}
                }
            }
        }
        // Next frontiers: every combination of each member's alternatives. A member with one
        // alternative adds it to every combination in place (copying the combinations for
        // each member would be quadratic in the frontier's width).
        let mut next: Vec<Vec<NodeIx>> = vec![Vec::new()];
        for n in &frontier {
            let alts = alt_cache.get(n).map_or(&[][..], Vec::as_slice);
            if alts.len() <= 1 || next.len() * alts.len() > 256 {
                for x in &mut next {
                    x.extend(alts.iter().flatten().copied());
                }
                continue;
            }
            next = next
                .iter()
                .flat_map(|x| alts.iter().map(move |a| x.iter().chain(a).copied().collect::<Vec<_>>()))
                .collect();
        }
        for mut f in next {
            f.sort();
            f.dedup();
            if !f.is_empty() && seen.insert(f.clone()) {
                frontier_queue.push_back(f);
            }
        }
    }
    for (at, key, node, other, other_at) in report {
        let d = if let Some(item) = other.strip_prefix("fan-out:") {
            b.src
                .diag(
                    Code::WriteConflict,
                    &at,
                    format!(
                        "node `{node}` runs once per fan-out item (`{item}`) and writes `{key}`, which has no reducer"
                    ),
                )
                .help(format!(
                    "parallel copies would overwrite each other: give `{key}` a reducer such as `append`"
                ))
        } else {
            let other_span = other_at.and_then(|p| b.src.doc.spans.value(&p));
            b.src
                .diag(Code::WriteConflict, &at, format!("nodes `{other}` and `{node}` can run in the same superstep and both write `{key}`, which has no reducer"))
                .label(b.src.path(), other_span, format!("`{other}` writes `{key}` here"))
                .help(format!("give `{key}` a reducer (e.g. `reducer: append`), or have one of them write another key"))
        };
        b.diags.push(d);
    }
}

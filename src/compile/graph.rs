//! Edges into control flow, and the static analysis of the resulting graph: reachability,
//! exits, dead ends, routes without a default, write conflicts between nodes that can share a
//! superstep, and fan-outs over values that are not arrays.

use std::collections::{HashMap, HashSet, VecDeque};

use petgraph::Direction;
use petgraph::visit::EdgeRef;
use serde_json::Value;

use super::exprs::Scope;
use super::nodes::Build;
use super::plan::*;
use crate::diag::Code;
use crate::spec::load::push_pointer;
use crate::spec::{Edge, EdgeObject, OneOrMany, RouteClause};

/// Resolves a target name: a node or END.
pub(super) fn target(b: &mut Build, pointer: &str, name: &str) -> Option<Target> {
    match name {
        "END" => Some(Target::End),
        "START" => {
            b.diags.push(
                b.src
                    .diag(Code::BadEdge, pointer, "START cannot be a target")
                    .help("START is where a run begins; edges leave it"),
            );
            None
        }
        _ => match b.index.get(name) {
            Some(ix) => Some(Target::Node(*ix)),
            None => {
                let d = b
                    .src
                    .diag(Code::UnknownNode, pointer, format!("unknown node `{name}`"))
                    .suggest(name, b.index.keys().map(String::as_str).chain(["END"]))
                    .help_or("declare it under `nodes:`");
                b.diags.push(d);
                None
            }
        },
    }
}

fn source(b: &mut Build, pointer: &str, name: &str) -> Option<NodeIx> {
    match name {
        "START" => Some(b.start),
        "END" => {
            b.diags.push(
                b.src
                    .diag(Code::BadEdge, pointer, "END cannot be a source")
                    .help("a run ends at END; no edge leaves it"),
            );
            None
        }
        _ => target(b, pointer, name).map(|t| match t {
            Target::Node(n) => n,
            Target::End => b.end,
        }),
    }
}

fn vertex(b: &Build, t: Target) -> NodeIx {
    match t {
        Target::Node(n) => n,
        Target::End => b.end,
    }
}

fn add_branch(b: &mut Build, from: NodeIx, branch: Branch) {
    if from == b.start {
        b.entry.push(branch);
    } else if let Some(d) = b.drafts.get_mut(&from) {
        d.branches.push(branch);
    }
}

/// Parses every edge into branches and graph edges.
pub(super) fn edges(b: &mut Build) {
    let Some(Value::Array(raw)) = b.src.doc.value.get("edges").cloned() else {
        return;
    };
    for (i, value) in raw.iter().enumerate() {
        let pointer = format!("/edges/{i}");
        let Ok(edge) = serde_json::from_value::<Edge>(value.clone()) else {
            continue;
        };
        match edge {
            Edge::Chain(text) => chain(b, &pointer, &text),
            Edge::Object(obj) => object(b, &pointer, &obj),
        }
    }
}

fn chain(b: &mut Build, pointer: &str, text: &str) {
    let parts: Vec<&str> = text.split("->").map(str::trim).collect();
    if parts.len() < 2 || parts.iter().any(|p| p.is_empty() || p.contains(char::is_whitespace)) {
        b.diags.push(
            b.src
                .diag(Code::BadEdge, pointer, format!("`{text}` is not an edge"))
                .help("write `a -> b` or a chain `a -> b -> c`; use an object for joins, routes and fan-out"),
        );
        return;
    }
    for pair in parts.windows(2) {
        let Some(from) = source(b, pointer, pair[0]) else {
            continue;
        };
        let Some(to) = target(b, pointer, pair[1]) else {
            continue;
        };
        b.graph.add_edge(from, vertex(b, to), Flow::Static);
        add_branch(b, from, Branch::Always(vec![to]));
    }
}

fn object(b: &mut Build, pointer: &str, edge: &EdgeObject) {
    let given = [edge.to.is_some(), edge.route.is_some(), edge.send.is_some()]
        .iter()
        .filter(|x| **x)
        .count();
    if given != 1 {
        b.diags.push(
            b.src
                .diag(
                    Code::BadEdge,
                    pointer,
                    "an edge object takes exactly one of `to`, `route` and `send`",
                )
                .help("split it into several edges"),
        );
        return;
    }
    let from_pointer = push_pointer(pointer, "from");
    let sources: Vec<String> = edge.from.as_slice().to_vec();
    if let OneOrMany::Many(list) = &edge.from {
        if list.is_empty() {
            b.diags
                .push(b.src.diag(Code::BadEdge, &from_pointer, "`from` lists no node"));
            return;
        }
        if list.len() > 1 && edge.to.is_none() {
            b.diags.push(
                b.src
                    .diag(
                        Code::BadEdge,
                        &from_pointer,
                        "a join (`from` with several nodes) takes `to`",
                    )
                    .help("join first, then route or fan out from the joined node"),
            );
            return;
        }
    }
    let mut froms = Vec::new();
    for (i, name) in sources.iter().enumerate() {
        let at = if matches!(edge.from, OneOrMany::Many(_)) {
            push_pointer(&from_pointer, &i.to_string())
        } else {
            from_pointer.clone()
        };
        if let Some(ix) = source(b, &at, name) {
            froms.push(ix);
        }
    }
    if froms.len() != sources.len() {
        return;
    }
    let sym = b.sym.clone();
    if let Some(to) = &edge.to {
        let to_pointer = push_pointer(pointer, "to");
        let mut targets = Vec::new();
        for (i, name) in to.as_slice().iter().enumerate() {
            let at = if matches!(to, OneOrMany::Many(_)) {
                push_pointer(&to_pointer, &i.to_string())
            } else {
                to_pointer.clone()
            };
            if let Some(t) = target(b, &at, name) {
                targets.push(t);
            }
        }
        if froms.len() > 1 {
            if froms.contains(&b.start) {
                b.diags.push(
                    b.src
                        .diag(Code::BadEdge, &from_pointer, "START cannot be part of a join"),
                );
                return;
            }
            for t in &targets {
                for f in &froms {
                    b.graph.add_edge(*f, vertex(b, *t), Flow::Join);
                }
                b.joins.push((froms.clone(), *t));
            }
        } else {
            for t in &targets {
                b.graph.add_edge(froms[0], vertex(b, *t), Flow::Static);
            }
            add_branch(b, froms[0], Branch::Always(targets));
        }
    } else if let Some(route) = &edge.route {
        let scope = Scope::base(&sym);
        let clauses = clauses(b, Some(froms[0]), &push_pointer(pointer, "route"), route, scope, false);
        add_branch(b, froms[0], Branch::Route(clauses));
    } else if let Some(send) = &edge.send {
        let scope = Scope::base(&sym);
        if let Some(spec) = send_spec(b, froms[0], &push_pointer(pointer, "send"), send, scope) {
            add_branch(b, froms[0], Branch::Send(spec));
        }
    }
}

fn send_spec(b: &mut Build, from: NodeIx, pointer: &str, send: &crate::spec::Send, scope: Scope) -> Option<SendSpec> {
    let to_pointer = push_pointer(pointer, "to");
    let to = match target(b, &to_pointer, &send.to)? {
        Target::Node(n) => n,
        Target::End => {
            b.diags
                .push(b.src.diag(Code::BadEdge, &to_pointer, "a fan-out cannot target END"));
            return None;
        }
    };
    let item = send.item_name().to_string();
    if !super::defs::is_identifier(&item) || super::defs::RESERVED_ROOTS.contains(&item.as_str()) && item != "item" {
        b.diags.push(
            b.src
                .diag(Code::ReservedName, &push_pointer(pointer, "as"), format!("`{item}` cannot name a fan-out item"))
                .help("choose an identifier that is not state, input, config, context, params, output, usage, error or run"),
        );
    }
    if let Some(prev) = b.drafts.get(&to).and_then(|d| d.item.clone())
        && prev != item
    {
        b.diags.push(
            b.src
                .diag(
                    Code::BadEdge,
                    &push_pointer(pointer, "as"),
                    format!(
                        "`{}` is fanned out to as `{prev}` elsewhere; one node has one item name",
                        send.to
                    ),
                )
                .help(format!("use `as: {prev}` here too")),
        );
    }
    if let Some(d) = b.drafts.get_mut(&to) {
        d.item = Some(item.clone());
    }
    let foreach_pointer = push_pointer(pointer, "foreach");
    let foreach = b.expr(&foreach_pointer, &send.foreach, scope)?;
    check_foreach(b, &foreach_pointer, &send.foreach);
    b.graph.add_edge(
        from,
        to,
        Flow::Send {
            foreach: send.foreach.clone(),
            item: item.clone(),
        },
    );
    Some(SendSpec { to, foreach, item })
}

/// Compiles route (or goto) clauses and adds their graph edges.
pub(super) fn clauses(
    b: &mut Build,
    from: Option<NodeIx>,
    pointer: &str,
    list: &[RouteClause],
    scope: Scope,
    is_goto: bool,
) -> Vec<Clause> {
    let mut out = Vec::new();
    let mut has_default = false;
    for (i, clause) in list.iter().enumerate() {
        let at = push_pointer(pointer, &i.to_string());
        if has_default {
            b.diags.push(
                b.src
                    .diag(
                        Code::RouteOrder,
                        &at,
                        "this clause comes after the default clause and can never be taken",
                    )
                    .help("the clause without `when` is the default and must be last"),
            );
        }
        let when = match &clause.when {
            Some(text) => b.expr(&push_pointer(&at, "when"), text, scope),
            None => {
                has_default = true;
                None
            }
        };
        let label = clause.label.clone().or_else(|| clause.when.clone());
        let then = match (&clause.to, &clause.send) {
            (Some(to), None) => {
                let mut targets = Vec::new();
                for (j, name) in to.as_slice().iter().enumerate() {
                    let tp = if matches!(to, OneOrMany::Many(_)) {
                        push_pointer(&push_pointer(&at, "to"), &j.to_string())
                    } else {
                        push_pointer(&at, "to")
                    };
                    if let Some(t) = target(b, &tp, name) {
                        targets.push(t);
                    }
                }
                if let Some(f) = from {
                    for t in &targets {
                        let flow = if is_goto {
                            Flow::Goto { label: label.clone() }
                        } else {
                            Flow::Conditional { label: label.clone() }
                        };
                        let v = vertex(b, *t);
                        b.graph.add_edge(f, v, flow);
                    }
                }
                ClauseTarget::Nodes(targets)
            }
            (None, Some(send)) => {
                let Some(f) = from else { continue };
                let base = Scope {
                    output: None,
                    usage: false,
                    ..scope
                };
                match send_spec(
                    b,
                    f,
                    &push_pointer(&at, "send"),
                    send,
                    if is_goto { scope } else { base },
                ) {
                    Some(s) => ClauseTarget::Send(s),
                    None => continue,
                }
            }
            _ => {
                b.diags.push(
                    b.src
                        .diag(Code::BadEdge, &at, "a clause takes exactly one of `to` and `send`"),
                );
                continue;
            }
        };
        out.push(Clause { when, then, label });
    }
    if !has_default && !list.is_empty() && !is_goto {
        b.diags.push(
            b.src
                .diag_key(
                    Code::NoDefaultRoute,
                    pointer,
                    "no clause is taken when every condition is false, and the branch ends",
                )
                .help("add a last clause without `when`, e.g. `- {to: END}`"),
        );
    }
    out
}

/// E304: a fan-out over a value declared as something other than an array.
fn check_foreach(b: &mut Build, pointer: &str, text: &str) {
    let t = text.trim();
    let Some((root, key)) = t.split_once('.') else { return };
    if !super::defs::is_identifier(key) {
        return;
    }
    let types = match root {
        "state" => b.state_schemas.get(key).and_then(|s| b.resolver.types_of(s)),
        "config" => b.sym.config.get(key).map(|v| vec![json_type(v).to_string()]),
        _ => None,
    };
    if let Some(types) = types
        && !types.iter().any(|t| t == "array")
    {
        b.diags.push(
            b.src
                .diag(
                    Code::ForeachNotArray,
                    pointer,
                    format!("`{t}` is {}, not an array", types.join(" or ")),
                )
                .help("fan out over an array: one task per element"),
        );
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

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
        if !reachable.contains(&ix) {
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
                            Code::DeadEnd,
                            &pointer,
                            format!("node `{name}` has no outgoing edge; its branch ends after it"),
                        )
                        .help(format!("say so with `- {name} -> END`")),
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
    let mut can_finish = HashSet::new();
    for t in terminals {
        can_finish.extend(bfs(b, t, Direction::Incoming));
    }
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
    let mut seen = HashSet::from([from]);
    let mut queue = VecDeque::from([from]);
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
    let mut report: Vec<(String, String, String, String)> = Vec::new();
    for d in b.drafts.values() {
        if let Some(item) = &d.item {
            for (key, at) in &d.writes {
                if replace(b, key) {
                    report.push((at.clone(), key.clone(), d.name.clone(), format!("fan-out:{item}")));
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
            alternatives(&d.branches, &d.goto, joins_from.get(ix).map_or(&[][..], |v| v)),
        );
    }
    let mut frontier_queue: VecDeque<Vec<NodeIx>> = alternatives(&b.entry, &[], &[])
        .into_iter()
        .filter(|f| !f.is_empty())
        .collect();
    let mut seen: HashSet<Vec<NodeIx>> = frontier_queue.iter().cloned().collect();
    let mut checked_pairs: HashSet<(NodeIx, NodeIx)> = HashSet::new();
    let mut explored = 0;
    while let Some(frontier) = frontier_queue.pop_front() {
        explored += 1;
        if explored > 20_000 {
            break;
        }
        for (i, a) in frontier.iter().enumerate() {
            for c in &frontier[i + 1..] {
                if !checked_pairs.insert((*a, *c)) {
                    continue;
                }
                let (Some(da), Some(dc)) = (b.drafts.get(a), b.drafts.get(c)) else {
                    continue;
                };
                for (key, _) in &da.writes {
                    if !replace(b, key) {
                        continue;
                    }
                    if let Some((_, at)) = dc.writes.iter().find(|(k, _)| k == key) {
                        report.push((at.clone(), key.clone(), dc.name.clone(), da.name.clone()));
                    }
                }
            }
        }
        // Next frontiers: every combination of each member's alternatives.
        let mut next: Vec<Vec<NodeIx>> = vec![Vec::new()];
        for n in &frontier {
            let alts = alt_cache.get(n).cloned().unwrap_or_default();
            if next.len() * alts.len().max(1) > 256 {
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
    let mut done = HashSet::new();
    for (at, key, node, other) in report {
        if !done.insert((key.clone(), node.clone(), other.clone())) {
            continue;
        }
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
            b.src
                .diag(Code::WriteConflict, &at, format!("nodes `{other}` and `{node}` can run in the same superstep and both write `{key}`, which has no reducer"))
                .help(format!("give `{key}` a reducer (e.g. `reducer: append`), or have one of them write another key"))
        };
        b.diags.push(d);
    }
}

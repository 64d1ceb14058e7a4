//! Edges into control flow: branches for the engine, graph edges for analysis and pictures,
//! route and goto clauses, fan-outs (with a check that they iterate over arrays).

use serde_json::Value;

use super::exprs::Scope;
use super::nodes::Build;
use super::plan::*;
use crate::diag::{Code, did_you_mean};
use crate::spec::load::push_pointer;
use crate::spec::{Edge, EdgeObject, OneOrMany, RouteClause};

/// Resolves a target name: a node or END.
pub(super) fn target(b: &mut Build, pointer: &str, name: &str) -> Option<Target> {
    resolve(b, pointer, name, true)
}

/// Resolves a node name. An unknown name is reported; as a target (`recover`) it then stands
/// for the node it was probably meant to be (or END), so the graph analysis does not report
/// the typo again as a dead end, an unreachable node or an item out of scope. The error bars
/// the plan either way.
fn resolve(b: &mut Build, pointer: &str, name: &str, recover: bool) -> Option<Target> {
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
                if !recover {
                    return None;
                }
                b.broken_edges = true;
                match did_you_mean(name, b.index.keys().map(String::as_str).chain(["END"])) {
                    Some("END") | None => Some(Target::End),
                    Some(meant) => b.index.get(meant).map(|ix| Target::Node(*ix)),
                }
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
        _ => resolve(b, pointer, name, false).map(|t| match t {
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
            // The schema check reported it.
            b.broken_edges = true;
            continue;
        };
        match edge {
            Edge::Chain(text) => chain(b, &pointer, &text),
            Edge::Object(obj) => object(b, &pointer, &obj),
        }
    }
    if b.diags.iter().any(|d| d.code == Code::BadEdge) {
        b.broken_edges = true;
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
                b.join_sites.push(pointer.to_string());
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
            Some(text) => {
                if !is_goto && let Some(f) = from {
                    b.conditions.push((f, push_pointer(&at, "when"), text.clone()));
                }
                b.expr(&push_pointer(&at, "when"), text, scope)
            }
            None => {
                has_default = true;
                None
            }
        };
        let label = clause.label.clone().or_else(|| clause.when.clone());
        let then = match (&clause.to, &clause.send, &clause.handoff) {
            (None, None, Some(h)) => {
                let hp = push_pointer(&at, "handoff");
                if !is_goto {
                    b.diags.push(
                        b.src
                            .diag_key(Code::BadEdge, &hp, "only a node's `goto` can hand off to the parent")
                            .help("move this clause into the `goto` of the node the route leaves"),
                    );
                    continue;
                }
                let Some(f) = from else { continue };
                let spec = handoff(b, &hp, h, scope);
                let label = label.clone().or_else(|| Some(format!("handoff to parent `{}`", h.to)));
                b.graph.add_edge(f, b.end, Flow::Goto { label });
                ClauseTarget::Handoff(spec)
            }
            (Some(to), None, None) => {
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
            (None, Some(send), None) => {
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
                b.diags.push(b.src.diag(
                    Code::BadEdge,
                    &at,
                    "a clause takes exactly one of `to`, `send` and `handoff`",
                ));
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

/// Compiles a handoff's writes in the `goto` scope and records the parent node and keys it
/// names: they are checked against each workflow that runs this one as a subgraph.
fn handoff(b: &mut Build, pointer: &str, h: &crate::spec::Handoff, scope: Scope) -> HandoffSpec {
    let to_pointer = push_pointer(pointer, "to");
    let update_pointer = push_pointer(pointer, "update");
    let mut update = Vec::new();
    let mut keys = Vec::new();
    for (key, value) in &h.update {
        let at = push_pointer(&update_pointer, key);
        let writer = match value {
            Value::String(text) => match b.expr(&at, text, scope) {
                Some(id) => Writer::Expr(id),
                None => continue,
            },
            other => Writer::Literal(other.clone()),
        };
        keys.push(Named {
            name: key.clone(),
            span: b.src.doc.spans.key(&at),
            pointer: at,
        });
        update.push((key.clone(), writer));
    }
    b.handoffs.push(HandoffSite {
        to: Named {
            name: h.to.clone(),
            span: b.src.doc.spans.value(&to_pointer),
            pointer: to_pointer,
        },
        keys,
    });
    HandoffSpec {
        to: h.to.clone(),
        update,
    }
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

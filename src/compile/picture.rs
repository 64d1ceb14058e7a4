//! Pictures of a plan: Mermaid, Graphviz dot, and JSON. Conditional edges are dashed and
//! labelled with their condition, joins and fan-outs are marked, interrupt gates are drawn as
//! hexagons, and subgraphs are drawn as clusters holding the child plan.

use std::fmt::Write;

use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use serde_json::{Value, json};

use super::plan::{Flow, NodeIx, Plan, Vertex};

/// A picture format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PictureFormat {
    /// Mermaid flowchart text (renders on GitHub and in many editors).
    #[default]
    Mermaid,
    /// Graphviz dot.
    Dot,
    /// The plan's nodes and edges as JSON.
    Json,
}

pub fn render(plan: &Plan, format: PictureFormat) -> String {
    match format {
        PictureFormat::Mermaid => {
            let mut out = String::from("flowchart TD\n");
            mermaid(plan, "", &mut out);
            out
        }
        PictureFormat::Dot => {
            let mut out = format!(
                "digraph {} {{\n  rankdir=TB;\n  node [fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n",
                quote(&plan.name)
            );
            dot(plan, "", &mut out, 1);
            out.push_str("}\n");
            out
        }
        PictureFormat::Json => {
            let mut text = serde_json::to_string_pretty(&json_value(plan)).unwrap_or_default();
            text.push('\n');
            text
        }
    }
}

fn is_interrupt(plan: &Plan, ix: NodeIx) -> bool {
    plan.nodes
        .get(&ix)
        .is_some_and(|n| n.gate || n.spec.common().interrupt_before || n.spec.common().interrupt_after)
}

fn kind_label(plan: &Plan, ix: NodeIx) -> String {
    match plan.nodes.get(&ix) {
        Some(n) => match &n.user_kind {
            Some(k) => format!("{} ({k})", n.spec.kind_name()),
            None => n.spec.kind_name().to_string(),
        },
        None => String::new(),
    }
}

fn id(prefix: &str, plan: &Plan, ix: NodeIx) -> String {
    let name = match &plan.graph[ix] {
        Vertex::Start => "__start__".to_string(),
        Vertex::End => "__end__".to_string(),
        Vertex::Node(n) => n.clone(),
    };
    format!("{prefix}{name}")
}

fn edge_label(flow: &Flow) -> Option<String> {
    match flow {
        Flow::Static => None,
        Flow::Conditional { label } | Flow::Goto { label } => Some(label.clone().unwrap_or_else(|| "otherwise".into())),
        Flow::Join => Some("join".into()),
        Flow::Send { foreach, item } => Some(format!("send {item} in {foreach}")),
        Flow::OnError => Some("on error".into()),
    }
}

fn mermaid_text(s: &str) -> String {
    s.replace('"', "#quot;").replace('\n', " ")
}

fn mermaid(plan: &Plan, prefix: &str, out: &mut String) {
    for ix in plan.graph.node_indices() {
        let nid = id(prefix, plan, ix);
        let _ = match &plan.graph[ix] {
            Vertex::Start => writeln!(out, "  {nid}([START])"),
            Vertex::End => writeln!(out, "  {nid}([END])"),
            Vertex::Node(name) => {
                let text = mermaid_text(&format!("{name}<br/><small>{}</small>", kind_label(plan, ix)));
                if let Some(child) = plan.subgraphs.get(&ix) {
                    let _ = writeln!(out, "  subgraph {nid}[\"{text}\"]");
                    let _ = writeln!(out, "    direction TB");
                    mermaid(child, &format!("{nid}__"), out);
                    writeln!(out, "  end")
                } else if is_interrupt(plan, ix) {
                    writeln!(out, "  {nid}{{{{\"{text}\"}}}}")
                } else {
                    writeln!(out, "  {nid}[\"{text}\"]")
                }
            }
        };
    }
    for e in (&plan.graph).edge_references() {
        let (a, b) = (id(prefix, plan, e.source()), id(prefix, plan, e.target()));
        let label = edge_label(e.weight()).map(|l| mermaid_text(&l));
        let _ = match (e.weight(), label) {
            (Flow::Static, _) => writeln!(out, "  {a} --> {b}"),
            (Flow::Send { .. }, Some(l)) => writeln!(out, "  {a} ==>|\"{l}\"| {b}"),
            (Flow::Join, Some(l)) => writeln!(out, "  {a} -->|\"{l}\"| {b}"),
            (_, Some(l)) => writeln!(out, "  {a} -.->|\"{l}\"| {b}"),
            (_, None) => writeln!(out, "  {a} -.-> {b}"),
        };
    }
}

fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn dot(plan: &Plan, prefix: &str, out: &mut String, depth: usize) {
    let pad = "  ".repeat(depth);
    for ix in plan.graph.node_indices() {
        let nid = quote(&id(prefix, plan, ix));
        match &plan.graph[ix] {
            Vertex::Start => {
                let _ = writeln!(out, "{pad}{nid} [label=\"START\", shape=circle];");
            }
            Vertex::End => {
                let _ = writeln!(out, "{pad}{nid} [label=\"END\", shape=doublecircle];");
            }
            Vertex::Node(name) => {
                let label = quote(&format!("{name}\n{}", kind_label(plan, ix)));
                if let Some(child) = plan.subgraphs.get(&ix) {
                    let _ = writeln!(
                        out,
                        "{pad}subgraph {} {{",
                        quote(&format!("cluster_{}", id(prefix, plan, ix)))
                    );
                    let _ = writeln!(out, "{pad}  label={label}; style=rounded;");
                    let _ = writeln!(out, "{pad}  {nid} [label={label}, shape=box3d];");
                    dot(child, &format!("{}__", id(prefix, plan, ix)), out, depth + 1);
                    let _ = writeln!(out, "{pad}}}");
                } else if is_interrupt(plan, ix) {
                    let _ = writeln!(
                        out,
                        "{pad}{nid} [label={label}, shape=hexagon, style=filled, fillcolor=\"#fde68a\"];"
                    );
                } else {
                    let _ = writeln!(out, "{pad}{nid} [label={label}, shape=box, style=rounded];");
                }
            }
        }
    }
    for e in (&plan.graph).edge_references() {
        let (a, b) = (
            quote(&id(prefix, plan, e.source())),
            quote(&id(prefix, plan, e.target())),
        );
        let style = match e.weight() {
            Flow::Static => String::new(),
            Flow::Conditional { .. } | Flow::Goto { .. } => ", style=dashed".into(),
            Flow::Join => ", arrowhead=tee".into(),
            Flow::Send { .. } => ", style=bold, color=\"#2563eb\"".into(),
            Flow::OnError => ", style=dotted, color=\"#dc2626\"".into(),
        };
        let label = edge_label(e.weight())
            .map(|l| format!("label={}", quote(&l)))
            .unwrap_or_default();
        let attrs = format!("{label}{style}");
        let attrs = attrs.trim_start_matches(", ");
        if attrs.is_empty() {
            let _ = writeln!(out, "{pad}{a} -> {b};");
        } else {
            let _ = writeln!(out, "{pad}{a} -> {b} [{attrs}];");
        }
    }
}

/// The plan as JSON: nodes with kinds, edges with their flow, subgraphs nested.
pub fn json_value(plan: &Plan) -> Value {
    let nodes: Vec<Value> = plan
        .nodes
        .iter()
        .map(|(ix, n)| {
            let mut v = json!({
                "name": n.name,
                "kind": n.spec.kind_name(),
                "interrupt": is_interrupt(plan, *ix),
            });
            if let Some(k) = &n.user_kind {
                v["user_kind"] = json!(k);
            }
            if let Some(item) = &n.item {
                v["fan_out_item"] = json!(item);
            }
            if let Some(child) = plan.subgraphs.get(ix) {
                v["subgraph"] = json_value(child);
            }
            v
        })
        .collect();
    let edges: Vec<Value> = (&plan.graph)
        .edge_references()
        .map(|e| {
            let (kind, label) = match e.weight() {
                Flow::Static => ("static", None),
                Flow::Conditional { label } => ("conditional", label.clone()),
                Flow::Goto { label } => ("goto", label.clone()),
                Flow::Join => ("join", None),
                Flow::Send { foreach, item } => ("send", Some(format!("{item} in {foreach}"))),
                Flow::OnError => ("on_error", None),
            };
            json!({"from": plan.name_of(e.source()), "to": plan.name_of(e.target()), "kind": kind, "label": label})
        })
        .collect();
    json!({"name": plan.name, "hash": plan.hash, "nodes": nodes, "edges": edges})
}

/// How far a LangGraph drawing expands subgraphs (LangGraph's `xray`): not at all, `n` levels
/// down, or every level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Xray {
    #[default]
    Off,
    Depth(u32),
    All,
}

impl Xray {
    /// The query value LangGraph's server takes: `true`, `false`, or a depth of 1 or more;
    /// `None` for anything else.
    pub fn parse(text: &str) -> Option<Xray> {
        match text {
            "" | "false" | "False" => Some(Xray::Off),
            "true" | "True" => Some(Xray::All),
            n => n
                .parse::<i64>()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| Xray::Depth(u32::try_from(n).unwrap_or(u32::MAX))),
        }
    }

    /// What the subgraphs a drawing expands are drawn with.
    fn inner(self) -> Xray {
        match self {
            Xray::Depth(n) if n > 1 => Xray::Depth(n - 1),
            Xray::Depth(_) | Xray::Off => Xray::Off,
            Xray::All => Xray::All,
        }
    }
}

/// A drawing in LangGraph's shape: nodes by id, in order, and edges.
struct Drawing {
    nodes: Vec<(String, Value)>,
    edges: Vec<Edge>,
}

/// An edge of a [`Drawing`].
struct Edge {
    source: String,
    target: String,
    conditional: bool,
    /// runner's name for its flow: `static`, `route`, `goto`, `fanout`, `join`, `on_error`.
    kind: &'static str,
    /// The route's condition, a fan-out's item and list.
    data: Option<String>,
}

/// The plan as LangGraph's server draws a graph (`GET /assistants/{id}/graph`): `{nodes:
/// [{id, type, data: {id, name}, metadata}], edges: [{source, target, conditional?, data?}]}`,
/// with `__start__` and `__end__` as nodes, and with `xray` a subgraph node replaced by its
/// child's nodes (`node:child`) as LangGraph expands it: the child's start and end dropped
/// where a single edge leaves or enters them, the edges into and out of the node moved to the
/// child's first and last node.
///
/// runner's additions, which LangGraph's clients ignore: a node's `metadata` says its `kind`
/// (and `user_kind`), whether it is a `gate`, a fan-out target (`fan_out`), the nodes a join
/// waits for (`join`), its child (`subgraph`), its `retry` policy, and LangGraph's own
/// `defer` and `__interrupt`; an edge's `kind` names its flow and `data` its condition.
pub fn langgraph_json(plan: &Plan, xray: Xray) -> Value {
    let d = drawing(plan, xray);
    let nodes: Vec<Value> = d.nodes.into_iter().map(|(_, n)| n).collect();
    let edges: Vec<Value> = d
        .edges
        .into_iter()
        .map(|e| {
            let mut v = json!({"source": e.source, "target": e.target, "kind": e.kind});
            if let Some(data) = e.data {
                v["data"] = json!(data);
            }
            if e.conditional {
                v["conditional"] = json!(true);
            }
            v
        })
        .collect();
    json!({"nodes": nodes, "edges": edges})
}

fn drawing(plan: &Plan, xray: Xray) -> Drawing {
    let mut nodes = vec![(
        "__start__".to_string(),
        json!({"id": "__start__", "type": "runnable", "data": {"name": "__start__"}}),
    )];
    for (ix, n) in &plan.nodes {
        nodes.push((
            n.name.clone(),
            json!({
                "id": n.name,
                "type": "runnable",
                "data": {"id": ["runner", n.spec.kind_name()], "name": n.name},
                "metadata": node_metadata(plan, *ix),
            }),
        ));
    }
    let mut edges: Vec<Edge> = Vec::new();
    for e in (&plan.graph).edge_references() {
        let (source, target) = (id("", plan, e.source()), id("", plan, e.target()));
        // One edge between two nodes, as LangGraph draws them.
        if edges.iter().any(|d| d.source == source && d.target == target) {
            continue;
        }
        let (kind, conditional, data) = match e.weight() {
            Flow::Static => ("static", false, None),
            Flow::Conditional { label } => ("route", true, label.clone()),
            Flow::Goto { label } => ("goto", true, label.clone()),
            Flow::Join => ("join", false, None),
            Flow::Send { foreach, item } => ("fanout", true, Some(format!("{item} in {foreach}"))),
            Flow::OnError => ("on_error", true, None),
        };
        edges.push(Edge {
            source,
            target,
            conditional,
            kind,
            data,
        });
    }
    // LangGraph adds its end once an edge goes there.
    if edges.iter().any(|e| e.target == "__end__") {
        nodes.push(("__end__".to_string(), json!({"id": "__end__"})));
    }
    let mut d = Drawing { nodes, edges };
    if xray == Xray::Off {
        return d;
    }
    for (ix, child) in &plan.subgraphs {
        let name = plan.name_of(*ix).to_string();
        let mut sub = drawing(child, xray.inner());
        if sub.nodes.len() <= 1 || sub.first().is_none() || sub.last().is_none() {
            continue;
        }
        sub.trim_first();
        sub.trim_last();
        let (first, last) = (sub.first(), sub.last());
        d.nodes.retain(|(id, _)| *id != name);
        let prefixed = |id: &str| format!("{name}:{id}");
        for (id, mut node) in sub.nodes {
            let id = prefixed(&id);
            node["id"] = json!(id);
            if node.get("data").is_some() {
                node["data"]["name"] = json!(id);
            }
            d.nodes.push((id, node));
        }
        for e in &mut d.edges {
            if e.source == name
                && let Some(last) = &last
            {
                e.source = prefixed(last);
            }
            if e.target == name
                && let Some(first) = &first
            {
                e.target = prefixed(first);
            }
        }
        d.edges.extend(sub.edges.into_iter().map(|e| Edge {
            source: prefixed(&e.source),
            target: prefixed(&e.target),
            ..e
        }));
    }
    d
}

impl Drawing {
    /// The one node no edge goes to, leaving out `exclude` and the edges from it.
    fn first_but(&self, exclude: Option<&str>) -> Option<String> {
        let targets: Vec<&str> = self
            .edges
            .iter()
            .filter(|e| Some(e.source.as_str()) != exclude)
            .map(|e| e.target.as_str())
            .collect();
        let found: Vec<&String> = self
            .nodes
            .iter()
            .map(|(id, _)| id)
            .filter(|id| Some(id.as_str()) != exclude && !targets.contains(&id.as_str()))
            .collect();
        (found.len() == 1).then(|| found[0].clone())
    }

    /// The one node no edge leaves, leaving out `exclude` and the edges to it.
    fn last_but(&self, exclude: Option<&str>) -> Option<String> {
        let sources: Vec<&str> = self
            .edges
            .iter()
            .filter(|e| Some(e.target.as_str()) != exclude)
            .map(|e| e.source.as_str())
            .collect();
        let found: Vec<&String> = self
            .nodes
            .iter()
            .map(|(id, _)| id)
            .filter(|id| Some(id.as_str()) != exclude && !sources.contains(&id.as_str()))
            .collect();
        (found.len() == 1).then(|| found[0].clone())
    }

    fn first(&self) -> Option<String> {
        self.first_but(None)
    }

    fn last(&self) -> Option<String> {
        self.last_but(None)
    }

    fn remove(&mut self, id: &str) {
        self.nodes.retain(|(n, _)| n != id);
        self.edges.retain(|e| e.source != id && e.target != id);
    }

    /// Drops the first node when a single edge leaves it and another node would be first
    /// (LangChain's `Graph.trim_first_node`).
    fn trim_first(&mut self) {
        if let Some(first) = self.first()
            && self.first_but(Some(&first)).is_some()
            && self.edges.iter().filter(|e| e.source == first).count() == 1
        {
            self.remove(&first);
        }
    }

    /// Drops the last node when a single edge enters it and another node would be last
    /// (LangChain's `Graph.trim_last_node`).
    fn trim_last(&mut self) {
        if let Some(last) = self.last()
            && self.last_but(Some(&last)).is_some()
            && self.edges.iter().filter(|e| e.target == last).count() == 1
        {
            self.remove(&last);
        }
    }
}

/// What runner says of node `ix` beside LangGraph's drawing.
fn node_metadata(plan: &Plan, ix: NodeIx) -> Value {
    let Some(n) = plan.nodes.get(&ix) else {
        return Value::Null;
    };
    let common = n.spec.common();
    let mut m = json!({"kind": n.spec.kind_name(), "gate": n.gate});
    if let Some(k) = &n.user_kind {
        m["user_kind"] = json!(k);
    }
    if n.item.is_some() {
        m["fan_out"] = json!(true);
    }
    if let Some(child) = plan.subgraphs.get(&ix) {
        m["subgraph"] = json!(child.name);
    }
    let joins: Vec<&str> = plan
        .joins
        .iter()
        .filter(|(_, to)| matches!(to, super::plan::Target::Node(t) if *t == ix))
        .flat_map(|(from, _)| from.iter().map(|f| plan.name_of(*f)))
        .collect();
    if !joins.is_empty() {
        m["join"] = json!(joins);
    }
    let r = &n.retry;
    if r.max_attempts > 1 {
        m["retry"] = json!({
            "max_attempts": r.max_attempts,
            "initial_interval": r.initial.as_secs_f64(),
            "backoff_factor": r.factor,
            "max_interval": r.max.as_secs_f64(),
            "jitter": r.jitter,
            "retry_on": r.retry_on.iter().map(|c| c.name()).collect::<Vec<_>>(),
        });
    }
    if common.defer {
        m["defer"] = json!(true);
    }
    let interrupt = match (common.interrupt_before, common.interrupt_after) {
        (true, true) => Some("before,after"),
        (true, false) => Some("before"),
        (false, true) => Some("after"),
        (false, false) => None,
    };
    if let Some(i) = interrupt {
        m["__interrupt"] = json!(i);
    }
    m
}

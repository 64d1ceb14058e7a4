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

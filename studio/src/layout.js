// A served graph (`GET /assistants/{id}/graph?xray=true`, LangGraph's shape plus runner's
// `metadata` and edge `kind`) turned into what the page draws: nodes with their kind, the
// subgraphs the reader collapsed folded into one node, and a dagre layout.
import dagre from "@dagrejs/dagre";

const START = "__start__";
const END = "__end__";

/** What kind of node `n` is: runner's `metadata.kind`, else the `["runner", kind]` data id. */
export function kindOf(n) {
  if (n.type === "schema" || n.id === START || n.id === END || n.id.endsWith(":" + START) || n.id.endsWith(":" + END))
    return "terminal";
  const meta = n.metadata || {};
  if (meta.kind) return meta.kind;
  const id = n.data && n.data.id;
  if (Array.isArray(id) && id[0] === "runner" && typeof id[1] === "string") return id[1];
  return "node";
}

/** The families the page colours nodes by. */
export function familyOf(kind, meta = {}) {
  if (meta.gate || kind === "interrupt") return "gate";
  switch (kind) {
    case "terminal":
      return "terminal";
    case "llm":
    case "agent":
      return kind === "agent" ? "agent" : "llm";
    case "tools":
    case "tool":
    case "mcp":
      return "tool";
    case "subgraph":
      return "subgraph";
    case "http":
    case "search":
    case "scrape":
    case "load":
    case "save":
      return "io";
    case "index":
    case "retrieve":
    case "store":
      return "data";
    case "set":
    case "emit":
      return "state";
    default:
      return "other";
  }
}

/** The label of an edge: its predicate or route text. */
function edgeLabel(e) {
  if (typeof e.data === "string") return e.data;
  if (e.data && typeof e.data === "object") return e.data.label || e.data.when || "";
  return "";
}

/** An edge's kind: runner's `kind`, else LangGraph's `conditional`. */
function edgeKind(e) {
  if (e.kind) return e.kind;
  return e.conditional ? "route" : "static";
}

/** The ids of every subgraph `graph` holds expanded (a node id before a `:`), outermost first. */
export function groupsOf(graph) {
  const groups = new Set();
  for (const n of graph.nodes) {
    const parts = n.id.split(":");
    for (let i = 1; i < parts.length; i++) groups.add(parts.slice(0, i).join(":"));
  }
  return [...groups].sort((a, b) => a.split(":").length - b.split(":").length || a.localeCompare(b));
}

/**
 * The graph as drawn: `open` is the set of expanded subgraphs; every node inside a collapsed
 * one is drawn as that subgraph's node, its edges rerouted there. Returns
 * `{nodes: [{id, label, kind, family, meta, x, y, width, height, group, expandable}],
 *   edges: [{id, source, target, kind, label, points, labelPos}], clusters, width, height}`.
 */
export function layout(graph, open = new Set()) {
  const byId = new Map(graph.nodes.map((n) => [n.id, n]));
  const groups = groupsOf(graph);
  // The node a served node is drawn as: its outermost collapsed ancestor, or itself.
  const shown = (id) => {
    const parts = id.split(":");
    for (let i = 1; i < parts.length; i++) {
      const g = parts.slice(0, i).join(":");
      if (!open.has(g)) return g;
    }
    return id;
  };
  const drawn = new Map();
  const add = (id, n) => {
    if (drawn.has(id)) return;
    const kind = n ? kindOf(n) : "subgraph";
    const meta = (n && n.metadata) || {};
    // Inside an expanded subgraph LangGraph names a node by its whole path: its own name is
    // the last part.
    const name = (n && n.data && typeof n.data === "object" && n.data.name ? n.data.name : id).split(":").pop();
    drawn.set(id, {
      id,
      label: name,
      kind: groups.includes(id) && kind === "node" ? "subgraph" : kind,
      family: familyOf(groups.includes(id) && kind === "node" ? "subgraph" : kind, meta),
      meta,
      expandable: groups.includes(id),
      group: id.includes(":") ? id.slice(0, id.lastIndexOf(":")) : null,
    });
  };
  for (const n of graph.nodes) {
    const id = shown(n.id);
    if (id === n.id) {
      // An expanded subgraph's own node becomes its cluster, not a node.
      if (!open.has(n.id) || !groups.includes(n.id)) add(id, n);
    } else add(id, byId.get(id));
  }
  // An edge to or from an expanded subgraph's node enters at its start (or its first nodes)
  // and leaves from its end (or its last nodes).
  const inner = (g, end) => {
    const own = graph.nodes.filter((n) => n.id.startsWith(g + ":") && !n.id.slice(g.length + 1).includes(":"));
    const terminal = own.find((n) => n.id === `${g}:${end ? END : START}`);
    if (terminal) return [terminal.id];
    const ids = new Set(own.map((n) => n.id));
    const internal = graph.edges.filter((e) => ids.has(e.source) && ids.has(e.target));
    const picked = own
      .filter((n) => !internal.some((e) => (end ? e.source === n.id : e.target === n.id)))
      .map((n) => n.id);
    return picked.length ? picked : own.map((n) => n.id).slice(0, 1);
  };
  const ends = (id, end) => {
    if (open.has(id) && groups.includes(id)) return inner(id, end).flatMap((i) => ends(i, end));
    return [shown(id)];
  };
  const edges = [];
  const seen = new Set();
  for (const e of graph.edges) {
    for (const s of ends(e.source, true)) {
      for (const t of ends(e.target, false)) {
        if (s === t || !drawn.has(s) || !drawn.has(t)) continue;
        const kind = edgeKind(e);
        const label = edgeLabel(e);
        const key = `${s}->${t}:${kind}:${label}`;
        if (seen.has(key)) continue;
        seen.add(key);
        edges.push({ id: key, source: s, target: t, kind, label });
      }
    }
  }
  // Joins: a node that waits for several sources (runner's `metadata.join`).
  for (const n of drawn.values()) {
    if (Array.isArray(n.meta.join) && n.meta.join.length) n.join = true;
    if (n.meta.fan_out) n.fanOut = true;
  }

  const g = new dagre.graphlib.Graph({ multigraph: true, compound: true });
  g.setGraph({ rankdir: "TB", nodesep: 28, ranksep: 46, edgesep: 12, marginx: 16, marginy: 16 });
  g.setDefaultEdgeLabel(() => ({}));
  for (const n of drawn.values()) {
    const terminal = n.family === "terminal";
    n.width = terminal ? Math.max(64, n.label.length * 6.5 + 20) : Math.max(96, n.label.length * 7.4 + 34);
    n.height = terminal ? 26 : 44;
    g.setNode(n.id, { width: n.width, height: n.height });
  }
  const clusters = groups.filter((c) => open.has(c) && !groups.some((p) => c.startsWith(p + ":") && !open.has(p)));
  for (const c of clusters) g.setNode(`cluster:${c}`, { label: c, clusterLabelPos: "top", paddingTop: 18 });
  for (const c of clusters) {
    const parent = c.includes(":") ? c.slice(0, c.lastIndexOf(":")) : null;
    if (parent && clusters.includes(parent)) g.setParent(`cluster:${c}`, `cluster:${parent}`);
  }
  for (const n of drawn.values()) {
    if (n.group && clusters.includes(n.group)) g.setParent(n.id, `cluster:${n.group}`);
  }
  for (const e of edges) {
    const label = e.label ? e.label.slice(0, 40) : "";
    g.setEdge(e.source, e.target, { label, width: label ? label.length * 6 + 8 : 0, height: label ? 14 : 0, labelpos: "c" }, e.id);
  }
  dagre.layout(g);
  for (const n of drawn.values()) {
    const p = g.node(n.id);
    n.x = p.x;
    n.y = p.y;
  }
  for (const e of edges) {
    const p = g.edge(e.source, e.target, e.id);
    e.points = p.points;
    e.labelPos = e.label ? { x: p.x, y: p.y } : null;
  }
  const boxes = clusters.map((c) => {
    const p = g.node(`cluster:${c}`);
    return { id: c, x: p.x - p.width / 2, y: p.y - p.height / 2, width: p.width, height: p.height };
  });
  // dagre's own bounds leave out some edges' bends (they can fall left of the first node):
  // everything is moved into view by the box of what is drawn.
  let minX = Infinity;
  let minY = Infinity;
  let maxX = -Infinity;
  let maxY = -Infinity;
  const take = (x0, y0, x1, y1) => {
    minX = Math.min(minX, x0);
    minY = Math.min(minY, y0);
    maxX = Math.max(maxX, x1);
    maxY = Math.max(maxY, y1);
  };
  for (const n of drawn.values()) take(n.x - n.width / 2, n.y - n.height / 2, n.x + n.width / 2, n.y + n.height / 2);
  for (const e of edges) {
    for (const p of e.points) take(p.x, p.y, p.x, p.y);
    if (e.labelPos) take(e.labelPos.x - e.label.length * 3.2, e.labelPos.y - 8, e.labelPos.x + e.label.length * 3.2, e.labelPos.y + 8);
  }
  for (const c of boxes) take(c.x, c.y, c.x + c.width, c.y + c.height);
  if (minX === Infinity) return { nodes: [], edges: [], clusters: [], width: 0, height: 0 };
  const margin = 16;
  const dx = margin - minX;
  const dy = margin - minY;
  for (const n of drawn.values()) {
    n.x += dx;
    n.y += dy;
  }
  for (const e of edges) {
    e.points = e.points.map((p) => ({ x: p.x + dx, y: p.y + dy }));
    if (e.labelPos) e.labelPos = { x: e.labelPos.x + dx, y: e.labelPos.y + dy };
  }
  for (const c of boxes) {
    c.x += dx;
    c.y += dy;
  }
  return { nodes: [...drawn.values()], edges, clusters: boxes, width: maxX - minX + 2 * margin, height: maxY - minY + 2 * margin };
}

/** An SVG path through dagre's points, its corners rounded. */
export function edgePath(points) {
  if (!points || !points.length) return "";
  let d = `M${points[0].x},${points[0].y}`;
  if (points.length === 2) return d + `L${points[1].x},${points[1].y}`;
  for (let i = 1; i < points.length - 1; i++) {
    const p = points[i];
    const next = points[i + 1];
    const mx = (p.x + next.x) / 2;
    const my = (p.y + next.y) / 2;
    d += `Q${p.x},${p.y} ${i === points.length - 2 ? next.x : mx},${i === points.length - 2 ? next.y : my}`;
  }
  return d;
}

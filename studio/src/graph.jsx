// The graph drawn: nodes by kind (shape and colour), routes dashed and labelled with their
// predicates, fan-outs, joins and gates marked, subgraphs expandable, the run's state on each
// node (running, done, failed, waiting, next).
import { useMemo, useState, useRef, useEffect } from "preact/hooks";
import { layout, edgePath, groupsOf } from "./layout.js";

const STATE_RANK = { error: 5, running: 4, interrupted: 3, next: 2, done: 1 };

/** The state a drawn node shows: its own, or the strongest of the nodes folded into it. */
function stateOf(id, states, folded) {
  let best = states[id];
  if (folded) {
    for (const [k, v] of Object.entries(states)) {
      if (k.startsWith(id + ":") && (STATE_RANK[v] || 0) > (STATE_RANK[best] || 0)) best = v;
    }
  }
  return best;
}

function Shape({ n }) {
  const w = n.width;
  const h = n.height;
  const x = -w / 2;
  const y = -h / 2;
  switch (n.family) {
    case "terminal":
      return <rect class="shape" x={x} y={y} width={w} height={h} rx={h / 2} />;
    case "gate": {
      const c = 12;
      const pts = [
        [x + c, y],
        [x + w - c, y],
        [x + w, 0],
        [x + w - c, y + h],
        [x + c, y + h],
        [x, 0],
      ];
      return <polygon class="shape" points={pts.map((p) => p.join(",")).join(" ")} />;
    }
    case "tool": {
      const c = 10;
      return (
        <polygon
          class="shape"
          points={`${x + c},${y} ${x + w},${y} ${x + w - c},${y + h} ${x},${y + h}`}
        />
      );
    }
    case "data":
      return (
        <g>
          <rect class="shape" x={x} y={y} width={w} height={h} rx={10} />
          <path class="shape-line" d={`M${x},${y + 9} Q0,${y + 17} ${x + w},${y + 9}`} />
        </g>
      );
    case "subgraph":
    case "agent":
      return (
        <g>
          <rect class="shape" x={x} y={y} width={w} height={h} rx={4} />
          <rect class="shape-line" x={x + 4} y={y + 4} width={w - 8} height={h - 8} rx={2} />
        </g>
      );
    default:
      return <rect class="shape" x={x} y={y} width={w} height={h} rx={n.family === "llm" ? 12 : 3} />;
  }
}

const MARK = { running: "●", done: "✓", error: "✕", interrupted: "‖", next: "→" };

export function GraphView({ graph, states = {}, selected, onSelect, testid = "graph" }) {
  const groups = useMemo(() => (graph ? groupsOf(graph) : []), [graph]);
  const [open, setOpen] = useState(() => new Set());
  const [zoom, setZoom] = useState(1);
  const box = useRef(null);
  const drawn = useMemo(() => {
    if (!graph) return null;
    const t0 = performance.now();
    const d = layout(graph, open);
    d.ms = performance.now() - t0;
    return d;
  }, [graph, open]);
  // A graph taller or wider than its box starts fitted to it (not below half size, where
  // labels stop being readable); the reader zooms from there.
  useEffect(() => {
    const el = box.current;
    if (!drawn || !el || !drawn.width) return;
    const fits = Math.min(el.clientWidth / drawn.width, el.clientHeight / drawn.height);
    setZoom(fits < 1 ? Math.max(0.5, fits) : 1);
  }, [graph]);
  useEffect(() => {
    if (!drawn) return;
    // The time from the graph's arrival to its first painted frame, for the page's own
    // measurements (README: first paint of a 50-node graph).
    const arrived = graph.__arrived;
    requestAnimationFrame(() => {
      window.__studio = window.__studio || {};
      window.__studio.graphPaint = {
        nodes: graph.nodes.length,
        layoutMs: drawn.ms,
        sinceArrivalMs: arrived ? performance.now() - arrived : null,
        sinceNavigationMs: performance.now(),
      };
    });
  }, [drawn]);
  if (!graph) return <div class="empty">No graph.</div>;
  const toggle = (id) => {
    const next = new Set(open);
    if (next.has(id)) {
      for (const g of [...next]) if (g === id || g.startsWith(id + ":")) next.delete(g);
    } else next.add(id);
    setOpen(next);
  };
  const fit = () => {
    const el = box.current;
    if (!el || !drawn.width) return;
    setZoom(Math.min(1.5, Math.max(0.2, Math.min(el.clientWidth / drawn.width, el.clientHeight / drawn.height))));
  };
  const w = drawn.width * zoom;
  const h = drawn.height * zoom;
  return (
    <div class="graph" data-testid={testid}>
      <div class="graph-tools" role="toolbar" aria-label="Graph view">
        <button type="button" onClick={() => setZoom((z) => Math.min(3, z * 1.2))} aria-label="Zoom in">
          +
        </button>
        <button type="button" onClick={() => setZoom((z) => Math.max(0.2, z / 1.2))} aria-label="Zoom out">
          −
        </button>
        <button type="button" onClick={fit}>
          Fit
        </button>
        {groups.length > 0 && (
          <button
            type="button"
            data-testid="expand-all"
            onClick={() => setOpen(open.size === groups.length ? new Set() : new Set(groups))}
          >
            {open.size === groups.length ? "Collapse subgraphs" : "Expand subgraphs"}
          </button>
        )}
        <span class="muted">
          {graph.nodes.length} nodes · {graph.edges.length} edges
        </span>
      </div>
      <div class="graph-box" ref={box}>
        <svg
          width={w}
          height={h}
          viewBox={`0 0 ${drawn.width} ${drawn.height}`}
          role="img"
          aria-label="Workflow graph"
          data-testid="graph-svg"
        >
          <defs>
            <marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto">
              <path d="M0,0 L10,5 L0,10 z" class="arrow" />
            </marker>
          </defs>
          {drawn.clusters.map((c) => (
            <g class="cluster" key={c.id}>
              <rect x={c.x} y={c.y} width={c.width} height={c.height} rx={8} />
              <text x={c.x + 8} y={c.y + 13}>
                {c.id}
              </text>
            </g>
          ))}
          {drawn.edges.map((e) => (
            <g class={`edge edge-${e.kind}`} key={e.id} data-testid="graph-edge" data-kind={e.kind}>
              <path d={edgePath(e.points)} marker-end="url(#arrow)" />
              {e.labelPos && (
                <text x={e.labelPos.x} y={e.labelPos.y + 4} text-anchor="middle">
                  <title>{e.label}</title>
                  {e.label.length > 40 ? e.label.slice(0, 39) + "…" : e.label}
                </text>
              )}
            </g>
          ))}
          {drawn.nodes.map((n) => {
            const st = stateOf(n.id, states, n.expandable && !open.has(n.id));
            const cls = [
              "node",
              `fam-${n.family}`,
              st ? `st-${st}` : "",
              selected === n.id ? "selected" : "",
            ].join(" ");
            const pick = () => onSelect && n.family !== "terminal" && onSelect(n.id);
            return (
              <g
                key={n.id}
                class={cls}
                transform={`translate(${n.x},${n.y})`}
                tabIndex={n.family === "terminal" ? -1 : 0}
                role="button"
                aria-label={`${n.label} (${n.kind})${st ? ", " + st : ""}`}
                aria-pressed={selected === n.id}
                data-testid="graph-node"
                data-node={n.id}
                data-state={st || ""}
                data-kind={n.kind}
                onClick={pick}
                onKeyDown={(ev) => {
                  if (ev.key === "Enter" || ev.key === " ") {
                    ev.preventDefault();
                    pick();
                  }
                }}
              >
                <title>
                  {n.id} · {n.kind}
                  {n.meta.gate ? " · gate" : ""}
                  {n.fanOut ? " · fan-out" : ""}
                  {n.join ? " · join of " + n.meta.join.join(", ") : ""}
                  {n.meta.retry ? " · retry " + JSON.stringify(n.meta.retry) : ""}
                </title>
                <Shape n={n} />
                <text class="label" y={n.family === "terminal" ? 4 : -2} text-anchor="middle">
                  {n.label}
                </text>
                {n.family !== "terminal" && (
                  <text class="kind" y={13} text-anchor="middle">
                    {n.kind}
                    {n.join ? " · join" : ""}
                    {n.fanOut ? " · fan-out" : ""}
                  </text>
                )}
                {st && (
                  <text class="mark" x={n.width / 2 - 9} y={-n.height / 2 + 12} text-anchor="middle">
                    {MARK[st]}
                  </text>
                )}
                {n.expandable && (
                  <g
                    class="expander"
                    transform={`translate(${-n.width / 2 + 9},${-n.height / 2 + 9})`}
                    onClick={(ev) => {
                      ev.stopPropagation();
                      toggle(n.id);
                    }}
                  >
                    <rect x={-7} y={-7} width={14} height={14} rx={3} />
                    <text y={4} text-anchor="middle">
                      +
                    </text>
                  </g>
                )}
              </g>
            );
          })}
          {drawn.clusters.map((c) => (
            <g
              key={"x" + c.id}
              class="expander"
              transform={`translate(${c.x + c.width - 10},${c.y + 10})`}
              onClick={() => toggle(c.id)}
              role="button"
              aria-label={`Collapse ${c.id}`}
            >
              <rect x={-7} y={-7} width={14} height={14} rx={3} />
              <text y={4} text-anchor="middle">
                −
              </text>
            </g>
          ))}
        </svg>
      </div>
      <Legend />
    </div>
  );
}

function Legend() {
  const items = [
    ["llm", "model"],
    ["tool", "tools"],
    ["gate", "gate"],
    ["subgraph", "subgraph"],
    ["io", "web / files"],
    ["data", "data store"],
    ["state", "set / emit"],
  ];
  return (
    <div class="legend" aria-hidden="true">
      {items.map(([f, t]) => (
        <span key={f} class={`chip fam-${f}`}>
          {t}
        </span>
      ))}
      <span class="chip edge-chip">— static</span>
      <span class="chip edge-chip dashed">- - route</span>
    </div>
  );
}

// A run as it streams: the stream modes' events (`values`, `updates`, `messages`, `custom`,
// `events`, `debug`, each `|namespace`d inside subgraphs) folded into what the page shows —
// each node's state, tokens and calls, the custom events, tool calls, errors and retries.
//
// Events arrive faster than a page should redraw (hundreds a second): they are folded into
// this mutable record as they come, and the view redraws at most once a frame.

const LOG_CAP = 2000;
/** The shortest time between two redraws of a streaming run (about 15 a second). */
const DRAW_MS = 66;
const SPAN_CAP = 5000;

/** The graph node id an event is about: its subgraph path (`parent:child`) and its name. */
export function nodeId(ns, name) {
  return ns.length ? `${ns.join(":")}:${name}` : name;
}

/** The namespace of an event name `mode|parent:<task>|child:<task>`: `["parent", "child"]`. */
export function namespaceOf(eventName) {
  const parts = eventName.split("|");
  return { mode: parts[0], ns: parts.slice(1).map((p) => p.split(":")[0]) };
}

function text(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content))
    return content.map((b) => (typeof b === "string" ? b : b && b.type === "text" ? b.text || "" : "")).join("");
  return "";
}

export class LiveRun {
  constructor({ threadId, kind = "run" } = {}) {
    this.threadId = threadId;
    this.kind = kind;
    this.runId = null;
    this.status = "starting";
    this.nodes = {};
    this.log = [];
    this.dropped = 0;
    this.customCount = 0;
    this.eventCount = 0;
    this.values = null;
    this.interrupts = [];
    this.error = null;
    this.usage = {};
    this.hasEvents = false;
    this.startedAt = performance.now();
    this.endedAt = null;
    this.version = 0;
    this.listeners = new Set();
    this.frame = 0;
    this.drawn = 0;
    // Each task's start and end as this page saw them (debug events), for a waterfall where
    // the server keeps no trace.
    this.spans = new Map();
  }

  subscribe(fn) {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /**
   * Redraws at most once a frame and at most every `DRAW_MS`, however many events came in
   * between: a fast run's events are folded as they come and drawn together.
   */
  changed() {
    this.version++;
    if (this.frame) return;
    const wait = Math.max(0, DRAW_MS - (performance.now() - this.drawn));
    this.frame = setTimeout(() => {
      requestAnimationFrame(() => {
        this.frame = 0;
        this.drawn = performance.now();
        for (const fn of this.listeners) fn(this.version);
      });
    }, wait);
  }

  node(id) {
    return (this.nodes[id] ||= { status: null, tokens: "", calls: 0, input: undefined, result: undefined, error: null, usage: null });
  }

  push(entry) {
    entry.t = Math.round(performance.now() - this.startedAt);
    this.log.push(entry);
    if (this.log.length > LOG_CAP) {
      this.log.splice(0, this.log.length - LOG_CAP);
      this.dropped++;
    }
  }

  /** Folds one SSE event into the run. */
  apply(eventName, data) {
    this.eventCount++;
    const { mode, ns } = namespaceOf(eventName);
    switch (mode) {
      case "metadata":
        this.runId = data.run_id;
        this.status = "running";
        break;
      case "values":
        if (!ns.length) {
          this.values = data;
          if (Array.isArray(data && data.__interrupt__)) this.interrupts = data.__interrupt__;
        }
        break;
      case "updates":
        for (const [name, update] of Object.entries(data || {})) {
          if (name === "__interrupt__") {
            this.interrupts = update;
            for (const i of update) this.push({ kind: "interrupt", node: ns.join(":") || null, data: i.value, text: "waits for an answer" });
            continue;
          }
          const n = this.node(nodeId(ns, name));
          if (n.status !== "error") n.status = "done";
          n.result = update;
        }
        break;
      case "messages":
        this.message(ns, data);
        break;
      case "custom":
        this.customCount++;
        this.push({ kind: "custom", node: null, ns: ns.join(":"), data });
        break;
      case "debug":
        this.debug(ns, data);
        break;
      case "events":
        this.hasEvents = true;
        this.callback(ns, data);
        break;
      case "error":
        this.error = data;
        this.status = "error";
        // The run is over: the page's graph says so at once, not when the stream closes.
        this.settleNodes();
        this.push({ kind: "error", node: null, text: `${data.error || "Error"}: ${data.message || ""}` });
        break;
      default:
        break;
    }
    this.changed();
  }

  debug(ns, d) {
    const p = d && d.payload;
    if (!p) return;
    const now = Math.round(performance.now() - this.startedAt);
    if (d.type === "task") {
      if (this.spans.size < SPAN_CAP)
        this.spans.set(p.id, { id: p.id, kind: "task", name: nodeId(ns, p.name), node: nodeId(ns, p.name), step: d.step, start_ms: now, end_ms: null, status: "running", input: p.input });
      const n = this.node(nodeId(ns, p.name));
      n.status = "running";
      n.input = p.input;
      n.calls++;
      n.taskId = p.id;
      n.step = d.step;
    } else if (d.type === "task_result") {
      const id = nodeId(ns, p.name);
      const span = this.spans.get(p.id);
      if (span) {
        span.end_ms = now;
        span.status = p.error ? "error" : "success";
        span.error = p.error || undefined;
        span.writes = p.result;
      }
      const n = this.node(id);
      n.result = p.result;
      if (p.error) {
        n.status = "error";
        n.error = p.error;
        this.push({ kind: "error", node: id, text: String(p.error) });
      } else if (p.interrupts && p.interrupts.length) {
        n.status = "interrupted";
      } else {
        n.status = "done";
      }
    }
  }

  message(ns, data) {
    const [chunk, meta] = Array.isArray(data) ? data : [data, {}];
    if (!chunk) return;
    const name = (meta && meta.langgraph_node) || "?";
    const id = nodeId(ns, name);
    const n = this.node(id);
    if (chunk.type === "AIMessageChunk") {
      n.tokens += text(chunk.content);
      if (n.status !== "error") n.status = n.status === "done" ? "done" : "running";
      for (const c of chunk.tool_call_chunks || []) {
        if (c.name && !this.hasEvents) this.push({ kind: "tool", node: id, text: `calls ${c.name}`, data: c.args });
      }
      return;
    }
    if (this.hasEvents) return;
    if (chunk.type === "ai" && Array.isArray(chunk.tool_calls)) {
      for (const c of chunk.tool_calls) this.push({ kind: "tool", node: id, text: `calls ${c.name}`, data: c.args, callId: c.id });
    } else if (chunk.type === "tool") {
      this.push({ kind: "tool", node: id, text: `${chunk.name || "tool"} answered${chunk.status === "error" ? " with an error" : ""}`, data: chunk.content, callId: chunk.tool_call_id, failed: chunk.status === "error" });
    }
  }

  /** LangChain's callback events (`stream_mode: "events"`): model and tool calls, usage. */
  callback(ns, e) {
    const meta = e.metadata || {};
    const node = meta.langgraph_node ? nodeId(ns, meta.langgraph_node) : null;
    switch (e.event) {
      case "on_chat_model_start":
        this.push({ kind: "model", node, text: `model ${meta.ls_model_name || e.name || ""} called` });
        break;
      case "on_chat_model_end": {
        const out = (e.data && e.data.output) || {};
        const u = out.usage_metadata || {};
        const cost = meta.cost_usd ?? out.cost_usd ?? null;
        if (node) {
          const n = this.node(node);
          n.usage = addUsage(n.usage, u, cost);
        }
        const model = meta.ls_model_name || e.name || "model";
        this.usage[model] = addUsage(this.usage[model], u, cost);
        this.push({ kind: "model", node, text: `model ${model}: ${u.input_tokens ?? "?"} in, ${u.output_tokens ?? "?"} out${cost != null ? `, $${Number(cost).toFixed(6)}` : ""}` });
        break;
      }
      case "on_tool_start":
        this.push({ kind: "tool", node, text: `calls ${e.name}`, data: e.data && e.data.input });
        break;
      case "on_tool_end":
        this.push({ kind: "tool", node, text: `${e.name} answered`, data: e.data && e.data.output });
        break;
      case "on_tool_error":
        this.push({ kind: "error", node, text: `${e.name} failed`, data: e.data && e.data.error });
        break;
      case "on_retry":
      case "on_chain_retry":
        this.push({ kind: "retry", node, text: "retried", data: e.data });
        break;
      case "on_chain_error":
        if (node) this.push({ kind: "error", node, text: "failed", data: e.data && e.data.error });
        break;
      default:
        if (/retry/i.test(e.event || "")) this.push({ kind: "retry", node, text: e.event, data: e.data });
    }
  }

  /** The run's end, as the server stored it. */
  finish(status) {
    // A run that stopped at a gate ended well (LangGraph's server says `success`); the page
    // says it waits.
    if (this.interrupts.length && (!status || status === "success")) status = "interrupted";
    this.status = status || (this.error ? "error" : "success");
    this.endedAt = performance.now();
    this.settleNodes();
    this.changed();
  }

  /** Nodes still running when the run ends failed with it, or finished with it. */
  settleNodes() {
    for (const n of Object.values(this.nodes)) if (n.status === "running") n.status = this.status === "error" ? "error" : "done";
  }

  /** Each node's state, for the graph. */
  states() {
    const s = {};
    for (const [k, n] of Object.entries(this.nodes)) if (n.status) s[k] = n.status;
    return s;
  }
}

export function addUsage(into, u, cost) {
  const r = into ? { ...into } : { input_tokens: 0, output_tokens: 0, cost_usd: 0 };
  r.input_tokens += u.input_tokens || 0;
  r.output_tokens += u.output_tokens || 0;
  if (cost != null) r.cost_usd = (r.cost_usd || 0) + Number(cost);
  return r;
}

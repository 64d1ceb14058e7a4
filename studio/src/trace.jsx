// A run's trace (runner's `GET /threads/{t}/runs/{r}/trace`) as a waterfall — steps, tasks,
// model, tool and HTTP calls with their durations, each span's input and writes, a task's input
// state read from the checkpoint it read (asked for when the span is opened) — and its
// tokens and cost per node and per model, input and output apart, summed per run and per
// thread (`GET /threads/{t}/usage`). A server without them answers 404: "not available".
import { useState, useEffect, useMemo } from "preact/hooks";
import { get, enc } from "./api.js";
import { JsonTree, Diff } from "./json.jsx";

const money = (v) => (v == null ? "—" : `$${Number(v).toFixed(6)}`);
const num = (v) => (v == null ? "—" : String(v));

export function UsageTable({ title, rows, testid }) {
  const entries = Object.entries(rows || {});
  if (!entries.length) return null;
  return (
    <table class="usage" data-testid={testid}>
      <caption>{title}</caption>
      <thead>
        <tr>
          <th scope="col">{title.startsWith("By model") ? "model" : "node"}</th>
          <th scope="col">input tokens</th>
          <th scope="col">output tokens</th>
          <th scope="col">cost</th>
        </tr>
      </thead>
      <tbody>
        {entries.map(([k, u]) => (
          <tr key={k} data-key={k}>
            <th scope="row">{k}</th>
            <td data-col="input">{num(u.input_tokens)}</td>
            <td data-col="output">{num(u.output_tokens)}</td>
            <td data-col="cost">{money(u.cost_usd)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function Total({ label, u, testid }) {
  if (!u) return null;
  return (
    <div class="total" data-testid={testid}>
      {label}: <strong>{num(u.input_tokens)}</strong> in · <strong>{num(u.output_tokens)}</strong> out · <strong>{money(u.cost_usd)}</strong>
    </div>
  );
}

function depthOf(spans) {
  const byId = new Map(spans.map((s) => [s.id, s]));
  const depth = new Map();
  const d = (s) => {
    if (depth.has(s.id)) return depth.get(s.id);
    let v = 0;
    const p = s.parent != null ? byId.get(s.parent) : null;
    if (p && p !== s) {
      depth.set(s.id, 0);
      v = d(p) + 1;
    }
    depth.set(s.id, v);
    return v;
  };
  for (const s of spans) d(s);
  return depth;
}

// The states of checkpoints read for the spans opened, by thread and checkpoint: a
// checkpoint never changes, so each is asked for once per page.
const states = new Map();
function stateAt(threadId, checkpointId) {
  const key = `${threadId}/${checkpointId}`;
  if (!states.has(key)) {
    const p = get(`/threads/${enc(threadId)}/state/${enc(checkpointId)}`);
    p.catch(() => states.delete(key));
    states.set(key, p);
  }
  return states.get(key);
}

const pick = (values, keys) => Object.fromEntries(keys.filter((k) => values && k in values).map((k) => [k, values[k]]));

/**
 * A task's input: the state of the checkpoint it read (the span's `input_checkpoint_id`), read
 * when the span is opened, and what its step made of the keys the task wrote (that state
 * against the one of the checkpoint its step made).
 */
function TaskInput({ threadId, span, step }) {
  const [read, setRead] = useState(null);
  const [error, setError] = useState(null);
  const inputId = span.input_checkpoint_id;
  const outputId = step && step.checkpoint_id;
  useEffect(() => {
    let gone = false;
    setRead(null);
    setError(null);
    Promise.all([stateAt(threadId, inputId), outputId ? stateAt(threadId, outputId) : null]).then(
      ([input, output]) => !gone && setRead({ input, output }),
      (e) => !gone && setError(e.message),
    );
    return () => {
      gone = true;
    };
  }, [threadId, inputId, outputId]);
  if (error) return <div class="banner err">The state the task read could not be loaded: {error}</div>;
  if (!read) return <div class="muted" data-testid="span-input-loading">Reading the state at checkpoint {inputId.slice(0, 8)}…</div>;
  const before = (read.input && read.input.values) || {};
  const wrote = span.writes && typeof span.writes === "object" ? Object.keys(span.writes) : null;
  const after = read.output && read.output.values;
  return (
    <div class="task-input" data-testid="span-input" data-checkpoint={inputId}>
      <h4>Input state</h4>
      <div class="muted small">at checkpoint {inputId}</div>
      <JsonTree value={before} testid="span-input-state" />
      {after && (
        <>
          <h4>What its writes changed</h4>
          <Diff
            from={wrote ? pick(before, wrote) : before}
            to={wrote ? pick(after, wrote) : after}
            testid="span-diff"
            none={wrote && !wrote.length ? "It wrote nothing." : "No change to the keys it wrote."}
          />
        </>
      )}
    </div>
  );
}

function Waterfall({ trace }) {
  const [picked, setPicked] = useState(null);
  const spans = trace.spans || [];
  const depth = useMemo(() => depthOf(spans), [trace]);
  const byId = useMemo(() => new Map(spans.map((s) => [s.id, s])), [trace]);
  const end = Math.max(1, ...spans.map((s) => s.end_ms ?? s.start_ms ?? 0));
  const shown = spans.slice(0, 1000);
  return (
    <div class="waterfall" data-testid="waterfall">
      <div class="muted small">
        {spans.length} spans · {(end / 1000).toFixed(2)} s{spans.length > shown.length ? ` · the first ${shown.length}` : ""}
      </div>
      <ol>
        {shown.map((s) => {
          const left = ((s.start_ms || 0) / end) * 100;
          const width = Math.max(0.4, (((s.end_ms ?? end) - (s.start_ms || 0)) / end) * 100);
          return (
            <li key={s.id} class={`span k-${s.kind} ${s.status === "error" ? "failed" : ""}`}>
              <button type="button" onClick={() => setPicked(picked === s ? null : s)} aria-expanded={picked === s} data-testid="span" data-kind={s.kind} data-node={s.node || ""}>
                <span class="span-name" style={{ paddingLeft: `${(depth.get(s.id) || 0) * 10}px` }}>
                  <span class={`badge k-${s.kind}`}>{s.kind}</span> {s.name}
                </span>
                <span class="span-bar">
                  <span style={{ left: `${left}%`, width: `${width}%` }} />
                </span>
                <span class="span-ms">{s.end_ms != null ? `${Math.round(s.end_ms - s.start_ms)} ms` : "…"}</span>
              </button>
              {picked === s && (
                <div class="span-detail">
                  {s.error && <div class="banner err">{s.error}</div>}
                  {s.model && <div>model: {s.model}</div>}
                  {s.usage && (
                    <div>
                      {num(s.usage.input_tokens)} in · {num(s.usage.output_tokens)} out · {money(s.usage.cost_usd)}
                    </div>
                  )}
                  {s.kind === "task" && s.input_checkpoint_id && trace.thread_id && (
                    <TaskInput threadId={trace.thread_id} span={s} step={byId.get(s.parent)} />
                  )}
                  {s.input !== undefined && (
                    <>
                      <h4>{s.kind === "task" ? "Fan-out item" : "Input"}</h4>
                      <JsonTree value={s.input} />
                    </>
                  )}
                  {s.writes !== undefined && (
                    <>
                      <h4>Writes</h4>
                      <JsonTree value={s.writes} />
                    </>
                  )}
                </div>
              )}
            </li>
          );
        })}
      </ol>
    </div>
  );
}

export function TracePanel({ threadId, runs, live }) {
  const [runId, setRunId] = useState(null);
  const [trace, setTrace] = useState(undefined);
  const [usage, setUsage] = useState(undefined);
  const [error, setError] = useState(null);
  const chosen = runId || (runs[0] && runs[0].run_id) || (live && live.runId);
  const liveDone = live && live.status !== "running" && live.status !== "starting";
  useEffect(() => {
    if (!threadId || !chosen) return;
    let gone = false;
    setError(null);
    (async () => {
      try {
        const [t, u] = await Promise.all([
          get(`/threads/${enc(threadId)}/runs/${enc(chosen)}/trace`, { optional: true }),
          get(`/threads/${enc(threadId)}/usage`, { optional: true }),
        ]);
        if (!gone) {
          setTrace(t);
          setUsage(u);
        }
      } catch (e) {
        if (!gone) setError(e.message);
      }
    })();
    return () => {
      gone = true;
    };
  }, [threadId, chosen, liveDone, runs.length]);
  if (!threadId) return <div class="empty">Start a run to see its trace.</div>;
  return (
    <div class="trace-panel" data-testid="trace-panel">
      <div class="row">
        <label for="trace-run">Run</label>
        <select id="trace-run" value={chosen || ""} onChange={(e) => setRunId(e.currentTarget.value)} data-testid="trace-run">
          {runs.map((r) => (
            <option key={r.run_id} value={r.run_id}>
              {r.run_id.slice(0, 8)} · {r.status} · {new Date(r.created_at).toLocaleTimeString()}
            </option>
          ))}
        </select>
      </div>
      {error && <div class="banner err">{error}</div>}
      {trace === null && (
        <div class="muted" data-testid="trace-unavailable">
          This server does not keep traces (no <code>/threads/…/runs/…/trace</code>): the live run's model calls show in the Run tab.
        </div>
      )}
      {live && live.runId === chosen && Object.keys(live.usage).length > 0 && !trace && <UsageTable title="By model (live)" rows={live.usage} testid="live-usage" />}
      {trace === null && live && live.runId === chosen && live.spans.size > 0 && (
        <>
          <h3>Tasks as this page saw them stream</h3>
          <Waterfall trace={{ spans: [...live.spans.values()] }} />
        </>
      )}
      {trace && (
        <>
          <Total label="This run" u={trace.usage && trace.usage.total} testid="run-total" />
          <UsageTable title="By node" rows={trace.usage && trace.usage.by_node} testid="usage-by-node" />
          <UsageTable title="By model" rows={trace.usage && trace.usage.by_model} testid="usage-by-model" />
          <Waterfall trace={trace} />
        </>
      )}
      {usage && (
        <>
          <Total label={`This thread (${usage.runs ?? "?"} runs)`} u={usage.total} testid="thread-total" />
          <UsageTable title="By node, whole thread" rows={usage.by_node} testid="thread-by-node" />
        </>
      )}
    </div>
  );
}

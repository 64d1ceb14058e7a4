// Starting a run (the input schema as a form, the context, breakpoints) and watching it: status,
// custom events as they arrive, tool calls, model calls, errors and retries, each node's
// streamed tokens; a node's own view (its input, result, error, tokens and usage).
import { useState, useEffect } from "preact/hooks";
import { SchemaForm, initialValue, resolve } from "./form.jsx";
import { JsonTree } from "./json.jsx";

const SHOWN = 200;

function hasProperties(schema) {
  const s = schema && resolve(schema, schema);
  return !!(s && s.properties && Object.keys(s.properties).length);
}

function nodeNames(graph) {
  return graph ? graph.nodes.filter((n) => n.type !== "schema" && !n.id.includes(":") && !n.id.startsWith("__")).map((n) => n.id) : [];
}

export function RunPanel({ schemas, graph, threadId, thread, live, running, onRun, onCancel, onSelectNode }) {
  const inputSchema = schemas && schemas.input_schema;
  const contextSchema = schemas && schemas.context_schema;
  const [input, setInput] = useState({});
  const [context, setContext] = useState({});
  const [before, setBefore] = useState([]);
  const [after, setAfter] = useState([]);
  useEffect(() => {
    if (schemas) {
      setInput(initialValue(inputSchema || {}));
      setContext(initialValue(contextSchema || {}));
    }
  }, [schemas]);
  const submit = (e) => {
    e.preventDefault();
    const body = { input: input ?? {} };
    if (hasProperties(contextSchema)) body.context = context;
    if (before.length) body.interrupt_before = before;
    if (after.length) body.interrupt_after = after;
    onRun(body);
  };
  const names = nodeNames(graph);
  return (
    <div class="run-panel">
      <form onSubmit={submit} data-testid="run-form" aria-label="Start a run">
        <h2>{threadId ? "New turn on this thread" : "New run"}</h2>
        {!schemas && <div class="muted">Reading the input schema…</div>}
        {schemas && <SchemaForm schema={inputSchema || {}} value={input} onChange={setInput} idPrefix="in" testid="input-form" />}
        {hasProperties(contextSchema) && (
          <details open>
            <summary>Context</summary>
            <SchemaForm schema={contextSchema} value={context} onChange={setContext} idPrefix="ctx" testid="context-form" />
          </details>
        )}
        {names.length > 0 && (
          <details>
            <summary>Breakpoints</summary>
            <div class="breakpoints">
              {names.map((n) => (
                <div key={n} class="bp">
                  <code>{n}</code>
                  <label>
                    <input type="checkbox" checked={before.includes(n)} onChange={(e) => setBefore(e.currentTarget.checked ? [...before, n] : before.filter((x) => x !== n))} /> before
                  </label>
                  <label>
                    <input type="checkbox" checked={after.includes(n)} onChange={(e) => setAfter(e.currentTarget.checked ? [...after, n] : after.filter((x) => x !== n))} /> after
                  </label>
                </div>
              ))}
            </div>
          </details>
        )}
        <div class="row">
          <button type="submit" class="primary" disabled={running || !schemas} data-testid="run-submit">
            {threadId ? "Run on thread" : "Run"}
          </button>
          {running && (
            <button type="button" class="danger" onClick={onCancel} data-testid="run-cancel">
              Cancel run
            </button>
          )}
        </div>
        {thread && thread.status === "error" && !running && (
          <p class="muted">This thread's last run failed: pick the failed node on the graph to edit its input and run it again.</p>
        )}
      </form>
      {live && <LiveView live={live} onSelectNode={onSelectNode} />}
    </div>
  );
}

function elapsed(live) {
  const end = live.endedAt || performance.now();
  return ((end - live.startedAt) / 1000).toFixed(1) + " s";
}

const KINDS = ["all", "custom", "tool", "model", "error", "retry", "interrupt"];

export function LiveView({ live, onSelectNode }) {
  const [filter, setFilter] = useState("all");
  const entries = filter === "all" ? live.log : live.log.filter((e) => e.kind === filter);
  const shown = entries.slice(-SHOWN);
  const withTokens = Object.entries(live.nodes).filter(([, n]) => n.tokens);
  return (
    <section class="live" aria-label="Live run" data-testid="live-run" data-status={live.status}>
      <h2>
        {live.kind}{" "}
        <span class={`badge st-${live.status}`} data-testid="run-status">
          {live.status}
        </span>
      </h2>
      <div class="muted small">
        {live.runId ? (
          <span>
            run <code data-testid="run-id">{live.runId}</code> ·{" "}
          </span>
        ) : null}
        {live.eventCount} events · {live.customCount} custom · {elapsed(live)}
      </div>
      {live.error && (
        <div class="banner err" role="alert" data-testid="run-error">
          {live.error.error}: {live.error.message}
        </div>
      )}
      {withTokens.length > 0 && (
        <div class="tokens">
          {withTokens.map(([id, n]) => (
            <details key={id} open data-testid="node-tokens" data-node={id}>
              <summary>
                <button type="button" class="link" onClick={() => onSelectNode(id)}>
                  {id}
                </button>{" "}
                <span class="muted">{n.tokens.length} chars</span>
              </summary>
              <pre class="stream-text">{n.tokens.length > 4000 ? "…" + n.tokens.slice(-4000) : n.tokens}</pre>
            </details>
          ))}
        </div>
      )}
      <div class="log-head">
        <h3>Events</h3>
        <div class="filters" role="radiogroup" aria-label="Show">
          {KINDS.map((k) => (
            <button type="button" key={k} role="radio" aria-checked={filter === k} class={filter === k ? "on" : ""} onClick={() => setFilter(k)}>
              {k}
            </button>
          ))}
        </div>
      </div>
      {entries.length > SHOWN && <div class="muted small">the last {SHOWN} of {entries.length}{live.dropped ? " (older ones dropped)" : ""}</div>}
      <ol class="log" data-testid="run-log">
        {shown.map((e, i) => (
          <li key={entries.length - shown.length + i} class={`log-${e.kind}`} data-testid={`log-${e.kind}`}>
            <span class="t">{(e.t / 1000).toFixed(2)}</span>
            <span class={`badge k-${e.kind}`}>{e.kind}</span>{" "}
            {e.node && (
              <button type="button" class="link" onClick={() => onSelectNode(e.node)}>
                {e.node}
              </button>
            )}{" "}
            {e.kind === "custom" ? <CustomEvent data={e.data} /> : <span>{e.text}</span>}
            {e.kind !== "custom" && e.data !== undefined && e.data !== null && <code class="data">{short(e.data)}</code>}
          </li>
        ))}
      </ol>
    </section>
  );
}

function short(v) {
  const t = typeof v === "string" ? v : JSON.stringify(v);
  return t && t.length > 240 ? t.slice(0, 239) + "…" : t;
}

function CustomEvent({ data }) {
  const name = data && typeof data === "object" ? data.type || data.event || data.name : null;
  return (
    <span class="custom" data-event={name || ""}>
      {name && <strong>{name}</strong>} <code class="data">{short(data)}</code>
    </span>
  );
}

export function NodeInspector({ id, graph, info, checkpoint, live, canRerun, onRerun, onClose }) {
  const node = graph && graph.nodes.find((n) => n.id === id);
  const task = checkpoint && (checkpoint.tasks || []).find((t) => t.name === id);
  const kind = node && node.data && node.data.id ? node.data.id[1] : node && node.metadata && node.metadata.kind;
  return (
    <section class="inspector" aria-label={`Node ${id}`} data-testid="node-inspector" data-node={id}>
      <div class="inspector-head">
        <h2>
          {id} <span class="muted">{kind}</span>
        </h2>
        <div class="row">
          {canRerun && (
            <button type="button" onClick={onRerun} data-testid="node-rerun">
              Edit input &amp; re-run
            </button>
          )}
          <button type="button" onClick={onClose} aria-label="Close node view">
            ×
          </button>
        </div>
      </div>
      <div class="inspector-body">
        {info && (
          <div>
            <div>
              state: <span class={`badge st-${info.status}`}>{info.status || "—"}</span>
              {info.calls > 1 && <span class="muted"> · ran {info.calls} times</span>}
              {info.usage && (
                <span class="muted" data-testid="node-usage">
                  {" "}
                  · {info.usage.input_tokens} in / {info.usage.output_tokens} out tokens
                  {info.usage.cost_usd ? ` · $${info.usage.cost_usd.toFixed(6)}` : ""}
                </span>
              )}
            </div>
            {(info.error || (task && task.error)) && (
              <div class="banner err" data-testid="node-error">
                {String(info.error || task.error)}
              </div>
            )}
            {info.tokens && (
              <>
                <h3>Streamed</h3>
                <pre class="stream-text" data-testid="inspector-tokens">
                  {info.tokens}
                </pre>
              </>
            )}
            {info.input !== undefined && (
              <>
                <h3>Input</h3>
                <JsonTree value={info.input} />
              </>
            )}
            {info.result !== undefined && (
              <>
                <h3>Writes</h3>
                <JsonTree value={info.result} />
              </>
            )}
          </div>
        )}
        {!info && task && (
          <div>
            {task.error && (
              <div class="banner err" data-testid="node-error">
                {String(task.error)}
              </div>
            )}
            {task.interrupts && task.interrupts.length > 0 && <div>waits at a gate</div>}
            {task.result !== undefined && task.result !== null && (
              <>
                <h3>Writes</h3>
                <JsonTree value={task.result} />
              </>
            )}
            {!task.error && !task.result && <div class="muted">runs next from this checkpoint</div>}
          </div>
        )}
        {!info && !task && <div class="muted">{live ? "Not run in this run." : "Start a run to see this node at work."}</div>}
      </div>
    </section>
  );
}

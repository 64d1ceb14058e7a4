// Threads: the list of a workflow's threads beside its graph, and every thread of the server
// (`POST /threads/search`) — status, workflow, last update — searched by id, status or
// metadata.
import { useState, useEffect } from "preact/hooks";
import { post, get, enc } from "./api.js";
import { go } from "./router.js";
import { afterGraph } from "./boot.js";

function ago(t) {
  if (!t) return "";
  const s = (Date.now() - new Date(t).getTime()) / 1000;
  if (isNaN(s)) return t;
  if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t).toLocaleDateString();
}

export function ThreadSidebar({ assistants, graphId, threadId, version, onNew }) {
  const [threads, setThreads] = useState(null);
  useEffect(() => {
    let gone = false;
    afterGraph()
      .then(() => post("/threads/search", { metadata: { graph_id: graphId }, limit: 50, offset: 0, sort_by: "updated_at", sort_order: "desc" }))
      .then((t) => !gone && setThreads(t))
      .catch(() => !gone && setThreads([]));
    return () => {
      gone = true;
    };
  }, [graphId, version, threadId]);
  return (
    <aside class="sidebar" aria-label="Workflows and threads">
      <h2>Workflows</h2>
      <ul class="list" data-testid="assistants">
        {assistants.map((a) => (
          <li key={a.assistant_id}>
            <a href={`#/graph/${enc(a.graph_id)}`} aria-current={a.graph_id === graphId ? "page" : undefined} data-testid="assistant" data-graph={a.graph_id}>
              {a.graph_id}
            </a>
          </li>
        ))}
      </ul>
      <div class="row spread">
        <h2>Threads</h2>
        <button type="button" onClick={onNew} data-testid="new-thread">
          + New
        </button>
      </div>
      {threads === null && <div class="muted">…</div>}
      {threads && !threads.length && <div class="muted small">No thread yet.</div>}
      <ul class="list threads" data-testid="graph-threads">
        {(threads || []).map((t) => (
          <li key={t.thread_id}>
            <a href={`#/graph/${enc(graphId)}/thread/${enc(t.thread_id)}`} aria-current={t.thread_id === threadId ? "page" : undefined} data-testid="thread-link" data-thread={t.thread_id}>
              <code>{t.thread_id.slice(0, 8)}</code> <span class={`badge st-${t.status}`}>{t.status}</span>
              <span class="muted small"> {ago(t.updated_at)}</span>
            </a>
          </li>
        ))}
      </ul>
    </aside>
  );
}

/** `key=value` pairs of a search box as metadata; anything else is a thread id. */
function parseQuery(q) {
  const metadata = {};
  const ids = [];
  for (const part of q.split(/\s+/).filter(Boolean)) {
    const eq = part.indexOf("=");
    if (eq > 0) {
      const raw = part.slice(eq + 1);
      let v = raw;
      try {
        v = JSON.parse(raw);
      } catch {
        v = raw;
      }
      metadata[part.slice(0, eq)] = v;
    } else ids.push(part);
  }
  return { metadata, ids };
}

const PAGE = 50;

export function ThreadList({ assistants }) {
  const [q, setQ] = useState("");
  const [status, setStatus] = useState("");
  const [graph, setGraph] = useState("");
  const [offset, setOffset] = useState(0);
  const [threads, setThreads] = useState(null);
  const [error, setError] = useState(null);
  const search = async () => {
    const { metadata, ids } = parseQuery(q);
    if (graph) metadata.graph_id = graph;
    const body = { metadata, limit: PAGE, offset, sort_by: "updated_at", sort_order: "desc" };
    if (status) body.status = status;
    try {
      let found;
      if (ids.length === 1) {
        // An id is looked up directly (a thread of any workflow).
        const one = await get(`/threads/${enc(ids[0])}`).catch(() => null);
        found = one ? [one] : [];
      } else {
        if (ids.length) body.ids = ids;
        found = await post("/threads/search", body);
      }
      setThreads(found);
      setError(null);
    } catch (e) {
      setError(e.message);
    }
  };
  useEffect(() => {
    search();
  }, [status, graph, offset]);
  return (
    <div class="thread-list">
      <h1>Threads</h1>
      <form
        class="row wrap"
        role="search"
        onSubmit={(e) => {
          e.preventDefault();
          setOffset(0);
          search();
        }}
      >
        <label for="thread-q" class="sr-only">
          Search
        </label>
        <input id="thread-q" type="search" placeholder="thread id, or key=value metadata" value={q} onInput={(e) => setQ(e.currentTarget.value)} data-testid="thread-search" />
        <label for="thread-status">status</label>
        <select id="thread-status" value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
          <option value="">any</option>
          {["idle", "busy", "interrupted", "error"].map((s) => (
            <option key={s}>{s}</option>
          ))}
        </select>
        <label for="thread-graph">workflow</label>
        <select id="thread-graph" value={graph} onChange={(e) => setGraph(e.currentTarget.value)}>
          <option value="">any</option>
          {assistants.map((a) => (
            <option key={a.graph_id}>{a.graph_id}</option>
          ))}
        </select>
        <button type="submit">Search</button>
      </form>
      {error && <div class="banner err">{error}</div>}
      <table class="threads-table" data-testid="threads-table">
        <thead>
          <tr>
            <th scope="col">thread</th>
            <th scope="col">workflow</th>
            <th scope="col">status</th>
            <th scope="col">updated</th>
          </tr>
        </thead>
        <tbody>
          {(threads || []).map((t) => {
            const g = (t.metadata && t.metadata.graph_id) || "";
            return (
              <tr key={t.thread_id}>
                <td>
                  <a
                    href={g ? `#/graph/${enc(g)}/thread/${enc(t.thread_id)}` : "#/threads"}
                    onClick={(e) => {
                      if (!g) return;
                      e.preventDefault();
                      go({ view: "graph", graph: g, thread: t.thread_id });
                    }}
                  >
                    <code>{t.thread_id}</code>
                  </a>
                </td>
                <td>{g}</td>
                <td>
                  <span class={`badge st-${t.status}`}>{t.status}</span>
                </td>
                <td title={t.updated_at}>{ago(t.updated_at)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {threads && !threads.length && <div class="empty">No thread found.</div>}
      <div class="row">
        <button type="button" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - PAGE))}>
          Newer
        </button>
        <button type="button" disabled={!threads || threads.length < PAGE} onClick={() => setOffset(offset + PAGE)}>
          Older
        </button>
      </div>
    </div>
  );
}
